//! The root's child cgroups, where the connect programs go on a kernel that cannot
//! order cgroup links while another program (a socket load balancer) is at the
//! root's connect hook: the kernel runs a cgroup's effective programs descendants
//! first (`compute_effective_progs` in kernel/bpf/cgroup.c walks from the socket's
//! cgroup up to the root, appending each level's programs), so a program linked at
//! `kubepods.slice` runs before every program at the root for every socket below it.
//!
//! Watched by a rescan on the agent's heartbeat (every 5 s), not inotify: a
//! new top-level cgroup is rare (the init system makes its slices at boot, before
//! the agent; kubelet makes `kubepods.slice` once), a rescan is one readdir of one
//! directory, and it cannot miss an event (an inotify queue overflows, and a watch
//! on a cgroup2 mount made inside a container's namespace may see nothing).
//!
//! Owns reading the cgroup tree (children, the root's own processes). Never links
//! (the lifecycle's executor does).

use std::{io, path::Path};

/// The child cgroups of the cgroup v2 directory `root`, by name, sorted: each
/// directory in it (cgroupfs has no other directories).
pub(crate) fn list(root: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(root)? {
        let e = e?;
        if !e.file_type()?.is_dir() {
            continue;
        }
        // A name that is not UTF-8 cannot be pinned by name: left out, and said.
        match e.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(name) => tracing::warn!(
                cgroup = %name.to_string_lossy(),
                "a child cgroup whose name is not UTF-8: hairpin's connect programs are not linked there"
            ),
        }
    }
    names.sort();
    Ok(names)
}

/// How many user-space processes live in the cgroup `root` itself (its
/// `cgroup.procs`), which links at its children do not reach: on a kernel that
/// cannot order links, their connects meet the socket load balancer's program
/// first. Kernel threads (which live there too, and do not dial LoadBalancers) are
/// left out by their `PF_KTHREAD` flag; so are tasks outside this process's PID
/// namespace, which the kernel lists as 0 (the DaemonSet has no `hostPID`: from
/// inside it, what the agent cannot see is not counted).
pub(crate) fn own_processes(root: &Path) -> io::Result<usize> {
    let procs = std::fs::read_to_string(root.join("cgroup.procs"))?;
    Ok(procs
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter(|pid| *pid != 0 && !kernel_thread(*pid))
        .count())
}

/// `PF_KTHREAD` in a task's flags (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether `pid` is a kernel thread: the flags field of /proc/PID/stat (the 9th,
/// the 7th after the command's closing parenthesis). One gone is none.
fn kernel_thread(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_the_directories_and_the_own_processes_the_lines_of_cgroup_procs() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for child in ["system.slice", "kubepods.slice"] {
            std::fs::create_dir(dir.path().join(child)).expect("mkdir");
        }
        // This process, a kernel thread (kthreadd, pid 2) and a task of another PID
        // namespace (0).
        let own = std::process::id();
        std::fs::write(dir.path().join("cgroup.procs"), format!("{own}\n2\n0\n")).expect("write");
        assert_eq!(
            list(dir.path()).expect("list"),
            ["kubepods.slice", "system.slice"]
        );
        assert_eq!(own_processes(dir.path()).expect("read"), 1);
    }
}
