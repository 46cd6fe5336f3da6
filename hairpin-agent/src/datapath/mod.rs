//! The kernel side's edge: loading the embedded object, linking connect4/connect6
//! at a cgroup v2 directory through bpf_links, writing the frontend map, the
//! heartbeat and the relay's liveness map.
//!
//! With the kernel path on (and loadable), a sock_ops program is linked beside them
//! and an sk_msg program on the sockets map, and the connect programs that mark
//! sockets replace the plain ones; see [`KernelPath`]. With a pin directory, links,
//! programs and maps are pinned ([`pin`]) and outlive the agent: the next agent
//! adopts them and swaps its programs in place. The connect programs act only
//! while the heartbeat is younger than its TTL and send to a relay listener only
//! while it listens, so a dead agent's datapath never breaks traffic.

mod btf;
pub mod cgroup;
mod error;
pub mod kernel_objects;
mod kernel_path;
pub mod pin;
mod sys;

pub use cgroup::find_cgroup2_root;
pub use error::{DatapathError, Denial, classify_denial};
use error::{is_full, load_error, map_error, program_error};
pub use kernel_path::{
    Fill, KernelPath, describe as describe_value, drain_kernel_sockets, read_frontend_paths,
};
pub use pin::{PinDir, Role};

use std::{
    fmt,
    fs::File,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, SockHash},
    programs::CgroupSockAddr,
};
use hairpin_ebpf::{
    Counter, FrontendKey, GLOBAL_BYPASS_MARK, GLOBAL_FASTOPEN_CONNECT_MASK,
    GLOBAL_FASTOPEN_CONNECT_OFF, GLOBAL_FASTOPEN_REQ_OFF, GLOBAL_NODE_IP4, GLOBAL_NODE_IP6,
    GLOBAL_SOCKETS_LIMIT, HEARTBEAT_BEAT, HEARTBEAT_TTL, MAP_COUNTERS, MAP_FASTOPEN, MAP_FRONTENDS,
    MAP_HEARTBEAT, MAP_PENDING, MAP_RELAYS, MAP_SOCKETS, MAP_SOCKETS_FILL, MAX_FRONTENDS,
    MAX_KERNEL_SOCKETS, PIN_LAYOUT, PROG_CONNECT4_KERNEL_PERFMON, PROG_SETSOCKOPT, PROG_SK_MSG,
    PROG_SOCK_OPS, Redirect,
};

use crate::model::{FirstSpeaker, PathChoice, ProxyVersion};

#[cfg(hairpin_ebpf_embedded)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hairpin-ebpf.o"));

/// The BPF object compiled into this binary, if it was built with one.
pub fn embedded_object() -> Option<&'static [u8]> {
    #[cfg(hairpin_ebpf_embedded)]
    return Some(OBJECT);
    #[cfg(not(hairpin_ebpf_embedded))]
    None
}

/// Where the programs are attached, and through which links.
#[derive(Debug)]
pub struct Attachment {
    /// The cgroup v2 directory.
    pub cgroup: PathBuf,
    links: Vec<Link>,
    /// What became of the links found pinned at start: adopted (swapped in place)
    /// or not, per hook.
    pub adopted: Vec<(&'static str, Adoption)>,
}

/// One hook's bpf_link.
#[derive(Debug)]
struct Link {
    role: Role,
    /// The program it runs (ELF name).
    program: &'static str,
    /// The link (None: sk_msg attached to the map the old way).
    fd: Option<OwnedFd>,
    /// The link's id, for `status`.
    id: Option<u32>,
}

/// What the agent did with a hook's link at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// None was pinned: a new link was made.
    New,
    /// A pinned link ran an earlier agent's program: swapped for this agent's in
    /// place (`BPF_LINK_UPDATE`), so the hook was never without a program.
    Swapped,
    /// A pinned link was not what this hook needs (why): a new link was made and
    /// the old one detached after it.
    Replaced(String),
}

impl fmt::Display for Adoption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Adoption::New => f.write_str("new"),
            Adoption::Swapped => f.write_str("swapped"),
            Adoption::Replaced(why) => write!(f, "replaced: {why}"),
        }
    }
}

/// Whether the datapath outlives the agent (see [`pin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// No pin directory: the links and maps are the process's own and go with it.
    Off,
    /// Pinned here: links and maps outlive the process.
    Pinned(PathBuf),
    /// Pinning failed, and why: the datapath is the process's own.
    Failed(String),
}

/// Default of `--datapath-ttl`: how long the connect programs act after the last
/// heartbeat; long enough for an upgrade that pulls an image.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);

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
    /// How long the connect programs act after the last heartbeat.
    pub ttl: Duration,
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
            ttl: DEFAULT_TTL,
        }
    }
}

