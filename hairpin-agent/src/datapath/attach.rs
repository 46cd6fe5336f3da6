//! Attach and adopt: each hook's program linked at the cgroup (sk_msg at the sockets
//! map), consumers first; a link an earlier agent pinned adopted by swapping its
//! program in place (compare-and-swap, attach type and target checked) or replaced
//! new-first; detaching, and removing the whole datapath on an uninstall.
//!
//! Owns the links and the [`Attachment`] record. Never writes a map entry but the
//! first heartbeat (through liveness.rs), and never decides whether to keep or remove
//! a datapath: its callers do.

use std::{
    fmt,
    fs::File,
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use hairpin_ebpf::{PROG_SETSOCKOPT, PROG_SK_MSG, PROG_SOCK_OPS};

use super::error::program_error;
use super::{Datapath, DatapathError, KernelPath, Mptcp, Role};
use super::{pin, sys};

/// Where the programs are attached, and through which links.
#[derive(Debug)]
pub struct Attachment {
    /// The cgroup v2 directory.
    pub cgroup: PathBuf,
    pub(super) links: Vec<Link>,
    /// What became of the links found pinned at start: adopted (swapped in place)
    /// or not, per hook.
    pub adopted: Vec<(&'static str, Adoption)>,
}

/// One hook's bpf_link.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) role: Role,
    /// The program it runs (ELF name).
    pub(super) program: &'static str,
    /// The link (None: sk_msg attached to the map the old way).
    pub(super) fd: Option<OwnedFd>,
    /// The link's id, for `status`.
    pub(super) id: Option<u32>,
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

impl Datapath {
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
