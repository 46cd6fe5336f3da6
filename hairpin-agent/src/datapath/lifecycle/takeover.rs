//! The executor's hand-over of another layout's live datapath, whose agent has
//! exited (this one holds the pin directory's lock): this agent's programs in place
//! before the other layout's go, so no instant is without a program, never two that
//! mark at once, and no socket the other layout marked goes without its header.
//!
//! 1. At attach, this agent's consumers (sk_msg, sock_ops, setsockopt) are linked
//!    beside the other layout's; the connect hooks keep the other layout's links and
//!    programs, which still find their own frontends (decide: `Hook::Defer`).
//! 2. Once this agent's frontends are live ([`Datapath::complete_handover`], after
//!    its first apply), its connect programs are swapped into those links in place
//!    (`Hook::TakeOverLink`), which are pinned as this layout's from then on.
//! 3. The other layout's consumers stay until the sockets its connect programs
//!    marked have their header (a handshake settles, its sockets map empties, for
//!    at most [`RETIRE_MAX`]); then the whole layout is removed.
//!
//! Part of the one executor (execute.rs): never decides, only observes and acts.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{Map, MapData, SockHash};
use hairpin_ebpf::MAP_SOCKETS;

use super::super::{
    Adoption, Datapath, DatapathError, Role, attach::Link, kernel_path::HANDSHAKE_SETTLE, pin, sys,
};
use super::{
    decide,
    execute::{Target, link_error, link_of, update_link},
    state::{ForeignLayout, PinnedLink},
};

/// The longest the other layout's consumers stay for the sockets it marked.
pub const RETIRE_MAX: Duration = Duration::from_secs(30);

/// How often the other layout's sockets map is read while it drains.
const RETIRE_POLL: Duration = Duration::from_millis(100);

/// A hand-over of other layouts' live datapaths under way.
#[derive(Debug)]
pub(in crate::datapath) struct Handover {
    /// Their layout directories.
    from: Vec<PathBuf>,
    /// The connect hooks still running their programs, until this agent's
    /// frontends are live.
    pub(super) deferred: Vec<Role>,
}

impl Handover {
    /// A hand-over of `live`.
    pub(super) fn of(live: &[ForeignLayout]) -> Handover {
        Handover {
            from: live.iter().map(|l| l.dir.clone()).collect(),
            deferred: Vec::new(),
        }
    }
}

/// The other layout's link at a hook: its descriptor, description and layout
/// directory.
pub(super) type Theirs = (OwnedFd, sys::LinkInfo, PathBuf);

impl Datapath {
    /// What the layouts being handed over pinned at `role` (the first that has a
    /// link there), with the link. `Absent` when none is being handed over.
    pub(super) fn observe_foreign(
        &self,
        role: Role,
        target_id: u64,
        cgroup: &Path,
    ) -> Result<(PinnedLink, Option<Theirs>), DatapathError> {
        let Some(h) = &self.handover else {
            return Ok((PinnedLink::Absent, None));
        };
        for dir in &h.from {
            let path = dir.join("links").join(role.name());
            let link = match sys::open_pinned(&path) {
                Ok(link) => link,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(link_error(role, cgroup, "read")(e)),
            };
            let info = sys::link_info(link.as_fd()).map_err(link_error(role, cgroup, "read"))?;
            let seen = decide::pinned_link(role, &info, target_id);
            return Ok((seen, Some((link, info, dir.clone()))));
        }
        Ok((PinnedLink::Absent, None))
    }

    /// Swaps `prog` (the program `name`) into the other layout's link `theirs` in
    /// place, compare-and-swap against the program pinned beside it, and pins the
    /// link and `prog` as this layout's, their pins gone. `None` when the kernel
    /// says the link can no longer be updated (ENOLINK: its cgroup went away).
    pub(super) fn take_over_link(
        &self,
        role: Role,
        name: &'static str,
        prog: &OwnedFd,
        theirs: &Theirs,
        cgroup: &Path,
    ) -> Result<Option<(Link, Adoption)>, DatapathError> {
        let (link, info, dir) = theirs;
        let their_prog = dir.join("progs").join(role.name());
        if !update_link(role, link, prog, (&their_prog, info.prog_id), cgroup)? {
            return Ok(None);
        }
        let link = link.try_clone().map_err(link_error(role, cgroup, "read"))?;
        self.pin_link(role, Some(&link), prog, cgroup)?;
        let _ = pin::unpin(&dir.join("links").join(role.name()));
        let _ = pin::unpin(&their_prog);
        let from = dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        tracing::info!(hook = role.name(), layout = %from, "handed over: this agent's program swapped into the other layout's link in place");
        Ok(Some((
            link_of(role, name, Some(link)),
            Adoption::TakenOver(from),
        )))
    }