/// The loaded programs and their maps.
pub struct Datapath {
    ebpf: Ebpf,
    frontends: HashMap<MapData, FrontendKey, Redirect>,
    counters: PerCpuArray<MapData, u64>,
    sockets: SockHash<MapData, u64>,
    heartbeat: Heartbeat,
    relays: RelayLiveness,
    sockets_id: Option<u32>,
    /// The connect programs loaded: the marking ones when the kernel path loaded.
    connect: [&'static str; 2],
    attachment: Option<Attachment>,
    capacity: u32,
    kernel_path: KernelPath,
    /// The locked pin directory, when the datapath is pinned.
    pins: Option<PinDir>,
    /// Whether it is pinned: the directory, or why not.
    pin: Pin,
    /// How MPTCP subflows are told apart at connect.
    mptcp: Mptcp,
    /// Reads the programs' aya-log events into the agent's log while it lives.
    _events: Option<EventsReader>,
}

pub use crate::status::MptcpDetection as Mptcp;

/// The maps every agent shares through the pin directory, by ELF name.
const SHARED_MAPS: [&str; 8] = [
    MAP_FRONTENDS,
    MAP_COUNTERS,
    MAP_SOCKETS,
    MAP_SOCKETS_FILL,
    MAP_PENDING,
    MAP_FASTOPEN,
    MAP_HEARTBEAT,
    MAP_RELAYS,
];

impl Datapath {
    /// Loads `object` with the bypass mark set, and both programs into the kernel
    /// (not yet attached), with room for [`MAX_FRONTENDS`] frontends.
    pub fn load(object: &[u8], bypass_mark: u32) -> Result<Datapath, DatapathError> {
        Datapath::load_with(object, &LoadOptions::relay(bypass_mark))
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
        )
    }

    /// Loads `object` as `opts` say. With a pin directory it is locked first
    /// ([`DatapathError::Busy`] while another agent holds it) and the shared maps are
    /// the pinned ones when an earlier agent left them (created and pinned
    /// otherwise). The kernel path's programs are tried first when asked for; when
    /// this kernel cannot run them the relay path's connect programs load instead and
    /// [`Datapath::kernel_path`] says why. Nothing is attached yet.
    pub fn load_with(object: &[u8], opts: &LoadOptions) -> Result<Datapath, DatapathError> {
        raise_memlock_limit();
        let (pins, pin) = lock_pins(opts)?;
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
        let maps = OpenedMaps::take(&mut ebpf)?;
        // Every program is loaded: the ring buffer's descriptor can move to the reader.
        let events = runtime.and_then(|rt| EventsReader::start(&mut ebpf, &rt));
        Ok(Datapath {
            ebpf,
            frontends: maps.frontends,
            counters: maps.counters,
            sockets: maps.sockets,
            heartbeat: Heartbeat {
                map: Arc::new(std::sync::Mutex::new(maps.heartbeat)),
                ttl: opts.ttl,
            },
            relays: RelayLiveness(Arc::new(std::sync::Mutex::new(maps.relays))),
            sockets_id: maps.sockets_id,
            connect: kernel_connect.unwrap_or_else(|| kernel_path.connect_programs()),
            attachment: None,
            capacity: opts.max_frontends,
            kernel_path,
            pins,
            pin,
            mptcp,
            _events: events,
        })
    }

    /// How the kernel path stands: off, unavailable (why), or on.
    pub fn kernel_path(&self) -> &KernelPath {
        &self.kernel_path
    }

    /// How MPTCP subflows are told apart (`off` without the kernel path).
    pub fn mptcp(&self) -> Mptcp {
        self.mptcp
    }

    /// The hooks this agent links, consumers first, with the program each runs.
    fn wanted(&self) -> Vec<(Role, &'static str)> {
        let mut wanted = Vec::new();
        if self.kernel_path.is_on() {
            wanted.push((Role::SkMsg, PROG_SK_MSG));
            wanted.push((Role::SockOps, PROG_SOCK_OPS));
            wanted.push((Role::SetSockopt, PROG_SETSOCKOPT));
        }
        wanted.push((Role::Connect4, self.connect[0]));
        wanted.push((Role::Connect6, self.connect[1]));
        wanted
    }

