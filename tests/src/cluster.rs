//! A real Kubernetes control plane for the simulated node: etcd, kube-apiserver
//! (`--authorization-mode=Node,RBAC`, PodSecurity admission, service-account keys
//! and a serving certificate made at start) and kube-controller-manager, built from
//! source by `cargo xtask k8s`, running in the node's network namespace as on a
//! single control-plane node. A Node object stands for the simulated node; kube-proxy
//! runs against it ([`proxy`]).
//!
//! ```text
//!  test process (host netns)            node netns
//!  kube client -> 127.0.0.1:F --fwd-->  192.0.2.1:6443 kube-apiserver -> 127.0.0.1:2379 etcd
//!                                       kube-controller-manager, kube-proxy, hairpin-agent
//! ```
//! Everything is stopped on drop, also when the test panics (and the node's own drop
//! kills whatever is left in its namespace).

pub mod binaries;
pub mod certs;
pub mod demo;
pub mod dns;
pub mod forward;
pub mod kubelet;
pub mod objects;
pub mod proxy;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    node::{NODE_IP4, NODE_IP6, SimNode},
    sh::command_in,
};

pub use binaries::Binaries;

/// The API server's secure port, on every address of the node namespace.
pub const APISERVER_PORT: u16 = 6443;
/// The Services' cluster IP ranges (dual-stack).
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:10:96::/112";
/// The Node object standing for the simulated node (`--node-name` of the agent).
pub const NODE_NAME: &str = "sim-node";
/// The simulated node's pod networks (its `spec.podCIDRs`).
pub const POD_CIDRS: [&str; 2] = ["192.0.2.0/24", "2001:db8:1::/64"];

/// Static bearer tokens (`--token-auth-file`) of the control plane's own clients:
/// (token, user, groups). The agent never uses these: it gets its ServiceAccount's.
const TOKENS: [(&str, &str, &str); 5] = [
    ("admin-token", "kubernetes-admin", "system:masters"),
    ("kcm-token", "system:kube-controller-manager", ""),
    ("proxy-token", "system:kube-proxy", ""),
    // The kubelet of the simulated node (kubelet.rs) and its scheduler.
    ("kubelet-token", "system:node:sim-node", "system:nodes"),
    ("scheduler-token", "system:kube-scheduler", ""),
];

/// One control-plane process, killed on drop.
pub struct Proc {
    /// What it is, for messages.
    pub name: &'static str,
    child: Option<Child>,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `argv` in `netns` (outside the node's cgroup: hairpin's programs never
    /// see the control plane's own connections), logging to `dir/NAME.log`.
    pub fn spawn(name: &'static str, netns: &str, dir: &Path, argv: &[&str]) -> Proc {
        Proc::spawn_env(name, netns, dir, argv, &[])
    }

    /// As [`Proc::spawn`], with `env` added to its environment.
    pub fn spawn_env(
        name: &'static str,
        netns: &str,
        dir: &Path,
        argv: &[&str],
        env: &[(&str, String)],
    ) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let err = out.try_clone().expect("log file");
        let child = command_in(netns, None, argv)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {name}: {e}"));
        Proc {
            name,
            child: Some(child),
            log,
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails with its log when it has exited.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!(
                "{} exited ({status}):\n{}",
                self.name,
                tail(&self.log_text())
            );
        }
    }

