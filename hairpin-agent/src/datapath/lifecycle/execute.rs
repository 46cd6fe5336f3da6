//! The lifecycle's executor: the one place that observes the node's datapath and
//! changes it as decide.rs says. It locks the pin directory and reads what is pinned
//! there (start), removes another layout's expired datapath (take over), links,
//! swaps, replaces and detaches each hook's link in the one order decide.rs gives,
//! and removes the datapath on an uninstall.
//!
//! Owns every link and pin change of the agent. Never decides (decide.rs does), and
//! never writes a map entry but the first heartbeat (through liveness.rs).

use std::{
    fs::File,
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use hairpin_ebpf::{MAP_HEARTBEAT, PROG_SETSOCKOPT, PROG_SK_MSG, PROG_SOCK_OPS};

use super::super::{
    Adoption, Attachment, Datapath, DatapathError, KernelPath, LoadOptions, Mptcp, Pin, PinDir,
    Role, attach::Link, error::program_error, heartbeat_state, order, pin, sys,
};
use super::{
    decide,
    state::{
        ForeignLayout, Go, Hook, HookSeen, LinkFailed, PinDirSeen, PinnedLink, Start, StartSeen,
        Wait,
    },
    takeover::Handover,
};

/// What [`start`] came to.
// A Datapath is large and a Wait small, but this is returned once per attempt.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per start attempt, never stored in bulk"
)]
pub enum Started {
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

/// Observes the node, decides, and loads `object` as decided (nothing attached yet),
/// or says what to wait for. While waiting, the lock is not held: the next
/// observation takes it again.
pub fn start(object: &[u8], opts: &LoadOptions) -> Result<Started, DatapathError> {
    let (seen, pins) = observe_start(opts);
    let go = match decide::start(&seen) {
        Start::Wait(wait) => return Ok(Started::Waiting(wait)),
        Start::Go(go) => go,
    };
    take_over(&go);
    let pin = match (&go, &opts.pin_dir) {
        (Go::Unpinned(Some(why)), _) => {
            tracing::warn!(error = %why, "the datapath is not pinned: it goes with this process, and traffic loses hairpin while no agent runs");
            Pin::Failed(why.clone())
        }
        (Go::Unpinned(None), _) | (_, None) => Pin::Off,
        (_, Some(dir)) => Pin::Pinned(dir.clone()),
    };
    let mut datapath = Datapath::load_with(object, opts, pins, pin)?;
    if let Go::HandOver { live, .. } = &go {
        datapath.handover = Some(Handover::of(live));
    }
    Ok(Started::Loaded { datapath, go })
}

/// What a starting agent finds: the pin directory (locked when it can be, the lock
/// returned), this layout's links and the other layouts' datapaths with their
/// heartbeats.
fn observe_start(opts: &LoadOptions) -> (StartSeen, Option<PinDir>) {
    let mut seen = StartSeen {
        pins: PinDirSeen::Off,
        dir: opts.pin_dir.clone(),
        own_links: false,
        foreign: Vec::new(),
    };
    let Some(dir) = &opts.pin_dir else {
        return (seen, None);
    };
    match PinDir::lock(dir, opts.pin_layout, opts.pin_owner) {
        Ok(pins) => {
            seen.pins = PinDirSeen::Locked;
            seen.own_links = Role::ALL.iter().any(|r| pins.link(*r).exists());
            seen.foreign = pins
                .foreign_layouts()
                .into_iter()
                .map(|dir| ForeignLayout {
                    heartbeat: heartbeat_state(&dir.join("maps").join(MAP_HEARTBEAT)),
                    dir,
                })
                .collect();
            (seen, Some(pins))
        }
        Err(pin::PinError::Busy { .. }) => {
            seen.pins = PinDirSeen::Busy;
            (seen, None)
        }
        Err(e) => {
            seen.pins = PinDirSeen::Unusable(e.to_string());
            (seen, None)
        }
    }
}

/// Removes the expired datapaths of other layouts a takeover or a hand-over names.
fn take_over(go: &Go) {
    let (Go::TakeOver { expired, .. } | Go::HandOver { expired, .. }) = go else {
        return;
    };
    for layout in expired {
        tracing::warn!(layout = %layout.dir.display(), heartbeat = %layout.heartbeat, "a datapath of another layout has expired: removing it and taking over");
        for r in pin::remove_layout(&layout.dir) {
            if let Err(e) = r.result {
                tracing::warn!(pin = %r.path.display(), error = %e, "could not remove");
            }
        }
    }
}

/// Where the hooks are: the cgroup's directory, open, and its id.
pub(super) struct Target<'a> {
    path: &'a Path,
    dir: File,
    id: u64,
}

