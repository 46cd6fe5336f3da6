//! A simulated node's teardown: its namespaces' processes killed, its cgroups and
//! bpffs removed when it drops, and what a crashed run left swept at the next start.

use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{PREFIX, SimNode};
use crate::sh::run_quiet;

impl Drop for SimNode {
    fn drop(&mut self) {
        for ns in &self.netns_created {
            kill_netns_processes(ns);
            run_quiet(&["ip", "netns", "del", ns]);
        }
        unmount_bpffs(&self.bpffs());
        remove_cgroup_tree(&self.cgroup);
        remove_cgroup_tree(&self.outside_cgroup_path());
        if std::env::var_os("HAIRPIN_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn kill_netns_processes(ns: &str) {
    if let Ok(out) = std::process::Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
    {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            run_quiet(&["kill", "-9", pid]);
        }
    }
}

/// Removes a cgroup directory tree, killing anything left in it first.
fn remove_cgroup_tree(cg: &Path) {
    if !cg.exists() {
        return;
    }
    if let Ok(kill) = fs::OpenOptions::new()
        .write(true)
        .open(cg.join("cgroup.kill"))
    {
        use std::io::Write;
        let _ = (&kill).write_all(b"1");
    }
    for _ in 0..50 {
        let children: Vec<PathBuf> = fs::read_dir(cg)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        for c in &children {
            let _ = fs::remove_dir(c);
        }
        if fs::remove_dir(cg).is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!("warning: could not remove cgroup {}", cg.display());
}

/// The cgroup v2 hierarchy's root mount.
pub fn cgroup2_root() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    hairpin_agent::datapath::find_cgroup2_root(&mountinfo)
        .expect("no cgroup v2 hierarchy is mounted: mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`")
}

/// Removes namespaces and cgroups left by test processes that no longer exist.
pub(super) fn sweep_stale() {
    let alive = |name: &str| -> bool {
        let pid = name
            .trim_start_matches(PREFIX)
            .split('x')
            .next()
            .unwrap_or("");
        pid.parse::<u32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists())
    };
    if let Ok(list) = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
    {
        for line in String::from_utf8_lossy(&list.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(PREFIX) && !alive(name) {
                kill_netns_processes(name);
                run_quiet(&["ip", "netns", "del", name]);
            }
        }
    }
    if let Ok(dir) = fs::read_dir(cgroup2_root()) {
        for e in dir.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(PREFIX) && !alive(&name) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    // The bpf filesystems of nodes whose test process died without its teardown.
    let tmp = std::env::temp_dir();
    if let Ok(mounts) = fs::read_to_string("/proc/self/mounts") {
        for line in mounts.lines() {
            let mut f = line.split_whitespace().skip(1);
            let (Some(at), Some(kind)) = (f.next(), f.next()) else {
                continue;
            };
            let at = Path::new(at);
            let node_dir = at
                .strip_prefix(&tmp)
                .ok()
                .and_then(|rest| rest.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned());
            if kind == "bpf"
                && let Some(name) = node_dir
                && name.starts_with(PREFIX)
                && !alive(&name)
            {
                unmount_bpffs(at);
            }
        }
    }
}

/// Unmounts a node's bpf filesystem (lazily: a process still in it lets go later),
/// which frees whatever was pinned there.
fn unmount_bpffs(at: &Path) {
    let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
}
