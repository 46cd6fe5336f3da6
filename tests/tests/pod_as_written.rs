//! The DaemonSet's pod as written in `deploy/base/daemonset.yaml`, run on a simulated
//! node the way containerd runs it (`hairpin_tests::pod` lists what is simulated and
//! what is not): its env with the downward API filled in, its args, its hostPath
//! volumes at their mountPaths with `readOnly` honoured, a read-only root, exactly the
//! added capabilities, no_new_privs, and `seccompProfile: RuntimeDefault` as
//! containerd's default profile resolves it for those capabilities.
//!
//! - containerd 1.6.9's default (the first with the CAP_BPF case, also in 1.7.0 and
//!   2.x; 2.3.4's tried too) and the Localhost profile shipped in
//!   `deploy/components/seccomp-localhost`: the programs attach, and a pod's
//!   connections through the proxied LB IPs reach nginx and haproxy with the pod's
//!   address in the PROXY header.
//! - containerd 1.6.8's (bpf only with CAP_SYS_ADMIN): `--mode auto` falls back to the
//!   name relay, and the log, `status` and `doctor` (from the node and from inside the
//!   pod) say a seccomp filter refused bpf() and name the fix.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use hairpin_tests::{
    agent::agent_bin,
    cli::doctor_check,
    client::{from_pod, url},
    fakeapi::{FakeApi, digitalocean_service},
    node::{NODE_IP4, NODE_IP6, POD_IP4, SimNode},
    pod::{Bind, Container, Downward, Launch, PodProcess, daemonset_container},
    repo::workspace,
    require_privileges,
    servers::{Server, start_haproxy, start_nginx},
    sh::command_in,
};
use serde_json::Value;

const HELPER: &str = env!("CARGO_BIN_EXE_hairpin-pod");
const KUBECONFIG: &str = "/var/run/secrets/hairpin-test/kubeconfig";

fn profile(name: &str) -> PathBuf {
    workspace().join(name)
}

fn container() -> Container {
    let c = daemonset_container("deploy/base/daemonset.yaml");
    // What this test stands for: the manifest as shipped.
    assert_eq!(c.seccomp, "RuntimeDefault");
    assert!(c.drop_all && !c.privileged && c.no_new_privs && c.read_only_root);
    assert_eq!(
        c.caps,
        [
            "CAP_BPF",
            "CAP_NET_ADMIN",
            "CAP_NET_BIND_SERVICE",
            "CAP_CHOWN"
        ],
        "the capabilities as written"
    );
    c
}

/// The node-side stand-ins of the DaemonSet's hostPath volumes.
fn host_source(node: &SimNode, host_path: &str, host_type: &str) -> PathBuf {
    match host_path {
        // The node's cgroup v2 root: the simulated node's subtree.
        "/sys/fs/cgroup" => node.cgroup.clone(),
        "/etc/hosts" => {
            assert_eq!(host_type, "File");
            let p = node.dir.join("node-hosts");
            if !p.exists() {
                std::fs::write(&p, "127.0.0.1\tlocalhost\n::1\tlocalhost\n").expect("hosts");
            }
            p
        }
        "/run/hairpin" => {
            assert_eq!(host_type, "DirectoryOrCreate");
            let p = node.dir.join("run-hairpin");
            std::fs::create_dir_all(&p).expect("run dir");
            p
        }
        // hairpin's directory of the host's bpf filesystem (the kernel path's pins):
        // the node's own bpffs, so nothing lands in the machine's /sys/fs/bpf.
        "/sys/fs/bpf/hairpin" => {
            assert_eq!(host_type, "DirectoryOrCreate");
            let p = node.pin_dir();
            std::fs::create_dir_all(&p).expect("pin dir");
            p
        }
        other => panic!("the DaemonSet mounts {other}, which has no stand-in here"),
    }
}

/// The container with `argv` (the manifest's when `None`) under `seccomp`.
fn launch(
    node: &SimNode,
    c: &Container,
    seccomp: &Path,
    tag: &str,
    argv: Option<&[&str]>,
) -> Launch {
    let d = Downward {
        node_name: "sim-node".into(),
        namespace: "hairpin-system".into(),
        pod_name: "hairpin-sim".into(),
        host_ips: vec![NODE_IP4.into(), NODE_IP6.into()],
    };
    let mut binds: Vec<Bind> = c
        .mounts
        .iter()
        .map(|m| Bind {
            source: host_source(node, &m.host_path, &m.host_type),
            target: m.mount_path.clone(),
            read_only: m.read_only,
        })
        .collect();
    binds.push(Bind {
        source: node.dir.join("kubeconfig"),
        target: KUBECONFIG.into(),
        read_only: true,
    });
    let mut env: Vec<String> = c
        .resolved_env(&d)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // What the runtime and kubelet add: the image's PATH, the hostname; and the fake
    // API server's kubeconfig in place of the service account files.
    env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    env.push("HOSTNAME=sim-node".into());
    env.push(format!("KUBECONFIG={KUBECONFIG}"));
    Launch {
        netns: PathBuf::from(format!("/run/netns/{}", node.node_ns)),
        cgroup: node.agent_cgroup(),
        root: node.dir.join(format!("rootfs-{tag}")),
        binary: agent_bin(),
        binds,
        read_only_root: c.read_only_root,
        uid: c.uid,
        gid: c.gid,
        groups: c.groups.clone(),
        caps: c.caps.clone(),
        no_new_privs: c.no_new_privs,
        seccomp: Some(seccomp.to_path_buf()),
        argv: match argv {
            Some(a) => a.iter().map(|s| s.to_string()).collect(),
            None => c.argv.clone(),
        },
        env,
    }
}

