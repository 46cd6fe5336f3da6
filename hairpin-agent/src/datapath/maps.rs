//! Maps and their owners: which maps every agent shares through the pins, the
//! handles user space keeps, the frontends map's entries and the counters.
//!
//! One writer per map: `frontends` is written only through [`FrontendsMap`], which
//! the agent hands to its reconciler ([`Datapath::take_frontends`]); `counters`, `sockets`, `sockets_fill`,
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

use super::error::{is_full, map_error};
use super::kernel_path;
use super::{Datapath, DatapathError, KernelPath, LoadOptions, PinDir};
use crate::model::{FirstSpeaker, PathChoice, ProxyVersion};

/// The maps every agent shares through the pin directory, by ELF name.
pub(super) const SHARED_MAPS: [&str; 9] = [
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
/// [`Datapath::take_frontends`]) is the only code that changes `HAIRPIN_FRONTENDS`.
pub struct FrontendsMap {
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
    pub(super) fn new(
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
    pub fn kernel_path(&self) -> &KernelPath {
        &self.kernel_path
    }

    /// Redirects connects to `frontend` to `slot` (the relay path, whatever the
    /// kernel path's state): the names ports' entries.
    pub fn insert(&mut self, frontend: SocketAddr, slot: SlotRef) -> Result<(), DatapathError> {
        self.insert_value(frontend, Redirect::new(slot, 0))
    }

    /// As [`FrontendsMap::insert`] for a frontend whose ingress expects `version`
    /// headers: with the kernel path on, a client that speaks `first` and `path`
    /// `auto`, the kernel writes them on the client's own socket and the slot is
    /// the fallback; otherwise (off, unavailable, a server that speaks first, or the
    /// relay asked for) its relay writes them. Whether the entry gives the kernel path.
    pub fn insert_frontend(
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
    pub fn retain(&mut self, live: &std::collections::BTreeSet<SocketAddr>) {
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
    pub fn remove(&mut self, frontend: SocketAddr) -> Result<(), DatapathError> {
        match self.map.remove(&FrontendKey::new(frontend)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(map_error("remove", MAP_FRONTENDS, frontend.to_string())(
                source,
            )),
        }
    }
}

impl Datapath {
    /// Hands the frontends map's one writer to its owner (in the agent, the
    /// reconciler), with the kernel path as it stands now: take it after
    /// [`Datapath::attach`], which may find the kernel path unavailable. `None` once
    /// taken.
    pub fn take_frontends(&mut self) -> Option<FrontendsMap> {
        let map = self.frontends.take()?;
        Some(FrontendsMap::new(
            map,
            self.capacity,
            self.kernel_path.clone(),
        ))
    }

    /// Kernel id of the sockets map, for `status` and `dump`.
    pub fn sockets_map_id(&self) -> Option<u32> {
        self.sockets_id
    }

    /// The per-CPU counters, summed.
    pub fn counters(&self) -> Vec<(Counter, u64)> {
        sum_counters(&self.counters)
    }

    /// A reader of the counters through this process's own descriptor of the map,
    /// for `/status` and `/metrics`: opening the map by id (`dump`, and
    /// [`kernel_objects::read_counters`]) needs CAP_SYS_ADMIN, which the DaemonSet does not
    /// grant, so there the kernel path's fallback and miss counters would not show.
    pub fn counters_reader(&self) -> Result<CountersReader, DatapathError> {
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
        Ok(CountersReader(map))
    }
}

/// The sockets map's size. Not preallocated, but kept small while unused; a
/// pinned one is sized for any later agent (its buckets cost about 16 bytes each),
/// and one an earlier agent pinned keeps its own size, which the limit then follows.
pub(super) fn sockets_capacity(pins: Option<&PinDir>, opts: &LoadOptions) -> u32 {
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
pub(super) fn warn_if_counters_short(counters: &PerCpuArray<MapData, u64>) {
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
pub(super) struct OpenedMaps {
    pub(super) frontends: HashMap<MapData, FrontendKey, Redirect>,
    pub(super) counters: PerCpuArray<MapData, u64>,
    pub(super) heartbeat: Array<MapData, u64>,
    pub(super) relays: SockMap<MapData>,
    pub(super) slots: HashMap<MapData, SlotKey, Slot>,
    /// A descriptor of the slots map of its own, for the relay's reader.
    pub(super) slots_fd: std::os::fd::OwnedFd,
    pub(super) sockets: SockHash<MapData, u64>,
    /// The sockets map's kernel id, for `status`.
    pub(super) sockets_id: Option<u32>,
}

impl OpenedMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<OpenedMaps, DatapathError> {
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

/// The programs' counters, read through a descriptor this process holds (see
/// [`Datapath::counters_reader`]); valid while the process runs.
pub struct CountersReader(PerCpuArray<MapData, u64>);

impl CountersReader {
    /// The per-CPU counters, summed, by name.
    pub fn read(&self) -> Vec<(&'static str, u64)> {
        sum_counters(&self.0)
            .into_iter()
            .map(|(c, v)| (c.name(), v))
            .collect()
    }

    /// The sockets map's fill as the counters tell it: sockets in the map (entered
    /// less left) and marked sockets not yet seen established. Each difference reads
    /// its subtrahends first, so a socket that moves on between the reads is never
    /// missed, only counted twice.
    pub fn fill(&self) -> kernel_path::Fill {
        let get = |c: Counter| -> u64 {
            self.0
                .get(&(c as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0)
        };
        let left = get(Counter::KernelSocketsLeft);
        let settled = get(Counter::KernelMissedInsert) + get(Counter::KernelMissedDataFirst);
        let entered = get(Counter::KernelSocketsEntered);
        let marked = get(Counter::KernelMarked);
        kernel_path::Fill {
            in_map: entered.saturating_sub(left),
            connecting: marked.saturating_sub(entered + settled),
        }
    }
}

pub(super) fn sum_counters(map: &PerCpuArray<MapData, u64>) -> Vec<(Counter, u64)> {
    Counter::ALL
        .iter()
        .map(|c| {
            let total = map
                .get(&(*c as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0);
            (*c, total)
        })
        .collect()
}

/// [`sum_counters`] by counter name, as `status` and `dump` read a counters map
/// opened by pin or by id.
pub(super) fn named_counters(map: &PerCpuArray<MapData, u64>) -> Vec<(&'static str, u64)> {
    sum_counters(map)
        .into_iter()
        .map(|(c, total)| (c.name(), total))
        .collect()
}
