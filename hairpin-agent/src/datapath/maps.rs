//! Maps and their owners: which maps every agent shares through the pins, the
//! handles user space keeps, the frontends map's entries and the counters.
//!
//! One writer per map: `frontends` is written only through [`FrontendsMap`], which
//! the agent hands to its reconciler (`Datapath::take_frontends`); `counters`, `sockets`, `sockets_fill`,
//! `pending` and `fastopen` are the programs' own (user space sizes, pins and reads
//! them); `heartbeat` and `relays` belong to liveness.rs, `slots` to slots.rs. Never
//! touches a link or a program.

use std::{net::SocketAddr, os::fd::AsFd};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray, SockHash, SockMap},
};
use hairpin_ebpf::{
    Counter, FrontendKey, MAP_COUNTERS, MAP_FASTOPEN, MAP_FRONTENDS, MAP_HEARTBEAT, MAP_PENDING,
    MAP_RELAYS, MAP_SLOTS, MAP_SOCKETS, MAP_SOCKETS_FILL, Redirect, Slot, SlotKey, SlotRef,
};

use super::counters::{CountersReader, sum_counters};
use super::error::{DatapathError, is_full, map_error};
use super::kernel_path::KernelPath;
use super::options::LoadOptions;
use super::pin::PinDir;
use crate::model::{FirstSpeaker, PathChoice, ProxyVersion};

/// The maps every agent shares through the pin directory, by ELF name.
pub(crate) const SHARED_MAPS: [&str; 9] = [
    MAP_FRONTENDS,
    MAP_SLOTS,
    MAP_COUNTERS,
    MAP_SOCKETS,
    MAP_SOCKETS_FILL,
    MAP_PENDING,
    MAP_FASTOPEN,
    MAP_HEARTBEAT,
    MAP_RELAYS,
];

/// The frontends map's one writer: whoever holds it (the agent's reconciler, through
/// `Datapath::take_frontends`) is the only code that changes `HAIRPIN_FRONTENDS`.
pub(crate) struct FrontendsMap {
    map: HashMap<MapData, FrontendKey, Redirect>,
    /// Its capacity (`--max-frontends`), for the error when it is full.
    capacity: u32,
    /// The kernel path as it stood when the map was taken (after attach): whether an
    /// entry may ask for the kernel path, and why not.
    kernel_path: KernelPath,
}

impl std::fmt::Debug for FrontendsMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontendsMap")
            .field("capacity", &self.capacity)
            .field("kernel_path", &self.kernel_path)
            .finish_non_exhaustive()
    }
}

impl FrontendsMap {
    fn new(
        map: HashMap<MapData, FrontendKey, Redirect>,
        capacity: u32,
        kernel_path: KernelPath,
    ) -> FrontendsMap {
        FrontendsMap {
            map,
            capacity,
            kernel_path,
        }
    }

    /// The kernel path as the entries see it.
    pub(crate) fn kernel_path(&self) -> &KernelPath {
        &self.kernel_path
    }

    /// Redirects connects to `dialled` to `slot` (the relay path, whatever the
    /// kernel path's state): the names ports' entries.
    pub(crate) fn redirect(
        &mut self,
        dialled: SocketAddr,
        slot: SlotRef,
    ) -> Result<(), DatapathError> {
        self.insert_value(dialled, Redirect::new(slot, 0))
    }

    /// Whether an entry for a frontend whose `first` side speaks first and that asks
    /// for `path` gives it the kernel path: then it goes live without a slot when
    /// none can be had (see [`SlotRef::NONE`]).
    pub(crate) fn takes_kernel_path(&self, first: FirstSpeaker, path: PathChoice) -> bool {
        self.kernel_path
            .value(SlotRef::NONE, ProxyVersion::V1, first, path)
            .is_kernel()
    }

    /// Redirects connects to `frontend`, whose ingress expects `version` headers:
    /// with the kernel path on, a client that speaks `first` and `path` `auto`, the
    /// kernel writes them on the client's own socket and the slot is the fallback
    /// ([`SlotRef::NONE`]: none yet); otherwise (off, unavailable, a server that
    /// speaks first, or the relay asked for) its relay writes them. Whether the
    /// entry gives the kernel path.
    pub(crate) fn insert(
        &mut self,
        frontend: SocketAddr,
        slot: SlotRef,
        version: ProxyVersion,
        first: FirstSpeaker,
        path: PathChoice,
    ) -> Result<bool, DatapathError> {
        let value = self.kernel_path.value(slot, version, first, path);
        self.insert_value(frontend, value)?;
        Ok(value.is_kernel())
    }

    fn insert_value(&mut self, frontend: SocketAddr, value: Redirect) -> Result<(), DatapathError> {
        match self.map.insert(FrontendKey::new(frontend), value, 0) {
            Ok(()) => Ok(()),
            Err(e) if is_full(&e) => Err(DatapathError::MapFull {
                frontend,
                capacity: self.capacity,
            }),
            Err(e) => Err(map_error("insert", MAP_FRONTENDS, frontend.to_string())(e)),
        }
    }

