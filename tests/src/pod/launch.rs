//! What `hairpin-pod` is told ([`Launch`]) and does: the mount namespace and root the
//! container runtime would make, then the capabilities, `no_new_privs` and seccomp,
//! and exec.

use std::{
    collections::BTreeSet,
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use super::caps::{cap_number, capset};
use super::seccomp::{compile_filters, goarch, kernel, resolve_profile};

/// A bind mount into the container.
#[derive(Clone, Debug, PartialEq)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Path inside the container.
    pub target: String,
    /// Remounted read-only.
    pub read_only: bool,
}

/// Everything `hairpin-pod` needs to start the container: written as JSON by the test,
/// read by the helper.
#[derive(Clone, Debug)]
pub struct Launch {
    /// `/run/netns/NAME` to join.
    pub netns: PathBuf,
    /// The cgroup v2 directory to join.
    pub cgroup: PathBuf,
    /// Scratch directory for the root mount point.
    pub root: PathBuf,
    /// The agent binary, mounted at `argv[0]`.
    pub binary: PathBuf,
    /// Volumes and other bind mounts.
    pub binds: Vec<Bind>,
    /// `readOnlyRootFilesystem`.
    pub read_only_root: bool,
    /// uid and gid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Supplementary groups (the pod's `supplementalGroups`).
    pub groups: Vec<u32>,
    /// The bounding, permitted and effective capabilities (`CAP_` names).
    pub caps: Vec<String>,
    /// `no_new_privs`.
    pub no_new_privs: bool,
    /// The seccomp profile to resolve and install, if any.
    pub seccomp: Option<PathBuf>,
    /// argv.
    pub argv: Vec<String>,
    /// env, `NAME=value`.
    pub env: Vec<String>,
}

impl Launch {
    /// As JSON.
    pub fn to_json(&self) -> String {
        let binds: Vec<Value> = self
            .binds
            .iter()
            .map(|b| json!({"source": b.source, "target": b.target, "read_only": b.read_only}))
            .collect();
        json!({
            "netns": self.netns, "cgroup": self.cgroup, "root": self.root,
            "binary": self.binary, "binds": binds, "read_only_root": self.read_only_root,
            "uid": self.uid, "gid": self.gid, "groups": self.groups, "caps": self.caps,
            "no_new_privs": self.no_new_privs, "seccomp": self.seccomp,
            "argv": self.argv, "env": self.env,
        })
        .to_string()
    }

    /// From [`Launch::to_json`]'s text.
    pub fn from_json(text: &str) -> Launch {
        let v: Value = serde_json::from_str(text).expect("launch JSON");
        let s = |k: &str| v[k].as_str().unwrap_or_else(|| panic!("{k}")).to_string();
        let strs = |k: &str| -> Vec<String> {
            v[k].as_array()
                .expect(k)
                .iter()
                .map(|s| s.as_str().expect("string").to_string())
                .collect()
        };
        Launch {
            netns: s("netns").into(),
            cgroup: s("cgroup").into(),
            root: s("root").into(),
            binary: s("binary").into(),
            binds: v["binds"]
                .as_array()
                .expect("binds")
                .iter()
                .map(|b| Bind {
                    source: b["source"].as_str().expect("source").into(),
                    target: b["target"].as_str().expect("target").to_string(),
                    read_only: b["read_only"].as_bool().expect("read_only"),
                })
                .collect(),
            read_only_root: v["read_only_root"].as_bool().expect("read_only_root"),
            uid: v["uid"].as_u64().expect("uid") as u32,
            gid: v["gid"].as_u64().expect("gid") as u32,
            groups: v["groups"]
                .as_array()
                .expect("groups")
                .iter()
                .map(|g| g.as_u64().expect("a group id") as u32)
                .collect(),
            caps: strs("caps"),
            no_new_privs: v["no_new_privs"].as_bool().expect("no_new_privs"),
            seccomp: v["seccomp"].as_str().map(PathBuf::from),
            argv: strs("argv"),
            env: strs("env"),
        }
    }
}

