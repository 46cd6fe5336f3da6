//! The object and its load: the BPF object compiled into this binary, what to load
//! ([`LoadOptions`]), and [`Datapath::load_with`], which sets the programs' read-only
//! globals, sizes the maps, reuses the shared maps an earlier agent pinned, and loads
//! the programs into the kernel (the kernel path's when it can, else the relay path's).
//! Also the task that reads the programs' events into the agent's log.
//!
//! Owns the [`Datapath`] value and the loader's globals. Never attaches a program
//! (attach.rs), never writes a map entry (maps.rs, liveness.rs), and locks the pin
//! directory only through pin.rs.

use std::{
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsFd,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, SockHash},
    programs::CgroupSockAddr,
};
use hairpin_ebpf::{
    DEFAULT_MESH_PORTS, FrontendKey, GLOBAL_BYPASS_MARK, GLOBAL_FASTOPEN_CONNECT_MASK,
    GLOBAL_FASTOPEN_CONNECT_OFF, GLOBAL_FASTOPEN_REQ_OFF, GLOBAL_MESH_PORTS, GLOBAL_NODE_IP4,
    GLOBAL_NODE_IP6, GLOBAL_SLOT_ADDRS4, GLOBAL_SLOT_ADDRS6, GLOBAL_SOCKETS_LIMIT, MAP_FRONTENDS,
    MAP_SLOTS, MAP_SOCKETS, MAP_SPLICE, MAP_SPLICE_CREDIT, MAP_SPLICE_PEERS, MAP_SPLICE_SEEN,
    MAX_FRONTENDS, MAX_KERNEL_SOCKETS, MAX_SPLICE_SOCKETS, MESH_PORTS, PIN_LAYOUT,
    PROG_CONNECT4_KERNEL_PERFMON, PROG_SK_LOOKUP, Redirect, Slot, SlotKey, mesh_ports_be,
    slot_addrs4, slot_addrs6,
};

use super::adopt;
use super::error::{load_error, program_error};
use super::maps::{OpenedMaps, SHARED_MAPS, sockets_capacity, warn_if_counters_short};
use super::order::{self, LinkOrder};
use super::{
    Attachment, DEFAULT_TTL, DatapathError, Heartbeat, KernelPath, Pin, PinDir, RelayLiveness,
    SlotAddrs,
};
use super::{Role, btf, kernel_path};

#[cfg(hairpin_ebpf_embedded)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hairpin-ebpf.o"));

/// The BPF object compiled into this binary, if it was built with one.
pub fn embedded_object() -> Option<&'static [u8]> {
    #[cfg(hairpin_ebpf_embedded)]
    return Some(OBJECT);
    #[cfg(not(hairpin_ebpf_embedded))]
    None
}

/// What to load: the relay path's settings, and the kernel path's when asked for.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// SO_MARK of the relay's upstream sockets, which the connect programs skip.
    pub bypass_mark: u32,
    /// Capacity of the frontends map (preallocated).
    pub max_frontends: u32,
    /// Whether to try the kernel path.
    pub kernel_path: bool,
    /// Capacity of the sockets map (allocated as used): established sockets whose
    /// header is not out yet.
    pub max_kernel_sockets: u32,
    /// The node's IPv4 address: the header's source for a socket whose own address
    /// is loopback or the LB address (as the relay names host processes).
    pub node_ipv4: Option<Ipv4Addr>,
    /// The node's IPv6 address, likewise.
    pub node_ipv6: Option<Ipv6Addr>,
    /// Where links, programs and maps are pinned (on a bpf filesystem) so the
    /// datapath outlives this process; `None`: they go with it.
    pub pin_dir: Option<PathBuf>,
    /// The pin layout (`hairpin_ebpf::PIN_LAYOUT` but in tests of an upgrade).
    pub pin_layout: u32,
    /// Who the pin directory is handed to (`--pin-owner`); `None`: uid 0, 0700.
    pub pin_owner: Option<super::pin::PinOwner>,
    /// How long the connect programs act after the last heartbeat.
    pub ttl: Duration,
    /// The relay's slot addresses (the listen addresses), fixed in the object: the
    /// only addresses a connect is ever rewritten to.
    pub slot_addrs: SlotAddrs,
    /// Capacity of the relay's splice maps (two sockets per spliced connection).
    pub splice_sockets: u32,
    /// Whether the connect links go before every other program at the cgroup, where
    /// the kernel orders cgroup links (`false`: appended, as on a kernel that does
    /// not; `--link-order append`).
    pub link_first: bool,
    /// The outbound capture ports of mesh proxies the kernel-path connect programs
    /// look for in the client's network namespace (host byte order; 0: unused).
    pub mesh_ports: [u16; MESH_PORTS],
}