    /// Removes every entry but those of `live`: what an earlier agent left for
    /// frontends that are gone. Logged per entry (the first few at info level).
    pub(crate) fn retain(&mut self, live: &std::collections::BTreeSet<SocketAddr>) {
        let stale: Vec<FrontendKey> = self
            .map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !live.contains(&k.socket_addr()))
            .collect();
        let mut said = crate::logs::LogBudget::default();
        for k in stale {
            match self.map.remove(&k) {
                Ok(()) => {
                    crate::item!(said, info, frontend = %k.socket_addr(), "an earlier agent's frontend that is gone: removed from the map");
                }
                Err(e) => {
                    tracing::warn!(frontend = %k.socket_addr(), error = %e, "an earlier agent's stale frontend could not be removed")
                }
            }
        }
        said.more(|n| tracing::info!(more = n, "and more of an earlier agent's frontends that are gone: removed from the map (each at log level debug)"));
    }

    /// Stops redirecting connects to `frontend`.
    pub(crate) fn remove(&mut self, frontend: SocketAddr) -> Result<(), DatapathError> {
        match self.map.remove(&FrontendKey::new(frontend)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(map_error("remove", MAP_FRONTENDS, frontend.to_string())(
                source,
            )),
        }
    }
}

/// The maps user space keeps beside liveness's and the slots': the frontends map
/// until its one writer is handed out, the counters, the sockets map (which sk_msg
/// links to) and their kernel ids.
pub(crate) struct Maps {
    /// The frontends map, until its one writer is taken ([`Maps::take_frontends`]).
    frontends: Option<HashMap<MapData, FrontendKey, Redirect>>,
    /// Its kernel id, for `status` and `dump`.
    frontends_id: Option<u32>,
    /// Its capacity (`--max-frontends`).
    capacity: u32,
    counters: PerCpuArray<MapData, u64>,
    sockets: SockHash<MapData, u64>,
    sockets_id: Option<u32>,
}

impl Maps {
    /// The maps taken out of the loaded object (the sockets map with its kernel
    /// id), the frontends map sized for `capacity`.
    pub(crate) fn new(
        frontends: HashMap<MapData, FrontendKey, Redirect>,
        counters: PerCpuArray<MapData, u64>,
        (sockets, sockets_id): (SockHash<MapData, u64>, Option<u32>),
        capacity: u32,
    ) -> Maps {
        Maps {
            frontends_id: aya::maps::IterableMap::map(&frontends)
                .info()
                .ok()
                .map(|i| i.id()),
            frontends: Some(frontends),
            capacity,
            counters,
            sockets,
            sockets_id,
        }
    }

    /// Hands the frontends map's one writer to its owner, with the kernel path as
    /// it stands now. `None` once taken.
    pub(crate) fn take_frontends(&mut self, kernel_path: &KernelPath) -> Option<FrontendsMap> {
        let map = self.frontends.take()?;
        Some(FrontendsMap::new(map, self.capacity, kernel_path.clone()))
    }

    /// Kernel id of the frontends map.
    pub(crate) fn frontends_id(&self) -> Option<u32> {
        self.frontends_id
    }

    /// Kernel id of the counters map.
    pub(crate) fn counters_id(&self) -> Option<u32> {
        use aya::maps::IterableMap;
        self.counters.map().info().ok().map(|i| i.id())
    }

    /// Kernel id of the sockets map.
    pub(crate) fn sockets_id(&self) -> Option<u32> {
        self.sockets_id
    }

    /// A descriptor of the sockets map of its own (what sk_msg links to) and its
    /// kernel id (0 when unknown).
    pub(crate) fn sockets_target(&self) -> Result<(std::os::fd::OwnedFd, u64), DatapathError> {
        let fd = self
            .sockets
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|io_error| {
                map_error("open", MAP_SOCKETS, String::new())(aya::maps::MapError::SyscallError(
                    aya::sys::SyscallError {
                        call: "dup",
                        io_error,
                    },
                ))
            })?;
        Ok((fd, u64::from(self.sockets_id.unwrap_or(0))))
    }

    /// The per-CPU counters, summed.
    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        sum_counters(&self.counters)
    }

    /// A reader of the counters through this process's own descriptor of the map,
    /// for `/status` and `/metrics`: opening the map by id (`dump`, and
    /// `kernel_objects::read_counters`) needs CAP_SYS_ADMIN, which the DaemonSet does
    /// not grant, so there the kernel path's fallback and miss counters would not show.
    pub(crate) fn counters_reader(&self) -> Result<CountersReader, DatapathError> {
        use aya::maps::IterableMap;
        let fd = self
            .counters
            .map()
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| {
                map_error("open", MAP_COUNTERS, String::new())(aya::maps::MapError::SyscallError(
                    aya::sys::SyscallError {
                        call: "dup",
                        io_error: source,
                    },
                ))
            })?;
        let data = MapData::from_fd(fd).map_err(map_error("open", MAP_COUNTERS, String::new()))?;
        let map = PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).map_err(map_error(
            "open",
            MAP_COUNTERS,
            String::new(),
        ))?;
        Ok(CountersReader::new(map))
    }
}

