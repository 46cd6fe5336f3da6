//! The few bpf(2) commands aya 0.14 does not offer for cgroup programs: creating a
//! bpf_link the agent owns (and may pin), swapping a link's program in place
//! (`BPF_LINK_UPDATE` with `BPF_F_REPLACE`), detaching a pinned link, pinning and
//! opening objects, and reading a link's or program's info. aya still loads the
//! programs and creates the maps; this module only handles their descriptors.
//!
//! Every command here checks no capability beyond file access to a pin (opening a
//! pinned link or map), except link creation, which needs what attaching needs
//! (CAP_NET_ADMIN for cgroup programs, CAP_BPF).

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

/// `enum bpf_cmd` values used here.
mod cmd {
    pub(super) const OBJ_PIN: libc::c_long = 6;
    pub(super) const OBJ_GET: libc::c_long = 7;
    pub(super) const PROG_ATTACH: libc::c_long = 8;
    pub(super) const PROG_DETACH: libc::c_long = 9;
    pub(super) const PROG_GET_FD_BY_ID: libc::c_long = 13;
    pub(super) const OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    pub(super) const PROG_QUERY: libc::c_long = 16;
    pub(super) const LINK_CREATE: libc::c_long = 28;
    pub(super) const LINK_UPDATE: libc::c_long = 29;
    pub(super) const LINK_DETACH: libc::c_long = 34;
}

/// `BPF_F_REPLACE`: the update happens only if the link still runs `old_prog_fd`.
const BPF_F_REPLACE: u32 = 1 << 2;

/// `BPF_F_BEFORE` at `BPF_LINK_CREATE` on a cgroup: the new link runs before the
/// program or link `relative_fd`/`relative_id` names, or, with 0 there, before
/// every one attached at that cgroup for that attach type. Kernels without cgroup
/// link ordering refuse any flag there with EINVAL.
pub(crate) const BPF_F_BEFORE: u32 = 1 << 3;

/// `enum bpf_attach_type` values of hairpin's programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AttachType {
    /// `BPF_CGROUP_SOCK_OPS`.
    SockOps = 3,
    /// `BPF_SK_MSG_VERDICT` (on a sockmap or sockhash).
    SkMsgVerdict = 7,
    /// `BPF_CGROUP_INET4_CONNECT`.
    Connect4 = 10,
    /// `BPF_CGROUP_INET6_CONNECT`.
    Connect6 = 11,
    /// `BPF_CGROUP_SETSOCKOPT`.
    SetSockopt = 22,
}

impl AttachType {
    /// The value as the kernel numbers it.
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// `BPF_LINK_TYPE_CGROUP`.
pub(crate) const LINK_TYPE_CGROUP: u32 = 3;
/// `BPF_LINK_TYPE_SOCKMAP` (6.10 and newer).
pub(crate) const LINK_TYPE_SOCKMAP: u32 = 14;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a #[repr(C)] prefix of `union bpf_attr` for `cmd`, zeroed
    // beyond the fields set (the kernel checks the bytes it does not know are 0),
    // and its size is passed with it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A bpf(2) command `cmd` that returns a new descriptor (a program or link made, an
/// object opened): the descriptor, which this process then owns. For commands this
/// module does not wrap (the suites load their own small programs with it).
///
/// # Safety
///
/// `attr` must be a `#[repr(C)]` prefix of `union bpf_attr` for `cmd`, zeroed beyond
/// the fields set, and every address in it must be valid for what `cmd` reads or
/// writes there (instructions, a license, a log buffer) for the whole call.
#[cfg(feature = "testing")]
pub unsafe fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    bpf(cmd, attr).map(new_fd)
}

fn new_fd(r: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a fresh descriptor this process now owns.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a pin path"))
}

#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// Pins the object behind `fd` (a link, program or map) at `path` on a bpf
/// filesystem. EEXIST when something is pinned there already.
pub(crate) fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let p = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: p.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        ..ObjAttr::default()
    };
    bpf(cmd::OBJ_PIN, &mut attr).map(|_| ())
}

/// Opens the object pinned at `path`, read-write (a link must be opened so to be
/// updated or detached).
pub(crate) fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    open_pinned_with(path, 0)
}

/// `BPF_F_RDONLY` (`file_flags` of BPF_OBJ_GET): a map descriptor that can look up
/// but never update or delete.
const BPF_F_RDONLY: u32 = 1 << 3;

/// Opens the map pinned at `path` read-only: it needs read access to the pin only,
/// and nothing can be written through it. (The kernel opens links read-write only.)
pub(crate) fn open_pinned_read_only(path: &Path) -> io::Result<OwnedFd> {
    open_pinned_with(path, BPF_F_RDONLY)
}

