//! Finding the cgroup v2 hierarchy the programs attach to.

use std::path::{Path, PathBuf};

/// Finds the cgroup v2 hierarchy's root mount in `mountinfo` (the text of
/// /proc/self/mountinfo).
///
/// mountinfo shows each mount's root relative to the reader's cgroup namespace:
/// `/` is the namespace's root (the node's root only outside a container's own
/// cgroup namespace), `/../..` lies above it (the host's hierarchy mounted into a
/// namespaced container by hostPath), and `/kubepods/...` is a subtree (a
/// container's own cgroup without a cgroup namespace). The highest mount wins;
/// subtrees never do. Among equals, /sys/fs/cgroup, then the shortest mount point.
pub fn find_cgroup2_root(mountinfo: &str) -> Option<PathBuf> {
    let mut found: Vec<(usize, PathBuf)> = mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let mut f = pre.split_whitespace();
            let root = f.nth(3)?;
            let mount_point = f.next()?;
            if fstype != "cgroup2" {
                return None;
            }
            let up = root
                .split('/')
                .filter(|c| !c.is_empty())
                .take_while(|c| *c == "..")
                .count();
            let is_root_or_above = root.split('/').filter(|c| !c.is_empty()).all(|c| c == "..");
            is_root_or_above.then(|| (up, PathBuf::from(unescape(mount_point))))
        })
        .collect();
    found.sort_by_key(|(up, p)| {
        (
            std::cmp::Reverse(*up),
            p != Path::new("/sys/fs/cgroup"),
            p.as_os_str().len(),
        )
    });
    found.into_iter().next().map(|(_, p)| p)
}

/// Whether `path` is the cgroup v2 hierarchy's root, whatever the reader's cgroup
/// namespace: a directory of a cgroup2 filesystem whose kernfs id, its inode
/// number, is 1 (the first the hierarchy allocates), where every cgroup below has
/// another. A program attached there runs for every socket on the node.
pub(crate) fn is_cgroup2_root(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let cgroup2 = nix::sys::statfs::statfs(path)
        .is_ok_and(|st| st.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    cgroup2 && std::fs::metadata(path).is_ok_and(|m| m.ino() == 1)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub(crate) fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_hierarchys_root_is_the_root() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(!is_cgroup2_root(dir.path()));
        assert!(!is_cgroup2_root(&dir.path().join("missing")));
        let Some(root) = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|m| find_cgroup2_root(&m))
        else {
            return;
        };
        if !is_cgroup2_root(&root) {
            // A container's own cgroup namespace mounted as its root: a subtree.
            return;
        }
        let child = std::fs::read_dir(&root)
            .expect("read the cgroup root")
            .filter_map(Result::ok)
            .find(|e| e.file_type().is_ok_and(|t| t.is_dir()));
        if let Some(child) = child {
            assert!(
                !is_cgroup2_root(&child.path()),
                "{}",
                child.path().display()
            );
        }
    }

    #[test]
    fn finds_the_unified_hierarchy_beside_v1_controllers() {
        let mi = "\
25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
33 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        assert_eq!(
            find_cgroup2_root(mi),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn in_a_private_cgroup_namespace_the_hosts_hierarchy_wins() {
        // The container runtime's own cgroup2 mount shows `/` (the namespace root);
        // the hostPath mount of the node's /sys/fs/cgroup lies above it.
        let mi = "\
50 40 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw
51 40 0:30 /../../.. /host/sys/fs/cgroup ro - cgroup2 cgroup2 rw
";
        assert_eq!(
            find_cgroup2_root(mi),
            Some(PathBuf::from("/host/sys/fs/cgroup"))
        );
    }

    #[test]
    fn skips_a_namespaced_cgroup_root_and_prefers_sys_fs_cgroup() {
        let mi = "\
40 30 0:30 /kubepods/pod1/ctr /sys/fs/cgroup ro - cgroup2 cgroup2 rw
41 30 0:30 / /host/sys\\040fs/cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(
            find_cgroup2_root(mi),
            Some(PathBuf::from("/host/sys fs/cgroup"))
        );
        let mi = "\
1 0 0:30 / /run/cilium/cgroupv2 rw - cgroup2 cgroup2 rw
2 0 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(find_cgroup2_root(mi), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            find_cgroup2_root("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}