    /// Attaches the programs at `cgroup` (a cgroup v2 directory) through bpf_links,
    /// beside whatever else is attached there (links never replace another's
    /// program), consumers first: sk_msg on the sockets map, sock_ops, setsockopt,
    /// then connect4 and connect6, so every socket marked has the programs that
    /// finish its header behind it. The heartbeat is written first.
    ///
    /// Pinned, each hook's link left by an earlier agent is adopted: its attach type
    /// and target are checked (the kernel checks neither on update), and its program
    /// is swapped for this agent's in place, compare-and-swap against the pinned
    /// program it runs; the hook never runs without a program. A link that is not
    /// what the hook needs is replaced (the new one first, then the old detached).
    /// Links of the kernel path that this agent does not want (the kernel path off
    /// now) are detached after the connect programs were swapped.
    pub fn attach(&mut self, cgroup: &Path) -> Result<&Attachment, DatapathError> {
        let dir = File::open(cgroup).map_err(|source| DatapathError::Cgroup {
            path: cgroup.to_path_buf(),
            source,
        })?;
        let cgroup_id = sys::cgroup_id(&dir).map_err(|source| DatapathError::Cgroup {
            path: cgroup.to_path_buf(),
            source,
        })?;
        // Live before any program of this agent's runs: a new datapath, or one
        // whose earlier agent has been gone past the TTL, acts from now on.
        if let Err(e) = self.heartbeat.beat() {
            tracing::warn!(error = %e, "the first heartbeat could not be written");
        }
        let mut links: Vec<Link> = Vec::new();
        let mut adopted = Vec::new();
        let wanted = self.wanted();
        for (role, name) in wanted {
            if role.kernel_path_only() && !self.kernel_path.is_on() {
                continue;
            }
            match self.link(role, name, &dir, cgroup_id, cgroup) {
                Ok((link, how)) => {
                    adopted.push((role.name(), how));
                    links.push(link);
                }
                Err(e) if role.kernel_path_only() => {
                    // The marking connect programs stay: with the kernel path off, no
                    // entry asks them to mark, and they redirect as the plain ones.
                    // What of it was linked goes again.
                    tracing::warn!(error = %e, "the kernel path is unavailable: every frontend takes the relay path");
                    self.kernel_path = KernelPath::Unavailable(e.to_string());
                    self.mptcp = Mptcp::Off;
                    let linked: Vec<Role> = links.iter().map(|l| l.role).collect();
                    self.attachment = Some(Attachment {
                        cgroup: cgroup.to_path_buf(),
                        links: std::mem::take(&mut links),
                        adopted: Vec::new(),
                    });
                    self.detach_roles(&linked);
                    self.attachment = None;
                    adopted.clear();
                }
                // The links made here without a pin go as `links` drops; pinned ones,
                // adopted or new, stay as they are: an earlier agent's programs or
                // this one's, on the same maps, serve until the TTL (fail open).
                Err(e) => return Err(e),
            }
        }
        if let Some(pins) = &self.pins {
            // Hooks an earlier agent linked that this one does not use.
            for role in Role::ALL {
                if links.iter().any(|l: &Link| l.role == role) {
                    continue;
                }
                let path = pins.link(role);
                if let Ok(fd) = sys::open_pinned(&path) {
                    match sys::link_detach(fd.as_fd()) {
                        Ok(()) => tracing::info!(
                            hook = role.name(),
                            "an earlier agent's link this agent does not use: detached"
                        ),
                        Err(e) => {
                            tracing::warn!(hook = role.name(), error = %e, "an earlier agent's unused link could not be detached")
                        }
                    }
                    let _ = pin::unpin(&path);
                    let _ = pin::unpin(&pins.prog(role));
                }
            }
        }
        for (hook, how) in &adopted {
            match how {
                Adoption::New => tracing::debug!(hook, "linked"),
                Adoption::Swapped => {
                    tracing::info!(hook, "adopted the pinned link: program swapped in place")
                }
                Adoption::Replaced(why) => {
                    tracing::warn!(hook, reason = %why, "the pinned link was replaced")
                }
            }
        }
        self.attachment = Some(Attachment {
            cgroup: cgroup.to_path_buf(),
            links,
            adopted,
        });
        Ok(self
            .attachment
            .as_ref()
            .expect("the attachment was recorded just above"))
    }

