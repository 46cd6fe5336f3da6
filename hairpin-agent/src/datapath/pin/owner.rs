//! The pins handed to a dedicated account (`--pin-owner`): since Linux 5.19
//! opening a pinned map needs only file access to the pin, so a root process without
//! capabilities that reaches the host's bpf filesystem could open hairpin's maps.

use std::{
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    sys::stat::{FileStat, Mode, SFlag, fstat},
};

use super::{PinError, Removed, UnpinError};

/// Who owns the pins when they are handed to a dedicated account
/// (`--pin-owner`): since Linux 5.19 opening a pinned map needs only file access to
/// the pin, and uid 0 owning a pin can always open it, capabilities or not. Owned by
/// this uid and gid instead, with no access for others, a root process without
/// CAP_DAC_OVERRIDE cannot open them; the agent reaches them through the group (the
/// DaemonSet gives the pod that supplementary group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinOwner {
    /// The pins' owner.
    pub uid: u32,
    /// The pins' group: the agent's supplementary group.
    pub gid: u32,
}

impl std::fmt::Display for PinOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

impl std::str::FromStr for PinOwner {
    type Err = String;

    /// `UID:GID`, or `UID` alone for the same number as both; neither may be 0 (uid
    /// 0 owning the pins is what this guards against).
    fn from_str(s: &str) -> Result<PinOwner, String> {
        let num = |v: &str, what: &str| {
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n != 0 && *n != u32::MAX)
                .ok_or_else(|| {
                    format!(
                        "--pin-owner {s:?}: the {what} must be a number from 1 to 4294967294, \
                         expected UID:GID such as 60104:60104"
                    )
                })
        };
        let (uid, gid) = s.split_once(':').unwrap_or((s, s));
        Ok(PinOwner {
            uid: num(uid, "uid")?,
            gid: num(gid, "gid")?,
        })
    }
}

/// Fails unless `owner`'s group is this process's effective or a supplementary
/// group: the agent reaches handed-over pins through it (it holds no
/// CAP_DAC_OVERRIDE).
pub(super) fn check_in_group(root: &Path, owner: PinOwner) -> Result<(), PinError> {
    let gid = nix::unistd::Gid::from_raw(owner.gid);
    let groups = nix::unistd::getgroups().unwrap_or_default();
    if nix::unistd::getegid() == gid || groups.contains(&gid) {
        return Ok(());
    }
    Err(PinError::NotInGroup {
        path: root.to_path_buf(),
        owner,
        gid: owner.gid,
        groups: groups
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    })
}

/// The directory flags of every step of a walk: a real directory, never a link.
fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// What [`walk`] found: a directory the agent made (open, so it is changed through
/// its descriptor) or a pin (open with `O_PATH`, the inode itself, never a link).
pub(super) struct Found<'a> {
    /// Its path, for errors and logs only: nothing is done by path.
    pub path: &'a Path,
    /// The descriptor every change goes through.
    pub fd: &'a OwnedFd,
    /// Its metadata, read from that descriptor.
    pub stat: &'a FileStat,
}

/// Opens `name` under `parent` as a directory without following a link, on
/// `dev` (the pin directory's device) only; `None` when it does not exist or is
/// not a directory.
fn open_dir_at(
    parent: &OwnedFd,
    name: &str,
    path: &Path,
    dev: u64,
) -> Result<Option<(OwnedFd, FileStat)>, PinError> {
    match nix::fcntl::openat(parent, name, dir_flags(), Mode::empty()) {
        Ok(fd) => {
            let stat = fstat(&fd).map_err(nix_error("stat", path))?;
            same_device(path, &stat, dev)?;
            Ok(Some((fd, stat)))
        }
        Err(Errno::ENOENT) => Ok(None),
        // O_NOFOLLOW on a symbolic link: ELOOP, or ENOTDIR with O_DIRECTORY.
        Err(Errno::ELOOP) => Err(PinError::Symlink {
            path: path.to_path_buf(),
        }),
        Err(Errno::ENOTDIR) => {
            let kind =
                nix::sys::stat::fstatat(parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT);
            match kind {
                Ok(SFlag::S_IFLNK) => Err(PinError::Symlink {
                    path: path.to_path_buf(),
                }),
                _ => Ok(None),
            }
        }
        Err(e) => Err(nix_error("open", path)(e)),
    }
}

