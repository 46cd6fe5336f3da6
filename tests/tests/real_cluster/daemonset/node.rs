//! The simulated node with a kubelet and the chart installed: what every
//! `daemonset_` scenario starts from.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use hairpin_tests::{
    cluster::{
        NODE_NAME,
        kubelet::{BUSYBOX_IMAGE, NodeRuntime, get_json},
    },
    node::KubeProxyMode,
};
use serde_json::{Value, json};

use crate::{RELEASE_NS, RealNode};

/// A node with the real control plane, kube-proxy and a kubelet; `None` when the
/// scenario skips.
pub(super) struct KubeletNode {
    // Drop order: the runtime (its pods) before the control plane and the node.
    pub(super) runtime: NodeRuntime,
    pub(super) rn: RealNode,
}

impl KubeletNode {
    pub(super) fn start() -> Option<KubeletNode> {
        let rn = RealNode::start(KubeProxyMode::Iptables)?;
        match NodeRuntime::start(&rn.cluster, &rn.node) {
            Ok(runtime) => Some(KubeletNode { runtime, rn }),
            Err(msg) => {
                eprintln!("skipped: {msg}");
                None
            }
        }
    }

    /// `kubectl ARGS` as the cluster admin; its output, whatever the status.
    pub(super) fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new("kubectl")
            .arg(format!(
                "--kubeconfig={}",
                self.rn.cluster.admin_kubeconfig().display()
            ))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// `kubectl ARGS`, failing with its output.
    pub(super) fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// README's install: the namespace, its Pod Security label, `helm install`
    /// with the values this node needs: its cgroup2 (not at /sys/fs/cgroup on this
    /// machine) and no image pulls (no registry here).
    pub(super) fn helm_install(&self, extra: &[&str]) {
        self.kubectl_ok(&["create", "namespace", RELEASE_NS]);
        self.kubectl_ok(&[
            "label",
            "namespace",
            RELEASE_NS,
            "pod-security.kubernetes.io/enforce=privileged",
        ]);
        let mut args: Vec<String> = vec![
            "cluster-install".into(),
            self.rn.cluster.admin_kubeconfig().display().to_string(),
            hairpin_tests::repo::workspace()
                .join(hairpin_tests::helm::CHART)
                .display()
                .to_string(),
            RELEASE_NS.into(),
        ];
        for set in [
            format!("cgroupHostPath={}", self.runtime.cgroup().display()),
            "image.pullPolicy=Never".to_string(),
        ]
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        {
            args.push("--set".into());
            args.push(set.to_string());
        }
        hairpin_tests::helm::helm(&args);
    }