    /// Its exit status once it has exited (`None` while it runs, or once killed).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills it (SIGKILL) and waits.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last 60 lines of a log.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// The control plane. Dropping it stops every process it started.
pub struct Cluster {
    /// Certificates, kubeconfigs, data and logs.
    pub dir: PathBuf,
    /// The node namespace it runs in.
    pub netns: String,
    /// The binaries it runs.
    pub bins: Binaries,
    // Field order is drop order: the client and the forwarder go before the
    // processes, the runtime last.
    client: Client,
    _forward: forward::Forwarder,
    kcm: Option<Proc>,
    apiserver: Proc,
    etcd: Proc,
    rt: tokio::runtime::Runtime,
    /// How long [`Cluster::start`] took until the API server was ready.
    pub startup: Duration,
}

impl Cluster {
    /// Starts etcd, the API server and the controller manager in `node`'s namespace,
    /// waits until the API server is ready and creates the Node object; prints the
    /// startup time. `None` (the suite skips) when the binaries are missing outside
    /// CI; under `CI=true` that fails instead.
    pub fn start(node: &SimNode) -> Option<Cluster> {
        let bins = Binaries::find()?;
        let started = Instant::now();
        let dir = node.dir.join("cluster");
        fs::create_dir_all(&dir).expect("cluster dir");
        let pki = certs::Pki::make(&dir.join("pki"));
        let tokens = dir.join("tokens.csv");
        let lines: Vec<String> = TOKENS
            .iter()
            .map(|(t, u, g)| format!("{t},{u},{u},\"{g}\""))
            .collect();
        fs::write(&tokens, lines.join("\n") + "\n").expect("token file");
        let etcd = start_etcd(&bins, &node.node_ns, &dir);
        let apiserver = start_apiserver(&bins, &node.node_ns, &dir, &pki, &tokens);
        let forward = forward::Forwarder::start(
            &node.node_ns,
            format!("{NODE_IP4}:{APISERVER_PORT}")
                .parse()
                .expect("socket address"),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        // The test's own kubeconfig (through the forwarder) and the node's (direct).
        let admin = dir.join("admin.kubeconfig");
        write_kubeconfig(
            &admin,
            &format!("https://127.0.0.1:{}", forward.port()),
            &pki.ca_cert,
            "admin-token",
        );
        for (name, token) in [("kcm", "kcm-token"), ("proxy", "proxy-token")] {
            write_kubeconfig(
                &dir.join(format!("{name}.kubeconfig")),
                &node_server(),
                &pki.ca_cert,
                token,
            );
        }
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&admin).expect("read admin kubeconfig");
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .expect("admin kubeconfig");
            Client::try_from(config).expect("kube client")
        });
        let mut cluster = Cluster {
            dir,
            netns: node.node_ns.clone(),
            bins,
            client,
            _forward: forward,
            kcm: None,
            apiserver,
            etcd,
            rt,
            startup: Duration::ZERO,
        };
        cluster.wait_ready(Duration::from_secs(60));
        cluster.kcm = Some(start_kcm(&cluster.bins, &cluster.netns, &cluster.dir, &pki));
        cluster.create_node();
        cluster.startup = started.elapsed();
        eprintln!(
            "real control plane (Kubernetes {}, etcd {}) ready in {:.1} s",
            cluster.bins.k8s_version,
            cluster.bins.etcd_version,
            cluster.startup.as_secs_f64()
        );
        Some(cluster)
    }

    /// A client with the cluster admin's rights (`system:masters`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Runs `f` to completion on the cluster's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The admin kubeconfig (server through the forwarder, reachable from the host).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The CA certificate of the API server.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("pki/ca.crt")
    }

    /// Writes a kubeconfig for processes in the node namespace with bearer `token`.
    pub fn node_kubeconfig(&self, path: &Path, token: &str) {
        write_kubeconfig(path, &node_server(), &self.ca_cert(), token);
    }

    /// Waits until `/readyz` answers `ok`, or fails with the API server's log.
    fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            self.etcd.assert_running();
            self.apiserver.assert_running();
            let client = self.client.clone();
            let ready = self.rt.block_on(async move {
                let req = axum::http::Request::get("/readyz")
                    .body(Vec::new())
                    .expect("request");
                tokio::time::timeout(Duration::from_secs(2), client.request_text(req)).await
            });
            if matches!(ready, Ok(Ok(ref t)) if t.trim() == "ok") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the API server was not ready within {within:?} ({ready:?}):\n{}",
                tail(&self.apiserver.log_text())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Creates the Node for the simulated node: its pod CIDRs and addresses, as the
    /// kubelet and the node IPAM controller would have set them.
    fn create_node(&self) {
        let nodes: Api<Node> = Api::all(self.client());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}},
            "spec": {"podCIDR": POD_CIDRS[0], "podCIDRs": POD_CIDRS},
        }))
        .expect("node object");
        let status = json!({"status": {
            "addresses": [
                {"type": "InternalIP", "address": NODE_IP4},
                {"type": "InternalIP", "address": NODE_IP6},
                {"type": "Hostname", "address": NODE_NAME},
            ],
        }});
        self.block_on(async {
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("create the Node");
            nodes
                .patch_status(NODE_NAME, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("set the Node's addresses");
        });
    }

    /// Kills the API server and etcd, as a control-plane outage does; returns once
    /// both are gone. [`Cluster::restart_control_plane`] brings them back.
    pub fn stop_control_plane(&mut self) {
        self.apiserver.kill();
        self.etcd.kill();
    }

    /// Starts etcd and the API server again on the same data and waits until ready.
    pub fn restart_control_plane(&mut self) -> Duration {
        let started = Instant::now();
        self.etcd = start_etcd(&self.bins, &self.netns, &self.dir);
        let pki = certs::Pki::at(&self.dir.join("pki"));
        self.apiserver = start_apiserver(
            &self.bins,
            &self.netns,
            &self.dir,
            &pki,
            &self.dir.join("tokens.csv"),
        );
        self.wait_ready(Duration::from_secs(60));
        started.elapsed()
    }

    /// The API server's log so far.
    pub fn apiserver_log(&self) -> String {
        self.apiserver.log_text()
    }
}

