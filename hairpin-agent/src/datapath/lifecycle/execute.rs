//! The lifecycle's executor: the one place that changes the node's links and pins as
//! decide.rs says. [`Links`] owns them: the attachment, the pin directory (one enum,
//! [`Pinning`]), where new connect links go ([`LinkOrder`]) and a hand-over under
//! way. It links, swaps, replaces and detaches each hook's link in the one order
//! decide.rs gives, and removes the datapath on an uninstall. Every kernel call goes
//! through the seam (kernel.rs), so the order is unit-tested without root
//! (executor_tests.rs).
//!
//! Owns every link and pin change of the agent. Never decides (decide.rs does),
//! never loads a program (load.rs) and never writes a map entry.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use super::decide;
use super::hook::{Target, link_error, link_of, pin_link, repin, update_link};
use super::kernel::{LinkKernel, LoadedPrograms, Sys};
use super::state::{Hook, HookSeen, LinkFailed, PinnedLink, Stale};
use super::takeover::{self, Handover, take_over_link};

mod children;
use crate::datapath::attach::{Adoption, Attachment, Link};
use crate::datapath::error::DatapathError;
use crate::datapath::order::{self, LinkOrder};
use crate::datapath::pin::{self, PinDir, Pinning};
use crate::datapath::role::Role;
use crate::datapath::sys::LinkInfo;
use crate::status::ForeignProgram;

/// The datapath's links: what is attached and pinned, and the executor that alone
/// changes them. Generic over the kernel's calls ([`Sys`] but in unit tests).
pub(crate) struct Links<K: LinkKernel = Sys> {
    kernel: K,
    /// Whether the datapath is pinned: the locked directory, or why not.
    pinning: Pinning,
    /// Where new connect links go among the other programs at the cgroup.
    order: LinkOrder,
    /// The sockets map sk_msg links to, and its kernel id.
    sockets: (OwnedFd, u64),
    attachment: Option<Attachment>,
    /// Another layout's live datapath being handed over, until this agent's
    /// frontends are live (see takeover.rs).
    handover: Option<Handover>,
}

impl<K: LinkKernel> Links<K> {
    /// Nothing attached yet: links to come through `kernel`, pinned as `pinning`
    /// says, ordered as `order` says, sk_msg on the sockets map `sockets` (its
    /// descriptor and id); `handover` when another layout's live datapath is
    /// being handed over.
    pub(crate) fn new(
        kernel: K,
        pinning: Pinning,
        order: LinkOrder,
        sockets: (OwnedFd, u64),
        handover: Option<Handover>,
    ) -> Links<K> {
        Links {
            kernel,
            pinning,
            order,
            sockets,
            attachment: None,
            handover,
        }
    }

    /// Whether the datapath is pinned: the directory, or why not.
    pub(crate) fn pinning(&self) -> &Pinning {
        &self.pinning
    }

    /// Where new connect links go among the other programs at the cgroup.
    pub(crate) fn order(&self) -> &LinkOrder {
        &self.order
    }

    /// Where the programs are attached, if they are.
    pub(crate) fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Whether a hand-over of another layout's datapath waits for this agent's
    /// frontends to be live.
    #[cfg(test)]
    pub(crate) fn handover_pending(&self) -> bool {
        self.handover.is_some()
    }

    fn pins(&self) -> Option<&PinDir> {
        self.pinning.dir()
    }