    /// Links `name` at the hook `role`: adopts the pinned link when there is one of
    /// the right kind, else makes one (and pins it, when pinning).
    fn link(
        &mut self,
        role: Role,
        name: &'static str,
        dir: &File,
        cgroup_id: u64,
        cgroup: &Path,
    ) -> Result<(Link, Adoption), DatapathError> {
        let error = |op: &'static str| link_error(role, cgroup, op);
        let prog = self
            .ebpf
            .program(name)
            .ok_or(DatapathError::Missing {
                kind: "program",
                name,
            })?
            .fd()
            .map_err(program_error(name, "attach", cgroup))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(error("read"))?;
        let (target, target_id) = if role == Role::SkMsg {
            let fd = self
                .sockets
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(error("read"))?;
            (fd, u64::from(self.sockets_id.unwrap_or(0)))
        } else {
            (
                dir.as_fd().try_clone_to_owned().map_err(error("read"))?,
                cgroup_id,
            )
        };
        let Some(pins) = &self.pins else {
            let fd = self.create_link(role, &prog, &target, error("create"))?;
            return Ok((link_of(role, name, fd), Adoption::New));
        };
        let (link_pin, prog_pin) = (pins.link(role), pins.prog(role));
        let (how, stale) = match adopt_pinned(role, &link_pin, &prog_pin, &prog, target_id, cgroup)?
        {
            Pinned::Absent => (Adoption::New, None),
            Pinned::Swapped(link) => {
                repin(&prog_pin, &prog).map_err(error("pin"))?;
                return Ok((link_of(role, name, Some(link)), Adoption::Swapped));
            }
            Pinned::Stale { why, link } => (Adoption::Replaced(why), Some(link)),
        };
        let fd = self.create_link(role, &prog, &target, error("create"))?;
        if let Some(fd) = &fd {
            let _ = pin::unpin(&link_pin);
            sys::pin(fd.as_fd(), &link_pin).map_err(error("pin"))?;
        }
        repin(&prog_pin, &prog).map_err(error("pin"))?;
        if let Some(old) = stale {
            // After the new link: the hook was never without a program.
            if let Err(e) = sys::link_detach(old.as_fd()) {
                tracing::debug!(hook = role.name(), error = %e, "the replaced link could not be detached (already gone)");
            }
        }
        Ok((link_of(role, name, fd), how))
    }

