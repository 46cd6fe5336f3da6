//! The object and its load: the BPF object compiled into this binary, and
//! [`Datapath::load_with`], which sets the programs' read-only globals, sizes the
//! maps, reuses the shared maps an earlier agent pinned, loads the programs into the
//! kernel (the kernel path's when it can, else the relay path's) and hands each part
//! to its owner: the programs (programs.rs), the links (the lifecycle's executor),
//! the maps (maps.rs), liveness (liveness.rs), the slots (slots.rs), the splice
//! (splice.rs). [`Datapath`] composes them and only delegates.
//!
//! Owns the [`Datapath`] value and the loader's globals. Never attaches a program
//! (the executor does), never writes a map entry, and locks the pin directory only
//! through pin.rs.

use std::{
    net::SocketAddr,
    os::fd::AsFd,
    path::{Path, PathBuf},
    sync::Arc,
};

use aya::{Ebpf, EbpfLoader, programs::CgroupSockAddr};
use hairpin_ebpf::{
    Counter, FrontendKey, GLOBAL_BYPASS_MARK, GLOBAL_FASTOPEN_CONNECT_MASK,
    GLOBAL_FASTOPEN_CONNECT_OFF, GLOBAL_FASTOPEN_REQ_OFF, GLOBAL_MESH_CACHE, GLOBAL_MESH_PORTS,
    GLOBAL_NODE_IP4, GLOBAL_NODE_IP6, GLOBAL_SLOT_ADDRS4, GLOBAL_SLOT_ADDRS6, GLOBAL_SOCKETS_LIMIT,
    MAP_FRONTENDS, MAP_SLOTS, MAP_SOCKETS, MAP_SPLICE, MAP_SPLICE_CREDIT, MAP_SPLICE_PEERS,
    MAP_SPLICE_SEEN, PROG_CONNECT4_KERNEL_PERFMON, PROG_SK_LOOKUP, mesh_ports_be, slot_addrs4,
    slot_addrs6,
};

use super::adopt;
use super::attach::Attachment;
use super::btf;
use super::counters::CountersReader;
use super::error::{DatapathError, SteeringError, load_error, program_error};
use super::events::{EventsReader, events_level};
use super::kernel_path::{self, KernelPath};
use super::lifecycle::execute::Links;
use super::lifecycle::kernel::Sys;
use super::lifecycle::start::{Decided, decide_start};
use super::lifecycle::state::{Go, Wait};
use super::lifecycle::takeover::Handover;
use super::liveness::{Heartbeat, Liveness, RelayLiveness};
use super::maps::{
    FrontendsMap, Maps, OpenedMaps, SHARED_MAPS, sockets_capacity, warn_if_counters_short,
};
use super::options::LoadOptions;
use super::order::{self, LinkOrder};
use super::pin::{Pin, PinDir, Pinning};
use super::programs::Programs;
use super::role::Role;
use super::slots::{SlotTable, Slots, SlotsReader};
use super::splice::{self, Splice, SpliceError};
use crate::status::LinkOrderStatus;
#[cfg(hairpin_ebpf_embedded)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hairpin-ebpf.o"));

/// The BPF object compiled into this binary, if it was built with one.
pub fn embedded_object() -> Option<&'static [u8]> {
    #[cfg(hairpin_ebpf_embedded)]
    return Some(OBJECT);
    #[cfg(not(hairpin_ebpf_embedded))]
    None
}

/// The loaded datapath: its parts, each with its one owner. The programs, the links
/// (the lifecycle's executor), the maps, liveness, the slots and the splice.
pub struct Datapath {
    programs: Programs,
    links: Links,
    maps: Maps,
    liveness: Liveness,
    slots: Slots,
    /// The relay's kernel splice, or why there is none.
    splice: Result<Splice, Arc<SpliceError>>,
}

/// How MPTCP subflows are told apart at connect.
pub(super) use crate::status::MptcpDetection as Mptcp;

/// What [`start`] came to.
// A Datapath is large and a Wait small, but this is returned once per attempt.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per start attempt, never stored in bulk"
)]
pub(crate) enum Started {
    /// Loaded (not attached yet), and how: fresh, adopted, after a takeover, unpinned.
    Loaded {
        /// The datapath.
        datapath: Datapath,
        /// What the lifecycle decided.
        go: Go,
    },
    /// Not loaded: the agent waits, and says why; nothing was changed.
    Waiting(Wait),
}

