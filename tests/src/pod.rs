//! The DaemonSet's pod as written in `deploy/base/daemonset.yaml`, run the way a
//! container runtime (containerd's CRI plugin and runc) runs it, on a simulated node:
//!
//! - the container's `command`, `args` and `env`, downward API `fieldRef`s filled from
//!   the simulated node (node name, namespace, pod name, host IPs);
//! - the node's network namespace (`hostNetwork: true`), inside the node's cgroup
//!   subtree, with a cgroup namespace of its own rooted there (mounted read-only at
//!   `/sys/fs/cgroup`, as runc does on cgroup v2);
//! - a private mount namespace whose root is a fresh tmpfs holding the image's content
//!   (the host's `/usr`, `/etc` and library directories, read-only, standing in for the
//!   debian-slim image the Dockerfile builds), the agent binary at the `command` path,
//!   `/proc`, `/dev` and a read-only `/sys`, and every `hostPath` volume bind-mounted
//!   at its `mountPath` from a per-test stand-in, read-only where `readOnly` says so;
//!   the root then remounted read-only (`readOnlyRootFilesystem`) and pivoted into;
//! - `runAsUser`/`runAsGroup`, supplementary groups cleared;
//! - capabilities as containerd's CRI plugin sets them for `drop: [ALL]` plus `add`:
//!   bounding, permitted and effective exactly the added ones; inheritable and ambient
//!   empty (containerd 1.6.2+ and runc 1.1.1+ leave inheritable empty since
//!   CVE-2022-24769; for uid 0 it makes no difference, exec gives root its bounding set);
//! - `no_new_privs` when `allowPrivilegeEscalation: false`;
//! - last, a seccomp filter built from a profile in `tests/fixtures/seccomp/` resolved
//!   for the container's capabilities and this machine's architecture as containerd's
//!   `DefaultProfile` resolves it (`RuntimeDefault`), or a Localhost profile as it is.
//!
//! Not simulated: the pod's own PID, IPC and UTS namespaces, the masked /proc paths, the service
//! account token (the fake API server speaks plain HTTP, so the agent gets a
//! kubeconfig through `KUBECONFIG` instead of the in-cluster files), and AppArmor.
//!
//! The setup runs in `hairpin-pod` (`src/bin/hairpin-pod.rs`), a single-threaded
//! helper that does it step by step and then execs the agent: no work between fork and
//! exec in the multithreaded test process.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// One variable of the container's env, as written.
#[derive(Clone, Debug, PartialEq)]
pub enum EnvSource {
    /// `value:`.
    Value(String),
    /// `valueFrom.fieldRef.fieldPath`.
    Field(String),
}

/// A volume mount with the hostPath volume behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMount {
    /// The volume's name.
    pub name: String,
    /// Where the container sees it.
    pub mount_path: String,
    /// `readOnly`.
    pub read_only: bool,
    /// `hostPath.path`.
    pub host_path: String,
    /// `hostPath.type` (`Directory`, `File`, `DirectoryOrCreate`, ...).
    pub host_type: String,
}

/// The agent container of the DaemonSet, as written.
#[derive(Clone, Debug)]
pub struct Container {
    /// `command` then `args`.
    pub argv: Vec<String>,
    /// `env`, in order.
    pub env: Vec<(String, EnvSource)>,
    /// `volumeMounts` joined with their hostPath volumes.
    pub mounts: Vec<HostMount>,
    /// `securityContext.readOnlyRootFilesystem`.
    pub read_only_root: bool,
    /// `securityContext.runAsUser` (the image's user 0 when absent).
    pub uid: u32,
    /// `securityContext.runAsGroup`.
    pub gid: u32,
    /// The pod's `securityContext.supplementalGroups`.
    pub groups: Vec<u32>,
    /// `!allowPrivilegeEscalation`.
    pub no_new_privs: bool,
    /// `capabilities.add`, as `CAP_` names.
    pub caps: Vec<String>,
    /// `capabilities.drop` contains `ALL`.
    pub drop_all: bool,
    /// `seccompProfile.type`.
    pub seccomp: String,
    /// `privileged`.
    pub privileged: bool,
}