    /// A new link of `prog` at `target`; sk_msg falls back to the map attachment on
    /// kernels without sockmap links (before 6.10), which lasts as long as the map:
    /// `None` then.
    fn create_link(
        &self,
        role: Role,
        prog: &OwnedFd,
        target: &OwnedFd,
        error: impl FnOnce(std::io::Error) -> DatapathError,
    ) -> Result<Option<OwnedFd>, DatapathError> {
        match sys::link_create(prog.as_fd(), target.as_fd(), role.attach_type()) {
            Ok(fd) => Ok(Some(fd)),
            Err(e)
                if role == Role::SkMsg
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
                    ) =>
            {
                tracing::debug!(error = %e, "no sockmap links on this kernel: sk_msg attaches to the map");
                sys::map_attach(prog.as_fd(), target.as_fd(), role.attach_type())
                    .map(|()| None)
                    .map_err(error)
            }
            Err(e) => Err(error(e)),
        }
    }

    /// Whether the datapath is pinned: the directory, or why not.
    pub fn pin(&self) -> &Pin {
        &self.pin
    }

    /// Where the sockets map is pinned, when the datapath is.
    pub fn sockets_pin(&self) -> Option<PathBuf> {
        self.pins.as_ref().map(|p| p.map(MAP_SOCKETS))
    }

    /// The heartbeat writer: the agent beats every second (see [`Heartbeat`]).
    pub fn heartbeat(&self) -> Heartbeat {
        self.heartbeat.clone()
    }

    /// The relay's liveness registry (see [`RelayLiveness`]).
    pub fn relay_liveness(&self) -> RelayLiveness {
        self.relays.clone()
    }

    /// Registers the relay listener `fd` listening on `addr` (tests that stand in
    /// for the relay with a listener of their own use this).
    pub fn register_listener(
        &self,
        addr: SocketAddr,
        fd: BorrowedFd<'_>,
    ) -> Result<(), DatapathError> {
        self.relays.register(addr, fd)
    }

    /// Detaches the connect programs only (and after them the setsockopt program,
    /// which serves only them), and unpins them: from now on no connect is
    /// redirected or marked. sock_ops stays, so sockets already marked still enter
    /// the sockets map at their handshake and leave it at their first RTT sample (or
    /// close), and sk_msg stays on the map, so they still get their header. Whether
    /// sock_ops is still attached: then the sockets map is worth waiting for
    /// ([`CountersReader::fill`]) before [`Datapath::detach`].
    pub fn detach_connect(&mut self) -> bool {
        self.detach_roles(&[Role::Connect4, Role::Connect6, Role::SetSockopt]);
        self.attachment
            .as_ref()
            .is_some_and(|a| a.links.iter().any(|l| l.role == Role::SockOps))
    }

    /// Detaches whatever is still attached: the connect programs, then sock_ops and
    /// sk_msg, and unpins their links.
    pub fn detach(&mut self) {
        self.detach_roles(&[Role::Connect4, Role::Connect6, Role::SetSockopt]);
        self.detach_roles(&[Role::SockOps, Role::SkMsg]);
        self.attachment = None;
    }

    fn detach_roles(&mut self, roles: &[Role]) {
        let Some(att) = self.attachment.as_mut() else {
            return;
        };
        let (gone, kept): (Vec<Link>, Vec<Link>) = std::mem::take(&mut att.links)
            .into_iter()
            .partition(|l| roles.contains(&l.role));
        att.links = kept;
        for l in gone {
            let detached = match &l.fd {
                Some(fd) => sys::link_detach(fd.as_fd()),
                None => self
                    .ebpf
                    .program(l.program)
                    .and_then(|p| p.fd().ok())
                    .map_or(Ok(()), |p| {
                        sys::map_detach(p.as_fd(), self.sockets.fd().as_fd(), l.role.attach_type())
                    }),
            };
            if let Err(e) = detached {
                tracing::warn!(hook = l.role.name(), error = %e, "detach failed");
            }
            if let Some(pins) = &self.pins {
                let _ = pin::unpin(&pins.link(l.role));
                let _ = pin::unpin(&pins.prog(l.role));
            }
        }
    }

    /// Removes the datapath: detaches every link and removes every pin (links,
    /// programs, maps), so nothing of hairpin stays in the kernel once this process
    /// exits. For an uninstall, and for a failed attach.
    pub fn uninstall(&mut self) {
        self.detach();
        if let Some(pins) = &self.pins {
            for r in pin::remove_all(pins.root()) {
                if let Err(e) = r.result {
                    tracing::warn!(kind = r.kind, pin = %r.path.display(), error = %e, "could not remove");
                }
            }
        }
    }

    /// Where the programs are attached, if they are.
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Kernel ids of the programs, their links and the maps, for `status` and `dump`.
    pub fn kernel_ids(&self) -> crate::status::KernelIds {
        use aya::maps::IterableMap;
        let mut ids = crate::status::KernelIds::default();
        if let Some(att) = &self.attachment {
            // The connect programs first, as `status` has always listed them.
            let (connect, rest): (Vec<&Link>, Vec<&Link>) = att
                .links
                .iter()
                .partition(|l| matches!(l.role, Role::Connect4 | Role::Connect6));
            let order = |r: Role| match r {
                Role::SockOps => 0,
                Role::SetSockopt => 1,
                _ => 2,
            };
            let mut rest = rest;
            rest.sort_by_key(|l| order(l.role));
            for l in connect.into_iter().chain(rest) {
                let Some(info) = self.ebpf.program(l.program).and_then(|p| p.info().ok()) else {
                    continue;
                };
                ids.programs.push(crate::status::ProgramIds {
                    name: l.program.to_string(),
                    program_id: info.id(),
                    link_ids: l.id.into_iter().collect(),
                    map_ids: info.map_ids().ok().flatten().unwrap_or_default(),
                });
            }
        }
        ids.counters_map_id = self.counters.map().info().ok().map(|i| i.id());
        ids.frontends_map_id = self.frontends.map().info().ok().map(|i| i.id());
        ids
    }

    /// Redirects connects to `frontend` to `listener` (the relay path, whatever the
    /// kernel path's state).
    pub fn insert(
        &mut self,
        frontend: SocketAddr,
        listener: SocketAddr,
    ) -> Result<(), DatapathError> {
        self.insert_value(frontend, listener, Redirect::new(listener))
    }

    /// As [`Datapath::insert`] for a frontend whose ingress expects `version`
    /// headers: with the kernel path on, a client that speaks `first` and `path`
    /// `auto`, the kernel writes them on the client's own socket and the listener is
    /// the fallback; otherwise (off, unavailable, a server that speaks first, or the
    /// relay asked for) its relay writes them. Whether the entry gives the kernel path.
    pub fn insert_frontend(
        &mut self,
        frontend: SocketAddr,
        listener: SocketAddr,
        version: ProxyVersion,
        first: FirstSpeaker,
        path: PathChoice,
    ) -> Result<bool, DatapathError> {
        let value = self.kernel_path.value(listener, version, first, path);
        self.insert_value(frontend, listener, value)?;
        Ok(value.is_kernel())
    }

    fn insert_value(
        &mut self,
        frontend: SocketAddr,
        listener: SocketAddr,
        value: Redirect,
    ) -> Result<(), DatapathError> {
        if frontend.is_ipv4() != listener.is_ipv4() {
            return Err(DatapathError::FamilyMismatch { frontend, listener });
        }
        match self.frontends.insert(FrontendKey::new(frontend), value, 0) {
            Ok(()) => Ok(()),
            Err(e) if is_full(&e) => Err(DatapathError::MapFull {
                frontend,
                capacity: self.capacity,
            }),
            Err(e) => Err(map_error("insert", MAP_FRONTENDS, frontend.to_string())(e)),
        }
    }

    /// Removes every entry of the frontends map but those of `live`: what an earlier
    /// agent left for frontends that are gone. Logged per entry.
    pub fn retain_frontends(&mut self, live: &std::collections::BTreeSet<SocketAddr>) {
        let stale: Vec<FrontendKey> = self
            .frontends
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !live.contains(&k.socket_addr()))
            .collect();
        for k in stale {
            match self.frontends.remove(&k) {
                Ok(()) => {
                    tracing::info!(frontend = %k.socket_addr(), "an earlier agent's frontend that is gone: removed from the map")
                }
                Err(e) => {
                    tracing::warn!(frontend = %k.socket_addr(), error = %e, "an earlier agent's stale frontend could not be removed")
                }
            }
        }
    }

    /// Stops redirecting connects to `frontend`.
    pub fn remove(&mut self, frontend: SocketAddr) -> Result<(), DatapathError> {
        match self.frontends.remove(&FrontendKey::new(frontend)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(map_error("remove", MAP_FRONTENDS, frontend.to_string())(
                source,
            )),
        }
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

/// The error of linking `role` at `cgroup` when `op` fails.
fn link_error(
    role: Role,
    cgroup: &Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> DatapathError {
    let cgroup = cgroup.to_path_buf();
    move |source| DatapathError::Link {
        op,
        role: role.name(),
        cgroup,
        source,
    }
}

/// What was pinned at a hook's link pin, and what became of it.
enum Pinned {
    /// Nothing: a new link is made.
    Absent,
    /// This hook's link, now running the new program.
    Swapped(OwnedFd),
    /// A link that cannot be adopted (why): replaced, and detached once the new
    /// one is in place.
    Stale { why: String, link: OwnedFd },
}

/// Swaps `prog` into the link pinned at `link_pin` when it is this hook's link (its
/// type, attach type and target), compare-and-swap against the program pinned at
/// `prog_pin` when that is the one it runs.
fn adopt_pinned(
    role: Role,
    link_pin: &Path,
    prog_pin: &Path,
    prog: &OwnedFd,
    target_id: u64,
    cgroup: &Path,
) -> Result<Pinned, DatapathError> {
    let error = |op: &'static str| link_error(role, cgroup, op);
    let link = match sys::open_pinned(link_pin) {
        Ok(link) => link,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Pinned::Absent),
        Err(e) => return Err(error("read")(e)),
    };
    let info = sys::link_info(link.as_fd()).map_err(error("read"))?;
    if let Some(why) = link_mismatch(role, &info, target_id) {
        return Ok(Pinned::Stale { why, link });
    }
    // Compare-and-swap against the program the earlier agent pinned beside its
    // link, when that is the one it runs.
    let old = sys::open_pinned(prog_pin)
        .ok()
        .filter(|old| sys::prog_id(old.as_fd()).is_ok_and(|id| id == info.prog_id));
    if old.is_none() {
        tracing::warn!(
            hook = role.name(),
            "the program the pinned link runs is not pinned beside it: swapped without compare-and-swap"
        );
    }
    match sys::link_update(link.as_fd(), prog.as_fd(), old.as_ref().map(|o| o.as_fd())) {
        Ok(()) => Ok(Pinned::Swapped(link)),
        // The cgroup went away under the link (ENOLINK): make a new one.
        Err(e) if e.raw_os_error() == Some(libc::ENOLINK) => Ok(Pinned::Stale {
            why: format!("update: {e}"),
            link,
        }),
        Err(e) => Err(error("update")(e)),
    }
}

/// Why the pinned link `info` is not `role`'s at `target_id` (its link type, attach
/// type or target), or `None` when it is.
fn link_mismatch(role: Role, info: &sys::LinkInfo, target_id: u64) -> Option<String> {
    let expected_type = if role == Role::SkMsg {
        sys::LINK_TYPE_SOCKMAP
    } else {
        sys::LINK_TYPE_CGROUP
    };
    if info.link_type != expected_type {
        Some(format!(
            "link type {} (expected {expected_type})",
            info.link_type
        ))
    } else if info.attach_type != role.attach_type().raw() {
        Some(format!(
            "attach type {} (expected {})",
            info.attach_type,
            role.attach_type().raw()
        ))
    } else if info.target_id != target_id {
        Some(format!(
            "target id {} (expected {target_id}: {})",
            info.target_id,
            if role == Role::SkMsg {
                "the pinned sockets map"
            } else {
                "this cgroup, the old one is gone or another"
            }
        ))
    } else {
        None
    }
}

/// A [`Link`] record for `fd` (its id read from the kernel).
fn link_of(role: Role, program: &'static str, fd: Option<OwnedFd>) -> Link {
    let id = fd
        .as_ref()
        .and_then(|fd| sys::link_info(fd.as_fd()).ok())
        .map(|i| i.id);
    Link {
        role,
        program,
        fd,
        id,
    }
}

/// Pins `prog` at `path` in place of whatever was pinned there.
fn repin(path: &Path, prog: &OwnedFd) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    sys::pin(prog.as_fd(), path)
}