/// Observes the node, decides (the lifecycle's start), and loads `object` as
/// decided (nothing attached yet), or says what to wait for.
pub(crate) fn start(object: &[u8], opts: &LoadOptions) -> Result<Started, DatapathError> {
    match decide_start(opts) {
        Decided::Wait(wait) => Ok(Started::Waiting(wait)),
        Decided::Load {
            go,
            pinning,
            handover,
        } => {
            let datapath = Datapath::load_with(object, opts, pinning, handover)?;
            Ok(Started::Loaded { datapath, go })
        }
    }
}

impl Datapath {
    /// Loads `object` with the bypass mark set, and both programs into the kernel
    /// (not yet attached), with room for [`MAX_FRONTENDS`] frontends.
    pub fn load(object: &[u8], bypass_mark: u32) -> Result<Datapath, DatapathError> {
        Datapath::load_with(object, &LoadOptions::relay(bypass_mark), Pinning::Off, None)
    }

    /// Loads `object` as `opts` say, pinned as `pinning` says (its directory locked
    /// by the lifecycle, which decided it; see the lifecycle's `start`): the shared
    /// maps are the pinned ones when an earlier agent left them (created and pinned
    /// otherwise). The kernel path's programs are tried first when asked for; when
    /// this kernel cannot run them the relay path's connect programs load instead
    /// and [`Datapath::kernel_path`] says why. Nothing is attached yet.
    fn load_with(
        object: &[u8],
        opts: &LoadOptions,
        pinning: Pinning,
        handover: Option<Handover>,
    ) -> Result<Datapath, DatapathError> {
        raise_memlock_limit();
        let pins = pinning.dir();
        let sockets = sockets_capacity(pins, opts);
        // The programs' diagnostic events go to a ring buffer that a task reads; with
        // no runtime to run it, none are written.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let log_level = if runtime.is_some() { events_level() } else { 0 };
        // Where tcp_sock keeps its Fast Open fields, for the connect programs that
        // may read it (CAP_PERFMON); all 0 when unknown, and then they are not loaded.
        let fast_open = opts
            .kernel_path
            .then(btf::running_kernel_fast_open_fields)
            .transpose();
        let fields = fast_open.as_ref().ok().copied().flatten();
        let globals = Globals {
            log_level,
            sockets,
            fast_open: fields,
        };
        let mut ebpf = load_object(object, opts, pins, &globals)?;
        let (kernel_path, kernel_connect) =
            load_connect_programs(&mut ebpf, opts, fast_open.map(|_| ()))?;
        let mptcp = match kernel_connect {
            None => Mptcp::Off,
            Some([PROG_CONNECT4_KERNEL_PERFMON, _]) => Mptcp::MptcpSock,
            Some(_) => Mptcp::NotsentLowat,
        };
        let steering = load_sk_lookup(&mut ebpf);
        let connect = kernel_connect.unwrap_or_else(|| kernel_path.connect_programs());
        let link_order = link_order(&ebpf, opts, connect[0]);
        let OpenedMaps {
            frontends,
            counters,
            heartbeat,
            relays,
            slots,
            slots_fd,
            sockets,
            sockets_id,
        } = OpenedMaps::take(&mut ebpf)?;
        warn_if_counters_short(&counters);
        let splice = splice::offer(&mut ebpf);
        // Every program is loaded: the ring buffer's descriptor can move to the reader.
        let events = runtime.and_then(|rt| EventsReader::start(&mut ebpf, &rt));
        let liveness = Liveness::new(heartbeat, opts.ttl, relays, opts.bypass_mark);
        let slots = Slots::new(slots, slots_fd, opts.slot_addrs.clone());
        let maps = Maps::new(
            frontends,
            counters,
            (sockets, sockets_id),
            opts.max_frontends,
        );
        let links = Links::new(Sys, pinning, link_order, maps.sockets_target()?, handover);
        let programs = Programs::new(ebpf, connect, (kernel_path, mptcp), steering, events);
        Ok(Datapath {
            programs,
            links,
            maps,
            liveness,
            slots,
            splice,
        })
    }

    /// Whether connections aimed at the relay's slots can reach its listeners: why
    /// not, when the sk_lookup program did not load.
    pub(crate) fn steering(&self) -> Result<(), &SteeringError> {
        self.programs.steering()
    }

    /// How the kernel path stands: off, unavailable (why), or on.
    pub(crate) fn kernel_path(&self) -> &KernelPath {
        self.programs.kernel_path()
    }

    /// How MPTCP subflows are told apart (`off` without the kernel path).
    pub(crate) fn mptcp(&self) -> Mptcp {
        self.programs.mptcp()
    }

