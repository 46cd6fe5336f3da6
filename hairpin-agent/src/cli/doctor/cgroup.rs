//! The `cgroup2` check: the cgroup v2 directory the agent attaches at.
//!
//! In the DaemonSet's pod that is `--cgroup-path` (the chart sets
//! `HAIRPIN_CGROUP_PATH=/host/sys/fs/cgroup`, a hostPath of the node's hierarchy),
//! not a cgroup2 root this process finds mounted: the pod's own `/sys/fs/cgroup` is
//! its cgroup namespace's (or cgroup v1's) view, which says nothing about the node.
//! The check reads the same setting as the agent and looks at that directory.

use std::path::{Component, Path, PathBuf};

use super::{Check, Status};
use crate::datapath::{self, unescape_mountinfo as unescape};

/// What `statfs` says of the directory: cgroup v2, or another filesystem (its magic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FsKind {
    /// `CGROUP2_SUPER_MAGIC`.
    Cgroup2,
    /// Anything else: cgroup v1's, tmpfs (a hybrid node's /sys/fs/cgroup), ...
    Other(i64),
}

/// The check on this machine: `path` as the agent is told (`--cgroup-path`), else
/// the cgroup v2 root found in /proc/self/mountinfo as the agent would.
pub(super) fn cgroup2(path: Option<&Path>) -> Check {
    let mountinfo = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(m) => m,
        Err(e) => {
            return Check::new(
                "cgroup2",
                Status::Fail,
                format!("cannot read /proc/self/mountinfo: {e}"),
            );
        }
    };
    let Some(path) = path else {
        return match datapath::find_cgroup2_root(&mountinfo) {
            Some(p) => Check::new("cgroup2", Status::Ok, format!("hierarchy root at {}", p.display())),
            None => Check::new("cgroup2", Status::Fail, "no cgroup v2 hierarchy root is mounted")
                .fix("mount -t cgroup2 none /sys/fs/cgroup (or mount the host's at a hostPath and pass --cgroup-path)"),
        };
    };
    let kind = nix::sys::statfs::statfs(path).map(|s| {
        if s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC {
            FsKind::Cgroup2
        } else {
            FsKind::Other(s.filesystem_type().0)
        }
    });
    match kind {
        Ok(kind) => judge(path, kind, &mountinfo),
        Err(e) => Check::new(
            "cgroup2",
            Status::Fail,
            format!("--cgroup-path {}: {e}", path.display()),
        )
        .fix(FIX_PATH),
    }
}

/// What to do when `--cgroup-path` is not the node's cgroup v2 hierarchy.
const FIX_PATH: &str = "point --cgroup-path (HAIRPIN_CGROUP_PATH; the chart mounts its value \
     cgroupHostPath there) at the node's cgroup v2 hierarchy: /sys/fs/cgroup, or \
     /sys/fs/cgroup/unified on a node with cgroup v1 controllers beside it";

/// The verdict for `--cgroup-path` `path`, of filesystem `kind`, given this process's
/// mountinfo: fail when it is not cgroup v2; ok at the hierarchy's root (as this
/// process's cgroup namespace shows it); a warning at a cgroup below it, whose
/// programs see only the processes in that cgroup's subtree.
pub(super) fn judge(path: &Path, kind: FsKind, mountinfo: &str) -> Check {
    let shown = path.display();
    if let FsKind::Other(magic) = kind {
        return Check::new(
            "cgroup2",
            Status::Fail,
            format!(
                "--cgroup-path {shown} is not a cgroup v2 directory (filesystem magic {magic:#x})"
            ),
        )
        .fix(FIX_PATH);
    }
    match cgroup_of(path, mountinfo) {
        Some(cg) if is_root(&cg) => Check::new(
            "cgroup2",
            Status::Ok,
            format!("--cgroup-path {shown}: the root of the cgroup v2 hierarchy"),
        ),
        Some(cg) => Check::new(
            "cgroup2",
            Status::Warn,
            format!(
                "--cgroup-path {shown}: cgroup v2, the cgroup {} below the hierarchy's root: \
                 hairpin sees only the processes in it and its descendants",
                cg.display()
            ),
        )
        .fix("to cover every pod and host process, mount the hierarchy's root (the chart's cgroupHostPath)"),
        // cgroup v2 by statfs, yet no mount shows it: say what was checked.
        None => Check::new(
            "cgroup2",
            Status::Ok,
            format!("--cgroup-path {shown}: cgroup v2 (its mount is not in /proc/self/mountinfo)"),
        ),
    }
}

