//! The executor's seam: what it needs from outside the links, as two traits. The
//! kernel's calls ([`LinkKernel`]: open the cgroup, create, update, detach, pin,
//! unpin, describe a link) go through one value the executor is generic over, so
//! unit tests replace the kernel (fake.rs) and assert the order of the calls without
//! root, as aya's `sys/fake.rs` does; [`Sys`] is the real one, over sys.rs. The
//! loaded programs ([`LoadedPrograms`]) say which program runs at a hook and give its
//! descriptor.
//!
//! Owns nothing but the seam. Never decides and never keeps state.

use std::{
    fs::File,
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::Path,
};

use crate::datapath::error::DatapathError;
use crate::datapath::role::Role;
use crate::datapath::sys::{self, AttachType, LinkInfo};

/// The bpf(2) and filesystem calls the executor makes, one method each.
pub(crate) trait LinkKernel {
    /// Opens the cgroup v2 directory `path`: its descriptor and its id.
    fn open_cgroup(&self, path: &Path) -> io::Result<(OwnedFd, u64)>;
    /// `BPF_LINK_CREATE` of `prog` at `target` (see [`sys::link_create`]).
    fn link_create(
        &self,
        prog: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        attach: AttachType,
        flags: u32,
    ) -> io::Result<OwnedFd>;
    /// `BPF_PROG_ATTACH` of `prog` to a sockmap (see [`sys::map_attach`]).
    fn map_attach(
        &self,
        prog: BorrowedFd<'_>,
        map: BorrowedFd<'_>,
        attach: AttachType,
    ) -> io::Result<()>;
    /// `BPF_PROG_DETACH` of `prog` from a sockmap (see [`sys::map_detach`]).
    fn map_detach(
        &self,
        prog: BorrowedFd<'_>,
        map: BorrowedFd<'_>,
        attach: AttachType,
    ) -> io::Result<()>;
    /// `BPF_LINK_UPDATE`, with `BPF_F_REPLACE` against `old` when given.
    fn link_update(
        &self,
        link: BorrowedFd<'_>,
        new: BorrowedFd<'_>,
        old: Option<BorrowedFd<'_>>,
    ) -> io::Result<()>;
    /// `BPF_LINK_DETACH`.
    fn link_detach(&self, link: BorrowedFd<'_>) -> io::Result<()>;
    /// What the kernel says of a link.
    fn link_info(&self, link: BorrowedFd<'_>) -> io::Result<LinkInfo>;
    /// The id of a program.
    fn prog_id(&self, prog: BorrowedFd<'_>) -> io::Result<u32>;
    /// `BPF_PROG_QUERY`: the ids of the programs attached at the cgroup `target`'s
    /// hook `attach`, in the order they run there.
    fn prog_query(&self, target: BorrowedFd<'_>, attach: AttachType) -> io::Result<Vec<u32>>;
    /// The child cgroups of the cgroup v2 directory `path`, by name, sorted.
    fn child_cgroups(&self, path: &Path) -> io::Result<Vec<String>>;
    /// The names of the pins in the directory `dir`, sorted (none when it is missing).
    fn pins_in(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// `BPF_OBJ_GET`: the object pinned at `path`.
    fn open_pinned(&self, path: &Path) -> io::Result<OwnedFd>;
    /// `BPF_OBJ_PIN` of `fd` at `path`.
    fn pin(&self, fd: BorrowedFd<'_>, path: &Path) -> io::Result<()>;
    /// Removes the pin at `path`; one already gone is fine.
    fn unpin(&self, path: &Path) -> io::Result<()>;
}

/// The real kernel: sys.rs's calls and the filesystem.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sys;

impl LinkKernel for Sys {
    fn open_cgroup(&self, path: &Path) -> io::Result<(OwnedFd, u64)> {
        let dir = File::open(path)?;
        let id = sys::cgroup_id(&dir)?;
        Ok((dir.into(), id))
    }

    fn link_create(
        &self,
        prog: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        attach: AttachType,
        flags: u32,
    ) -> io::Result<OwnedFd> {
        sys::link_create(prog, target, attach, flags)
    }

    fn map_attach(
        &self,
        prog: BorrowedFd<'_>,
        map: BorrowedFd<'_>,
        attach: AttachType,
    ) -> io::Result<()> {
        sys::map_attach(prog, map, attach)
    }

    fn map_detach(
        &self,
        prog: BorrowedFd<'_>,
        map: BorrowedFd<'_>,
        attach: AttachType,
    ) -> io::Result<()> {
        sys::map_detach(prog, map, attach)
    }

    fn link_update(
        &self,
        link: BorrowedFd<'_>,
        new: BorrowedFd<'_>,
        old: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        sys::link_update(link, new, old)
    }

    fn link_detach(&self, link: BorrowedFd<'_>) -> io::Result<()> {
        sys::link_detach(link)
    }

    fn link_info(&self, link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
        sys::link_info(link)
    }

    fn prog_id(&self, prog: BorrowedFd<'_>) -> io::Result<u32> {
        sys::prog_id(prog)
    }

    fn prog_query(&self, target: BorrowedFd<'_>, attach: AttachType) -> io::Result<Vec<u32>> {
        sys::prog_query(target, attach)
    }

    fn child_cgroups(&self, path: &Path) -> io::Result<Vec<String>> {
        crate::datapath::children::list(path)
    }

    fn pins_in(&self, dir: &Path) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for e in entries {
            // A name that is not UTF-8 is none the agent pins.
            if let Ok(name) = e?.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn open_pinned(&self, path: &Path) -> io::Result<OwnedFd> {
        sys::open_pinned(path)
    }

    fn pin(&self, fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
        sys::pin(fd.as_fd(), path)
    }

    fn unpin(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// What the executor needs of the loaded programs.
pub(crate) trait LoadedPrograms {
    /// The program this agent runs at `role`, if it uses the hook.
    fn program_for(&self, role: Role) -> Option<&'static str>;
    /// A descriptor of the loaded program `name`, to link at `role` in `cgroup`.
    fn program_fd(
        &self,
        role: Role,
        name: &'static str,
        cgroup: &Path,
    ) -> Result<OwnedFd, DatapathError>;
    /// A kernel path hook could not be linked (`why`): from now on the kernel path
    /// is unavailable, and [`LoadedPrograms::program_for`] names no kernel path
    /// program.
    fn lose_kernel_path(&mut self, why: DatapathError);
}