/// The first container of the DaemonSet in `path` (relative to the workspace).
pub fn daemonset_container(path: &str) -> Container {
    let text = fs::read_to_string(crate::repo::workspace().join(path)).expect("read the DaemonSet");
    let yaml: yaml_serde::Value = yaml_serde::from_str(&text).expect("DaemonSet YAML");
    let ds = serde_json::to_value(yaml).expect("YAML as JSON");
    assert_eq!(ds["kind"], "DaemonSet", "{path}");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        spec["hostNetwork"], true,
        "the agent runs in the host network"
    );
    let c = &spec["containers"][0];
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().expect("string").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut argv = strs(&c["command"]);
    argv.extend(strs(&c["args"]));
    let env = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_string();
            let src = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some(f) => EnvSource::Field(f.to_string()),
                None => EnvSource::Value(match &e["value"] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                }),
            };
            (name, src)
        })
        .collect();
    let volumes: BTreeMap<&str, &Value> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| (v["name"].as_str().expect("volume name"), v))
        .collect();
    let mounts = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let name = m["name"].as_str().expect("mount name");
            let vol = volumes
                .get(name)
                .unwrap_or_else(|| panic!("no volume {name}"));
            HostMount {
                name: name.to_string(),
                mount_path: m["mountPath"].as_str().expect("mountPath").to_string(),
                read_only: m["readOnly"].as_bool().unwrap_or(false),
                host_path: vol["hostPath"]["path"]
                    .as_str()
                    .unwrap_or_else(|| panic!("volume {name} is not a hostPath"))
                    .to_string(),
                host_type: vol["hostPath"]["type"].as_str().unwrap_or("").to_string(),
            }
        })
        .collect();
    let sc = &c["securityContext"];
    let caps = strs(&sc["capabilities"]["add"])
        .into_iter()
        .map(|c| format!("CAP_{}", c.trim_start_matches("CAP_")))
        .collect();
    Container {
        argv,
        env,
        mounts,
        read_only_root: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        uid: sc["runAsUser"].as_u64().unwrap_or(0) as u32,
        gid: sc["runAsGroup"].as_u64().unwrap_or(0) as u32,
        groups: spec["securityContext"]["supplementalGroups"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|g| g.as_u64().expect("a group id") as u32)
                    .collect()
            })
            .unwrap_or_default(),
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
        caps,
        drop_all: strs(&sc["capabilities"]["drop"]).iter().any(|d| d == "ALL"),
        seccomp: sc["seccompProfile"]["type"]
            .as_str()
            .unwrap_or("Unconfined")
            .to_string(),
        privileged: sc["privileged"].as_bool().unwrap_or(false),
    }
}

/// What the kubelet fills downward API fields from.
pub struct Downward {
    /// `spec.nodeName`.
    pub node_name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub pod_name: String,
    /// `status.hostIPs` (and `status.podIPs` of a hostNetwork pod).
    pub host_ips: Vec<String>,
}

impl Container {
    /// The env as the kubelet resolves it: `NAME=value` lines.
    pub fn resolved_env(&self, d: &Downward) -> Vec<(String, String)> {
        self.env
            .iter()
            .map(|(name, src)| {
                let value = match src {
                    EnvSource::Value(v) => v.clone(),
                    EnvSource::Field(f) => match f.as_str() {
                        "spec.nodeName" => d.node_name.clone(),
                        "metadata.namespace" => d.namespace.clone(),
                        "metadata.name" => d.pod_name.clone(),
                        "status.hostIP" | "status.podIP" => d.host_ips[0].clone(),
                        "status.hostIPs" | "status.podIPs" => d.host_ips.join(","),
                        other => panic!("downward API field {other} is not simulated"),
                    },
                };
                (name.clone(), value)
            })
            .collect()
    }
}

