//! The kernel side's edge: loading the embedded object, attaching connect4/connect6
//! at a cgroup v2 directory through bpf_links this process owns, and writing the
//! frontend map. A link owned by the process disappears with it, so a crashed agent
//! leaves no redirect behind.
//!
//! With the kernel path on (and loadable), a sock_ops program is attached beside
//! them and an sk_msg program on the sockets map, and the connect programs that mark
//! sockets replace the plain ones; see [`KernelPath`].

mod btf;
pub mod cgroup;
mod error;
pub mod kernel;
mod kernel_path;
pub mod pin;

pub use cgroup::find_cgroup2_root;
pub use error::{DatapathError, Denial, classify_denial};
use error::{is_full, load_error, map_error, program_error};
pub use kernel_path::{
    Fill, KernelPath, describe as describe_value, drain_kernel_sockets, read_frontend_paths,
};

use std::{
    fs::File,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, SockHash},
    programs::{
        CgroupAttachMode, CgroupSockAddr, CgroupSockopt, SkMsg, SockOps,
        cgroup_sock_addr::CgroupSockAddrLinkId, cgroup_sockopt::CgroupSockoptLinkId,
        sock_ops::SockOpsLinkId,
    },
};
use hairpin_ebpf::{
    Counter, FrontendKey, GLOBAL_BYPASS_MARK, GLOBAL_FASTOPEN_CONNECT_MASK,
    GLOBAL_FASTOPEN_CONNECT_OFF, GLOBAL_FASTOPEN_REQ_OFF, GLOBAL_NODE_IP4, GLOBAL_NODE_IP6,
    GLOBAL_SOCKETS_LIMIT, MAP_COUNTERS, MAP_FRONTENDS, MAP_SOCKETS, MAX_FRONTENDS,
    MAX_KERNEL_SOCKETS, PROG_SETSOCKOPT, PROG_SK_MSG, PROG_SOCK_OPS, Redirect,
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

/// Where the programs are attached.
#[derive(Debug)]
pub struct Attachment {
    /// The cgroup v2 directory.
    pub cgroup: PathBuf,
    links: Vec<(&'static str, CgroupSockAddrLinkId)>,
    /// The kernel path's setsockopt program (marks TCP_FASTOPEN_CONNECT sockets for
    /// the connect programs): detached with them.
    setsockopt: Option<CgroupSockoptLinkId>,
    sock_ops: Option<SockOpsLinkId>,
}

/// Whether the kernel path's sockets map is pinned (see [`pin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// No pin directory, or the kernel path is not attached.
    Off,
    /// Pinned here.
    Pinned(PathBuf),
    /// Pinning failed, and why.
    Failed(String),
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
    /// Where the kernel path's sockets map is pinned (on a bpf filesystem) so its
    /// sockets keep their header after this process dies; `None`: not pinned.
    pub pin_dir: Option<PathBuf>,
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
        }
    }
}

/// The loaded programs and their maps.
pub struct Datapath {
    ebpf: Ebpf,
    frontends: HashMap<MapData, FrontendKey, Redirect>,
    counters: PerCpuArray<MapData, u64>,
    sockets: SockHash<MapData, u64>,
    sockets_id: Option<u32>,
    /// The connect programs loaded: the marking ones when the kernel path loaded.
    connect: [&'static str; 2],
    attachment: Option<Attachment>,
    capacity: u32,
    kernel_path: KernelPath,
    /// Where to pin the sockets map once the kernel path is attached.
    pin_dir: Option<PathBuf>,
    /// Whether it is pinned: the pin, or why not.
    pin: Pin,
    /// Reads the programs' aya-log events into the agent's log while it lives.
    _events: Option<EventsReader>,
}

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