/// Locks the pin directory, when there is one, taking over from an agent whose
/// datapath expired: [`DatapathError::Busy`] while another agent holds it; any
/// other failure leaves the datapath unpinned (it goes with this process), and
/// says so.
fn lock_pins(opts: &LoadOptions) -> Result<(Option<PinDir>, Pin), DatapathError> {
    let Some(dir) = &opts.pin_dir else {
        return Ok((None, Pin::Off));
    };
    match PinDir::lock(dir, opts.pin_layout) {
        Ok(pins) => {
            take_over_expired(&pins, opts.pin_layout)?;
            Ok((Some(pins), Pin::Pinned(dir.clone())))
        }
        Err(e @ pin::PinError::Busy { .. }) => Err(DatapathError::Busy(e)),
        Err(e) => {
            tracing::warn!(error = %e, "the datapath is not pinned: it goes with this process, and traffic loses hairpin while no agent runs");
            Ok((None, Pin::Failed(e.to_string())))
        }
    }
}

/// The sockets map's size. Not preallocated, but kept small while unused; a
/// pinned one is sized for any later agent (its buckets cost about 16 bytes each),
/// and one an earlier agent pinned keeps its own size, which the limit then follows.
fn sockets_capacity(pins: Option<&PinDir>, opts: &LoadOptions) -> u32 {
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
        .map_max_entries(MAP_FRONTENDS, opts.max_frontends)
        .map_max_entries(MAP_SOCKETS, globals.sockets);
    let map_pins: Vec<(&'static str, PathBuf)> = pins
        .map(|p| SHARED_MAPS.iter().map(|m| (*m, p.map(m))).collect())
        .unwrap_or_default();
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
                (KernelPath::Unavailable(why.to_string()), None)
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

/// The maps user space keeps, taken out of the loaded object.
struct OpenedMaps {
    frontends: HashMap<MapData, FrontendKey, Redirect>,
    counters: PerCpuArray<MapData, u64>,
    heartbeat: Array<MapData, u64>,
    relays: SockHash<MapData, FrontendKey>,
    sockets: SockHash<MapData, u64>,
    /// The sockets map's kernel id, for `status`.
    sockets_id: Option<u32>,
}

impl OpenedMaps {
    fn take(ebpf: &mut Ebpf) -> Result<OpenedMaps, DatapathError> {
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
        let relays = SockHash::try_from(take(ebpf, MAP_RELAYS)?).map_err(map_error(
            "open",
            MAP_RELAYS,
            String::new(),
        ))?;
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
            sockets,
            sockets_id,
        })
    }
}