    /// Whether a hand-over of another layout's datapath waits for this agent's
    /// frontends to be live.
    pub fn handover_pending(&self) -> bool {
        self.handover.is_some()
    }

    /// Completes a hand-over once this agent's frontends are live (its first apply
    /// is done): its connect programs are swapped into the other layout's connect
    /// links in place, and that layout goes once the sockets it marked have their
    /// header (in the background, for at most [`RETIRE_MAX`]). Whether there was one
    /// to complete. A connect hook that cannot be taken over keeps the other
    /// layout's program until the layout goes, and the log says so.
    pub fn complete_handover(&mut self) -> bool {
        let Some(deferred) = self.handover.as_ref().map(|h| h.deferred.clone()) else {
            return false;
        };
        let cgroup = self.attachment.as_ref().map(|a| a.cgroup.clone());
        let target = cgroup.as_deref().map(Target::open);
        match target {
            Some(Ok(target)) => {
                for role in deferred {
                    self.take_over_deferred(role, &target);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the hand-over cannot complete: the cgroup cannot be opened");
            }
            None => {}
        }
        let from = self.handover.take().map(|h| h.from).unwrap_or_default();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(retire_layouts(from));
            }
            Err(_) => remove_layouts(&from),
        }
        true
    }

    /// Takes over the other layout's link at the deferred connect hook `role`.
    fn take_over_deferred(&mut self, role: Role, target: &Target<'_>) {
        let Some(program) = self.program_for(role) else {
            return;
        };
        match self.execute_hook(role, Some(program), target, true) {
            Ok(Some((link, how))) => {
                if let Some(att) = self.attachment.as_mut() {
                    att.adopted.push((role.name(), how));
                    att.links.push(link);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(hook = role.name(), error = %e, "the other layout's connect link could not be taken over: its program serves until that layout goes");
            }
        }
    }
}

/// Once a handshake under way has settled, waits for each layout's sockets map to
/// empty (every socket its connect programs marked has its header), for at most
/// [`RETIRE_MAX`], then removes the layout: its consumers' links detached, every
/// pin gone.
async fn retire_layouts(dirs: Vec<PathBuf>) {
    tokio::time::sleep(HANDSHAKE_SETTLE).await;
    let deadline = tokio::time::Instant::now() + RETIRE_MAX;
    for dir in &dirs {
        loop {
            match sockets_in(dir) {
                Some(0) | None => break,
                Some(n) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(layout = %dir.display(), sockets = n, "the other layout's sockets did not all write their header in time: they go without it");
                    break;
                }
                Some(_) => tokio::time::sleep(RETIRE_POLL).await,
            }
        }
    }
    remove_layouts(&dirs);
}

/// Removes each layout directory's datapath, logging what could not go.
fn remove_layouts(dirs: &[PathBuf]) {
    for dir in dirs {
        tracing::info!(layout = %dir.display(), "the other layout's datapath is handed over: removed");
        for r in pin::remove_layout(dir) {
            if let Err(e) = r.result {
                tracing::warn!(pin = %r.path.display(), error = %e, "could not remove");
            }
        }
    }
}

/// Sockets in the sockets map pinned in the layout directory `dir` (`None`: it
/// cannot be read as one, as a layout that changed its key would be).
fn sockets_in(dir: &Path) -> Option<usize> {
    let data = MapData::from_pin(dir.join("maps").join(MAP_SOCKETS)).ok()?;
    let map = SockHash::<MapData, u64>::try_from(Map::SockHash(data)).ok()?;
    Some(map.keys().count())
}
