//! A fake kernel for the executor's unit tests, in the way of aya's `sys/fake.rs`:
//! programs, links, cgroups and pins kept in memory, and every call that changes
//! them recorded in order. A fake, because what these tests check is the order of
//! the executor's kernel calls, which the real kernel shows only to root.
//!
//! Each object is a pipe of its own, so a descriptor the executor holds (or dups) is
//! told apart by its inode, as the kernel tells objects apart by their file.

use std::{
    cell::RefCell,
    collections::HashMap,
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    rc::Rc,
};

use super::kernel::{LinkKernel, LoadedPrograms};
use crate::datapath::error::DatapathError;
use crate::datapath::role::Role;
use crate::datapath::sys::{self, AttachType, LinkInfo};

/// The id of the cgroup the fake opens at every path.
pub(super) const CGROUP_ID: u64 = 4242;

/// The id of the sockets map sk_msg links to.
pub(super) const SOCKETS_ID: u64 = 77;

/// One call that changes the kernel's state, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Call {
    /// `BPF_LINK_CREATE`: the new link's id, at which hook, running which program,
    /// with which flags.
    Create {
        link: u32,
        hook: Role,
        prog: String,
        flags: u32,
    },
    /// `BPF_PROG_ATTACH` of a program to the sockets map.
    MapAttach { prog: String },
    /// `BPF_PROG_DETACH` of a program from the sockets map.
    MapDetach { prog: String },
    /// `BPF_LINK_UPDATE` of a link to a program, `BPF_F_REPLACE` against `replace`.
    Update {
        link: u32,
        prog: String,
        replace: Option<String>,
    },
    /// `BPF_LINK_DETACH` of a link.
    Detach { link: u32 },
    /// `BPF_OBJ_PIN` of an object (described) at a path.
    Pin { path: PathBuf, what: String },
    /// A pin removed (it was there).
    Unpin { path: PathBuf },
}

#[derive(Clone, Debug)]
enum Obj {
    Prog { id: u32, name: String },
    Link(LinkObj),
    Cgroup(u64),
    Map,
}

#[derive(Clone, Debug)]
struct LinkObj {
    id: u32,
    hook: Role,
    prog: u32,
    target: u64,
    detached: bool,
}

#[derive(Default)]
struct State {
    /// Every object by its pipe's inode, with the descriptor that keeps it.
    objs: HashMap<u64, (Obj, OwnedFd)>,
    pins: HashMap<PathBuf, u64>,
    calls: Vec<Call>,
    next_id: u32,
    /// Link creation at these hooks fails with this errno.
    fail_create: HashMap<Role, i32>,
    /// The child cgroups of every cgroup, by name.
    children: Vec<String>,
    /// Another agent's programs at the root's hooks, run before any link made here.
    foreign: HashMap<Role, Vec<u32>>,
}

/// The fake kernel; clones share it, so a test keeps one to read the calls.
#[derive(Clone, Default)]
pub(super) struct Fake(Rc<RefCell<State>>);