/// The sockets map's size. Not preallocated, but kept small while unused; a
/// pinned one is sized for any later agent (its buckets cost about 16 bytes each),
/// and one an earlier agent pinned keeps its own size, which the limit then follows.
pub(crate) fn sockets_capacity(pins: Option<&PinDir>, opts: &LoadOptions) -> u32 {
    if let Some(existing) = pins
        .and_then(|p| MapData::from_pin(p.map(MAP_SOCKETS)).ok())
        .and_then(|m| m.info().ok())
    {
        existing.max_entries()
    } else if opts.kernel_path || pins.is_some() {
        opts.max_kernel_sockets.max(1)
    } else {
        1
    }
}

/// Says so when the counters map an earlier agent pinned has fewer slots than this
/// build counts (counters were added within one pin layout, before any release):
/// the programs' lookups of the missing slots find nothing, so those counters
/// (the newest: `kernel_fallback_mesh`) read 0 until the datapath is made anew.
pub(crate) fn warn_if_counters_short(counters: &PerCpuArray<MapData, u64>) {
    use aya::maps::IterableMap;
    let Ok(slots) = counters.map().info().map(|i| i.max_entries()) else {
        return;
    };
    if slots < Counter::COUNT {
        let missing: Vec<&str> = Counter::ALL[slots as usize..]
            .iter()
            .map(|c| c.name())
            .collect();
        tracing::warn!(
            slots,
            counters = %missing.join(", "),
            "the pinned counters map was made by an earlier build with fewer slots: these counters stay 0 until the datapath is made anew (`hairpin-agent cleanup`, then a restart)"
        );
    }
}

/// The maps user space keeps, taken out of the loaded object.
pub(crate) struct OpenedMaps {
    pub(crate) frontends: HashMap<MapData, FrontendKey, Redirect>,
    pub(crate) counters: PerCpuArray<MapData, u64>,
    pub(crate) heartbeat: Array<MapData, u64>,
    pub(crate) relays: SockMap<MapData>,
    pub(crate) slots: HashMap<MapData, SlotKey, Slot>,
    /// A descriptor of the slots map of its own, for the relay's reader.
    pub(crate) slots_fd: std::os::fd::OwnedFd,
    pub(crate) sockets: SockHash<MapData, u64>,
    /// The sockets map's kernel id, for `status`.
    pub(crate) sockets_id: Option<u32>,
}

impl OpenedMaps {
    pub(crate) fn take(ebpf: &mut Ebpf) -> Result<OpenedMaps, DatapathError> {
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name)
                .ok_or(DatapathError::Missing { kind: "map", name })
        };
        let frontends = HashMap::try_from(take(ebpf, MAP_FRONTENDS)?).map_err(map_error(
            "open",
            MAP_FRONTENDS,
            String::new(),
        ))?;
        let counters = PerCpuArray::try_from(take(ebpf, MAP_COUNTERS)?).map_err(map_error(
            "open",
            MAP_COUNTERS,
            String::new(),
        ))?;
        let heartbeat = Array::try_from(take(ebpf, MAP_HEARTBEAT)?).map_err(map_error(
            "open",
            MAP_HEARTBEAT,
            String::new(),
        ))?;
        let relays = SockMap::try_from(take(ebpf, MAP_RELAYS)?).map_err(map_error(
            "open",
            MAP_RELAYS,
            String::new(),
        ))?;
        let slots: HashMap<MapData, SlotKey, Slot> = HashMap::try_from(take(ebpf, MAP_SLOTS)?)
            .map_err(map_error("open", MAP_SLOTS, String::new()))?;
        let slots_fd = aya::maps::IterableMap::map(&slots)
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|io_error| {
                map_error("open", MAP_SLOTS, String::new())(aya::maps::MapError::SyscallError(
                    aya::sys::SyscallError {
                        call: "dup",
                        io_error,
                    },
                ))
            })?;
        let sockets = take(ebpf, MAP_SOCKETS)?;
        let sockets_id = match &sockets {
            aya::maps::Map::SockHash(m) => m.info().ok().map(|i| i.id()),
            _ => None,
        };
        let sockets =
            SockHash::try_from(sockets).map_err(map_error("open", MAP_SOCKETS, String::new()))?;
        Ok(OpenedMaps {
            frontends,
            counters,
            heartbeat,
            relays,
            slots,
            slots_fd,
            sockets,
            sockets_id,
        })
    }
}