    /// Attaches `programs` at `cgroup` (a cgroup v2 directory) through bpf_links,
    /// beside whatever else is attached there (links never replace another's
    /// program), in [`decide::attach_order`]: sk_msg on the sockets map, sock_ops,
    /// setsockopt, then connect4 and connect6, so every socket marked has the
    /// programs that finish its header behind it. `first` runs once the cgroup is
    /// open, before any link changes (the first heartbeat).
    ///
    /// Pinned, each hook is observed and decided on ([`decide::hook`]): an earlier
    /// agent's link of the right kind has its program swapped in place,
    /// compare-and-swap against the pinned program it runs (the hook never runs
    /// without a program); a stale one is replaced (the new one first, then the old
    /// detached). Links of hooks this agent does not use (the kernel path off now)
    /// are detached after the connect programs were swapped.
    pub(crate) fn attach(
        &mut self,
        programs: &mut impl LoadedPrograms,
        cgroup: &Path,
        first: impl FnOnce(),
    ) -> Result<&Attachment, DatapathError> {
        let target = Target::open(&self.kernel, cgroup)?;
        first();
        let children = self.children_to_link(&target);
        let mut links: Vec<Link> = Vec::new();
        let mut adopted = Vec::new();
        for role in decide::attach_order() {
            let Some(program) = programs.program_for(role) else {
                continue;
            };
            if role.is_connect()
                && let Some(names) = &children
            {
                let made = self.link_children(programs, (role, program), cgroup, names);
                if !made.is_empty() {
                    for (link, how) in made {
                        adopted.push((role.name(), how));
                        links.push(link);
                    }
                    continue;
                }
                // Not one child could be linked: at the root, behind the other
                // program, as on a kernel without children to link.
            }
            match self.execute_hook(programs, role, Some(program), &target, false) {
                Ok(Some((link, how))) => {
                    adopted.push((role.name(), how));
                    links.push(link);
                }
                Ok(None) => {}
                Err(e) => match decide::link_failed(role) {
                    LinkFailed::RelayPathOnly => {
                        tracing::warn!(error = %e, "the kernel path is unavailable: every frontend takes the relay path");
                        programs.lose_kernel_path(e);
                        // What of the kernel path was linked goes again. The marking
                        // connect programs stay: with the kernel path off, no entry
                        // asks them to mark, and they redirect as the plain ones.
                        self.attachment = Some(Attachment::new(
                            cgroup.to_path_buf(),
                            std::mem::take(&mut links),
                            Vec::new(),
                        ));
                        self.detach(programs);
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
        self.detach_unused(programs, &links, &target);
        self.settle_children(&links);
        log_adoptions(&adopted);
        Ok(&*self
            .attachment
            .insert(Attachment::new(cgroup.to_path_buf(), links, adopted)))
    }

    /// The hooks an earlier agent linked that this one does not use: detached, after
    /// this agent's own were linked.
    fn detach_unused(
        &mut self,
        programs: &impl LoadedPrograms,
        links: &[Link],
        target: &Target<'_>,
    ) {
        if self.pins().is_none() {
            return;
        }
        for role in decide::attach_order() {
            // A connect hook linked at the root's children has its root link
            // settled by `settle_children`.
            if links.iter().any(|l| l.role == role) {
                continue;
            }
            if let Err(e) = self.execute_hook(programs, role, None, target, false) {
                tracing::warn!(hook = role.name(), error = %e, "an earlier agent's unused link could not be detached");
            }
        }
    }

    /// Observes `role`'s pinned link (and the one of a layout being handed over),
    /// decides, and acts: `program` is what this agent runs there (`None`: it does
    /// not use the hook), `frontends_live` whether its frontends are. The link made,
    /// adopted or taken over, and how.
    fn execute_hook(
        &mut self,
        programs: &impl LoadedPrograms,
        role: Role,
        program: Option<&'static str>,
        target: &Target<'_>,
        frontends_live: bool,
    ) -> Result<Option<(Link, Adoption)>, DatapathError> {
        let error = |op: &'static str| link_error(role, target.path, op);
        let (target_fd, target_id) = self.target_of(role, target).map_err(error("read"))?;
        let (mut pinned, old) = self.observe_hook(role, target, target_id)?;
        // Another layout's links are at the root only.
        let (mut theirs_seen, theirs) = match (&self.handover, target.child) {
            (Some(h), None) => h.observe(&self.kernel, role, target_id, target.path)?,
            _ => (PinnedLink::Absent, None),
        };
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
                    self.detach_unused_link(role, target, old.as_ref());
                    return Ok(None);
                }
                (Hook::Defer, _) => {
                    if let Some(h) = self.handover.as_mut() {
                        h.defer(role);
                    }
                    return Ok(None);
                }
                (Hook::Leave, _) | (_, None) => return Ok(None),
                (_, Some(name)) => name,
            };
            let prog = programs.program_fd(role, name, target.path)?;
            let how = match action {
                Hook::TakeOverLink => {
                    if let Some(t) = &theirs
                        && let Some(done) = take_over_link(
                            &self.kernel,
                            self.pins(),
                            (role, name),
                            &prog,
                            t,
                            target.path,
                        )?
                    {
                        return Ok(Some(done));
                    }
                    // Its cgroup went away: a new link of this agent's, decided again.
                    theirs_seen = PinnedLink::Stale(Stale::Gone);
                    continue;
                }
                Hook::SwapInPlace => {
                    let old = old.as_ref().map(|(fd, info)| (fd, info.prog_id));
                    match self.swap_in_place((role, target.child), &prog, old, target.path)? {
                        Some(link) => {
                            let link =
                                link_of(&self.kernel, (role, target.child), name, Some(link));
                            return Ok(Some((link, Adoption::Swapped)));
                        }
                        // The link cannot be updated (its cgroup went away): observed
                        // anew as stale, and decided again.
                        None => {
                            pinned = PinnedLink::Stale(Stale::Gone);
                            continue;
                        }
                    }
                }
                Hook::Replace(why) => Adoption::Replaced(why),
                // (the last two returned above)
                Hook::NewLink | Hook::DetachUnused | Hook::Leave | Hook::Defer => Adoption::New,
            };
            let fd = self.create_link(role, &prog, &target_fd, error("create"))?;
            pin_link(
                &self.kernel,
                self.pins(),
                (role, target.child),
                fd.as_ref(),
                &prog,
                target.path,
            )?;
            if let Some((stale, _)) = &old
                && matches!(how, Adoption::Replaced(_))
            {
                // After the new link: the hook was never without a program.
                if let Err(e) = self.kernel.link_detach(stale.as_fd()) {
                    tracing::debug!(hook = role.name(), error = %e, "the replaced link could not be detached (already gone)");
                }
            }
            return Ok(Some((
                link_of(&self.kernel, (role, target.child), name, fd),
                how,
            )));
        }
    }

    /// What `role` is linked to: the sockets map for sk_msg, else the cgroup; its
    /// descriptor and kernel id.
    fn target_of(&self, role: Role, target: &Target<'_>) -> std::io::Result<(OwnedFd, u64)> {
        if role == Role::SkMsg {
            Ok((self.sockets.0.try_clone()?, self.sockets.1))
        } else {
            Ok((target.dir.try_clone()?, target.id))
        }
    }

    /// What is pinned at `role`'s link pin at `target` (of id `target_id`), with
    /// the link and its description when there is one.
    fn observe_hook(
        &self,
        role: Role,
        target: &Target<'_>,
        target_id: u64,
    ) -> Result<(PinnedLink, Option<(OwnedFd, LinkInfo)>), DatapathError> {
        let cgroup = target.path;
        let error = |op: &'static str| link_error(role, cgroup, op);
        let Some(pins) = self.pins() else {
            return Ok((PinnedLink::NotPinning, None));
        };
        let link = match self.kernel.open_pinned(&target.link_pin(pins, role)) {
            Ok(link) => link,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Ok((PinnedLink::Absent, None));
            }
            Err(e) => return Err(error("read")(e)),
        };
        let info = self.kernel.link_info(link.as_fd()).map_err(error("read"))?;
        let mut pinned = decide::pinned_link(role, &info, target_id);
        if pinned == PinnedLink::Matches
            && self.order.flags(role) != 0
            && let Some(front) = running_in_front(role, cgroup, info.prog_id)
        {
            pinned = PinnedLink::Behind(front);
        }
        Ok((pinned, Some((link, info))))
    }