    /// Loads `object` as `opts` say. The kernel path's programs are tried first when
    /// asked for; when this kernel cannot run them the relay path's connect programs
    /// load instead and [`Datapath::kernel_path`] says why. Nothing is attached yet.
    pub fn load_with(object: &[u8], opts: &LoadOptions) -> Result<Datapath, DatapathError> {
        raise_memlock_limit();
        let node4 = opts
            .node_ipv4
            .map_or(0, |ip| u32::from_ne_bytes(ip.octets()));
        let node6 = opts.node_ipv6.map_or([0; 4], |ip| {
            FrontendKey::new(SocketAddr::new(ip.into(), 0)).addr
        });
        // Not preallocated, but kept small while unused.
        let sockets = if opts.kernel_path {
            opts.max_kernel_sockets.max(1)
        } else {
            1
        };
        // Past this fill, connects to kernel-path frontends go to the relay.
        let sockets_limit = hairpin_ebpf::sockets_limit(sockets);
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
        let (req_off, connect_off, connect_mask) =
            fields.map_or((0, 0, 0), |f| (f.req, f.connect_byte, f.connect_mask));
        let mut ebpf = EbpfLoader::new()
            // Not every object logs (must_exist false): it is aya-log's own global.
            .override_global(aya_log::LEVEL, &log_level, false)
            .override_global(GLOBAL_BYPASS_MARK, &opts.bypass_mark, true)
            .override_global(GLOBAL_NODE_IP4, &node4, true)
            .override_global(GLOBAL_NODE_IP6, &node6, true)
            .override_global(GLOBAL_SOCKETS_LIMIT, &sockets_limit, true)
            .override_global(GLOBAL_FASTOPEN_REQ_OFF, &req_off, true)
            .override_global(GLOBAL_FASTOPEN_CONNECT_OFF, &connect_off, true)
            .override_global(GLOBAL_FASTOPEN_CONNECT_MASK, &connect_mask, true)
            .map_max_entries(MAP_FRONTENDS, opts.max_frontends)
            .map_max_entries(MAP_SOCKETS, sockets)
            .load(object)
            .map_err(load_error)?;
        let (kernel_path, kernel_connect) = if opts.kernel_path {
            let fields = fast_open.map(|_| ()).map_err(|e| e.to_string());
            match kernel_path::load(&mut ebpf, fields) {
                Ok(connect) => (KernelPath::On, Some(connect)),
                Err(why) => {
                    tracing::warn!(reason = %why, "the kernel path is unavailable on this kernel: every frontend takes the relay path");
                    (KernelPath::Unavailable(why), None)
                }
            }
        } else {
            (KernelPath::Off, None)
        };
        if !kernel_path.is_on() {
            for name in kernel_path.connect_programs() {
                program(&mut ebpf, name, "load", Path::new(""))?
                    .load()
                    .map_err(program_error(name, "load", Path::new("")))?;
            }
        }
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name)
                .ok_or(DatapathError::Missing { kind: "map", name })
        };
        let frontends = HashMap::try_from(take(&mut ebpf, MAP_FRONTENDS)?).map_err(map_error(
            "open",
            MAP_FRONTENDS,
            String::new(),
        ))?;
        let counters = PerCpuArray::try_from(take(&mut ebpf, MAP_COUNTERS)?).map_err(map_error(
            "open",
            MAP_COUNTERS,
            String::new(),
        ))?;
        let sockets = take(&mut ebpf, MAP_SOCKETS)?;
        let sockets_id = match &sockets {
            aya::maps::Map::SockHash(m) => m.info().ok().map(|i| i.id()),
            _ => None,
        };
        let sockets =
            SockHash::try_from(sockets).map_err(map_error("open", MAP_SOCKETS, String::new()))?;
        // Every program is loaded: the ring buffer's descriptor can move to the reader.
        let events = runtime.and_then(|rt| EventsReader::start(&mut ebpf, &rt));
        Ok(Datapath {
            ebpf,
            frontends,
            counters,
            sockets,
            sockets_id,
            connect: kernel_connect.unwrap_or_else(|| kernel_path.connect_programs()),
            attachment: None,
            capacity: opts.max_frontends,
            kernel_path,
            pin_dir: opts.pin_dir.clone(),
            pin: Pin::Off,
            _events: events,
        })
    }

    /// How the kernel path stands: off, unavailable (why), or on.
    pub fn kernel_path(&self) -> &KernelPath {
        &self.kernel_path
    }

    /// The programs attached at the cgroup through bpf_links, by ELF name.
    fn linked_programs(&self) -> Vec<&'static str> {
        let mut names = self.connect.to_vec();
        if self.kernel_path.is_on() {
            names.push(PROG_SOCK_OPS);
            names.push(PROG_SETSOCKOPT);
        }
        names
    }

    /// Attaches sk_msg to the sockets map, then sock_ops and setsockopt at `dir`:
    /// before any connect program, so every socket marked has sock_ops and sk_msg
    /// behind it, and every TCP_FASTOPEN_CONNECT set from then on is seen.
    fn attach_kernel_path(
        &mut self,
        dir: &File,
        cgroup: &Path,
    ) -> Result<(SockOpsLinkId, CgroupSockoptLinkId), DatapathError> {
        let fd = self.sockets.fd().try_clone().map_err(|source| {
            map_error("open", MAP_SOCKETS, String::new())(aya::maps::MapError::SyscallError(
                aya::sys::SyscallError {
                    call: "dup",
                    io_error: source,
                },
            ))
        })?;
        let missing = |name| DatapathError::Missing {
            kind: "program",
            name,
        };
        kernel_path::program::<SkMsg>(&mut self.ebpf, PROG_SK_MSG)
            .ok_or(missing(PROG_SK_MSG))?
            .attach(&fd)
            .map_err(program_error(PROG_SK_MSG, "attach", cgroup))?;
        let sock_ops = kernel_path::program::<SockOps>(&mut self.ebpf, PROG_SOCK_OPS)
            .ok_or(missing(PROG_SOCK_OPS))?
            .attach(dir, CgroupAttachMode::Single)
            .map_err(program_error(PROG_SOCK_OPS, "attach", cgroup))?;
        let setsockopt = kernel_path::program::<CgroupSockopt>(&mut self.ebpf, PROG_SETSOCKOPT)
            .ok_or(missing(PROG_SETSOCKOPT))
            .and_then(|p| {
                p.attach(dir, CgroupAttachMode::Single)
                    .map_err(program_error(PROG_SETSOCKOPT, "attach", cgroup))
            });
        match setsockopt {
            Ok(id) => Ok((sock_ops, id)),
            Err(e) => {
                if let Some(p) = kernel_path::program::<SockOps>(&mut self.ebpf, PROG_SOCK_OPS) {
                    let _ = p.detach(sock_ops);
                }
                Err(e)
            }
        }
    }

    /// Attaches both programs at `cgroup` (a cgroup v2 directory), beside whatever
    /// else is attached there: bpf_links are always multi-attach, never replacing.
    pub fn attach(&mut self, cgroup: &Path) -> Result<&Attachment, DatapathError> {
        let dir = File::open(cgroup).map_err(|source| DatapathError::Cgroup {
            path: cgroup.to_path_buf(),
            source,
        })?;
        // The sk_msg program stays on the map until this process exits, so sockets
        // already established when the programs detach still get their header.
        let (sock_ops, setsockopt) = if self.kernel_path.is_on() {
            match self.attach_kernel_path(&dir, cgroup) {
                Ok((sock_ops, setsockopt)) => {
                    self.pin_sockets();
                    (Some(sock_ops), Some(setsockopt))
                }
                Err(e) => {
                    // The marking connect programs stay: with the kernel path off,
                    // no entry asks them to mark, and they redirect as the plain ones.
                    tracing::warn!(error = %e, "the kernel path is unavailable: every frontend takes the relay path");
                    self.kernel_path = KernelPath::Unavailable(e.to_string());
                    (None, None)
                }
            }
        } else {
            (None, None)
        };
        let mut links = Vec::new();
        for name in self.connect {
            // On kernels >= 5.7 aya makes a bpf_link; Single is what it passes as
            // flags, and the kernel runs links in multi mode regardless.
            let id = program(&mut self.ebpf, name, "attach", cgroup)?
                .attach(&dir, CgroupAttachMode::Single)
                .map_err(program_error(name, "attach", cgroup))?;
            links.push((name, id));
        }
        self.attachment = Some(Attachment {
            cgroup: cgroup.to_path_buf(),
            links,
            setsockopt,
            sock_ops,
        });
        // Checked, not assumed: aya falls back to a legacy attach where the kernel
        // has no cgroup links, and that one would outlive this process.
        if let Err((program, why)) = self.confirm_links() {
            self.detach();
            return Err(DatapathError::NotALink {
                program,
                cgroup: cgroup.to_path_buf(),
                why,
            });
        }
        Ok(self
            .attachment
            .as_ref()
            .expect("the attachment was recorded above and links were confirmed"))
    }

    /// Pins the sockets map in the pin directory, when there is one; a failure is
    /// logged and said in `status`, and the kernel path goes on unpinned.
    fn pin_sockets(&mut self) {
        let Some(dir) = self.pin_dir.clone() else {
            self.pin = Pin::Off;
            return;
        };
        let Some(id) = self.sockets_id else {
            self.pin = Pin::Failed("the sockets map's id cannot be read".into());
            return;
        };
        self.pin = match pin::pin_sockets(&dir, self.sockets.fd(), id) {
            Ok(path) => {
                tracing::info!(pin = %path.display(), "sockets map pinned: sockets established but not yet written keep their header if this process dies");
                Pin::Pinned(path)
            }
            Err(why) => {
                tracing::warn!(reason = %why, "the sockets map is not pinned: sockets established but not yet written when this process dies go without their header");
                Pin::Failed(why)
            }
        };
    }

    /// Whether the sockets map is pinned: the pin, or why not.
    pub fn pin(&self) -> &Pin {
        &self.pin
    }

    /// Removes this agent's pin of the sockets map (once it is empty: the kernel
    /// then frees it with this process).
    pub fn unpin(&mut self) {
        if let Pin::Pinned(path) = &self.pin {
            match pin::unpin(path) {
                Ok(()) => tracing::info!(pin = %path.display(), "sockets map unpinned"),
                Err(e) => tracing::warn!(error = %e, "the sockets map could not be unpinned"),
            }
            self.pin = Pin::Off;
        }
    }

    /// Ok when every program has a bpf_link the kernel lists; else the first that
    /// does not, and why.
    fn confirm_links(&self) -> Result<(), (&'static str, String)> {
        let programs = self.linked_programs();
        let links = match kernel::links() {
            Ok(links) => links,
            // Listing links (BPF_LINK_GET_NEXT_ID) needs CAP_SYS_ADMIN, which the
            // DaemonSet does not grant (CAP_BPF only). aya 0.14 (pinned exactly) attaches
            // through bpf_link_create whenever it finds a 5.7 or newer kernel, and fails
            // rather than falling back to a legacy attach, so there the ids it returned
            // are links; only where it found an older kernel can they be legacy ones.
            Err(e)
                if error::errno(&e) == Some(nix::errno::Errno::EPERM as i32)
                    && aya::util::KernelVersion::current()
                        .is_ok_and(|v| v >= aya::util::KernelVersion::new(5, 7, 0)) =>
            {
                tracing::debug!(error = %e, "bpf links cannot be listed without CAP_SYS_ADMIN: aya attached through bpf_link_create (kernel 5.7 or newer)");
                return Ok(());
            }
            Err(e) => {
                return Err((
                    programs[0],
                    format!("the kernel cannot list bpf links: {e}"),
                ));
            }
        };
        for name in programs {
            let id = self
                .ebpf
                .program(name)
                .and_then(|p| p.info().ok())
                .map(|i| i.id())
                .ok_or((name, "its program id cannot be read".to_string()))?;
            if !links.iter().any(|(program, _)| *program == id) {
                return Err((name, format!("no bpf link of program id {id}")));
            }
        }
        Ok(())
    }

    /// Detaches the connect programs only (and after them the setsockopt program,
    /// which serves only them): from now on no connect is redirected or marked.
    /// sock_ops stays, so sockets already marked still enter the sockets map
    /// at their handshake and leave it at their first RTT sample (or close), and
    /// sk_msg stays on the map until this process exits, so they still get their
    /// header. Whether sock_ops is still attached: then the sockets map is worth
    /// waiting for ([`CountersReader::fill`]) before [`Datapath::detach`].
    pub fn detach_connect(&mut self) -> bool {
        let Some(att) = self.attachment.as_mut() else {
            return false;
        };
        let links = std::mem::take(&mut att.links);
        let setsockopt = att.setsockopt.take();
        let cgroup = att.cgroup.clone();
        let sock_ops = att.sock_ops.is_some();
        for (name, id) in links {
            let detached = program(&mut self.ebpf, name, "detach", &cgroup)
                .and_then(|p| p.detach(id).map_err(program_error(name, "detach", &cgroup)));
            if let Err(e) = detached {
                tracing::warn!(error = %e, "detach failed");
            }
        }
        if let Some(id) = setsockopt
            && let Some(p) = kernel_path::program::<CgroupSockopt>(&mut self.ebpf, PROG_SETSOCKOPT)
            && let Err(e) = p.detach(id)
        {
            tracing::warn!(error = %e, "detach of {PROG_SETSOCKOPT} failed");
        }
        if !sock_ops {
            self.attachment = None;
        }
        sock_ops
    }

    /// Detaches whatever is still attached at the cgroup: the connect programs, then
    /// sock_ops (no socket enters or leaves the sockets map after this). sk_msg stays
    /// on the map until this process exits.
    pub fn detach(&mut self) {
        self.detach_connect();
        let Some(att) = self.attachment.take() else {
            return;
        };
        if let Some(id) = att.sock_ops
            && let Some(p) = kernel_path::program::<SockOps>(&mut self.ebpf, PROG_SOCK_OPS)
            && let Err(e) = p.detach(id)
        {
            tracing::warn!(error = %e, "detach of {PROG_SOCK_OPS} failed");
        }
    }

    /// Where the programs are attached, if they are.
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Kernel ids of the programs, their links and the maps, for `status` and `dump`.
    pub fn kernel_ids(&self) -> crate::status::KernelIds {
        let mut names = self.linked_programs();
        if self.kernel_path.is_on() {
            names.push(PROG_SK_MSG);
        }
        let infos: Vec<(&str, aya::programs::ProgramInfo)> = names
            .iter()
            .filter_map(|name| Some((*name, self.ebpf.program(name)?.info().ok()?)))
            .collect();
        let mut ids = crate::datapath::kernel::ids_of(&infos);
        // `ids_of` names the maps by opening them by id, which needs CAP_SYS_ADMIN
        // (the DaemonSet holds CAP_BPF only); the agent's own descriptors say it
        // without: `/status` finds its counters through these ids.
        use aya::maps::IterableMap;
        if ids.counters_map_id.is_none() {
            ids.counters_map_id = self.counters.map().info().ok().map(|i| i.id());
        }
        if ids.frontends_map_id.is_none() {
            ids.frontends_map_id = self.frontends.map().info().ok().map(|i| i.id());
        }
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
    /// [`kernel::read_counters`]) needs CAP_SYS_ADMIN, which the DaemonSet does not
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

impl Drop for Datapath {
    fn drop(&mut self) {
        self.detach();
    }
}

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