/// Another layout's datapath in the pin directory: left alone while its heartbeat
/// is live (this agent would misread its maps, and its kernel path still writes
/// headers without any agent), removed once it has expired, which it has when no
/// agent of its layout has beaten within its TTL. The heartbeat map's layout (two
/// u64: the beat and the TTL) is the one that never changes between layouts.
fn take_over_expired(pins: &PinDir, layout: u32) -> Result<(), DatapathError> {
    let foreign = pins.foreign_layouts();
    if foreign.is_empty() {
        return Ok(());
    }
    let mut live = Vec::new();
    for dir in &foreign {
        let state = heartbeat_state(&dir.join("maps").join(MAP_HEARTBEAT));
        match state {
            HeartbeatState::Live(left) => live.push(format!(
                "{} live for {}s more",
                dir.display(),
                left.as_secs()
            )),
            state => {
                tracing::warn!(layout = %dir.display(), heartbeat = %state, "a datapath of another layout has expired: removing it and taking over");
                for r in pin::remove_layout(dir) {
                    if let Err(e) = r.result {
                        tracing::warn!(pin = %r.path.display(), error = %e, "could not remove");
                    }
                }
            }
        }
    }
    if live.is_empty() {
        return Ok(());
    }
    Err(DatapathError::ForeignLayout {
        dir: pins.root().to_path_buf(),
        found: foreign
            .iter()
            .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(", "),
        layout,
        state: live.join("; "),
    })
}