    /// Where new connect links go among the other programs at the cgroup.
    pub(crate) fn link_order(&self) -> &LinkOrder {
        self.links.order()
    }

    /// Attaches the programs at `cgroup` (a cgroup v2 directory) through bpf_links,
    /// consumers first, adopting or replacing what an earlier agent pinned (see the
    /// lifecycle's executor). A new datapath's heartbeat is written first (its maps
    /// are empty: it acts from now on); an adopted one keeps its earlier agent's
    /// beat until this agent has applied what its source lists (see the agent's
    /// `report_datapath`), so frontends an earlier agent left are never revived, nor
    /// kept past its TTL, by an agent that cannot tell which still exist.
    pub(crate) fn attach(&mut self, cgroup: &Path) -> Result<&Attachment, DatapathError> {
        let heartbeat = self.liveness.heartbeat();
        self.links.attach(&mut self.programs, cgroup, || {
            if heartbeat.age().is_none()
                && let Err(e) = heartbeat.beat()
            {
                tracing::warn!(error = %e, "the first heartbeat could not be written");
            }
        })
    }

    /// Where the connect links are at the root's child cgroups: links those made
    /// since and forgets those removed (see `datapath::children`). How many of each.
    pub(crate) fn rescan_children(&mut self) -> (usize, usize) {
        self.links.rescan_children(&self.programs)
    }

    /// Where the programs are attached, if they are.
    pub(crate) fn attachment(&self) -> Option<&Attachment> {
        self.links.attachment()
    }

    /// Completes a hand-over once this agent's frontends are live (its first apply
    /// is done): its connect programs are swapped into the other layout's connect
    /// links in place, and that layout goes once the sockets it marked have their
    /// header. Whether there was one to complete.
    pub(crate) fn complete_handover(&mut self) -> bool {
        self.links.complete_handover(&self.programs)
    }

    /// Detaches the connect programs only (and after them the setsockopt program),
    /// and unpins them: from now on no connect is redirected or marked; sock_ops and
    /// sk_msg stay for the sockets already marked. Whether sock_ops is still
    /// attached: then the sockets map is worth waiting for
    /// ([`CountersReader::fill`]) before [`Datapath::detach`].
    pub(crate) fn detach_connect(&mut self) -> bool {
        self.links.detach_connect(&self.programs)
    }

    /// Removes the datapath: detaches every link and removes every pin (links,
    /// programs, maps), so nothing of hairpin stays in the kernel once this process
    /// exits. For an uninstall, and for a failed attach.
    pub(crate) fn uninstall(&mut self) {
        self.links.uninstall(&self.programs);
    }

    /// Kernel ids of the programs, their links and the maps, for `status` and `dump`.
    pub fn kernel_ids(&self) -> crate::status::KernelIds {
        let mut ids = match self.links.attachment() {
            Some(att) => att.kernel_ids(|name| self.programs.info(name)),
            None => crate::status::KernelIds::default(),
        };
        ids.counters_map_id = self.maps.counters_id();
        ids.frontends_map_id = self.maps.frontends_id();
        ids
    }

    /// Where the attached connect programs run among those at their cgroup, for
    /// `status`; `None` before attach.
    pub(crate) fn link_order_status(&self) -> Option<LinkOrderStatus> {
        let att = self.links.attachment()?;
        let own = |role: Role| Some(self.programs.info(att.program(role)?)?.id());
        Some(order::report(
            self.links.order(),
            &att.cgroup,
            own,
            &att.children(),
        ))
    }

    /// Whether the datapath is pinned: the directory, or why not.
    pub(crate) fn pin(&self) -> Pin {
        self.links.pinning().status()
    }

    /// Where the sockets map is pinned, when the datapath is.
    pub(crate) fn sockets_pin(&self) -> Option<PathBuf> {
        self.links.pinning().dir().map(|p| p.map(MAP_SOCKETS))
    }

    /// Hands the frontends map's one writer to its owner (in the agent, the
    /// reconciler), with the kernel path as it stands now: take it after
    /// [`Datapath::attach`], which may find the kernel path unavailable. `None` once
    /// taken.
    pub(crate) fn take_frontends(&mut self) -> Option<FrontendsMap> {
        self.maps.take_frontends(self.programs.kernel_path())
    }

    /// Kernel id of the sockets map, for `status` and `dump`.
    pub(crate) fn sockets_map_id(&self) -> Option<u32> {
        self.maps.sockets_id()
    }