/// The cgroup `path` is in its hierarchy (`/`, `/kubepods/...`, `/../..` above this
/// process's cgroup namespace), from the cgroup2 mount holding it: that mount's root
/// joined with the rest of the path. `None` when no cgroup2 mount holds it.
fn cgroup_of(path: &Path, mountinfo: &str) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut f = pre.split_whitespace();
            let root = f.nth(3)?;
            let mount_point = PathBuf::from(unescape(f.next()?));
            let rest = path.strip_prefix(&mount_point).ok()?.to_path_buf();
            Some((mount_point, PathBuf::from(unescape(root)).join(rest)))
        })
        // The innermost mount: later mounts over a path hide the earlier ones, and the
        // longest mount point holding the path is the one that shows it.
        .max_by_key(|(mount_point, _)| mount_point.as_os_str().len())
        .map(|(_, cgroup)| cgroup)
}

/// Whether a cgroup path is the hierarchy's root: nothing but `/` and `..`.
fn is_root(cgroup: &Path) -> bool {
    cgroup
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::ParentDir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DaemonSet pod's view on a hybrid node whose kubelet runs in a cgroup of
    /// its own (the suite's simulated node): v1 controllers at /sys/fs/cgroup, the
    /// node's cgroup2 directory at the chart's hostPath.
    const POD_SUBTREE: &str = "\
1201 1180 0:31 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs rw,mode=755
1202 1201 0:33 /kubepods/pod1/c1 /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory
1210 1180 0:30 /hairpin-node-1 /host/sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw
";
    /// A cgroup v2 node's pod in a cgroup namespace of its own, the node's
    /// hierarchy at the hostPath: its root shows as above the namespace's.
    const POD_ROOT: &str = "\
1301 1280 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw
1310 1280 0:30 /../../.. /host/sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw
";

    #[test]
    fn the_nodes_hierarchy_root_at_the_charts_hostpath_is_ok() {
        let c = judge(Path::new("/host/sys/fs/cgroup"), FsKind::Cgroup2, POD_ROOT);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        c.assert_detail_names(&["/host/sys/fs/cgroup", "root"]);
    }

    #[test]
    fn a_cgroup_below_the_root_is_a_warning_naming_it() {
        let c = judge(
            Path::new("/host/sys/fs/cgroup"),
            FsKind::Cgroup2,
            POD_SUBTREE,
        );
        assert_eq!(c.status, Status::Warn, "{c:?}");
        c.assert_detail_names(&["/hairpin-node-1", "descendants"]);
        c.assert_fix_names(&["cgroupHostPath"]);
        let c = judge(
            Path::new("/host/sys/fs/cgroup/kubepods"),
            FsKind::Cgroup2,
            POD_ROOT,
        );
        assert_eq!(c.status, Status::Warn, "{c:?}");
        c.assert_detail_names(&["/../../../kubepods"]);
    }

    #[test]
    fn a_path_that_is_not_cgroup2_fails_with_the_charts_value_in_the_fix() {
        // A hybrid node's /sys/fs/cgroup is a tmpfs (0x01021994) of v1 mounts.
        let c = judge(
            Path::new("/host/sys/fs/cgroup"),
            FsKind::Other(0x0102_1994),
            POD_SUBTREE,
        );
        assert_eq!(c.status, Status::Fail, "{c:?}");
        c.assert_detail_names(&["not a cgroup v2", "0x1021994"]);
        c.assert_fix_names(&["cgroupHostPath", "/sys/fs/cgroup/unified"]);
    }

    #[test]
    fn this_machines_cgroup_v2_mount_is_found_as_the_agent_finds_it() {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let Some(root) = datapath::find_cgroup2_root(&mountinfo) else {
            return;
        };
        let c = cgroup2(Some(&root));
        assert_ne!(c.status, Status::Fail, "{c:?}");
        let c = cgroup2(Some(Path::new("/proc")));
        assert_eq!(c.status, Status::Fail, "{c:?}");
    }
}