/// The API server as processes in the node namespace reach it.
fn node_server() -> String {
    format!("https://{NODE_IP4}:{APISERVER_PORT}")
}

/// Writes a kubeconfig for `server` trusting `ca` with bearer `token`.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, token: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: user\n  user:\n    token: {token}\n\
         contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: user\ncurrent-context: sim\n",
        ca = ca.display()
    );
    fs::write(path, text).expect("write kubeconfig");
}

fn start_etcd(bins: &Binaries, netns: &str, dir: &Path) -> Proc {
    let data = dir.join("etcd");
    let data = data.to_str().expect("utf-8 path");
    Proc::spawn(
        "etcd",
        netns,
        dir,
        &[
            bins.etcd.to_str().expect("utf-8 path"),
            "--name=sim",
            &format!("--data-dir={data}"),
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=sim=http://127.0.0.1:2380",
            // A test cluster's data is thrown away: no fsync on the shared disk.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )
}

fn start_apiserver(
    bins: &Binaries,
    netns: &str,
    dir: &Path,
    pki: &certs::Pki,
    tokens: &Path,
) -> Proc {
    let p = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let args = [
        format!("--advertise-address={NODE_IP4}"),
        format!("--secure-port={APISERVER_PORT}"),
        "--etcd-servers=http://127.0.0.1:2379".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction,PodSecurity".into(),
        format!("--tls-cert-file={}", p(&pki.server_cert)),
        format!("--tls-private-key-file={}", p(&pki.server_key)),
        format!("--client-ca-file={}", p(&pki.ca_cert)),
        format!("--token-auth-file={}", p(tokens)),
        format!("--service-account-key-file={}", p(&pki.sa_pub)),
        format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
        format!(
            "--kubelet-client-certificate={}",
            p(&pki.kubelet_client_cert)
        ),
        format!("--kubelet-client-key={}", p(&pki.kubelet_client_key)),
        // The node's name resolves nowhere: the kubelet is reached at its address.
        "--kubelet-preferred-address-types=InternalIP".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ];
    let mut argv = vec![bins.apiserver.to_str().expect("utf-8 path")];
    argv.extend(args.iter().map(String::as_str));
    Proc::spawn("kube-apiserver", netns, dir, &argv)
}

fn start_kcm(bins: &Binaries, netns: &str, dir: &Path, pki: &certs::Pki) -> Proc {
    let p = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let args = [
        format!("--kubeconfig={}", p(&dir.join("kcm.kubeconfig"))),
        format!("--service-account-private-key-file={}", p(&pki.sa_key)),
        format!("--root-ca-file={}", p(&pki.ca_cert)),
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
        // No kubelet posts the simulated node's status: the lifecycle controller
        // would taint it unreachable, which nothing here is about.
        "--controllers=*,-node-lifecycle-controller".into(),
        // Each controller with its own ServiceAccount and the bootstrap roles, as
        // kubeadm runs it (the shared identity lacks most of their permissions).
        "--use-service-account-credentials=true".into(),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--v=1".into(),
    ];
    let mut argv = vec![bins.controller_manager.to_str().expect("utf-8 path")];
    argv.extend(args.iter().map(String::as_str));
    Proc::spawn("kube-controller-manager", netns, dir, &argv)
}