    /// The per-CPU counters, summed.
    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        self.maps.counters()
    }

    /// A reader of the counters through this process's own descriptor of the map,
    /// for `/status` and `/metrics` (which may not open the map by id).
    pub fn counters_reader(&self) -> Result<CountersReader, DatapathError> {
        self.maps.counters_reader()
    }

    /// The heartbeat writer: the agent beats every [`BEAT_EVERY`](super::liveness::BEAT_EVERY).
    pub(crate) fn heartbeat(&self) -> Heartbeat {
        self.liveness.heartbeat().clone()
    }

    /// The relay's liveness registry.
    pub(crate) fn relay_liveness(&self) -> RelayLiveness {
        self.liveness.relays().clone()
    }

    /// Hands the slots map's one writer to its owner (the reconciler), with the
    /// slots an earlier agent bound; `avoid`: ports never to hand out. `None` once
    /// taken.
    pub(crate) fn take_slots(&mut self, avoid: Vec<u16>) -> Option<SlotTable> {
        self.slots.take(avoid)
    }

    /// A reader of the slots map for the relay's accept path.
    pub(crate) fn slots_reader(&self) -> Result<SlotsReader, DatapathError> {
        self.slots.reader()
    }

    /// Links the sk_lookup program to this process's network namespace, where the
    /// relay listens (see the loaded programs' `steer_slots`).
    pub(crate) fn steer_slots(&mut self) -> Result<(), DatapathError> {
        self.programs.steer_slots()
    }

    /// The relay's kernel splice, or why this datapath offers none.
    pub fn splice(&self) -> Result<Splice, Arc<SpliceError>> {
        self.splice.clone()
    }
}

/// Where this agent's connect links go: first where `opts` asks for it and the
/// kernel orders cgroup links, probed with the loaded connect4 program `connect4`.
fn link_order(ebpf: &Ebpf, opts: &LoadOptions, connect4: &'static str) -> LinkOrder {
    match opts.link_order {
        order::LinkOrderWanted::First => {}
        order::LinkOrderWanted::Append => return LinkOrder::Disabled,
        order::LinkOrderWanted::Children => {
            return LinkOrder::Unsupported(order::Unordered::Children);
        }
    }
    match ebpf.program(connect4).map(|p| p.fd()) {
        Some(Ok(fd)) => order::probe(fd.as_fd(), Role::Connect4.attach_type()),
        _ => LinkOrder::Unsupported(order::Unordered::NotLoaded(connect4)),
    }
}

/// The load-time values of the programs' globals that depend on this node and
/// this process, beside those [`LoadOptions`] gives.
struct Globals {
    /// aya-log's level: 0 (nothing written) without a runtime to read the events.
    log_level: u8,
    /// The sockets map's size (see [`sockets_capacity`]).
    sockets: u32,
    /// Where tcp_sock keeps its Fast Open fields, when known.
    fast_open: Option<btf::FastOpenFields>,
}