impl<'a> Target<'a> {
    /// The cgroup v2 directory `cgroup`, opened.
    pub(super) fn open(cgroup: &'a Path) -> Result<Target<'a>, DatapathError> {
        let cgroup_error = |source| DatapathError::Cgroup {
            path: cgroup.to_path_buf(),
            source,
        };
        let dir = File::open(cgroup).map_err(cgroup_error)?;
        let id = sys::cgroup_id(&dir).map_err(cgroup_error)?;
        Ok(Target {
            path: cgroup,
            dir,
            id,
        })
    }
}

impl Datapath {
    /// The program this agent runs at `role`, if it uses the hook.
    pub(super) fn program_for(&self, role: Role) -> Option<&'static str> {
        let kernel_path = self.kernel_path.is_on();
        match role {
            Role::SkMsg => kernel_path.then_some(PROG_SK_MSG),
            Role::SockOps => kernel_path.then_some(PROG_SOCK_OPS),
            Role::SetSockopt => kernel_path.then_some(PROG_SETSOCKOPT),
            Role::Connect4 => Some(self.connect[0]),
            Role::Connect6 => Some(self.connect[1]),
        }
    }

    /// Attaches the programs at `cgroup` (a cgroup v2 directory) through bpf_links,
    /// beside whatever else is attached there (links never replace another's
    /// program), in [`decide::attach_order`]: sk_msg on the sockets map, sock_ops,
    /// setsockopt, then connect4 and connect6, so every socket marked has the
    /// programs that finish its header behind it. The heartbeat is written first.
    ///
    /// Pinned, each hook is observed and decided on ([`decide::hook`]): an earlier
    /// agent's link of the right kind has its program swapped in place,
    /// compare-and-swap against the pinned program it runs (the hook never runs
    /// without a program); a stale one is replaced (the new one first, then the old
    /// detached). Links of hooks this agent does not use (the kernel path off now)
    /// are detached after the connect programs were swapped.
    pub fn attach(&mut self, cgroup: &Path) -> Result<&Attachment, DatapathError> {
        let target = Target::open(cgroup)?;
        // Live before any program of this agent's runs: a new datapath, or one
        // whose earlier agent has been gone past the TTL, acts from now on.
        if let Err(e) = self.heartbeat.beat() {
            tracing::warn!(error = %e, "the first heartbeat could not be written");
        }
        let mut links: Vec<Link> = Vec::new();
        let mut adopted = Vec::new();
        for role in decide::attach_order() {
            let Some(program) = self.program_for(role) else {
                continue;
            };
            match self.execute_hook(role, Some(program), &target, false) {
                Ok(Some((link, how))) => {
                    adopted.push((role.name(), how));
                    links.push(link);
                }
                Ok(None) => {}
                Err(e) => match decide::link_failed(role) {
                    LinkFailed::RelayPathOnly => {
                        self.lose_kernel_path(&e, cgroup, std::mem::take(&mut links));
                        adopted.clear();
                    }
                    // The links made here without a pin go as `links` drops; pinned
                    // ones, adopted or new, stay as they are: an earlier agent's
                    // programs or this one's, on the same maps, serve until the TTL
                    // (fail open).
                    LinkFailed::Stop => return Err(e),
                },
            }
        }
        self.detach_unused(&links, &target);
        log_adoptions(&adopted);
        Ok(&*self.attachment.insert(Attachment {
            cgroup: cgroup.to_path_buf(),
            links,
            adopted,
        }))
    }