/// Runs the container described by `launch` in this (single-threaded) process and
/// execs its command; returns only with the error that stopped it.
pub fn exec_container(launch: &Launch) -> anyhow::Error {
    match setup_and_exec(launch) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

enum Never {}

/// Binds `src` at `target` (made first: a directory, or an empty file), recursively
/// when `rec`, then read-only when `ro`.
fn bind(src: &Path, target: &Path, ro: bool, rec: bool) -> anyhow::Result<()> {
    use anyhow::Context;
    use nix::mount::{MsFlags, mount};
    let none: Option<&str> = None;
    if src.is_dir() {
        fs::create_dir_all(target)?;
    } else {
        fs::create_dir_all(target.parent().expect("parent"))?;
        fs::write(target, "")?;
    }
    let mut flags = MsFlags::MS_BIND;
    if rec {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(src), target, none, flags, none)
        .with_context(|| format!("bind {} at {}", src.display(), target.display()))?;
    if ro {
        mount(
            none,
            target,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            none,
        )
        .with_context(|| format!("remount {} read-only", target.display()))?;
    }
    Ok(())
}

/// The container's root filesystem under `l.root`, as runc builds one: a tmpfs with
/// the image's directories bound read-only, the binary over /usr/local, /proc, a
/// read-only /sys and the container's cgroup2, a minimal /dev, the pod's binds, and
/// the root made read-only when the pod asks for it.
fn make_root(l: &Launch) -> anyhow::Result<()> {
    use anyhow::Context;
    use nix::mount::{MsFlags, mount};
    let none: Option<&str> = None;
    let root = &l.root;
    fs::create_dir_all(root)?;
    mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )
    .context("mount the root tmpfs")?;
    let inside = |p: &str| root.join(p.trim_start_matches('/'));
    // The image: its files, read-only whatever readOnlyRootFilesystem says (the
    // host's must not be written); symlinks (merged /usr) as symlinks.
    for top in [
        "usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
    ] {
        let host = Path::new("/").join(top);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                std::os::unix::fs::symlink(fs::read_link(&host)?, inside(top))?;
            }
            Ok(_) => bind(&host, &inside(top), true, true)?,
            Err(_) => {}
        }
    }
    for dir in ["tmp", "run", "var/run", "root"] {
        fs::create_dir_all(inside(dir))?;
    }
    // The binary at the command's path, on a small tmpfs over the image's /usr/local.
    let bin = inside(&l.argv[0]);
    let local = inside("/usr/local");
    mount(
        Some("tmpfs"),
        &local,
        Some("tmpfs"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )
    .context("mount /usr/local")?;
    bind(&l.binary, &bin, true, false)?;
    mount(
        none,
        &local,
        none,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        none,
    )
    .context("remount /usr/local read-only")?;
    fs::create_dir_all(inside("proc"))?;
    mount(
        Some("proc"),
        &inside("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        none,
    )
    .context("mount /proc")?;
    // sysfs read-only, as for any unprivileged container (BTF is read from it).
    bind(Path::new("/sys"), &inside("sys"), true, false)?;
    mount(
        Some("cgroup2"),
        &inside("sys/fs/cgroup"),
        Some("cgroup2"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        none,
    )
    .context("mount the container's cgroup2")?;
    fs::create_dir_all(inside("dev"))?;
    mount(
        Some("tmpfs"),
        &inside("dev"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )
    .context("mount /dev")?;
    for dev in ["null", "zero", "full", "random", "urandom", "tty"] {
        bind(
            &Path::new("/dev").join(dev),
            &inside(&format!("dev/{dev}")),
            false,
            false,
        )?;
    }
    for b in &l.binds {
        bind(&b.source, &inside(&b.target), b.read_only, true)?;
    }
    if l.read_only_root {
        mount(
            none,
            root,
            none,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
            none,
        )
        .context("remount the root read-only")?;
    }
    Ok(())
}

fn setup_and_exec(l: &Launch) -> anyhow::Result<Never> {
    use anyhow::Context;
    use nix::{
        mount::{MntFlags, MsFlags, mount, umount2},
        sched::{CloneFlags, setns, unshare},
        unistd::{Gid, Uid, chdir, execve, pivot_root, setgid, setgroups, setuid},
    };
    // Resolved while the host's files are still reachable.
    let filters = match &l.seccomp {
        Some(p) => {
            let profile: Value = serde_json::from_str(&fs::read_to_string(p)?)?;
            compile_filters(&resolve_profile(&profile, &l.caps, goarch(), kernel()))
        }
        None => Vec::new(),
    };
    let last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")?
        .trim()
        .parse()?;
    let argv: Vec<CString> = l
        .argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = l
        .env
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()?;

    fs::write(l.cgroup.join("cgroup.procs"), "0").context("join the cgroup")?;
    let ns = fs::File::open(&l.netns).context("open the netns")?;
    setns(&ns, CloneFlags::CLONE_NEWNET).context("setns")?;
    // A private cgroup namespace rooted at the cgroup just joined, as runc makes for
    // cgroup v2 (containerd's default): the container's /sys/fs/cgroup shows "/".
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWCGROUP)
        .context("unshare the mount and cgroup namespaces")?;
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .context("make / private")?;

    make_root(l)?;
    let root = &l.root;
    // runc's pivot_root(".", "."): the old root ends up on top and is detached.
    chdir(root)?;
    pivot_root(".", ".").context("pivot_root")?;
    umount2(".", MntFlags::MNT_DETACH).context("detach the old root")?;
    chdir("/")?;

    let groups: Vec<Gid> = l.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups).context("setgroups")?;
    setgid(Gid::from_raw(l.gid)).context("setgid")?;
    if l.uid != 0 {
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) };
    }
    setuid(Uid::from_raw(l.uid)).context("setuid")?;

    let keep: BTreeSet<u32> = l.caps.iter().map(|c| cap_number(c)).collect();
    for cap in 0..=last_cap {
        if !keep.contains(&cap) {
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error()).context("drop from the bounding set");
            }
        }
    }
    let mask: u64 = keep.iter().fold(0, |m, c| m | (1u64 << c));
    capset(mask, mask, 0).context("capset")?;
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if l.no_new_privs {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error()).context("no_new_privs");
        }
    }
    for f in &filters {
        seccompiler::apply_filter(f).context("install the seccomp filter")?;
    }
    let never = execve(&argv[0], &argv, &envp).context("execve")?;
    match never {}
}