/// Loads `object` with its globals set and its maps sized, the shared maps reused
/// from (or pinned to) `pins`. No program is loaded into the kernel yet.
fn load_object(
    object: &[u8],
    opts: &LoadOptions,
    pins: Option<&PinDir>,
    globals: &Globals,
) -> Result<Ebpf, DatapathError> {
    let node4 = opts
        .node_ipv4
        .map_or(0, |ip| u32::from_ne_bytes(ip.octets()));
    let node6 = opts.node_ipv6.map_or([0; 4], |ip| {
        FrontendKey::new(SocketAddr::new(ip.into(), 0)).addr
    });
    // Past this fill, connects to kernel-path frontends go to the relay.
    let sockets_limit = hairpin_ebpf::sockets_limit(globals.sockets);
    let (req_off, connect_off, connect_mask) = globals
        .fast_open
        .map_or((0, 0, 0), |f| (f.req, f.connect_byte, f.connect_mask));
    let slots4 = slot_addrs4(&opts.slot_addrs.v4);
    let slots6 = slot_addrs6(&opts.slot_addrs.v6);
    let mesh_ports = mesh_ports_be(opts.mesh_ports);
    let mesh_cache = u32::from(opts.mesh_cache);
    let mut loader = EbpfLoader::new();
    loader
        // Not every object logs (must_exist false): it is aya-log's own global.
        .override_global(aya_log::LEVEL, &globals.log_level, false)
        .override_global(GLOBAL_BYPASS_MARK, &opts.bypass_mark, true)
        .override_global(GLOBAL_NODE_IP4, &node4, true)
        .override_global(GLOBAL_NODE_IP6, &node6, true)
        .override_global(GLOBAL_SOCKETS_LIMIT, &sockets_limit, true)
        .override_global(GLOBAL_FASTOPEN_REQ_OFF, &req_off, true)
        .override_global(GLOBAL_FASTOPEN_CONNECT_OFF, &connect_off, true)
        .override_global(GLOBAL_FASTOPEN_CONNECT_MASK, &connect_mask, true)
        .override_global(GLOBAL_SLOT_ADDRS4, &slots4, true)
        .override_global(GLOBAL_SLOT_ADDRS6, &slots6, true)
        .override_global(GLOBAL_MESH_PORTS, &mesh_ports, true)
        .override_global(GLOBAL_MESH_CACHE, &mesh_cache, true)
        .map_max_entries(MAP_FRONTENDS, opts.max_frontends)
        // Live slots and those in quarantine: twice the frontends.
        .map_max_entries(MAP_SLOTS, opts.max_frontends.saturating_mul(2))
        .map_max_entries(MAP_SOCKETS, globals.sockets);
    for map in [
        MAP_SPLICE,
        MAP_SPLICE_PEERS,
        MAP_SPLICE_CREDIT,
        MAP_SPLICE_SEEN,
    ] {
        loader.map_max_entries(map, opts.splice_sockets.max(1));
    }
    let map_pins: Vec<(&'static str, PathBuf)> = pins
        .map(|p| SHARED_MAPS.iter().map(|m| (*m, p.map(m))).collect())
        .unwrap_or_default();
    // Only a map that is what this object defines is adopted.
    adopt::refuse_foreign(object, &map_pins);
    for (name, path) in &map_pins {
        // An earlier agent's map of this layout is reused as it is (its entries,
        // counters, sockets and their storage); else made and pinned here.
        loader.map_pin_path(name, path.as_path());
    }
    loader.load(object).map_err(load_error)
}

/// Loads the connect programs: the kernel path's when asked for and this kernel
/// runs them (with the pair that loaded), else the relay path's, with why.
fn load_connect_programs(
    ebpf: &mut Ebpf,
    opts: &LoadOptions,
    fast_open_fields: Result<(), btf::BtfError>,
) -> Result<(KernelPath, Option<[&'static str; 2]>), DatapathError> {
    let (kernel_path, kernel_connect) = if opts.kernel_path {
        match kernel_path::load(ebpf, fast_open_fields) {
            Ok(connect) => (KernelPath::On, Some(connect)),
            Err(why) => {
                tracing::warn!(reason = %why, "the kernel path is unavailable on this kernel: every frontend takes the relay path");
                (KernelPath::Unavailable(Arc::new(why)), None)
            }
        }
    } else {
        (KernelPath::Off, None)
    };
    if !kernel_path.is_on() {
        for name in kernel_path.connect_programs() {
            program(ebpf, name, "load", Path::new(""))?
                .load()
                .map_err(program_error(name, "load", Path::new("")))?;
        }
    }
    Ok((kernel_path, kernel_connect))
}

/// Loads the relay's sk_lookup program (not attached yet: see
/// [`Datapath::steer_slots`]); why not, when it does not (Linux before 5.9).
fn load_sk_lookup(ebpf: &mut Ebpf) -> Result<(), SteeringError> {
    let program: &mut aya::programs::SkLookup = ebpf
        .program_mut(PROG_SK_LOOKUP)
        .ok_or(SteeringError::Missing)?
        .try_into()
        .map_err(SteeringError::Type)?;
    program.load().map_err(|e| {
        let why = SteeringError::Load(e);
        tracing::warn!(reason = %why, "the relay path is unavailable: connects to relayed frontends go as before hairpin");
        why
    })
}

// No Drop: a link this process made without pinning it goes when its descriptor
// closes with the process; a pinned datapath stays for the next agent, which is the
// point of pinning it ([`Datapath::remove`] takes it away on an uninstall).

/// One of our programs, as the connect-hook type.
pub(super) fn program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
    op: &'static str,
    cgroup: &Path,
) -> Result<&'a mut CgroupSockAddr, DatapathError> {
    ebpf.program_mut(name)
        .ok_or(DatapathError::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(program_error(name, op, cgroup))
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it so the load
/// does not fail there with a misleading EPERM. Newer kernels ignore it.
fn raise_memlock_limit() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
    if let Err(e) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        tracing::debug!(error = %e, "could not raise RLIMIT_MEMLOCK");
    }
}