fn start_pod(node: &SimNode, c: &Container, seccomp: &Path, tag: &str) -> PodProcess {
    let l = launch(node, c, seccomp, tag, None);
    PodProcess::start(
        Path::new(HELPER),
        &l,
        &node.dir,
        node.dir.join(format!("agent-{tag}.log")),
    )
}

/// The simulated cluster: nginx and haproxy behind LB IPs, and a fake API server with
/// a PROXY-protocol Service for each.
fn cluster(node: &SimNode) -> (FakeApi, Server, Server) {
    let nginx = start_nginx(node);
    let haproxy = start_haproxy(node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    api.node_kubeconfig(node);
    // The Node, with the pod CIDRs the relays serve (the simulated pod is in them).
    api.put_node(serde_json::json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "sim-node", "resourceVersion": "1"},
        "spec": {"podCIDR": "192.0.2.0/24", "podCIDRs": ["192.0.2.0/24", "2001:db8:1::/64"]}}));
    let svc = digitalocean_service();
    api.apply(svc.clone());
    // The same Service shape for haproxy's LB (203.0.113.11 -> accept-proxy).
    let mut h = svc;
    h["metadata"]["name"] = "haproxy-ingress".into();
    h["metadata"]["uid"] = "0f0b7c2e-3a51-4f0e-9d1e-2b8f4b1c9a11".into();
    h["spec"]["clusterIP"] = "10.245.12.35".into();
    h["spec"]["clusterIPs"] = serde_json::json!(["10.245.12.35"]);
    h["status"]["loadBalancer"]["ingress"][0]["ip"] = "203.0.113.11".into();
    api.apply(h);
    (api, nginx, haproxy)
}