fn open_pinned_with(path: &Path, file_flags: u32) -> io::Result<OwnedFd> {
    let p = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: p.as_ptr() as u64,
        file_flags,
        ..ObjAttr::default()
    };
    bpf(cmd::OBJ_GET, &mut attr).map(new_fd)
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    // The per-type union that follows (unused for cgroup and sockmap links).
    _rest: [u64; 4],
}

/// Attaches the program `prog` to `target` (a cgroup directory, or a sockmap /
/// sockhash for [`AttachType::SkMsgVerdict`]) through a new bpf_link: with `flags`
/// 0 after every program already there, with [`BPF_F_BEFORE`] (and the relative fd
/// or id left 0) before every one. The link lasts while its descriptor or a pin of
/// it does.
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach: AttachType,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: target.as_raw_fd() as u32,
        attach_type: attach.raw(),
        flags,
        ..LinkCreateAttr::default()
    };
    bpf(cmd::LINK_CREATE, &mut attr).map(new_fd)
}

/// `BPF_LINK_CREATE` of `prog` at `attach` with `flags` and no target (fd -1): a
/// probe of the flags, which attaches nothing. A kernel that takes the flags fails
/// on the target (EBADF); one that does not, on the flags (EINVAL).
pub(crate) fn link_create_without_target(
    prog: BorrowedFd<'_>,
    attach: AttachType,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: u32::MAX,
        attach_type: attach.raw(),
        flags,
        ..LinkCreateAttr::default()
    };
    bpf(cmd::LINK_CREATE, &mut attr).map(new_fd)
}

#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

/// The ids of the programs attached at the cgroup `target` for `attach`, in the
/// order they run (the kernel lists a cgroup's own programs so; those of its
/// ancestors, which run after them, are not listed). Needs CAP_NET_ADMIN.
pub(crate) fn prog_query(target: BorrowedFd<'_>, attach: AttachType) -> io::Result<Vec<u32>> {
    let mut room = 16usize;
    loop {
        let mut ids = vec![0u32; room];
        let mut attr = ProgQueryAttr {
            target_fd: target.as_raw_fd() as u32,
            attach_type: attach.raw(),
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: room as u32,
            ..ProgQueryAttr::default()
        };
        match bpf(cmd::PROG_QUERY, &mut attr) {
            Ok(_) => {
                ids.truncate(attr.prog_cnt as usize);
                return Ok(ids);
            }
            // More programs than room (the count is in prog_cnt): again, larger.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && room < 4096 => {
                room = (attr.prog_cnt as usize).max(room * 2);
            }
            Err(e) => return Err(e),
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct GetFdByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `struct bpf_prog_info` up to its name (the pointers left 0: nothing else copied).
#[repr(C)]
#[derive(Default)]
struct RawProgInfoNamed {
    type_: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

/// The kernel's name of the program `id` (up to 15 bytes; empty when it was loaded
/// without one). Opening a program by id needs CAP_SYS_ADMIN: EPERM without it.
pub(crate) fn prog_name(id: u32) -> io::Result<String> {
    let mut attr = GetFdByIdAttr {
        id,
        ..GetFdByIdAttr::default()
    };
    let fd = bpf(cmd::PROG_GET_FD_BY_ID, &mut attr).map(new_fd)?;
    let mut info = RawProgInfoNamed::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<RawProgInfoNamed>() as u32,
        info: (&raw mut info) as u64,
    };
    bpf(cmd::OBJ_GET_INFO_BY_FD, &mut attr)?;
    let end = info
        .name
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(info.name.len());
    Ok(String::from_utf8_lossy(&info.name[..end]).into_owned())
}

#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Swaps the program the link `link` runs for `new`, atomically: the hook runs
/// either program at every instant, never none. With `old`, only if the link still
/// runs that program (compare-and-swap; EPERM otherwise). The kernel does not check
/// that `new` has the link's attach type: callers check [`link_info`] first.
pub(crate) fn link_update(
    link: BorrowedFd<'_>,
    new: BorrowedFd<'_>,
    old: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: new.as_raw_fd() as u32,
        flags: if old.is_some() { BPF_F_REPLACE } else { 0 },
        old_prog_fd: old.map_or(0, |o| o.as_raw_fd() as u32),
    };
    bpf(cmd::LINK_UPDATE, &mut attr).map(|_| ())
}

#[repr(C)]
#[derive(Default)]
struct LinkDetachAttr {
    link_fd: u32,
}

/// Detaches the link from its hook now, whoever else holds it (its pin, other
/// descriptors): the program stops running there. The link object stays until its
/// last reference goes.
pub(crate) fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = LinkDetachAttr {
        link_fd: link.as_raw_fd() as u32,
    };
    bpf(cmd::LINK_DETACH, &mut attr).map(|_| ())
}