    /// A kernel path hook could not be linked: the kernel path is unavailable, and
    /// what of it was linked (`linked`) goes again. The marking connect programs
    /// stay: with the kernel path off, no entry asks them to mark, and they redirect
    /// as the plain ones.
    fn lose_kernel_path(&mut self, e: &DatapathError, cgroup: &Path, linked: Vec<Link>) {
        tracing::warn!(error = %e, "the kernel path is unavailable: every frontend takes the relay path");
        self.kernel_path = KernelPath::Unavailable {
            kind: crate::status::KernelPathReason::LinkFailed,
            why: e.to_string(),
        };
        self.mptcp = Mptcp::Off;
        self.attachment = Some(Attachment {
            cgroup: cgroup.to_path_buf(),
            links: linked,
            adopted: Vec::new(),
        });
        self.detach_roles(|_| true);
        self.attachment = None;
    }

    /// The hooks an earlier agent linked that this one does not use: detached, after
    /// this agent's own were linked.
    fn detach_unused(&mut self, links: &[Link], target: &Target<'_>) {
        if self.pins.is_none() {
            return;
        }
        for role in decide::attach_order() {
            if links.iter().any(|l| l.role == role) {
                continue;
            }
            if let Err(e) = self.execute_hook(role, None, target, false) {
                tracing::warn!(hook = role.name(), error = %e, "an earlier agent's unused link could not be detached");
            }
        }
    }

    /// Observes `role`'s pinned link (and the one of a layout being handed over),
    /// decides, and acts: `program` is what this agent runs there (`None`: it does
    /// not use the hook), `frontends_live` whether its frontends are. The link made,
    /// adopted or taken over, and how.
    pub(super) fn execute_hook(
        &mut self,
        role: Role,
        program: Option<&'static str>,
        target: &Target<'_>,
        frontends_live: bool,
    ) -> Result<Option<(Link, Adoption)>, DatapathError> {
        let error = |op: &'static str| link_error(role, target.path, op);
        let (target_fd, target_id) = self.target_of(role, target).map_err(error("read"))?;
        let (mut pinned, old) = self.observe_hook(role, target_id, target.path)?;
        let (mut theirs_seen, theirs) = self.observe_foreign(role, target_id, target.path)?;
        loop {
            let seen = HookSeen {
                role,
                wanted: program.is_some(),
                pinned: pinned.clone(),
                theirs: theirs_seen.clone(),
                frontends_live,
            };
            let action = decide::hook(&seen);
            let name = match (&action, program) {
                (Hook::DetachUnused, _) => {
                    self.detach_unused_link(role, old.as_ref());
                    return Ok(None);
                }
                (Hook::Defer, _) => {
                    if let Some(h) = self.handover.as_mut() {
                        h.deferred.push(role);
                    }
                    return Ok(None);
                }
                (Hook::Leave, _) | (_, None) => return Ok(None),
                (_, Some(name)) => name,
            };
            let prog = self.program_fd(role, name, target.path)?;
            let how = match action {
                Hook::TakeOverLink => {
                    if let Some(t) = &theirs
                        && let Some(done) =
                            self.take_over_link(role, name, &prog, t, target.path)?
                    {
                        return Ok(Some(done));
                    }
                    // Its cgroup went away: a new link of this agent's, decided again.
                    theirs_seen = PinnedLink::Stale("update: the link's target is gone".into());
                    continue;
                }
                Hook::SwapInPlace => {
                    let old = old.as_ref().map(|(fd, info)| (fd, info.prog_id));
                    match self.swap_in_place(role, &prog, old, target.path)? {
                        Some(link) => {
                            return Ok(Some((link_of(role, name, Some(link)), Adoption::Swapped)));
                        }
                        // The link cannot be updated (its cgroup went away): observed
                        // anew as stale, and decided again.
                        None => {
                            pinned = PinnedLink::Stale(
                                "update: the link's target is gone (ENOLINK)".into(),
                            );
                            continue;
                        }
                    }
                }
                Hook::Replace(why) => Adoption::Replaced(why),
                // (the last two returned above)
                Hook::NewLink | Hook::DetachUnused | Hook::Leave | Hook::Defer => Adoption::New,
            };
            let fd = self.create_link(role, &prog, &target_fd, error("create"))?;
            self.pin_link(role, fd.as_ref(), &prog, target.path)?;
            if let Some((stale, _)) = &old
                && matches!(how, Adoption::Replaced(_))
            {
                // After the new link: the hook was never without a program.
                if let Err(e) = sys::link_detach(stale.as_fd()) {
                    tracing::debug!(hook = role.name(), error = %e, "the replaced link could not be detached (already gone)");
                }
            }
            return Ok(Some((link_of(role, name, fd), how)));
        }
    }

