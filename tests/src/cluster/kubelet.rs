//! A real kubelet on the simulated node: containerd (Debian's, with its CRI plugin,
//! runc and the CNI plugins) and the kubelet and kube-scheduler `cargo xtask k8s`
//! builds, in the node's network namespace and in a mount namespace of the node's
//! own, so that what the chart's hostPaths name (`/sys/fs/bpf`, `/run/hairpin`,
//! `/etc/hosts`) is the node's and never the machine's. Images come from no
//! registry: the agent's from `cargo xtask image`, a pause image of the pause binary
//! `cargo xtask k8s` builds and a busybox image for test pods, imported with
//! `ctr -n k8s.io images import`.
//!
//! This machine has cgroup v1 controllers with cgroup2 beside them and no
//! CAP_SYS_RESOURCE: containerd runs with `restrict_oom_score_adj = true`, the
//! kubelet with `failCgroupV1: false` and the cgroupfs driver; [`NodeRuntime::start`]
//! checks that each took. The kubelet's cgroup root is the node's cgroup (`cgroupRoot`),
//! so its pods live under the cgroup the agent attaches at.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{Cluster, NODE_NAME, Proc, tail};

mod config;
mod images;
use crate::{
    node::{NODE_IP4, NODE_IP6, SimNode},
    sh::run,
};

/// The pause image's name in the node's image store (containerd's `sandbox_image`).
pub const PAUSE_IMAGE: &str = "localhost/hairpin-test/pause:3.10.2";
/// The test pods' image: busybox (static) alone, as `/bin/busybox`.
pub const BUSYBOX_IMAGE: &str = "localhost/hairpin-test/busybox:1";
/// The ingress pods' image: Debian's nginx (`/usr/sbin/nginx`) with the shared
/// libraries it links, nothing else.
pub const NGINX_IMAGE: &str = "localhost/hairpin-test/nginx:1";
/// The agent's image as `cargo xtask image` leaves it in podman's storage.
pub const AGENT_DEV_IMAGE: &str = "localhost/hairpin-agent:dev";
/// The next version's image `cargo xtask test` builds (the same tree, the agent
/// built to report another version: `cargo xtask image --agent-version`).
pub const AGENT_NEXT_IMAGE: &str = "localhost/hairpin-agent:next";
/// The chart's default repository.
pub const CHART_REPOSITORY: &str = "ghcr.io/hairpin-dev/hairpin-agent";

/// The v1 hierarchies the kubelet's cgroupfs driver uses on this machine.
const V1_CONTROLLERS: [&str; 9] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
];

/// The kernel settings the kubelet insists on (`setupKernelTunables`); with
/// `protectKernelDefaults` it only reads them. They are machine-wide (the machine's
/// panic behaviour among them), so the node's mount namespace shows them set and the
/// machine's own are never written.
const KUBELET_SYSCTLS: [(&str, &str); 3] = [
    ("vm/overcommit_memory", "1"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
];

/// Where the kubelet's and the runtime's binaries are: the variables `cargo xtask
/// test` sets, else the cache. `None` with a message when one is missing.
fn node_binaries() -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let find = |var: &str, prefix: &str, name: &str| -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(var) {
            return Some(PathBuf::from(p)).filter(|p| p.exists());
        }
        let dir = crate::helm::cache_dir().join("k8s");
        let mut found: Vec<PathBuf> = fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path().join(name))
            .filter(|p| p.exists())
            .collect();
        found.sort_by_key(|p| p.symlink_metadata().and_then(|m| m.modified()).ok());
        found.pop()
    };
    let kubelet = find("HAIRPIN_KUBELET_BIN", "kubelet-", "kubelet");
    let scheduler = find("HAIRPIN_KUBE_SCHEDULER_BIN", "kubelet-", "kube-scheduler");
    let pause = find("HAIRPIN_PAUSE_BIN", "pause-", "pause");
    match (kubelet, scheduler, pause) {
        (Some(k), Some(s), Some(p)) => Ok((k, s, p)),
        _ => Err(
            "the kubelet, kube-scheduler or pause binary is not built: run \
                  `cargo xtask k8s`"
                .to_string(),
        ),
    }
}

