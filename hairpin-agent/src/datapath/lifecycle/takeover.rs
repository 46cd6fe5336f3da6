//! The executor's hand-over of another layout's live datapath, whose agent has
//! exited (this one holds the pin directory's lock): this agent's programs in place
//! before the other layout's go, so no instant is without a program, never two that
//! mark at once, and no socket the other layout marked goes without its header.
//!
//! 1. At attach, this agent's consumers (sk_msg, sock_ops, setsockopt) are linked
//!    beside the other layout's; the connect hooks keep the other layout's links and
//!    programs, which still find their own frontends (decide: `Hook::Defer`).
//! 2. Once this agent's frontends are live (the links' `complete_handover`, after
//!    its first apply), its connect programs are swapped into those links in place
//!    (`Hook::TakeOverLink`), which are pinned as this layout's from then on.
//! 3. The other layout's consumers stay until the sockets its connect programs
//!    marked have their header (a handshake settles, its sockets map empties, for
//!    at most [`RETIRE_MAX`]); then the whole layout is removed.
//!
//! Part of the one executor (execute.rs, which owns the [`Handover`] value): never
//! decides, only observes and acts, through the seam (kernel.rs).

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{Map, MapData, SockHash};
use hairpin_ebpf::MAP_SOCKETS;

use super::decide;
use super::decide::HANDSHAKE_SETTLE;
use super::hook::{link_error, link_of, pin_link, update_link};
use super::kernel::LinkKernel;
use super::state::{ForeignLayout, PinnedLink};
use crate::datapath::attach::{Adoption, Link};
use crate::datapath::error::DatapathError;
use crate::datapath::pin::{self, PinDir};
use crate::datapath::role::Role;
use crate::datapath::sys::LinkInfo;

/// The longest the other layout's consumers stay for the sockets it marked.
pub(crate) const RETIRE_MAX: Duration = Duration::from_secs(30);

/// How often the other layout's sockets map is read while it drains.
const RETIRE_POLL: Duration = Duration::from_millis(100);

/// A hand-over of other layouts' live datapaths under way.
#[derive(Debug)]
pub(crate) struct Handover {
    /// Their layout directories.
    from: Vec<PathBuf>,
    /// The connect hooks still running their programs, until this agent's
    /// frontends are live.
    deferred: Vec<Role>,
}

/// The other layout's link at a hook: its descriptor, description and layout
/// directory.
pub(super) type Theirs = (OwnedFd, LinkInfo, PathBuf);

impl Handover {
    /// A hand-over of `live`.
    pub(crate) fn of(live: &[ForeignLayout]) -> Handover {
        Handover {
            from: live.iter().map(|l| l.dir.clone()).collect(),
            deferred: Vec::new(),
        }
    }

    /// `role` keeps the other layout's link until this agent's frontends are live.
    pub(super) fn defer(&mut self, role: Role) {
        self.deferred.push(role);
    }

    /// The connect hooks deferred so far.
    pub(super) fn deferred(&self) -> &[Role] {
        &self.deferred
    }

    /// The layouts handed over, once the hand-over completes.
    pub(super) fn finish(self) -> Vec<PathBuf> {
        self.from
    }

    /// What the layouts being handed over pinned at `role` (the first that has a
    /// link there), with the link.
    pub(super) fn observe(
        &self,
        kernel: &impl LinkKernel,
        role: Role,
        target_id: u64,
        cgroup: &Path,
    ) -> Result<(PinnedLink, Option<Theirs>), DatapathError> {
        for dir in &self.from {
            let path = dir.join("links").join(role.name());
            let link = match kernel.open_pinned(&path) {
                Ok(link) => link,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(link_error(role, cgroup, "read")(e)),
            };
            let info = kernel
                .link_info(link.as_fd())
                .map_err(link_error(role, cgroup, "read"))?;
            let seen = decide::pinned_link(role, &info, target_id);
            return Ok((seen, Some((link, info, dir.clone()))));
        }
        Ok((PinnedLink::Absent, None))
    }
}

/// Swaps `prog` (the program `name`) into the other layout's link `theirs` in
/// place, compare-and-swap against the program pinned beside it, and pins the
/// link and `prog` as this layout's in `pins`, their pins gone. `None` when the
/// kernel says the link can no longer be updated (ENOLINK: its cgroup went away).
pub(super) fn take_over_link(
    kernel: &impl LinkKernel,
    pins: Option<&PinDir>,
    (role, name): (Role, &'static str),
    prog: &OwnedFd,
    theirs: &Theirs,
    cgroup: &Path,
) -> Result<Option<(Link, Adoption)>, DatapathError> {
    let (link, info, dir) = theirs;
    let their_prog = dir.join("progs").join(role.name());
    if !update_link(
        kernel,
        role,
        link,
        prog,
        (&their_prog, info.prog_id),
        cgroup,
    )? {
        return Ok(None);
    }
    let link = link.try_clone().map_err(link_error(role, cgroup, "read"))?;
    pin_link(kernel, pins, (role, None), Some(&link), prog, cgroup)?;
    let _ = kernel.unpin(&dir.join("links").join(role.name()));
    let _ = kernel.unpin(&their_prog);
    let from = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    tracing::info!(hook = role.name(), layout = %from, "handed over: this agent's program swapped into the other layout's link in place");
    Ok(Some((
        link_of(kernel, (role, None), name, Some(link)),
        Adoption::TakenOver(from),
    )))
}

/// Retires the layouts handed over: in the background once the sockets they
/// marked have their header (for at most [`RETIRE_MAX`]), or at once without a
/// runtime.
pub(super) fn retire(from: Vec<PathBuf>) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(retire_layouts(from));
        }
        Err(_) => remove_layouts(&from),
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