/// `hairpin-agent ARGS` on the node (as an operator would), at the pod's admin socket.
fn on_node(node: &SimNode, args: &[&str]) -> (i32, String) {
    let bin = agent_bin();
    let mut argv = vec![bin.to_str().expect("utf-8 path")];
    argv.extend_from_slice(args);
    let out = command_in(&node.node_ns, Some(&node.host_cgroup()), &argv)
        .env(
            "HAIRPIN_ADMIN_SOCKET",
            node.dir.join("run-hairpin/admin.sock"),
        )
        .env_remove("HAIRPIN_ADMIN_ADDRESS")
        .output()
        .expect("run hairpin-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// The field `name` of /proc/PID/status.
fn proc_status(pid: u32, name: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// The container process is confined as the manifest says.
fn assert_confined(pod: &PodProcess) {
    let pid = pod.pid();
    // CAP_CHOWN (0), CAP_NET_BIND_SERVICE (10), CAP_NET_ADMIN (12), CAP_BPF (39),
    // nothing else.
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(proc_status(pid, set), "0000008000001401", "{set}");
    }
    // The pod's supplementalGroups (the pins' owner's group), and only them.
    assert_eq!(proc_status(pid, "Groups"), "60104", "supplementalGroups");
    assert_eq!(proc_status(pid, "CapInh"), "0000000000000000");
    assert_eq!(proc_status(pid, "CapAmb"), "0000000000000000");
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    assert_eq!(proc_status(pid, "Seccomp"), "2");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let opts = |target: &str| -> String {
        mounts
            .lines()
            .rfind(|l| l.split(' ').nth(4) == Some(target))
            .and_then(|l| l.split(' ').nth(5))
            .unwrap_or_else(|| panic!("{target} is not mounted:\n{mounts}"))
            .to_string()
    };
    assert!(opts("/").starts_with("ro"), "readOnlyRootFilesystem");
    assert!(
        opts("/host/sys/fs/cgroup").starts_with("ro"),
        "readOnly: true"
    );
    assert!(opts("/host/etc/hosts").starts_with("rw"));
    assert!(opts("/run/hairpin").starts_with("rw"));
}

// Fake API: the pod's seccomp and capabilities are the point; the API only feeds one Service.
#[test]
fn with_a_default_profile_that_knows_cap_bpf_the_pod_as_written_relays_with_the_true_client() {
    require_privileges!();
    use std::os::unix::fs::MetadataExt;
    let c = container();
    let node = SimNode::new();
    let (_api, _nginx, _haproxy) = cluster(&node);
    for (tag, seccomp) in [
        ("v1.6.9", "tests/fixtures/seccomp/containerd-v1.6.9.json"),
        ("v2.3.4", "tests/fixtures/seccomp/containerd-v2.3.4.json"),
        ("localhost", "deploy/components/seccomp-localhost/bpf.json"),
    ] {
        let mut pod = start_pod(&node, &c, &profile(seccomp), tag);
        pod.wait_for_log("programs attached", Duration::from_secs(30));
        pod.wait_for_log("agent ready", Duration::from_secs(30));
        assert_confined(&pod);
        for lb in ["203.0.113.10", "203.0.113.11"] {
            let reply = from_pod(&node, &url(lb, 80, "/"));
            assert!(
                reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
                "{tag}: pod -> {lb}: {reply:?}\nagent:\n{}",
                pod.log()
            );
        }
        // HAIRPIN_PIN_OWNER: the pin directory handed to 60104, reached through the
        // pod's group.
        let pins = std::fs::metadata(node.pin_dir()).expect("pin dir");
        assert_eq!(
            (pins.uid(), pins.gid(), pins.mode() & 0o7777),
            (60104, 60104, 0o2770),
            "{tag}: the pin directory's owner and mode\nagent:\n{}",
            pod.log()
        );
        let (_, out) = on_node(&node, &["status", "--output", "json"]);
        let status = json(&out);
        let reason = status["status"]["mode"]["reason"]
            .as_str()
            .unwrap_or_default();
        assert!(reason.contains("programs attached"), "{tag}: {reason}");
        drop(pod);
    }
}

// Fake API: the pod's seccomp and capabilities are the point; the API only feeds one Service.
#[test]
fn with_the_default_profile_before_cap_bpf_the_agent_names_seccomp_and_auto_falls_back() {
    require_privileges!();
    let c = container();
    let node = SimNode::new();
    let (_api, _nginx, _haproxy) = cluster(&node);
    let old = profile("tests/fixtures/seccomp/containerd-v1.6.8.json");
    let mut pod = start_pod(&node, &c, &old, "v1.6.8");
    pod.wait_for_log("falling back", Duration::from_secs(30));
    pod.wait_for_log("agent ready", Duration::from_secs(30));
    assert_confined(&pod);
    let log = pod.log();
    for part in [
        "a seccomp filter refused bpf()",
        "NoNewPrivs: 1",
        "hairpin/bpf.json",
        "deploy/components/seccomp-localhost",
        "Unconfined",
    ] {
        assert!(
            log.contains(part),
            "{part:?} not in the agent's log:\n{log}"
        );
    }
    // Not proxied: nginx sees no PROXY header and closes (curl: empty reply).
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(!reply.ok(), "{reply:?}");

    let (_, out) = on_node(&node, &["status", "--output", "json"]);
    let status = json(&out);
    let reason = status["status"]["mode"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("--mode auto: eBPF could not be used (a seccomp filter refused bpf()")
            && reason.contains("hairpin/bpf.json"),
        "{reason}"
    );
    let (_, text) = on_node(&node, &["status"]);
    assert!(text.contains("a seccomp filter refused bpf()"), "{text}");

    // doctor on the node: the seccomp check fails with the fix.
    let (code, out) = on_node(&node, &["doctor", "--output", "json"]);
    assert_eq!(code, 1, "{out}");
    let seccomp = doctor_check(&json(&out), "seccomp");
    assert_eq!(seccomp["status"], "fail", "{seccomp}");
    assert!(
        seccomp["fix"]
            .as_str()
            .unwrap_or_default()
            .contains("hairpin/bpf.json"),
        "{seccomp}"
    );

    // doctor inside the pod (as `kubectl exec` runs it: the container's filter,
    // capabilities and mounts): it reports the container's Seccomp and NoNewPrivs, and
    // its own load of the object is refused the same way.
    let l = launch(
        &node,
        &c,
        &old,
        "doctor",
        Some(&["/usr/local/bin/hairpin-agent", "doctor", "--output", "json"]),
    );
    let mut doctor = PodProcess::start(
        Path::new(HELPER),
        &l,
        &node.dir,
        node.dir.join("doctor.log"),
    );
    assert_eq!(doctor.wait(Duration::from_secs(60)), 1, "{}", doctor.log());
    let report = json(&doctor.stdout());
    let seccomp = doctor_check(&report, "seccomp");
    assert_eq!(seccomp["status"], "fail", "{seccomp}");
    assert!(
        seccomp["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("Seccomp 2 (filter), NoNewPrivs 1"),
        "{seccomp}"
    );
    let object = doctor_check(&report, "ebpf_object");
    assert!(
        object["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("a seccomp filter refused bpf()"),
        "{object}"
    );
}