    /// Swaps `prog` into the pinned link `old` (with the id of the program it runs),
    /// compare-and-swap against the program pinned beside it when that is the one it
    /// runs, and pins `prog` there. The link, or `None` when the kernel says it can
    /// no longer be updated (ENOLINK: its cgroup went away).
    fn swap_in_place(
        &self,
        (role, child): (Role, Option<&str>),
        prog: &OwnedFd,
        old: Option<(&OwnedFd, u32)>,
        cgroup: &Path,
    ) -> Result<Option<OwnedFd>, DatapathError> {
        let error = |op: &'static str| link_error(role, cgroup, op);
        let (Some(pins), Some((link, running))) = (self.pins(), old) else {
            return Ok(None);
        };
        let prog_pin = pins.prog(role);
        if !update_link(&self.kernel, role, link, prog, (&prog_pin, running), cgroup)? {
            return Ok(None);
        }
        // At a child, repinned once every child has its link (`link_children`).
        if child.is_none() {
            repin(&self.kernel, &prog_pin, prog).map_err(error("pin"))?;
        }
        let link = link.try_clone().map_err(error("read"))?;
        Ok(Some(link))
    }

    /// Detaches and unpins an earlier agent's link at a hook this agent does not use
    /// (at `target`; the program's pin goes with the root's link only).
    fn detach_unused_link(
        &self,
        role: Role,
        target: &Target<'_>,
        old: Option<&(OwnedFd, LinkInfo)>,
    ) {
        let Some(pins) = self.pins() else {
            return;
        };
        if let Some((fd, _)) = old {
            match self.kernel.link_detach(fd.as_fd()) {
                Ok(()) => tracing::info!(
                    hook = role.name(),
                    "an earlier agent's link this agent does not use: detached"
                ),
                Err(e) => {
                    tracing::warn!(hook = role.name(), error = %e, "an earlier agent's unused link could not be detached")
                }
            }
        }
        let _ = self.kernel.unpin(&target.link_pin(pins, role));
        if target.child.is_none() {
            let _ = self.kernel.unpin(&pins.prog(role));
        }
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
        let flags = self.order.flags(role);
        match self
            .kernel
            .link_create(prog.as_fd(), target.as_fd(), role.attach_type(), flags)
        {
            Ok(fd) => Ok(Some(fd)),
            Err(e)
                if role == Role::SkMsg
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
                    ) =>
            {
                tracing::debug!(error = %e, "no sockmap links on this kernel: sk_msg attaches to the map");
                self.kernel
                    .map_attach(prog.as_fd(), target.as_fd(), role.attach_type())
                    .map(|()| None)
                    .map_err(error)
            }
            Err(e) => Err(error(e)),
        }
    }

    /// Completes a hand-over once this agent's frontends are live (its first apply
    /// is done): its connect programs are swapped into the other layout's connect
    /// links in place, and that layout goes once the sockets it marked have their
    /// header (in the background, for at most [`takeover::RETIRE_MAX`]). Whether
    /// there was one to complete. A connect hook that cannot be taken over keeps the
    /// other layout's program until the layout goes, and the log says so.
    pub(crate) fn complete_handover(&mut self, programs: &impl LoadedPrograms) -> bool {
        let Some(deferred) = self.handover.as_ref().map(|h| h.deferred().to_vec()) else {
            return false;
        };
        let cgroup = self.attachment.as_ref().map(|a| a.cgroup.clone());
        let target = cgroup.as_deref().map(|c| Target::open(&self.kernel, c));
        match target {
            Some(Ok(target)) => {
                for role in deferred {
                    self.take_over_deferred(programs, role, &target);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the hand-over cannot complete: the cgroup cannot be opened");
            }
            None => {}
        }
        if let Some(h) = self.handover.take() {
            takeover::retire(h.finish());
        }
        true
    }

    /// Takes over the other layout's link at the deferred connect hook `role`.
    fn take_over_deferred(
        &mut self,
        programs: &impl LoadedPrograms,
        role: Role,
        target: &Target<'_>,
    ) {
        let Some(program) = programs.program_for(role) else {
            return;
        };
        match self.execute_hook(programs, role, Some(program), target, true) {
            Ok(Some((link, how))) => {
                if let Some(att) = self.attachment.as_mut() {
                    att.push(link, role.name(), how);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(hook = role.name(), error = %e, "the other layout's connect link could not be taken over: its program serves until that layout goes");
            }
        }
    }

    /// Detaches the connect programs only (and after them the setsockopt program,
    /// which serves only them), and unpins them: from now on no connect is
    /// redirected or marked. sock_ops stays, so sockets already marked still enter
    /// the sockets map at their handshake and leave it at their first RTT sample (or
    /// close), and sk_msg stays on the map, so they still get their header. Whether
    /// sock_ops is still attached: then the sockets map is worth waiting for before
    /// [`Links::detach`].
    pub(crate) fn detach_connect(&mut self, programs: &impl LoadedPrograms) -> bool {
        self.detach_roles(programs, |r| !matches!(r, Role::SockOps | Role::SkMsg));
        self.attachment
            .as_ref()
            .is_some_and(|a| a.links.iter().any(|l| l.role == Role::SockOps))
    }

    /// Detaches whatever is still attached, in [`decide::detach_order`], and unpins
    /// their links.
    pub(crate) fn detach(&mut self, programs: &impl LoadedPrograms) {
        self.detach_roles(programs, |_| true);
        self.attachment = None;
    }

    /// Detaches the links of the roles `which` picks, in [`decide::detach_order`].
    fn detach_roles(&mut self, programs: &impl LoadedPrograms, which: impl Fn(Role) -> bool) {
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
        let cgroup = att.cgroup.clone();
        for l in gone {
            let detached = match &l.fd {
                Some(fd) => self.kernel.link_detach(fd.as_fd()),
                None => programs
                    .program_fd(l.role, l.program, &cgroup)
                    .ok()
                    .map_or(Ok(()), |p| {
                        self.kernel.map_detach(
                            p.as_fd(),
                            self.sockets.0.as_fd(),
                            l.role.attach_type(),
                        )
                    }),
            };
            if let Err(e) = detached {
                tracing::warn!(hook = l.role.name(), error = %e, "detach failed");
            }
            if let Some(pins) = self.pinning.dir() {
                let _ = self.kernel.unpin(&pins.link_at(l.role, l.child.as_deref()));
                let _ = self.kernel.unpin(&pins.prog(l.role));
            }
        }
    }

    /// Removes the datapath: detaches every link and removes every pin (links,
    /// programs, maps), so nothing of hairpin stays in the kernel once this process
    /// exits. For an uninstall, and for a failed attach.
    pub(crate) fn uninstall(&mut self, programs: &impl LoadedPrograms) {
        self.detach(programs);
        if let Some(pins) = self.pins() {
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

/// The programs that run before `running` (the pinned link's program) at `role`
/// in `cgroup`, named for the log and `status`; `None` when it runs first, or when
/// the hook cannot be listed (then it is adopted as it stands, and `status` says
/// what the kernel lists once attached).
fn running_in_front(role: Role, cgroup: &Path, running: u32) -> Option<Vec<ForeignProgram>> {
    match order::observe(cgroup, role, running) {
        Ok(hook) if hook.attached && !hook.in_front.is_empty() => Some(hook.in_front),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(hook = role.name(), error = %e, "the connect programs at the cgroup could not be listed");
            None
        }
    }
}
