//! The executor's steps at one hook, shared by the links' executor (execute.rs) and
//! its hand-over (takeover.rs): where the hooks are ([`Target`]), a compare-and-swap
//! of a link's program, pinning a link and its program, the record of a link made,
//! and the error of each step. Every call goes through the seam (kernel.rs).
//!
//! Owns no state. Never decides (decide.rs does).

use std::{
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use super::kernel::LinkKernel;
use crate::datapath::attach::Link;
use crate::datapath::error::DatapathError;
use crate::datapath::pin::PinDir;
use crate::datapath::role::Role;

/// Where the hooks are: the cgroup's directory, open, and its id; `child` names it
/// when it is one of the root's child cgroups (connect links only, on a kernel that
/// cannot order cgroup links: see datapath/children.rs).
pub(super) struct Target<'a> {
    pub(super) path: &'a Path,
    pub(super) dir: OwnedFd,
    pub(super) id: u64,
    pub(super) child: Option<&'a str>,
}

impl<'a> Target<'a> {
    /// The cgroup v2 directory `cgroup`, opened.
    pub(super) fn open(
        kernel: &impl LinkKernel,
        cgroup: &'a Path,
    ) -> Result<Target<'a>, DatapathError> {
        let (dir, id) = kernel
            .open_cgroup(cgroup)
            .map_err(|source| DatapathError::Cgroup {
                path: cgroup.to_path_buf(),
                source,
            })?;
        Ok(Target {
            path: cgroup,
            dir,
            id,
            child: None,
        })
    }

    /// The root's child cgroup `name` at `path`, opened.
    pub(super) fn open_child(
        kernel: &impl LinkKernel,
        path: &'a Path,
        name: &'a str,
    ) -> Result<Target<'a>, DatapathError> {
        let mut target = Target::open(kernel, path)?;
        target.child = Some(name);
        Ok(target)
    }

    /// Where the link of `role` here is pinned in `pins`.
    pub(super) fn link_pin(&self, pins: &PinDir, role: Role) -> std::path::PathBuf {
        pins.link_at(role, self.child)
    }
}

/// The error of linking `role` at `cgroup` when `op` fails.
pub(crate) fn link_error(
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

/// A [`Link`] record for `fd` (its id read from the kernel), at the root's child
/// cgroup `child` when it is there.
pub(super) fn link_of(
    kernel: &impl LinkKernel,
    (role, child): (Role, Option<&str>),
    program: &'static str,
    fd: Option<OwnedFd>,
) -> Link {
    let id = fd
        .as_ref()
        .and_then(|fd| kernel.link_info(fd.as_fd()).ok())
        .map(|i| i.id);
    Link {
        role,
        program,
        fd,
        id,
        child: child.map(str::to_string),
    }
}

/// Swaps `prog` into `link` in place (`BPF_LINK_UPDATE`), compare-and-swap against
/// the program pinned at `expected.0` when that is the one the link runs (id
/// `expected.1`). `false` when the kernel says the link can no longer be updated
/// (ENOLINK: its cgroup went away).
pub(super) fn update_link(
    kernel: &impl LinkKernel,
    role: Role,
    link: &OwnedFd,
    prog: &OwnedFd,
    expected: (&Path, u32),
    cgroup: &Path,
) -> Result<bool, DatapathError> {
    let (pinned, running) = expected;
    let expected = kernel
        .open_pinned(pinned)
        .ok()
        .filter(|p| kernel.prog_id(p.as_fd()).is_ok_and(|id| id == running));
    if expected.is_none() {
        tracing::warn!(
            hook = role.name(),
            "the program the pinned link runs is not pinned beside it: swapped without compare-and-swap"
        );
    }
    match kernel.link_update(
        link.as_fd(),
        prog.as_fd(),
        expected.as_ref().map(|p| p.as_fd()),
    ) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOLINK) => Ok(false),
        Err(e) => Err(link_error(role, cgroup, "update")(e)),
    }
}

/// Pins a new link `fd` (none: sk_msg on the map the old way) and its program
/// `prog` at `role`'s pins in `pins` (the link's at the root's child cgroup `child`
/// when it is there), when the datapath is pinned.
pub(super) fn pin_link(
    kernel: &impl LinkKernel,
    pins: Option<&PinDir>,
    (role, child): (Role, Option<&str>),
    fd: Option<&OwnedFd>,
    prog: &OwnedFd,
    cgroup: &Path,
) -> Result<(), DatapathError> {
    let error = |op: &'static str| link_error(role, cgroup, op);
    let Some(pins) = pins else {
        return Ok(());
    };
    if let Some(fd) = fd {
        let link_pin = pins.link_at(role, child);
        let _ = kernel.unpin(&link_pin);
        kernel.pin(fd.as_fd(), &link_pin).map_err(error("pin"))?;
    }
    if child.is_some() {
        // Repinned once every child has its link: until then the program pinned is
        // the one the other children's links run, their compare-and-swap's.
        return Ok(());
    }
    repin(kernel, &pins.prog(role), prog).map_err(error("pin"))
}

/// Pins `prog` at `path` in place of whatever was pinned there.
pub(super) fn repin(kernel: &impl LinkKernel, path: &Path, prog: &OwnedFd) -> std::io::Result<()> {
    kernel.unpin(path)?;
    kernel.pin(prog.as_fd(), path)
}