/// containerd, the kubelet and kube-scheduler for the simulated node. Dropping it
/// kills them and every container, and removes the pods' cgroups and the node's mount
/// namespace.
pub struct NodeRuntime {
    /// Configuration, state, images and logs.
    pub dir: PathBuf,
    /// The node's mount namespace (a bind-mounted nsfs file).
    mnt: PathBuf,
    /// containerd's socket.
    pub socket: PathBuf,
    /// The node's cgroup under the cgroup2 mount (the kubelet's `cgroupRoot`).
    cgroup: PathBuf,
    /// Its name, the same in each v1 hierarchy.
    cgroup_name: String,
    /// The agent image's name as the chart asks for it.
    pub agent_image: String,
    scheduler: Option<Proc>,
    kubelet: Option<Proc>,
    containerd: Option<Proc>,
    /// From the start of containerd to the Node Ready.
    pub startup: Duration,
}

/// Outcome of an optional start: the runtime, or why this machine cannot have it.
pub type Started = Result<NodeRuntime, String>;

impl NodeRuntime {
    /// Starts containerd, imports the images, starts the kubelet and the scheduler
    /// and waits for the Node to be Ready. `Err` (the scenario skips, saying why)
    /// when a binary is missing outside CI; under `CI=true` that fails.
    pub fn start(cluster: &Cluster, node: &SimNode) -> Started {
        let (kubelet_bin, scheduler_bin, pause_bin) = match node_binaries() {
            Ok(b) => b,
            Err(msg) => {
                assert!(std::env::var_os("CI").is_none(), "{msg}");
                return Err(msg);
            }
        };
        // The kubelet is built for the default release only; a kubelet newer than
        // its API server is outside Kubernetes' skew policy: another release's run
        // (`HAIRPIN_K8S_VERSION`) leaves these scenarios out, saying so.
        let out = Command::new(&kubelet_bin)
            .arg("--version")
            .output()
            .expect("run kubelet --version");
        let kubelet_version = String::from_utf8_lossy(&out.stdout)
            .trim()
            .trim_start_matches("Kubernetes ")
            .to_string();
        if kubelet_version != cluster.bins.k8s_version {
            return Err(format!(
                "the kubelet is {kubelet_version}, the control plane {}: the kubelet scenarios \
                 run with the default release only",
                cluster.bins.k8s_version
            ));
        }
        let started = Instant::now();
        let dir = cluster.dir.join("node-runtime");
        fs::create_dir_all(&dir).expect("runtime dir");
        let cgroup_name = node
            .cgroup
            .file_name()
            .expect("node cgroup name")
            .to_string_lossy()
            .into_owned();
        let mut rt = NodeRuntime {
            mnt: dir.join("ns/mnt"),
            socket: dir.join("containerd.sock"),
            cgroup: node.cgroup.clone(),
            cgroup_name,
            agent_image: format!("{CHART_REPOSITORY}:{}", chart_app_version()),
            dir,
            scheduler: None,
            kubelet: None,
            containerd: None,
            startup: Duration::ZERO,
        };
        // From here on a panic drops `rt`, which removes what was made so far.
        rt.make_mount_namespace();
        rt.make_v1_cgroups();
        rt.write_containerd_config();
        rt.containerd = Some(rt.spawn(
            "containerd",
            &node.node_ns,
            &["containerd", "--config", &rt.path("containerd.toml")],
        ));
        rt.wait_for_socket(Duration::from_secs(20));
        rt.check_containerd_settings();
        rt.import_images(&pause_bin);
        rt.write_kubelet_config(cluster);
        let kubelet = kubelet_bin.to_str().expect("utf-8 path").to_string();
        let argv = [
            kubelet.as_str(),
            &format!("--config={}", rt.path("kubelet.yaml")),
            &format!("--kubeconfig={}", rt.path("kubelet.kubeconfig")),
            &format!("--hostname-override={NODE_NAME}"),
            &format!("--node-ip={NODE_IP4},{NODE_IP6}"),
            &format!("--root-dir={}", rt.path("kubelet")),
            &format!("--cert-dir={}", rt.path("kubelet-pki")),
            "--v=2",
        ];
        rt.kubelet = Some(rt.spawn("kubelet", &node.node_ns, &argv));
        cluster.node_kubeconfig(&rt.dir.join("scheduler.kubeconfig"), "scheduler-token");
        let scheduler = scheduler_bin.to_str().expect("utf-8 path").to_string();
        rt.scheduler = Some(Proc::spawn(
            "kube-scheduler",
            &node.node_ns,
            &rt.dir,
            &[
                &scheduler,
                &format!("--kubeconfig={}", rt.path("scheduler.kubeconfig")),
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        ));
        rt.wait_node_ready(cluster, Duration::from_secs(90));
        untaint_ready_node(cluster);
        rt.check_kubelet_settings(cluster);
        rt.startup = started.elapsed();
        eprintln!(
            "kubelet up: Node {NODE_NAME} Ready {:.1} s after containerd started",
            rt.startup.as_secs_f64()
        );
        Ok(rt)
    }

    fn path(&self, name: &str) -> String {
        self.dir
            .join(name)
            .to_str()
            .expect("utf-8 path")
            .to_string()
    }

    /// Starts `argv` in `netns` and the node's mount namespace.
    fn spawn(&self, name: &'static str, netns: &str, argv: &[&str]) -> Proc {
        let mnt = format!("--mount={}", self.mnt.display());
        let mut full = vec!["nsenter", mnt.as_str(), "--"];
        full.extend_from_slice(argv);
        Proc::spawn(name, netns, &self.dir, &full)
    }

    /// Runs `argv` in the node's mount namespace (containerd's socket, its images).
    pub fn run(&self, argv: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .arg(format!("--mount={}", self.mnt.display()))
            .arg("--")
            .args(argv)
            .output()
            .unwrap_or_else(|e| panic!("failed to start {argv:?}: {e}"))
    }

    /// `ctr -n k8s.io ARGS` against the node's containerd, failing with its output.
    pub fn ctr(&self, args: &[&str]) -> String {
        let sock = format!("--address={}", self.socket.display());
        let mut argv = vec!["ctr", sock.as_str(), "--namespace=k8s.io"];
        argv.extend_from_slice(args);
        let out = self.run(&argv);
        assert!(
            out.status.success(),
            "{argv:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The mount namespace of the node: private propagation, its own bpffs on
    /// /sys/fs/bpf, tmpfs on /run and /var/log (the runtime's sockets and network
    /// namespaces, the pods' logs), a copy of /etc/hosts, and the kubelet's sysctls
    /// shown set ([`KUBELET_SYSCTLS`]).
    fn make_mount_namespace(&self) {
        let ns_dir = self.dir.join("ns");
        fs::create_dir_all(&ns_dir).expect("ns dir");
        let d = ns_dir.to_str().expect("utf-8 path");
        // The nsfs bind must sit on a mount that is not shared.
        run(&["mount", "--bind", d, d]);
        run(&["mount", "--make-private", d]);
        fs::write(&self.mnt, "").expect("mnt file");
        fs::copy("/etc/hosts", self.dir.join("hosts")).expect("copy /etc/hosts");
        let mut script = format!(
            "set -e; mount -t bpf bpf /sys/fs/bpf; mount -t tmpfs tmpfs /run; \
             mount -t tmpfs tmpfs /var/log; mount --bind {hosts} /etc/hosts;",
            hosts = self.path("hosts")
        );
        for (name, value) in KUBELET_SYSCTLS {
            let file = self.dir.join(format!("sysctl-{}", name.replace('/', "-")));
            fs::write(&file, format!("{value}\n")).expect("sysctl file");
            script.push_str(&format!(
                " mount --bind -o ro {} /proc/sys/{name};",
                file.display()
            ));
        }
        run(&[
            "unshare",
            &format!("--mount={}", self.mnt.display()),
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ]);
    }

    /// The node's cgroup in each v1 hierarchy (the kubelet's `cgroupRoot` must exist
    /// in all of them); cpuset's own needs its parent's CPUs and memory nodes.
    fn make_v1_cgroups(&self) {
        for c in V1_CONTROLLERS {
            let parent = Path::new("/sys/fs/cgroup").join(c);
            let dir = parent.join(&self.cgroup_name);
            fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("create cgroup {}: {e}", dir.display()));
            if c == "cpuset" {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = fs::read_to_string(parent.join(f)).expect("cpuset of the root");
                    fs::write(dir.join(f), v.trim()).expect("cpuset of the node");
                }
            }
        }
    }

    fn wait_for_socket(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(p) = self.containerd.as_mut() {
                p.assert_running();
            }
            if self.socket.exists()
                && self
                    .run(&[
                        "ctr",
                        &format!("--address={}", self.socket.display()),
                        "version",
                    ])
                    .status
                    .success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The CRI plugin's own view of its configuration (what `crictl info` prints
    /// comes from the same place): `restrict_oom_score_adj` and runc with cgroupfs.
    fn check_containerd_settings(&self) {
        let log = self.containerd.as_ref().expect("containerd").log_text();
        // containerd logs its CRI configuration at start ("Start cri plugin with
        // config {...}").
        let line = log
            .lines()
            .find(|l| l.contains("Start cri plugin with config"))
            .unwrap_or_else(|| panic!("containerd logged no CRI configuration:\n{}", tail(&log)));
        for (what, needle) in [
            ("restrict_oom_score_adj", "RestrictOOMScoreAdj:true"),
            ("the sandbox image", PAUSE_IMAGE),
            ("the CNI configuration", "hairpin"),
        ] {
            assert!(
                line.contains(needle),
                "containerd did not take {what} ({needle}): {line}"
            );
        }
    }

    fn wait_node_ready(&mut self, cluster: &Cluster, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            for p in [&mut self.containerd, &mut self.kubelet, &mut self.scheduler]
                .into_iter()
                .flatten()
            {
                p.assert_running();
            }
            let node = get_json(cluster, &format!("/api/v1/nodes/{NODE_NAME}"));
            let ready = node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Node was not Ready within {within:?}: {}\nkubelet:\n{}",
                node["status"]["conditions"],
                tail(&self.kubelet_log())
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The kubelet's running configuration (`/configz` through the API server) has
    /// the settings this machine needs.
    fn check_kubelet_settings(&self, cluster: &Cluster) {
        let path = format!("/api/v1/nodes/{NODE_NAME}/proxy/configz");
        let client = cluster.client();
        let req = axum::http::Request::get(&path)
            .body(Vec::new())
            .expect("request");
        let text = cluster
            .block_on(client.request_text(req))
            .unwrap_or_else(|e| panic!("GET {path} (API server -> kubelet): {e}"));
        let configz: Value = serde_json::from_str(&text).expect("configz is JSON");
        let kc = &configz["kubeletconfig"];
        // configz leaves out a false boolean (omitempty): absent is false. The kubelet
        // running at all on this v1 hierarchy shows it too.
        assert!(
            matches!(kc.get("failCgroupV1"), None | Some(Value::Bool(false))),
            "the kubelet did not take failCgroupV1: false: {kc}"
        );
        for (key, want) in [
            ("cgroupDriver", Value::from("cgroupfs")),
            ("cgroupRoot", Value::from(format!("/{}", self.cgroup_name))),
            ("protectKernelDefaults", Value::Bool(true)),
        ] {
            assert_eq!(kc[key], want, "the kubelet did not take {key}: {kc}");
        }
    }

    /// The kubelet's log so far.
    pub fn kubelet_log(&self) -> String {
        self.kubelet
            .as_ref()
            .map(Proc::log_text)
            .unwrap_or_default()
    }

    /// containerd's log so far.
    pub fn containerd_log(&self) -> String {
        self.containerd
            .as_ref()
            .map(Proc::log_text)
            .unwrap_or_default()
    }

    /// The node's cgroup (under the cgroup2 mount): where the kubelet's pods live.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// Every process in the node's mount namespace or in the kubepods subtree.
    fn leftover_pids(&self) -> Vec<i32> {
        let ns_ino = fs::metadata(&self.mnt).map(|m| m.ino()).ok();
        let mut pids = Vec::new();
        let mut dirs = vec![self.cgroup.join("kubepods")];
        while let Some(d) = dirs.pop() {
            if let Ok(text) = fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(rd) = fs::read_dir(&d) {
                dirs.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        if let Some(ino) = ns_ino {
            for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                if fs::metadata(e.path().join("ns/mnt")).is_ok_and(|m| m.ino() == ino) {
                    pids.push(pid);
                }
            }
        }
        pids.retain(|p| *p != std::process::id() as i32);
        pids
    }
}

/// Removes the `node.kubernetes.io/not-ready` taint the API server put on the Node
/// at its creation (TaintNodesByCondition), as the node lifecycle controller does
/// once the kubelet reports Ready: the suite's controller manager runs without that
/// controller (most scenarios have no kubelet to keep the Node alive). Pods without
/// the DaemonSet's tolerations (Helm's hook Jobs, `helm test`) need it gone.
fn untaint_ready_node(cluster: &Cluster) {
    use kube::api::{Api, Patch, PatchParams};
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    let node = cluster
        .block_on(nodes.get(NODE_NAME))
        .expect("get the Node");
    let taints: Vec<_> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != "node.kubernetes.io/not-ready")
        .collect();
    let patch = serde_json::json!({"spec": {"taints": taints}});
    cluster
        .block_on(nodes.patch(NODE_NAME, &PatchParams::default(), &Patch::Merge(&patch)))
        .expect("remove the not-ready taint");
}

/// `GET path` on the API server as the admin, as JSON (`Null` when it fails: the
/// callers poll).
pub fn get_json(cluster: &Cluster, path: &str) -> Value {
    let client = cluster.client();
    let req = axum::http::Request::get(path)
        .body(Vec::new())
        .expect("request");
    cluster.block_on(async move {
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
            Ok(Ok(text)) => serde_json::from_str(&text).unwrap_or(Value::Null),
            _ => Value::Null,
        }
    })
}

/// The version label of [`AGENT_NEXT_IMAGE`] in podman's storage; `None` when there
/// is no such image.
pub fn next_agent_version() -> Option<String> {
    let out = Command::new("podman")
        .args(["image", "inspect", "--format"])
        .arg("{{index .Labels \"org.opencontainers.image.version\"}}")
        .arg(AGENT_NEXT_IMAGE)
        .output()
        .ok()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !version.is_empty()).then_some(version)
}

/// The chart's appVersion (the image tag it asks for by default).
pub fn chart_app_version() -> String {
    let chart =
        fs::read_to_string(crate::repo::workspace().join("deploy/chart/hairpin/Chart.yaml"))
            .expect("read Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("Chart.yaml has an appVersion")
}

/// Removes `dir` and its children, deepest first (cgroup directories).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        for p in [&mut self.scheduler, &mut self.kubelet, &mut self.containerd]
            .into_iter()
            .flatten()
        {
            p.kill();
        }
        // The shims, the pause processes and the containers outlive containerd.
        for _ in 0..20 {
            let pids = self.leftover_pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // The namespace, and with it every mount the runtime made, goes with its
        // last process and this bind.
        let _ = Command::new("umount").arg(&self.mnt).output();
        let _ = Command::new("umount").arg(self.dir.join("ns")).output();
        remove_cgroup_tree(&self.cgroup.join("kubepods"));
        for c in V1_CONTROLLERS {
            remove_cgroup_tree(&Path::new("/sys/fs/cgroup").join(c).join(&self.cgroup_name));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