impl LoadOptions {
    /// The relay path only, with `bypass_mark` and room for [`MAX_FRONTENDS`].
    pub fn relay(bypass_mark: u32) -> LoadOptions {
        LoadOptions {
            bypass_mark,
            max_frontends: MAX_FRONTENDS,
            kernel_path: false,
            max_kernel_sockets: MAX_KERNEL_SOCKETS,
            node_ipv4: None,
            node_ipv6: None,
            pin_dir: None,
            pin_layout: PIN_LAYOUT,
            pin_owner: None,
            ttl: DEFAULT_TTL,
            slot_addrs: SlotAddrs::default(),
            splice_sockets: MAX_SPLICE_SOCKETS,
            link_first: true,
            mesh_ports: DEFAULT_MESH_PORTS,
        }
    }
}

/// The loaded programs and their maps.
pub struct Datapath {
    pub(super) ebpf: Ebpf,
    /// The frontends map, until its one writer is taken ([`Datapath::take_frontends`]).
    pub(super) frontends: Option<HashMap<MapData, FrontendKey, Redirect>>,
    /// Its kernel id, for `status` and `dump`.
    pub(super) frontends_id: Option<u32>,
    pub(super) counters: PerCpuArray<MapData, u64>,
    pub(super) sockets: SockHash<MapData, u64>,
    pub(super) heartbeat: Heartbeat,
    pub(super) relays: RelayLiveness,
    /// The slots map, until its one writer is taken ([`Datapath::take_slots`]).
    pub(super) slots: Option<HashMap<MapData, SlotKey, Slot>>,
    /// The slots map's descriptor, for the relay's reader.
    pub(super) slots_fd: std::os::fd::OwnedFd,
    /// The slot addresses the object was loaded with.
    pub(super) slot_addrs: SlotAddrs,
    /// Why the relay's sk_lookup program did not load, if it did not: then no
    /// connection reaches a slot, and the relay path is down on this node.
    pub(super) steering: Result<(), String>,
    pub(super) sockets_id: Option<u32>,
    /// The connect programs loaded: the marking ones when the kernel path loaded.
    pub(super) connect: [&'static str; 2],
    pub(super) attachment: Option<Attachment>,
    pub(super) capacity: u32,
    pub(super) kernel_path: KernelPath,
    /// The locked pin directory, when the datapath is pinned.
    pub(super) pins: Option<PinDir>,
    /// Whether it is pinned: the directory, or why not.
    pub(super) pin: Pin,
    /// How MPTCP subflows are told apart at connect.
    pub(super) mptcp: Mptcp,
    /// The relay's kernel splice, or why there is none.
    pub(super) splice: Result<super::splice::Splice, String>,
    /// Where new connect links go among the other programs at the cgroup.
    pub(super) link_order: LinkOrder,
    /// Another layout's live datapath being handed over, until this agent's
    /// frontends are live (see `lifecycle::takeover`).
    pub(super) handover: Option<super::lifecycle::Handover>,
    /// Reads the programs' aya-log events into the agent's log while it lives.
    _events: Option<EventsReader>,
}

pub use crate::status::MptcpDetection as Mptcp;

impl Datapath {
    /// Loads `object` with the bypass mark set, and both programs into the kernel
    /// (not yet attached), with room for [`MAX_FRONTENDS`] frontends.
    pub fn load(object: &[u8], bypass_mark: u32) -> Result<Datapath, DatapathError> {
        Datapath::load_with(object, &LoadOptions::relay(bypass_mark), None, Pin::Off)
    }

    /// As [`Datapath::load`], with the frontends map sized for `max_frontends`
    /// entries (the kernel preallocates them).
    pub fn load_with_capacity(
        object: &[u8],
        bypass_mark: u32,
        max_frontends: u32,
    ) -> Result<Datapath, DatapathError> {
        Datapath::load_with(
            object,
            &LoadOptions {
                max_frontends,
                ..LoadOptions::relay(bypass_mark)
            },
            None,
            Pin::Off,
        )
    }

    /// Loads `object` as `opts` say, pinned in `pins` (locked by the lifecycle,
    /// which decided `pin`; see [`super::lifecycle::start`]): the shared maps are the
    /// pinned ones when an earlier agent left them (created and pinned otherwise).
    /// The kernel path's programs are tried first when asked for; when this kernel
    /// cannot run them the relay path's connect programs load instead and
    /// [`Datapath::kernel_path`] says why. Nothing is attached yet.
    pub(super) fn load_with(
        object: &[u8],
        opts: &LoadOptions,
        pins: Option<PinDir>,
        pin: Pin,
    ) -> Result<Datapath, DatapathError> {
        raise_memlock_limit();
        let sockets = sockets_capacity(pins.as_ref(), opts);
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
        let mut ebpf = load_object(object, opts, pins.as_ref(), &globals)?;
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
        let maps = OpenedMaps::take(&mut ebpf)?;
        warn_if_counters_short(&maps.counters);
        let splice = super::splice::offer(&mut ebpf);
        // Every program is loaded: the ring buffer's descriptor can move to the reader.
        let events = runtime.and_then(|rt| EventsReader::start(&mut ebpf, &rt));
        Ok(Datapath {
            ebpf,
            frontends_id: aya::maps::IterableMap::map(&maps.frontends)
                .info()
                .ok()
                .map(|i| i.id()),
            frontends: Some(maps.frontends),
            counters: maps.counters,
            sockets: maps.sockets,
            heartbeat: Heartbeat {
                map: Arc::new(std::sync::Mutex::new(maps.heartbeat)),
                ttl: opts.ttl,
            },
            relays: RelayLiveness {
                map: Arc::new(std::sync::Mutex::new(maps.relays)),
                mark: opts.bypass_mark,
            },
            slots_fd: maps.slots_fd,
            slots: Some(maps.slots),
            slot_addrs: opts.slot_addrs.clone(),
            steering,
            sockets_id: maps.sockets_id,
            connect,
            attachment: None,
            capacity: opts.max_frontends,
            kernel_path,
            pins,
            pin,
            mptcp,
            splice,
            link_order,
            handover: None,
            _events: events,
        })
    }