/// One rule of a resolved seccomp profile.
#[derive(Clone, Debug, PartialEq)]
pub struct SeccompRule {
    /// Syscall names.
    pub names: Vec<String>,
    /// `None` to allow, `Some(errno)` to fail with it.
    pub errno: Option<u32>,
    /// (index, op, value, valueTwo); all must hold.
    pub args: Vec<(u8, String, u64, u64)>,
}

/// A profile resolved for one container: the errno of the default action and the rules.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// `defaultErrnoRet` (EPERM when absent).
    pub default_errno: u32,
    /// The rules that apply.
    pub rules: Vec<SeccompRule>,
}

impl Resolved {
    /// The names allowed unconditionally by some rule.
    pub fn allowed(&self) -> BTreeSet<String> {
        self.rules
            .iter()
            .filter(|r| r.errno.is_none() && r.args.is_empty())
            .flat_map(|r| r.names.iter().cloned())
            .collect()
    }
}

/// This machine's architecture in Go's GOARCH names (the profiles' `arches`).
pub fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no seccomp filter for {other} here"),
    }
}

/// The running kernel's (major, minor).
pub fn kernel() -> (u32, u32) {
    let u = nix::sys::utsname::uname().expect("uname");
    let r = u.release().to_string_lossy().into_owned();
    let mut it = r.split(|c: char| !c.is_ascii_digit());
    let mut n = || it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (n(), n())
}