/// Fails unless `stat` is on `dev`: the walk never leaves the pin directory's
/// bpf filesystem (a directory of another filesystem mounted or moved in is not the
/// agent's).
fn same_device(path: &Path, stat: &FileStat, dev: u64) -> Result<(), PinError> {
    if stat.st_dev == dev {
        return Ok(());
    }
    Err(PinError::Io {
        op: "stay on the pin directory's filesystem at",
        path: path.to_path_buf(),
        source: io::Error::other(format!(
            "device {:#x}, the pin directory's is {dev:#x}",
            stat.st_dev
        )),
    })
}

/// The names in the directory open at `dir`, sorted: read through
/// `/proc/self/fd/N`, which names that very directory whatever its path has become.
fn names(dir: &OwnedFd, path: &Path) -> Result<Vec<String>, PinError> {
    use std::os::fd::AsRawFd;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let read = |e: io::Error| PinError::Io {
        op: "read",
        path: path.to_path_buf(),
        source: e,
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(&by_fd).map_err(read)? {
        // A name that is not UTF-8 is none the agent pins.
        if let Ok(n) = e.map_err(read)?.file_name().into_string() {
            out.push(n);
        }
    }
    out.sort();
    Ok(out)
}

/// The pin `name` under `parent` as an `O_PATH` descriptor of its inode (a link is
/// opened as itself and refused, a directory is none of the agent's pins), on `dev`.
fn open_pin_at(
    parent: &OwnedFd,
    name: &str,
    path: &Path,
    dev: u64,
) -> Result<Option<(OwnedFd, FileStat)>, PinError> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(nix_error("open", path)(e)),
    };
    let stat = fstat(&fd).map_err(nix_error("stat", path))?;
    let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFLNK {
        return Err(PinError::Symlink {
            path: path.to_path_buf(),
        });
    }
    if kind == SFlag::S_IFDIR {
        return Ok(None);
    }
    same_device(path, &stat, dev)?;
    Ok(Some((fd, stat)))
}