#[repr(C)]
#[derive(Default)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _pad: u32,
}

/// Attaches `prog` to the map `map` the old way (`BPF_PROG_ATTACH`), for kernels
/// without sockmap links (before 6.10): the attachment lives as long as the map,
/// and attaching again replaces the program unconditionally.
pub(crate) fn map_attach(
    prog: BorrowedFd<'_>,
    map: BorrowedFd<'_>,
    attach: AttachType,
) -> io::Result<()> {
    let mut attr = ProgAttachAttr {
        target_fd: map.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: attach.raw(),
        ..ProgAttachAttr::default()
    };
    bpf(cmd::PROG_ATTACH, &mut attr).map(|_| ())
}

/// Takes `prog` off the map `map` (the inverse of [`map_attach`]).
pub(crate) fn map_detach(
    prog: BorrowedFd<'_>,
    map: BorrowedFd<'_>,
    attach: AttachType,
) -> io::Result<()> {
    let mut attr = ProgAttachAttr {
        target_fd: map.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: attach.raw(),
        ..ProgAttachAttr::default()
    };
    bpf(cmd::PROG_DETACH, &mut attr).map(|_| ())
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_link_info`, as far as hairpin reads it.
#[repr(C)]
#[derive(Default)]
struct RawLinkInfo {
    type_: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    // The per-type union: cgroup { u64 cgroup_id; u32 attach_type; }, sockmap
    // { u32 map_id; u32 attach_type; }.
    union: [u32; 6],
}

/// What the kernel says of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkInfo {
    /// `BPF_LINK_TYPE_*`.
    pub link_type: u32,
    /// The link's id.
    pub id: u32,
    /// The id of the program it runs now.
    pub prog_id: u32,
    /// The attach type (cgroup and sockmap links; 0 for others).
    pub attach_type: u32,
    /// The cgroup's id for a cgroup link (0 once the cgroup is gone), the map's id
    /// for a sockmap link.
    pub target_id: u64,
}

/// The kernel's description of the link `fd`.
pub(crate) fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    let mut info = RawLinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<RawLinkInfo>() as u32,
        info: (&raw mut info) as u64,
    };
    bpf(cmd::OBJ_GET_INFO_BY_FD, &mut attr)?;
    let u = info.union;
    let (attach_type, target_id) = match info.type_ {
        LINK_TYPE_CGROUP => (u[2], u64::from(u[0]) | u64::from(u[1]) << 32),
        LINK_TYPE_SOCKMAP => (u[1], u64::from(u[0])),
        _ => (0, 0),
    };
    Ok(LinkInfo {
        link_type: info.type_,
        id: info.id,
        prog_id: info.prog_id,
        attach_type,
        target_id,
    })
}

/// `struct bpf_prog_info`, its first fields: type, id, tag.
#[repr(C)]
#[derive(Default)]
struct RawProgInfo {
    type_: u32,
    id: u32,
    tag: [u8; 8],
}

/// The id of the program `fd`.
pub(crate) fn prog_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = RawProgInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<RawProgInfo>() as u32,
        info: (&raw mut info) as u64,
    };
    bpf(cmd::OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info.id)
}

/// The cgroup id of the cgroup v2 directory `dir`: the inode number of the
/// directory on cgroup2, which is what the kernel reports as a link's `cgroup_id`.
pub(crate) fn cgroup_id(dir: &impl AsFd) -> io::Result<u64> {
    let st = nix::sys::stat::fstat(dir.as_fd()).map_err(io::Error::from)?;
    Ok(st.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attr_layouts_match_the_kernels() {
        use std::mem::size_of;
        // struct { __aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags; __s32 path_fd; }
        assert_eq!(size_of::<ObjAttr>(), 24);
        assert_eq!(size_of::<LinkUpdateAttr>(), 16);
        assert_eq!(size_of::<ProgAttachAttr>(), 24);
        // bpf_link_info's union starts 8-aligned after three u32s.
        assert_eq!(std::mem::offset_of!(RawLinkInfo, union), 16);
        assert_eq!(size_of::<RawProgInfo>(), 16);
        // bpf_prog_info's name follows eleven fields: 64 bytes in.
        assert_eq!(std::mem::offset_of!(RawProgInfoNamed, name), 64);
        // The query's fields up to prog_cnt: target, type, two flags, the ids pointer.
        assert_eq!(std::mem::offset_of!(ProgQueryAttr, prog_cnt), 24);
        assert_eq!(size_of::<GetFdByIdAttr>(), 12);
    }

    #[test]
    fn a_path_that_is_not_pinned_is_an_error_not_a_descriptor() {
        let e = open_pinned(Path::new("/nonexistent/hairpin/link")).expect_err("no pin there");
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EPERM)),
            "{e}"
        );
    }
}
