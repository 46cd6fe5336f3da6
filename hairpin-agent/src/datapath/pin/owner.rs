//! The pins handed to a dedicated account (`--pin-owner`): since Linux 5.19
//! opening a pinned map needs only file access to the pin, so a root process without
//! capabilities that reaches the host's bpf filesystem could open hairpin's maps.

use std::{fs, path::Path};

use super::{PinError, io_error};

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

/// Calls `visit` with `root` and everything under it, each with its own metadata,
/// descending only into real directories (never through a symbolic link).
fn walk(
    root: &Path,
    mut visit: impl FnMut(&Path, &fs::Metadata) -> Result<(), PinError>,
) -> Result<(), PinError> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p).map_err(io_error("stat", &p))?;
        if meta.is_dir() {
            for e in fs::read_dir(&p).map_err(io_error("read", &p))? {
                stack.push(e.map_err(io_error("read", &p))?.path());
            }
        }
        visit(&p, &meta)?;
    }
    Ok(())
}

/// Without a [`PinOwner`]: `root` and the directories under it (never through a
/// symbolic link) 0700, as SECURITY.md states. This keeps out every uid but 0;
/// uid 0 without capabilities still gets in (it owns them): `--pin-owner` closes that.
pub(super) fn private_dirs(root: &Path) -> Result<(), PinError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    walk(root, |p, meta| {
        // Left as it is when another owner has it (an earlier --pin-owner): that is
        // at least as private.
        if meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o7777 != 0o700 {
            fs::set_permissions(p, fs::Permissions::from_mode(0o700))
                .map_err(io_error("chmod", p))?;
        }
        Ok(())
    })
}

/// The directories' mode under a [`PinOwner`]: the group may read, write and
/// search; new pins take the directory's group (set-group-ID); others nothing.
const SECURE_DIR_MODE: u32 = 0o2770;
/// The pins' mode under a [`PinOwner`].
const SECURE_PIN_MODE: u32 = 0o660;

/// Hands `root` and everything under it (never through a symbolic link) to `owner`:
/// directories 2770, pins 660, uid and gid `owner`'s. Needs CAP_CHOWN for what the
/// agent itself pinned (owned by uid 0): the mode is set first, while it still
/// owns them. What is already right is left alone; returns how many were changed.
pub(crate) fn secure(root: &Path, owner: PinOwner) -> Result<usize, PinError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut changed = 0;
    walk(root, |p, meta| {
        if meta.file_type().is_symlink() {
            return Err(PinError::Symlink {
                path: p.to_path_buf(),
            });
        }
        let want = if meta.is_dir() {
            SECURE_DIR_MODE
        } else {
            SECURE_PIN_MODE
        };
        let right_mode = meta.mode() & 0o7777 == want;
        let right_owner = meta.uid() == owner.uid && meta.gid() == owner.gid;
        if !right_mode {
            fs::set_permissions(p, fs::Permissions::from_mode(want))
                .map_err(io_error("chmod", p))?;
        }
        if !right_owner {
            nix::unistd::chown(
                p,
                Some(nix::unistd::Uid::from_raw(owner.uid)),
                Some(nix::unistd::Gid::from_raw(owner.gid)),
            )
            .map_err(|e| PinError::Io {
                op: "chown (CAP_CHOWN)",
                path: p.to_path_buf(),
                source: e.into(),
            })?;
        }
        changed += usize::from(!(right_mode && right_owner));
        Ok(())
    })?;
    Ok(changed)
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