/// How a pinned heartbeat stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatState {
    /// Younger than its TTL: the connect programs act for this much longer.
    Live(Duration),
    /// Older than its TTL by this much: the connect programs leave traffic alone.
    Expired(Duration),
    /// Never written.
    Never,
    /// The map cannot be read.
    Unreadable,
}

impl fmt::Display for HeartbeatState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeartbeatState::Live(left) => write!(f, "live for {}s more", left.as_secs()),
            HeartbeatState::Expired(ago) => write!(f, "expired {}s ago", ago.as_secs()),
            HeartbeatState::Never => f.write_str("never written"),
            HeartbeatState::Unreadable => f.write_str("unreadable"),
        }
    }
}

/// The state of the heartbeat pinned at `path`.
pub fn heartbeat_state(path: &Path) -> HeartbeatState {
    let Ok(data) = MapData::from_pin(path) else {
        return HeartbeatState::Unreadable;
    };
    let Ok(map) = Array::<MapData, u64>::try_from(aya::maps::Map::Array(data)) else {
        return HeartbeatState::Unreadable;
    };
    let (Ok(beat), Ok(ttl)) = (map.get(&HEARTBEAT_BEAT, 0), map.get(&HEARTBEAT_TTL, 0)) else {
        return HeartbeatState::Unreadable;
    };
    heartbeat_at(beat, ttl, monotonic_ns())
}

fn heartbeat_at(beat: u64, ttl: u64, now: u64) -> HeartbeatState {
    if beat == 0 {
        return HeartbeatState::Never;
    }
    let age = now.saturating_sub(beat);
    if age <= ttl {
        HeartbeatState::Live(Duration::from_nanos(ttl - age))
    } else {
        HeartbeatState::Expired(Duration::from_nanos(age - ttl))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists on Linux, so
    // the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The dead-man switch's writer: [`Heartbeat::beat`] stamps the heartbeat map with
/// `CLOCK_MONOTONIC` and the TTL. The agent beats every second; the connect
/// programs act only while the last beat is younger than the TTL.
#[derive(Clone)]
pub struct Heartbeat {
    map: Arc<std::sync::Mutex<Array<MapData, u64>>>,
    ttl: Duration,
}

impl Heartbeat {
    /// Writes the TTL and a beat of now.
    pub fn beat(&self) -> Result<(), DatapathError> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX);
        map.set(HEARTBEAT_TTL, ttl, 0)
            .and_then(|()| map.set(HEARTBEAT_BEAT, monotonic_ns(), 0))
            .map_err(map_error("write", MAP_HEARTBEAT, String::new()))
    }

    /// The heartbeat as the programs see it now.
    pub fn state(&self) -> HeartbeatState {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match (map.get(&HEARTBEAT_BEAT, 0), map.get(&HEARTBEAT_TTL, 0)) {
            (Ok(beat), Ok(ttl)) => heartbeat_at(beat, ttl, monotonic_ns()),
            _ => HeartbeatState::Unreadable,
        }
    }

    /// Seconds since the last beat (None: never, or unreadable).
    pub fn age(&self) -> Option<Duration> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let beat = map.get(&HEARTBEAT_BEAT, 0).ok().filter(|b| *b != 0)?;
        Some(Duration::from_nanos(monotonic_ns().saturating_sub(beat)))
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Beats every `every` until the task is dropped; a failed write is logged.
    pub async fn beat_every(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.beat() {
                tracing::warn!(error = %e, "heartbeat not written: the datapath goes inert once its TTL passes without one");
            }
        }
    }
}

/// The relay's liveness registry: each relay listener's socket in the relays
/// SOCKHASH by its address. The connect programs send a connect to a listener only
/// while it is there, and the kernel takes a listener out as it closes: a relay
/// that is gone is never a target.
#[derive(Clone)]
pub struct RelayLiveness(Arc<std::sync::Mutex<SockHash<MapData, FrontendKey>>>);

impl RelayLiveness {
    /// Registers the listening socket `fd` listening on `addr`. The map holds no
    /// reference that keeps it open: its owner closing it takes it out.
    pub fn register(&self, addr: SocketAddr, fd: BorrowedFd<'_>) -> Result<(), DatapathError> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(FrontendKey::new(addr), fd.as_raw_fd(), 0)
            .map_err(map_error("insert", MAP_RELAYS, addr.to_string()))
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

fn sum_counters(map: &PerCpuArray<MapData, u64>) -> Vec<(Counter, u64)> {
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
fn program<'a>(
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

#[cfg(test)]
mod tests;