fn inode(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(nix::sys::stat::fstat(fd).map_err(io::Error::from)?.st_ino)
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Fake {
    fn add(&self, obj: Obj) -> OwnedFd {
        let (reader, _writer) = std::io::pipe().expect("a pipe for a fake object");
        let fd = OwnedFd::from(reader);
        let ino = inode(fd.as_fd()).expect("fstat of a pipe");
        let mine = fd.try_clone().expect("dup of a pipe");
        self.0.borrow_mut().objs.insert(ino, (obj, mine));
        fd
    }

    fn id(&self) -> u32 {
        let mut st = self.0.borrow_mut();
        st.next_id += 1;
        st.next_id
    }

    fn obj(&self, fd: BorrowedFd<'_>) -> io::Result<(u64, Obj)> {
        let ino = inode(fd)?;
        let st = self.0.borrow();
        let (obj, _) = st.objs.get(&ino).ok_or_else(|| errno(libc::EBADF))?;
        Ok((ino, obj.clone()))
    }

    fn prog_name(&self, id: u32) -> String {
        self.0
            .borrow()
            .objs
            .values()
            .find_map(|(o, _)| match o {
                Obj::Prog { id: i, name } if *i == id => Some(name.clone()),
                _ => None,
            })
            .unwrap_or_else(|| format!("prog {id}"))
    }

    fn record(&self, call: Call) {
        self.0.borrow_mut().calls.push(call);
    }

    /// A loaded program `name`: its descriptor and id.
    pub(super) fn program(&self, name: &str) -> (OwnedFd, u32) {
        let id = self.id();
        let fd = self.add(Obj::Prog {
            id,
            name: name.to_string(),
        });
        (fd, id)
    }

    /// The sockets map sk_msg links to.
    pub(super) fn sockets_map(&self) -> OwnedFd {
        self.add(Obj::Map)
    }

    /// What an earlier agent left: a link at `hook` running `prog` (an id from
    /// [`Fake::program`]) on the target `target`, pinned at `path`, its program
    /// pinned at `prog_pin`. The link's id.
    pub(super) fn pinned_link(
        &self,
        hook: Role,
        prog: (&OwnedFd, u32),
        target: u64,
        (path, prog_pin): (&Path, &Path),
    ) -> u32 {
        let id = self.id();
        let link = self.add(Obj::Link(LinkObj {
            id,
            hook,
            prog: prog.1,
            target,
            detached: false,
        }));
        let mut st = self.0.borrow_mut();
        st.pins
            .insert(path.to_path_buf(), inode(link.as_fd()).expect("fstat"));
        st.pins.insert(
            prog_pin.to_path_buf(),
            inode(prog.0.as_fd()).expect("fstat"),
        );
        id
    }

    /// The cgroups' children are `names` from now on.
    pub(super) fn set_children(&self, names: &[&str]) {
        self.0.borrow_mut().children = names.iter().map(|n| n.to_string()).collect();
    }

    /// Another program (id `id`) is attached at the root's `hook`, before any
    /// link made here (as a socket load balancer that came first).
    pub(super) fn foreign_program(&self, hook: Role, id: u32) {
        self.0
            .borrow_mut()
            .foreign
            .entry(hook)
            .or_default()
            .push(id);
    }

    /// The id of the child cgroup `name` of the root.
    pub(super) fn child_id(name: &str) -> u64 {
        CGROUP_ID + 1 + name.bytes().map(u64::from).sum::<u64>()
    }

    /// The link `id` is at the cgroup of `target` id, not detached.
    pub(super) fn live_at(&self, link: u32) -> Option<u64> {
        self.0.borrow().objs.values().find_map(|(o, _)| match o {
            Obj::Link(l) if l.id == link && !l.detached => Some(l.target),
            _ => None,
        })
    }

    /// Link creation at `hook` fails with `e` from now on.
    pub(super) fn fail_create(&self, hook: Role, e: i32) {
        self.0.borrow_mut().fail_create.insert(hook, e);
    }

    /// The calls so far.
    pub(super) fn calls(&self) -> Vec<Call> {
        self.0.borrow().calls.clone()
    }

    /// Forgets the calls so far.
    pub(super) fn clear(&self) {
        self.0.borrow_mut().calls.clear();
    }

    /// The program the link `id` runs now, by name.
    pub(super) fn running(&self, link: u32) -> Option<String> {
        let prog = self.0.borrow().objs.values().find_map(|(o, _)| match o {
            Obj::Link(l) if l.id == link => Some(l.prog),
            _ => None,
        })?;
        Some(self.prog_name(prog))
    }

    /// What is pinned at `path`, described.
    pub(super) fn pinned(&self, path: &Path) -> Option<String> {
        let ino = *self.0.borrow().pins.get(path)?;
        let obj = self.0.borrow().objs.get(&ino).map(|(o, _)| o.clone())?;
        Some(self.describe(&obj))
    }

    fn describe(&self, obj: &Obj) -> String {
        match obj {
            Obj::Prog { name, .. } => name.clone(),
            Obj::Link(l) => format!("link {}", l.id),
            Obj::Cgroup(_) => "cgroup".into(),
            Obj::Map => "map".into(),
        }
    }
}

fn hook_of(attach: AttachType) -> Role {
    Role::ALL
        .into_iter()
        .find(|r| r.attach_type() == attach)
        .expect("an attach type of hairpin's")
}

impl LinkKernel for Fake {
    fn open_cgroup(&self, path: &Path) -> io::Result<(OwnedFd, u64)> {
        // A child of the root is named by its last component; anything else is
        // the root.
        let child = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| self.0.borrow().children.iter().any(|c| c == n));
        let id = child.map_or(CGROUP_ID, Fake::child_id);
        Ok((self.add(Obj::Cgroup(id)), id))
    }

    fn link_create(
        &self,
        prog: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        attach: AttachType,
        flags: u32,
    ) -> io::Result<OwnedFd> {
        let hook = hook_of(attach);
        if let Some(e) = self.0.borrow().fail_create.get(&hook) {
            return Err(errno(*e));
        }
        let (_, Obj::Prog { id: prog, name }) = self.obj(prog)? else {
            return Err(errno(libc::EINVAL));
        };
        let target = match self.obj(target)?.1 {
            Obj::Cgroup(id) => id,
            Obj::Map => SOCKETS_ID,
            _ => return Err(errno(libc::EINVAL)),
        };
        let id = self.id();
        let fd = self.add(Obj::Link(LinkObj {
            id,
            hook,
            prog,
            target,
            detached: false,
        }));
        self.record(Call::Create {
            link: id,
            hook,
            prog: name,
            flags,
        });
        Ok(fd)
    }

    fn map_attach(
        &self,
        prog: BorrowedFd<'_>,
        _map: BorrowedFd<'_>,
        _attach: AttachType,
    ) -> io::Result<()> {
        let (_, obj) = self.obj(prog)?;
        let prog = self.describe(&obj);
        self.record(Call::MapAttach { prog });
        Ok(())
    }

    fn map_detach(
        &self,
        prog: BorrowedFd<'_>,
        _map: BorrowedFd<'_>,
        _attach: AttachType,
    ) -> io::Result<()> {
        let (_, obj) = self.obj(prog)?;
        let prog = self.describe(&obj);
        self.record(Call::MapDetach { prog });
        Ok(())
    }

    fn link_update(
        &self,
        link: BorrowedFd<'_>,
        new: BorrowedFd<'_>,
        old: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        let (ino, Obj::Link(l)) = self.obj(link)? else {
            return Err(errno(libc::EINVAL));
        };
        let (_, Obj::Prog { id: new_id, name }) = self.obj(new)? else {
            return Err(errno(libc::EINVAL));
        };
        let replace = match old {
            Some(old) => match self.obj(old)?.1 {
                Obj::Prog { id, name } => Some((id, name)),
                _ => return Err(errno(libc::EINVAL)),
            },
            None => None,
        };
        self.record(Call::Update {
            link: l.id,
            prog: name,
            replace: replace.as_ref().map(|(_, n)| n.clone()),
        });
        if l.detached {
            return Err(errno(libc::ENOLINK));
        }
        if replace.is_some_and(|(id, _)| id != l.prog) {
            return Err(errno(libc::EPERM));
        }
        if let Some((Obj::Link(l), _)) = self.0.borrow_mut().objs.get_mut(&ino) {
            l.prog = new_id;
        }
        Ok(())
    }

    fn link_detach(&self, link: BorrowedFd<'_>) -> io::Result<()> {
        let (ino, Obj::Link(l)) = self.obj(link)? else {
            return Err(errno(libc::EINVAL));
        };
        self.record(Call::Detach { link: l.id });
        if let Some((Obj::Link(l), _)) = self.0.borrow_mut().objs.get_mut(&ino) {
            l.detached = true;
        }
        Ok(())
    }

    fn link_info(&self, link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
        let (_, Obj::Link(l)) = self.obj(link)? else {
            return Err(errno(libc::EINVAL));
        };
        Ok(LinkInfo {
            link_type: if l.hook == Role::SkMsg {
                sys::LINK_TYPE_SOCKMAP
            } else {
                sys::LINK_TYPE_CGROUP
            },
            id: l.id,
            prog_id: l.prog,
            attach_type: l.hook.attach_type().raw(),
            target_id: if l.detached { 0 } else { l.target },
        })
    }

    fn prog_id(&self, prog: BorrowedFd<'_>) -> io::Result<u32> {
        match self.obj(prog)?.1 {
            Obj::Prog { id, .. } => Ok(id),
            _ => Err(errno(libc::EINVAL)),
        }
    }

    fn prog_query(&self, target: BorrowedFd<'_>, attach: AttachType) -> io::Result<Vec<u32>> {
        let Obj::Cgroup(at) = self.obj(target)?.1 else {
            return Err(errno(libc::EINVAL));
        };
        let hook = hook_of(attach);
        let st = self.0.borrow();
        let mut ids = if at == CGROUP_ID {
            st.foreign.get(&hook).cloned().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut ours: Vec<(u32, u32)> = st
            .objs
            .values()
            .filter_map(|(o, _)| match o {
                Obj::Link(l) if l.hook == hook && l.target == at && !l.detached => {
                    Some((l.id, l.prog))
                }
                _ => None,
            })
            .collect();
        ours.sort_unstable();
        ids.extend(ours.into_iter().map(|(_, prog)| prog));
        Ok(ids)
    }

    fn child_cgroups(&self, _path: &Path) -> io::Result<Vec<String>> {
        Ok(self.0.borrow().children.clone())
    }

    fn pins_in(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = self
            .0
            .borrow()
            .pins
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    fn open_pinned(&self, path: &Path) -> io::Result<OwnedFd> {
        let st = self.0.borrow();
        let ino = st.pins.get(path).ok_or_else(|| errno(libc::ENOENT))?;
        let (_, fd) = st.objs.get(ino).ok_or_else(|| errno(libc::ENOENT))?;
        fd.try_clone()
    }

    fn pin(&self, fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
        let (ino, obj) = self.obj(fd)?;
        if self.0.borrow().pins.contains_key(path) {
            return Err(errno(libc::EEXIST));
        }
        self.0.borrow_mut().pins.insert(path.to_path_buf(), ino);
        self.record(Call::Pin {
            path: path.to_path_buf(),
            what: self.describe(&obj),
        });
        Ok(())
    }

    fn unpin(&self, path: &Path) -> io::Result<()> {
        if self.0.borrow_mut().pins.remove(path).is_some() {
            self.record(Call::Unpin {
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }
}

/// Loaded programs, faked: each a program of the fake kernel.
pub(super) struct FakePrograms {
    kernel_hooks: bool,
    progs: HashMap<&'static str, (OwnedFd, u32)>,
}

impl FakePrograms {
    /// The programs of `names` loaded into `kernel`, the kernel path's hooks used
    /// when `kernel_hooks`.
    pub(super) fn new(kernel: &Fake, names: &[&'static str], kernel_hooks: bool) -> FakePrograms {
        FakePrograms {
            kernel_hooks,
            progs: names.iter().map(|n| (*n, kernel.program(n))).collect(),
        }
    }
}

impl LoadedPrograms for FakePrograms {
    fn program_for(&self, role: Role) -> Option<&'static str> {
        use hairpin_ebpf::{
            PROG_CONNECT4, PROG_CONNECT6, PROG_SETSOCKOPT, PROG_SK_MSG, PROG_SOCK_OPS,
        };
        match role {
            Role::SkMsg => self.kernel_hooks.then_some(PROG_SK_MSG),
            Role::SockOps => self.kernel_hooks.then_some(PROG_SOCK_OPS),
            Role::SetSockopt => self.kernel_hooks.then_some(PROG_SETSOCKOPT),
            Role::Connect4 => Some(PROG_CONNECT4),
            Role::Connect6 => Some(PROG_CONNECT6),
        }
    }

    fn program_fd(
        &self,
        _role: Role,
        name: &'static str,
        _cgroup: &Path,
    ) -> Result<OwnedFd, DatapathError> {
        let (fd, _) = self.progs.get(name).ok_or(DatapathError::Missing {
            kind: "program",
            name,
        })?;
        Ok(fd.try_clone().expect("dup of a fake program"))
    }

    fn lose_kernel_path(&mut self, _why: DatapathError) {
        self.kernel_hooks = false;
    }
}