/// Calls `visit` with `root` and with every name the agent pins under it, each by
/// descriptor: `root`, its layout directories `v<N>` and their `maps`, `links`
/// and `progs`, the pins in those, and the legacy `sockets-*` maps in `root`.
/// Every step is `openat` relative to its parent's descriptor with `O_NOFOLLOW`, on
/// the root's device: a name swapped for a link (or a directory of elsewhere) between
/// one step and the next is refused or left alone, never followed. Anything else in
/// the directories is not the agent's and is left alone.
pub(super) fn walk(
    root: &Path,
    mut visit: impl FnMut(Found<'_>) -> Result<(), PinError>,
) -> Result<(), PinError> {
    let fd = match nix::fcntl::open(root, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => {
            return Err(PinError::Symlink {
                path: root.to_path_buf(),
            });
        }
        Err(e) => return Err(nix_error("open", root)(e)),
    };
    let stat = fstat(&fd).map_err(nix_error("stat", root))?;
    let dev = stat.st_dev;
    visit(Found {
        path: root,
        fd: &fd,
        stat: &stat,
    })?;
    for name in names(&fd, root)? {
        let path = root.join(&name);
        if super::is_layout_dir(&path) {
            let Some((layout, st)) = open_dir_at(&fd, &name, &path, dev)? else {
                continue;
            };
            visit(Found {
                path: &path,
                fd: &layout,
                stat: &st,
            })?;
            for sub in ["maps", "links", "progs"] {
                let sub_path = path.join(sub);
                let Some((dir, st)) = open_dir_at(&layout, sub, &sub_path, dev)? else {
                    continue;
                };
                visit(Found {
                    path: &sub_path,
                    fd: &dir,
                    stat: &st,
                })?;
                for pin in names(&dir, &sub_path)? {
                    let pin_path = sub_path.join(&pin);
                    if let Some((p, st)) = open_pin_at(&dir, &pin, &pin_path, dev)? {
                        visit(Found {
                            path: &pin_path,
                            fd: &p,
                            stat: &st,
                        })?;
                    }
                }
            }
        } else if name.starts_with(super::SOCKETS_PIN_PREFIX)
            && let Some((p, st)) = open_pin_at(&fd, &name, &path, dev)?
        {
            visit(Found {
                path: &path,
                fd: &p,
                stat: &st,
            })?;
        }
    }
    Ok(())
}

fn nix_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> PinError + 'a {
    move |e| PinError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

fn is_dir(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// Sets the mode of what `fd` is (a directory open for reading, or a pin's `O_PATH`
/// descriptor) through the descriptor itself: `/proc/self/fd/N` names that very
/// inode, whatever its name has become since (`fchmod` refuses an `O_PATH`
/// descriptor, and `fchmodat(AT_SYMLINK_NOFOLLOW)` goes by name).
fn chmod_fd(f: &Found<'_>, mode: u32) -> Result<(), PinError> {
    use std::os::fd::AsRawFd;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", f.fd.as_raw_fd()));
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &by_fd,
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(nix_error("chmod", f.path))
}

/// Changes the owner of what `fd` is, by the descriptor (`AT_EMPTY_PATH`).
fn chown_fd(f: &Found<'_>, owner: PinOwner) -> Result<(), PinError> {
    nix::unistd::fchownat(
        f.fd,
        "",
        Some(nix::unistd::Uid::from_raw(owner.uid)),
        Some(nix::unistd::Gid::from_raw(owner.gid)),
        nix::fcntl::AtFlags::AT_EMPTY_PATH | nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| PinError::Io {
        op: "chown (CAP_CHOWN)",
        path: f.path.to_path_buf(),
        source: e.into(),
    })
}

/// Without a [`PinOwner`]: `root` and the agent's directories under it (never
/// through a symbolic link) 0700, as SECURITY.md states. This keeps out every uid
/// but 0; uid 0 without capabilities still gets in (it owns them): `--pin-owner`
/// closes that.
pub(super) fn private_dirs(root: &Path) -> Result<(), PinError> {
    walk(root, |f| {
        // Left as it is when another owner has it (an earlier --pin-owner): that is
        // at least as private.
        if is_dir(f.stat) && f.stat.st_uid == 0 && f.stat.st_mode & 0o7777 != 0o700 {
            chmod_fd(&f, 0o700)?;
        }
        Ok(())
    })
}

/// The directories' mode under a [`PinOwner`]: the group may read, write and
/// search; new pins take the directory's group (set-group-ID); others nothing.
const SECURE_DIR_MODE: u32 = 0o2770;
/// The pins' mode under a [`PinOwner`].
const SECURE_PIN_MODE: u32 = 0o660;

/// Hands `root` and what the agent pins under it ([`walk`]: by descriptor, never
/// through a symbolic link, never off the pin directory's filesystem) to `owner`:
/// directories 2770, pins 660, uid and gid `owner`'s. Needs CAP_CHOWN for what the
/// agent itself pinned (owned by uid 0): the mode is set first, while it still
/// owns them. What is already right is left alone; returns how many were changed.
pub(crate) fn secure(root: &Path, owner: PinOwner) -> Result<usize, PinError> {
    let mut changed = 0;
    walk(root, |f| {
        let want = if is_dir(f.stat) {
            SECURE_DIR_MODE
        } else {
            SECURE_PIN_MODE
        };
        let right_mode = f.stat.st_mode & 0o7777 == want;
        let right_owner = f.stat.st_uid == owner.uid && f.stat.st_gid == owner.gid;
        if !right_mode {
            chmod_fd(&f, want)?;
        }
        if !right_owner {
            chown_fd(&f, owner)?;
        }
        changed += usize::from(!(right_mode && right_owner));
        Ok(())
    })?;
    Ok(changed)
}

/// Removes the datapath of one layout directory (`<dir>/v<N>`) by descriptor, as
/// [`walk`] reaches it: links detached first (connect programs before their
/// consumers), then every pin of `links`, `progs` and `maps`, and the directories.
/// A link is opened through its own `O_PATH` descriptor (`/proc/self/fd/N`), so a
/// name swapped for a symbolic link to another tool's pinned link is never detached;
/// pins are removed with `unlinkat` in their directory, never through a link.
pub(super) fn remove_layout(layout: &Path) -> Vec<Removed> {
    use std::os::fd::{AsFd, AsRawFd};
    let mut done = Vec::new();
    let symlink = |path: &Path| Removed {
        kind: "directory",
        path: path.to_path_buf(),
        result: Err(UnpinError::Symlink {
            path: path.to_path_buf(),
        }),
    };
    let opened = nix::fcntl::open(layout, dir_flags(), Mode::empty())
        .and_then(|fd| fstat(&fd).map(|st| (fd, st)));
    let (lfd, dev) = match opened {
        Ok((fd, st)) => (fd, st.st_dev),
        Err(Errno::ELOOP) => return vec![symlink(layout)],
        Err(e) => {
            return vec![Removed {
                kind: "directory",
                path: layout.to_path_buf(),
                result: Err(UnpinError::Remove {
                    path: layout.to_path_buf(),
                    source: e.into(),
                }),
            }];
        }
    };
    let sub = |name: &str| {
        let path = layout.join(name);
        let dir = open_dir_at(&lfd, name, &path, dev);
        (path, dir)
    };
    // Links first, connect programs before the consumers: no socket is marked
    // after this that sock_ops or sk_msg would not see.
    if let (links_path, Ok(Some((links, _)))) = sub("links") {
        // A connect hook's links at the root's child cgroups go with it.
        let all = names(&links, &links_path).unwrap_or_default();
        let each = super::super::role::detach_order().flat_map(|role| {
            std::iter::once(role.name().to_string()).chain(
                all.iter()
                    .filter(|n| super::child_of_pin(n, role).is_some())
                    .cloned()
                    .collect::<Vec<_>>(),
            )
        });
        for name in each {
            let name = name.as_str();
            let p = links_path.join(name);
            let pin = match open_pin_at(&links, name, &p, dev) {
                Ok(Some((pin, _))) => pin,
                Ok(None) => continue,
                Err(e) => {
                    done.push(Removed {
                        kind: "link",
                        path: p.clone(),
                        result: Err(UnpinError::Detach {
                            path: p,
                            source: io::Error::other(e.to_string()),
                        }),
                    });
                    continue;
                }
            };
            let by_fd = PathBuf::from(format!("/proc/self/fd/{}", pin.as_raw_fd()));
            let result = super::super::sys::open_pinned(&by_fd)
                .and_then(|fd| super::super::sys::link_detach(fd.as_fd()))
                .map_err(|source| UnpinError::Detach {
                    path: p.clone(),
                    source,
                })
                .and_then(|()| unlink_at(&links, name, &p));
            done.push(Removed {
                kind: "link",
                path: p,
                result,
            });
        }
    }
    for (name, kind) in [("links", "link"), ("progs", "program"), ("maps", "map")] {
        let (path, dir) = sub(name);
        let dir = match dir {
            Ok(Some((dir, _))) => dir,
            Ok(None) => continue,
            Err(PinError::Symlink { .. }) => {
                done.push(symlink(&path));
                continue;
            }
            Err(e) => {
                done.push(Removed {
                    kind: "directory",
                    path: path.clone(),
                    result: Err(UnpinError::Remove {
                        path,
                        source: io::Error::other(e.to_string()),
                    }),
                });
                continue;
            }
        };
        let pins = names(&dir, &path).unwrap_or_default();
        for pin in pins {
            let p = path.join(&pin);
            done.push(Removed {
                kind,
                result: unlink_at(&dir, &pin, &p),
                path: p,
            });
        }
        let _ = nix::unistd::unlinkat(&lfd, name, nix::unistd::UnlinkatFlags::RemoveDir);
    }
    drop(lfd);
    // The layout directory itself, by name in its parent: `remove_dir` never follows
    // a final link (rmdir of a link fails with ENOTDIR).
    let result = std::fs::remove_dir(layout).map_err(|source| UnpinError::Remove {
        path: layout.to_path_buf(),
        source,
    });
    done.push(Removed {
        kind: "directory",
        path: layout.to_path_buf(),
        result,
    });
    done
}

/// Removes the entry `name` of the directory open at `dir` (a link is removed as
/// itself); one already gone is fine.
fn unlink_at(dir: &OwnedFd, name: &str, path: &Path) -> Result<(), UnpinError> {
    match nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(UnpinError::Remove {
            path: path.to_path_buf(),
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_owner_is_uid_and_gid_never_root() {
        let o: PinOwner = "60104:60105".parse().unwrap();
        assert_eq!((o.uid, o.gid), (60104, 60105));
        assert_eq!(o.to_string(), "60104:60105");
        let same: PinOwner = "60104".parse().unwrap();
        assert_eq!((same.uid, same.gid), (60104, 60104));
        for bad in ["0:60104", "60104:0", "0", "x:1", "", "4294967295"] {
            let err = bad.parse::<PinOwner>().unwrap_err();
            assert!(err.contains("expected UID:GID"), "{bad}: {err}");
        }
    }
}