    /// The pods of `namespace` with `selector`, as JSON.
    pub(super) fn pods(&self, namespace: &str, selector: &str) -> Vec<Value> {
        let list = get_json(
            &self.rn.cluster,
            &format!("/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"),
        );
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until one pod matching `selector` is Ready; returns it.
    pub(super) fn wait_ready(&self, namespace: &str, selector: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let pods = self.pods(namespace, selector);
            if let Some(p) = pods.iter().find(|p| ready(p)) {
                return p.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no Ready pod {namespace}/{selector} within {within:?}: {}\nkubelet:\n{}",
                serde_json::to_string_pretty(&pods).unwrap_or_default(),
                hairpin_tests::cluster::tail(&self.runtime.kubelet_log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `hairpin-agent ARGS` in the agent pod `pod` (`kubectl exec`, as
    /// docs/troubleshooting.md has it).
    pub(super) fn agent_exec(&self, pod: &str, args: &[&str]) -> std::process::Output {
        let mut argv = vec![
            "exec",
            "-n",
            RELEASE_NS,
            pod,
            "--",
            "/usr/local/bin/hairpin-agent",
        ];
        argv.extend_from_slice(args);
        self.kubectl(&argv)
    }

    /// The version of the agent in the pod `agent`: what its binary says
    /// (`hairpin-agent --version`) and what the running agent process reports
    /// (`status`: its `/status`, which `hairpin_build_info` shares).
    pub(super) fn agent_versions(&self, agent: &Value) -> (String, String) {
        let pod = agent["metadata"]["name"].as_str().expect("agent pod name");
        let out = self.agent_exec(pod, &["--version"]);
        let binary = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let out = self.agent_exec(pod, &["status", "--output", "json"]);
        let status: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "status --output json in {pod}: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let running = status["status"]["agent"]["version"]
            .as_str()
            .unwrap_or_else(|| panic!("no agent version in {pod}'s status: {status}"))
            .to_string();
        (binary, running)
    }

    /// A busybox pod on the node that sleeps; returns once it runs, with its IP.
    pub(super) fn client_pod(&self, namespace: &str, name: &str) -> String {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {
                "nodeName": NODE_NAME,
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "client",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/busybox", "sleep", "3600"],
                }],
            },
        });
        let file = self.rn.node.dir.join(format!("{name}.json"));
        std::fs::write(&file, pod.to_string()).expect("pod file");
        self.kubectl_ok(&["apply", "-f", file.to_str().expect("utf-8 path")]);
        let p = self.wait_ready(namespace, &format!("app={name}"), Duration::from_secs(60));
        p["status"]["podIP"]
            .as_str()
            .expect("the client pod has an IP")
            .to_string()
    }

    /// One HTTP/1.0 request to `ip`:80 from the client pod (busybox nc, through
    /// `kubectl exec`); the reply's body line naming the client (`client=IP:PORT`,
    /// what the ingress read from the PROXY header), or why there is none. busybox's
    /// wget is not used: statically linked, it crashes looking up the `http` service
    /// in an image without NSS files.
    pub(super) fn request_from(
        &self,
        namespace: &str,
        pod: &str,
        ip: &str,
    ) -> Result<String, String> {
        let out = self.kubectl(&[
            "exec",
            "-n",
            namespace,
            pod,
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            &format!(
                "printf 'GET / HTTP/1.0\\r\\nHost: lb\\r\\n\\r\\n' | /bin/busybox nc -w 2 {ip} 80"
            ),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.starts_with("client="))
            .map(|l| l.trim().to_string())
            .ok_or_else(|| format!("{text:?} {}", String::from_utf8_lossy(&out.stderr)))
    }

    /// `helm install` (with `extra` values), the ingress pod, the DigitalOcean
    /// Service at 203.0.113.10 selecting it and a client pod that got its header through it once. Returns
    /// the agent pod and the client's IP.
    pub(super) fn installed_with_client(&self, extra: &[&str]) -> (Value, String) {
        self.helm_install(extra);
        let agent = self.wait_ready(
            RELEASE_NS,
            "app.kubernetes.io/component=agent",
            Duration::from_secs(120),
        );
        self.ingress_pod();
        self.ingress_pod_lb(
            "ingress-nginx-controller",
            &[],
            &["203.0.113.10", "2001:db8:ffff::10"],
        );
        self.rn.cluster.ensure_namespace("clients");
        let pod_ip = self.client_pod("clients", "client");
        let started = Instant::now();
        while !self
            .request_from("clients", "client", "203.0.113.10")
            .is_ok_and(|l| l.starts_with(&format!("client={pod_ip}:")))
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no header after install"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        (agent, pod_ip)
    }
}

/// Whether a pod's Ready condition is True.
pub(super) fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The oom_score_adj of every `pause` process under `cgroup` (the pods' sandboxes).
pub(super) fn pause_oom_scores(cgroup: &std::path::Path) -> Vec<String> {
    let mut scores = Vec::new();
    let mut dirs = vec![cgroup.join("kubepods")];
    while let Some(d) = dirs.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in text.lines() {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "pause" {
                    scores.push(
                        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
                            .unwrap_or_default()
                            .trim()
                            .to_string(),
                    );
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            dirs.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    scores
}