/// Resolves `profile` (the JSON of `tests/fixtures/seccomp/` with `includes` and
/// `excludes`, or an OCI profile without them) for a container whose bounding set is
/// `caps`, on `arch` (GOARCH) and `kernel`, as containerd's DefaultProfile decides
/// which rules to append.
pub fn resolve_profile(
    profile: &Value,
    caps: &[String],
    arch: &str,
    kernel: (u32, u32),
) -> Resolved {
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO", "default action");
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let has_cap = |v: &Value| list(v).iter().any(|c| caps.contains(c));
    let mut rules = Vec::new();
    for r in profile["syscalls"].as_array().expect("syscalls") {
        let (inc, exc) = (&r["includes"], &r["excludes"]);
        if inc["caps"].is_array() && !has_cap(&inc["caps"]) {
            continue;
        }
        if inc["arches"].is_array() && !list(&inc["arches"]).iter().any(|a| a == arch) {
            continue;
        }
        if let Some(min) = inc["minKernel"].as_str() {
            let mut it = min.split('.').map(|n| n.parse::<u32>().expect("minKernel"));
            let want = (it.next().unwrap_or(0), it.next().unwrap_or(0));
            if kernel < want {
                continue;
            }
        }
        if has_cap(&exc["caps"]) || list(&exc["arches"]).iter().any(|a| a == arch) {
            continue;
        }
        let errno = match r["action"].as_str().expect("action") {
            "SCMP_ACT_ALLOW" => None,
            "SCMP_ACT_ERRNO" => Some(r["errnoRet"].as_u64().unwrap_or(1) as u32),
            other => panic!("action {other} is not simulated"),
        };
        let args = r["args"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|a| {
                        (
                            a["index"].as_u64().expect("index") as u8,
                            a["op"].as_str().expect("op").to_string(),
                            a["value"].as_u64().expect("value"),
                            a["valueTwo"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        rules.push(SeccompRule {
            names: list(&r["names"]),
            errno,
            args,
        });
    }
    Resolved {
        default_errno: profile["defaultErrnoRet"].as_u64().unwrap_or(1) as u32,
        rules,
    }
}

fn target_arch() -> seccompiler::TargetArch {
    seccompiler::TargetArch::try_from(std::env::consts::ARCH).expect("seccompiler arch")
}

/// Whether seccompiler's syscall table has `name` on this architecture. runc skips
/// names libseccomp cannot resolve (syscalls of newer kernels or other
/// architectures); so does this.
fn known_syscall(name: &str) -> bool {
    // (seccompiler refuses a filter whose two actions are the same.)
    let probe = json!({"p": {"mismatch_action": "allow", "match_action": {"errno": 1},
                             "filter": [{"syscall": name}]}});
    seccompiler::compile_from_json(probe.to_string().as_bytes(), target_arch()).is_ok()
}

/// BPF programs equivalent to `resolved`, to install in order. One filter holds the
/// allow rules with the default errno on every other call; one more per errno action
/// (clone3's ENOSYS) fails its calls with that errno and allows the rest. The kernel
/// runs every installed filter and takes the most restrictive answer, and of two
/// errno answers the later filter's, so the stack decides as the single filter runc
/// builds does.
pub fn compile_filters(resolved: &Resolved) -> Vec<seccompiler::BpfProgram> {
    let cond = |(index, op, value, two): &(u8, String, u64, u64)| -> Value {
        let (op, val) = match op.as_str() {
            "SCMP_CMP_EQ" => (json!("eq"), *value),
            "SCMP_CMP_NE" => (json!("ne"), *value),
            "SCMP_CMP_LT" => (json!("lt"), *value),
            "SCMP_CMP_LE" => (json!("le"), *value),
            "SCMP_CMP_GT" => (json!("gt"), *value),
            "SCMP_CMP_GE" => (json!("ge"), *value),
            // OCI: (arg & value) == valueTwo.
            "SCMP_CMP_MASKED_EQ" => (json!({"masked_eq": value}), *two),
            other => panic!("seccomp op {other} is not simulated"),
        };
        json!({"index": index, "type": "qword", "op": op, "val": val})
    };
    let mut groups: BTreeMap<Option<u32>, Vec<&SeccompRule>> = BTreeMap::new();
    for r in &resolved.rules {
        groups.entry(r.errno).or_default().push(r);
    }
    let mut known = BTreeMap::new();
    let mut programs = Vec::new();
    for (errno, rules) in groups {
        // A name allowed without conditions anywhere in the group needs no conditions.
        let bare: BTreeSet<&str> = rules
            .iter()
            .filter(|r| r.args.is_empty())
            .flat_map(|r| r.names.iter().map(String::as_str))
            .collect();
        let mut filter = Vec::new();
        for r in rules {
            for name in &r.names {
                if !*known
                    .entry(name.clone())
                    .or_insert_with(|| known_syscall(name))
                {
                    continue;
                }
                if r.args.is_empty() {
                    filter.push(json!({"syscall": name}));
                } else if !bare.contains(name.as_str()) {
                    let args: Vec<Value> = r.args.iter().map(cond).collect();
                    filter.push(json!({"syscall": name, "args": args}));
                }
            }
        }
        assert!(
            errno.is_some() || filter.len() > 100,
            "only {} of the profile's allow rules are known syscalls here",
            filter.len()
        );
        let (mismatch, matched) = match errno {
            None => (json!({"errno": resolved.default_errno}), json!("allow")),
            Some(e) => (json!("allow"), json!({"errno": e})),
        };
        let doc = json!({"f": {"mismatch_action": mismatch, "match_action": matched,
                               "filter": filter}});
        let mut map = seccompiler::compile_from_json(doc.to_string().as_bytes(), target_arch())
            .unwrap_or_else(|e| panic!("compile the seccomp filter: {e}"));
        // Allow first: the errno filters installed after it answer for their calls.
        let p = map.remove("f").expect("filter f");
        if errno.is_none() {
            programs.insert(0, p);
        } else {
            programs.push(p);
        }
    }
    programs
}

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

/// Capability numbers of `CAP_` names (linux/capability.h).
pub fn cap_number(name: &str) -> u32 {
    const NAMES: [&str; 41] = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_DAC_READ_SEARCH",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_LINUX_IMMUTABLE",
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_BROADCAST",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_IPC_LOCK",
        "CAP_IPC_OWNER",
        "CAP_SYS_MODULE",
        "CAP_SYS_RAWIO",
        "CAP_SYS_CHROOT",
        "CAP_SYS_PTRACE",
        "CAP_SYS_PACCT",
        "CAP_SYS_ADMIN",
        "CAP_SYS_BOOT",
        "CAP_SYS_NICE",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_TIME",
        "CAP_SYS_TTY_CONFIG",
        "CAP_MKNOD",
        "CAP_LEASE",
        "CAP_AUDIT_WRITE",
        "CAP_AUDIT_CONTROL",
        "CAP_SETFCAP",
        "CAP_MAC_OVERRIDE",
        "CAP_MAC_ADMIN",
        "CAP_SYSLOG",
        "CAP_WAKE_ALARM",
        "CAP_BLOCK_SUSPEND",
        "CAP_AUDIT_READ",
        "CAP_PERFMON",
        "CAP_BPF",
        "CAP_CHECKPOINT_RESTORE",
    ];
    NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("unknown capability {name}")) as u32
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

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capset(effective: u64, permitted: u64, inheritable: u64) -> std::io::Result<()> {
    const V3: u32 = 0x2008_0522;
    let hdr = CapHeader {
        version: V3,
        pid: 0,
    };
    let lo = |m: u64| m as u32;
    let hi = |m: u64| (m >> 32) as u32;
    let data = [
        CapData {
            effective: lo(effective),
            permitted: lo(permitted),
            inheritable: lo(inheritable),
        },
        CapData {
            effective: hi(effective),
            permitted: hi(permitted),
            inheritable: hi(inheritable),
        },
    ];
    // SAFETY: capset(2) with a v3 header and two data structs, as the kernel expects.
    let r = unsafe { libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The container's process; SIGKILLed on drop if still running (its mount namespace,
/// and every mount made for it, goes with it).
pub struct PodProcess {
    child: Option<Child>,
    /// Its stderr.
    pub log: PathBuf,
    /// Its stdout.
    pub out: PathBuf,
}

impl PodProcess {
    /// Starts `launch` through `helper` (the `hairpin-pod` binary), stderr to `log`,
    /// stdout beside it (`.out`).
    pub fn start(helper: &Path, launch: &Launch, dir: &Path, log: PathBuf) -> PodProcess {
        let spec = dir.join(format!(
            "launch-{}.json",
            log.file_stem().and_then(|s| s.to_str()).unwrap_or("pod")
        ));
        fs::write(&spec, launch.to_json()).expect("write launch spec");
        let out = log.with_extension("out");
        let child = std::process::Command::new(helper)
            .arg(&spec)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).expect("pod stdout"))
            .stderr(fs::File::create(&log).expect("pod log"))
            .spawn()
            .expect("start hairpin-pod");
        PodProcess {
            child: Some(child),
            log,
            out,
        }
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Its output so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; panics with the log if it does not
    /// within `within` or the process exits first.
    pub fn wait_for_log(&mut self, needle: &str, within: Duration) {
        crate::agent::wait_for_log_of(
            "the pod's process",
            &self.log,
            self.child.as_mut(),
            needle,
            within,
        );
    }

    /// Waits for it to exit, at most `within`; its exit code.
    pub fn wait(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                self.child = None;
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Makes `cmd` (run as root) start with exactly the capabilities `caps` (`CAP_`
/// names), as the container's process would have them: every other one dropped from
/// the bounding set (which is what a root process's permitted and effective sets
/// become at execve), the permitted and effective sets cut to `caps`, and the
/// ambient set cleared. Only the child is changed; steps that need more (joining a
/// network namespace) must be registered on `cmd` before this.
pub fn with_only_caps(cmd: &mut std::process::Command, caps: &[&str]) {
    use std::os::unix::process::CommandExt;
    let last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .expect("read cap_last_cap")
        .trim()
        .parse()
        .expect("cap_last_cap is a number");
    let keep: BTreeSet<u32> = caps.iter().map(|c| cap_number(c)).collect();
    let mask: u64 = keep.iter().fold(0, |m, c| m | (1u64 << c));
    // SAFETY: the closure only makes prctl and capset system calls, which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for cap in 0..=last_cap {
                if mask & (1u64 << cap) == 0
                    && libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            capset(mask, mask, 0)?;
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
}