    /// Whether connections aimed at the relay's slots can reach its listeners: why
    /// not, when the sk_lookup program did not load.
    pub fn steering(&self) -> Result<(), &str> {
        self.steering.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// How the kernel path stands: off, unavailable (why), or on.
    pub fn kernel_path(&self) -> &KernelPath {
        &self.kernel_path
    }

    /// How MPTCP subflows are told apart (`off` without the kernel path).
    pub fn mptcp(&self) -> Mptcp {
        self.mptcp
    }

    /// Where new connect links go among the other programs at the cgroup.
    pub fn link_order(&self) -> &LinkOrder {
        &self.link_order
    }
}

/// Where this agent's connect links go: first where `opts` asks for it and the
/// kernel orders cgroup links, probed with the loaded connect4 program `connect4`.
fn link_order(ebpf: &Ebpf, opts: &LoadOptions, connect4: &'static str) -> LinkOrder {
    if !opts.link_first {
        return LinkOrder::Disabled;
    }
    match ebpf.program(connect4).map(|p| p.fd()) {
        Some(Ok(fd)) => order::probe(fd.as_fd(), Role::Connect4.attach_type()),
        _ => LinkOrder::Unsupported(format!(
            "{connect4} is not loaded: the probe of cgroup link ordering could not run"
        )),
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
                let kind = why.kind();
                (
                    KernelPath::Unavailable {
                        kind,
                        why: why.to_string(),
                    },
                    None,
                )
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
fn load_sk_lookup(ebpf: &mut Ebpf) -> Result<(), String> {
    let program: &mut aya::programs::SkLookup = ebpf
        .program_mut(PROG_SK_LOOKUP)
        .ok_or_else(|| format!("the eBPF object has no program {PROG_SK_LOOKUP}"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    program.load().map_err(|e| {
        let why = format!("{PROG_SK_LOOKUP} did not load (sk_lookup programs need Linux 5.9): {e}");
        tracing::warn!(reason = %why, "the relay path is unavailable: connects to relayed frontends go as before hairpin");
        why
    })
}

// No Drop: a link this process made without pinning it goes when its descriptor
// closes with the process; a pinned datapath stays for the next agent, which is the
// point of pinning it ([`Datapath::remove`] takes it away on an uninstall).

/// aya-log's level for the programs' events: the most verbose level the agent's
/// `--log` filter lets through for any target (0: none). It is a read-only global of
/// the object, so the verifier drops the events below it; finer per-target filtering
/// (`hairpin_ebpf=debug`) happens in the subscriber, as for the agent's own events.
fn events_level() -> u8 {
    use aya_log::Level;
    let level = match tracing::level_filters::LevelFilter::current().into_level() {
        None => return 0,
        Some(tracing::Level::ERROR) => Level::Error,
        Some(tracing::Level::WARN) => Level::Warn,
        Some(tracing::Level::INFO) => Level::Info,
        Some(tracing::Level::DEBUG) => Level::Debug,
        Some(_) => Level::Trace,
    };
    level.into()
}

/// The task reading the programs' aya-log ring buffer into the agent's log (through
/// the `log` crate, which the subscriber bridges to tracing); aborted on drop.
struct EventsReader(tokio::task::AbortHandle);

impl EventsReader {
    /// Takes the ring buffer out of `ebpf` and reads it on `rt`; None (and a debug
    /// line) when it cannot, which the datapath does without.
    fn start(ebpf: &mut Ebpf, rt: &tokio::runtime::Handle) -> Option<EventsReader> {
        let logger = match aya_log::EbpfLogger::init(ebpf) {
            Ok(logger) => logger,
            Err(e) => {
                tracing::debug!(error = %e, "the programs' events are not read (aya-log)");
                return None;
            }
        };
        let _entered = rt.enter();
        // SAFETY: the logger owns the ring buffer's descriptor and keeps it, open
        // and the same, for as long as it lives, which is as long as the AsyncFd.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        };
        let mut fd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                tracing::debug!(error = %e, "the programs' events are not read (aya-log)");
                return None;
            }
        };
        let task = rt.spawn(async move {
            loop {
                let Ok(mut ready) = fd.readable_mut().await else {
                    return;
                };
                ready.get_inner_mut().flush();
                ready.clear_ready();
            }
        });
        Some(EventsReader(task.abort_handle()))
    }
}

impl Drop for EventsReader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

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