    /// What `role` is linked to: the sockets map for sk_msg, else the cgroup; its
    /// descriptor and kernel id.
    fn target_of(&self, role: Role, target: &Target<'_>) -> std::io::Result<(OwnedFd, u64)> {
        if role == Role::SkMsg {
            let fd = self.sockets.fd().as_fd().try_clone_to_owned()?;
            Ok((fd, u64::from(self.sockets_id.unwrap_or(0))))
        } else {
            Ok((target.dir.as_fd().try_clone_to_owned()?, target.id))
        }
    }

    /// What is pinned at `role`'s link pin, with the link and its description when
    /// there is one.
    fn observe_hook(
        &self,
        role: Role,
        target_id: u64,
        cgroup: &Path,
    ) -> Result<(PinnedLink, Option<(OwnedFd, sys::LinkInfo)>), DatapathError> {
        let error = |op: &'static str| link_error(role, cgroup, op);
        let Some(pins) = &self.pins else {
            return Ok((PinnedLink::NotPinning, None));
        };
        let link = match sys::open_pinned(&pins.link(role)) {
            Ok(link) => link,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Ok((PinnedLink::Absent, None));
            }
            Err(e) => return Err(error("read")(e)),
        };
        let info = sys::link_info(link.as_fd()).map_err(error("read"))?;
        let mut pinned = decide::pinned_link(role, &info, target_id);
        if pinned == PinnedLink::Matches
            && self.link_order.flags(role) != 0
            && let Some(front) = running_in_front(role, cgroup, info.prog_id)
        {
            pinned = PinnedLink::Behind(front);
        }
        Ok((pinned, Some((link, info))))
    }

    /// A descriptor of the loaded program `name`, to link at `role`.
    fn program_fd(
        &self,
        role: Role,
        name: &'static str,
        cgroup: &Path,
    ) -> Result<OwnedFd, DatapathError> {
        self.ebpf
            .program(name)
            .ok_or(DatapathError::Missing {
                kind: "program",
                name,
            })?
            .fd()
            .map_err(program_error(name, "attach", cgroup))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(link_error(role, cgroup, "read"))
    }

    /// Swaps `prog` into the pinned link `old` (with the id of the program it runs),
    /// compare-and-swap against the program pinned beside it when that is the one it
    /// runs, and pins `prog` there. The link, or `None` when the kernel says it can
    /// no longer be updated (ENOLINK: its cgroup went away).
    fn swap_in_place(
        &self,
        role: Role,
        prog: &OwnedFd,
        old: Option<(&OwnedFd, u32)>,
        cgroup: &Path,
    ) -> Result<Option<OwnedFd>, DatapathError> {
        let error = |op: &'static str| link_error(role, cgroup, op);
        let (Some(pins), Some((link, running))) = (&self.pins, old) else {
            return Ok(None);
        };
        let prog_pin = pins.prog(role);
        if !update_link(role, link, prog, (&prog_pin, running), cgroup)? {
            return Ok(None);
        }
        repin(&prog_pin, prog).map_err(error("pin"))?;
        let link = link.try_clone().map_err(error("read"))?;
        Ok(Some(link))
    }

    /// Pins a new link `fd` (none: sk_msg on the map the old way) and its program
    /// `prog` at `role`'s pins, when the datapath is pinned.
    pub(super) fn pin_link(
        &self,
        role: Role,
        fd: Option<&OwnedFd>,
        prog: &OwnedFd,
        cgroup: &Path,
    ) -> Result<(), DatapathError> {
        let error = |op: &'static str| link_error(role, cgroup, op);
        let Some(pins) = &self.pins else {
            return Ok(());
        };
        if let Some(fd) = fd {
            let link_pin = pins.link(role);
            let _ = pin::unpin(&link_pin);
            sys::pin(fd.as_fd(), &link_pin).map_err(error("pin"))?;
        }
        repin(&pins.prog(role), prog).map_err(error("pin"))
    }

    /// Detaches and unpins an earlier agent's link at a hook this agent does not use.
    fn detach_unused_link(&self, role: Role, old: Option<&(OwnedFd, sys::LinkInfo)>) {
        let Some(pins) = &self.pins else {
            return;
        };
        if let Some((fd, _)) = old {
            match sys::link_detach(fd.as_fd()) {
                Ok(()) => tracing::info!(
                    hook = role.name(),
                    "an earlier agent's link this agent does not use: detached"
                ),
                Err(e) => {
                    tracing::warn!(hook = role.name(), error = %e, "an earlier agent's unused link could not be detached")
                }
            }
        }
        let _ = pin::unpin(&pins.link(role));
        let _ = pin::unpin(&pins.prog(role));
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
        let flags = self.link_order.flags(role);
        match sys::link_create(prog.as_fd(), target.as_fd(), role.attach_type(), flags) {
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
    /// ([`super::super::CountersReader::fill`]) before [`Datapath::detach`].
    pub fn detach_connect(&mut self) -> bool {
        self.detach_roles(|r| !matches!(r, Role::SockOps | Role::SkMsg));
        self.attachment
            .as_ref()
            .is_some_and(|a| a.links.iter().any(|l| l.role == Role::SockOps))
    }

    /// Detaches whatever is still attached, in [`decide::detach_order`], and unpins
    /// their links.
    pub fn detach(&mut self) {
        self.detach_roles(|_| true);
        self.attachment = None;
    }

    /// Detaches the links of the roles `which` picks, in [`decide::detach_order`].
    fn detach_roles(&mut self, which: impl Fn(Role) -> bool) {
        let Some(att) = self.attachment.as_mut() else {
            return;
        };
        let mut gone = Vec::new();
        for role in decide::detach_order().filter(|r| which(*r)) {
            let (now, kept): (Vec<Link>, Vec<Link>) = std::mem::take(&mut att.links)
                .into_iter()
                .partition(|l| l.role == role);
            att.links = kept;
            gone.extend(now);
        }
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
}

/// Logs what became of each hook's link.
fn log_adoptions(adopted: &[(&'static str, Adoption)]) {
    for (hook, how) in adopted {
        match how {
            Adoption::New => tracing::debug!(hook, "linked"),
            Adoption::Swapped => {
                tracing::info!(hook, "adopted the pinned link: program swapped in place")
            }
            Adoption::Replaced(why) => {
                tracing::warn!(hook, reason = %why, "the pinned link was replaced")
            }
            // Logged where it happens (takeover.rs).
            Adoption::TakenOver(_) => {}
        }
    }
}

/// The error of linking `role` at `cgroup` when `op` fails.
pub(super) fn link_error(
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

/// A [`Link`] record for `fd` (its id read from the kernel).
pub(super) fn link_of(role: Role, program: &'static str, fd: Option<OwnedFd>) -> Link {
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

/// Swaps `prog` into `link` in place (`BPF_LINK_UPDATE`), compare-and-swap against
/// the program pinned at `expected.0` when that is the one the link runs (id
/// `expected.1`). `false` when the kernel says the link can no longer be updated
/// (ENOLINK: its cgroup went away).
pub(super) fn update_link(
    role: Role,
    link: &OwnedFd,
    prog: &OwnedFd,
    expected: (&Path, u32),
    cgroup: &Path,
) -> Result<bool, DatapathError> {
    let (pinned, running) = expected;
    let expected = sys::open_pinned(pinned)
        .ok()
        .filter(|p| sys::prog_id(p.as_fd()).is_ok_and(|id| id == running));
    if expected.is_none() {
        tracing::warn!(
            hook = role.name(),
            "the program the pinned link runs is not pinned beside it: swapped without compare-and-swap"
        );
    }
    match sys::link_update(
        link.as_fd(),
        prog.as_fd(),
        expected.as_ref().map(|p| p.as_fd()),
    ) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOLINK) => Ok(false),
        Err(e) => Err(link_error(role, cgroup, "update")(e)),
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

/// The programs that run before `running` (the pinned link's program) at `role`
/// in `cgroup`, named for the log and `status`; `None` when it runs first, or when
/// the hook cannot be listed (then it is adopted as it stands, and `status` says
/// what the kernel lists once attached).
fn running_in_front(role: Role, cgroup: &Path, running: u32) -> Option<String> {
    match order::observe(cgroup, role, running) {
        Ok(hook) if hook.attached && !hook.in_front.is_empty() => Some(
            hook.in_front
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(hook = role.name(), error = %e, "the connect programs at the cgroup could not be listed");
            None
        }
    }
}
