//! The chart's DaemonSet run by a real kubelet (tests/src/cluster/kubelet.rs) on the
//! simulated node, installed with real Helm into the real API server as README's
//! "Install" says: the agent pod becomes Ready through its own probes, and a client
//! pod (a real pod: its sandbox, its network namespace from the CNI plugin, its
//! cgroup under the kubelet's) reaches the PROXY-protocol ingress pod through a
//! LoadBalancer IP with its own address in the header, on the kernel path and on the
//! relay, over IPv4 and IPv6.

mod ingress;
mod node;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use hairpin_tests::{
    cluster::{
        NODE_NAME,
        dns::{corefile_of, kube_dns_objects},
        kubelet::{AGENT_NEXT_IMAGE, chart_app_version, next_agent_version},
    },
    fakeapi::KUBEADM_COREFILE,
    node::INGRESS_IP4,
};
use serde_json::json;

use crate::{RELEASE_NS, vip};

use ingress::pod_ips;
use node::{KubeletNode, pause_oom_scores};

#[test]
fn daemonset_install_agent_ready_and_client_pod_gets_header() {
    let Some(kn) = KubeletNode::start() else {
        return;
    };
    let installed = Instant::now();
    kn.helm_install(&[]);
    let agent = kn.wait_ready(
        RELEASE_NS,
        "app.kubernetes.io/component=agent",
        Duration::from_secs(120),
    );
    eprintln!(
        "helm install -> agent pod Ready (its own probes): {:.1} s",
        installed.elapsed().as_secs_f64()
    );
    assert_eq!(agent["spec"]["nodeName"], NODE_NAME);
    // The runtime clamped the sandbox's oom_score_adj (-998 asked) to its own: the
    // setting took, else runc's write fails without CAP_SYS_RESOURCE.
    let scores = pause_oom_scores(kn.runtime.cgroup());
    assert!(
        !scores.is_empty(),
        "no pause process under the node's cgroup"
    );
    assert!(
        scores
            .iter()
            .all(|s| s.parse::<i32>().is_ok_and(|v| v >= 0)),
        "a sandbox's oom_score_adj is below containerd's own: {scores:?}"
    );
    let ingress = kn.ingress_pod();
    kn.ingress_pod_lb(
        "ingress-nginx-controller",
        &[],
        &["203.0.113.10", "2001:db8:ffff::10"],
    );
    kn.ingress_pod_lb(
        "ingress-relayed",
        &[("hairpin.dev/path", "relay")],
        &["203.0.113.11", "2001:db8:ffff::11"],
    );
    kn.rn.cluster.ensure_namespace("clients");
    kn.client_pod("clients", "client");
    let client = pod_ips(&kn.pods("clients", "app=client")[0]);
    eprintln!("ingress pod {ingress:?}, client pod {client:?}");
    let (v4, v6) = match client.as_slice() {
        [v4, v6] if v6.contains(':') => (v4, v6),
        _ => panic!("the client pod is not dual-stack (the CNI's ranges are): {client:?}"),
    };
    // Both families, the kernel path (.10) and the relay (.11).
    for (ip, lb) in [
        (v4, "203.0.113.10"),
        (v4, "203.0.113.11"),
        (v6, "2001:db8:ffff::10"),
        (v6, "2001:db8:ffff::11"),
    ] {
        let started = Instant::now();
        loop {
            let reply = kn.request_from("clients", "client", lb);
            if let Ok(line) = &reply
                && line.starts_with(&format!("client={ip}:"))
            {
                eprintln!("client pod {ip} -> {lb}: {line}");
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "client pod {ip} -> {lb}: no header naming it: {reply:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The operator's commands inside the agent pod, as docs/troubleshooting.md has
    // them: each answers; status names the frontends, doctor's datapath checks pass.
    let agent_pod = agent["metadata"]["name"].as_str().expect("agent pod name");
    let exec = |cmd: &str| {
        let out = kn.kubectl(&[
            "exec",
            "-n",
            RELEASE_NS,
            agent_pod,
            "--",
            "/usr/local/bin/hairpin-agent",
            cmd,
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!(
            "kubectl exec hairpin-agent {cmd}: {}, {} lines, first: {}",
            out.status,
            text.lines().count(),
            text.lines().next().unwrap_or("")
        );
        (out, text)
    };
    let (out, status) = exec("status");
    assert!(
        out.status.success() && status.contains("203.0.113.10") && status.contains("ready"),
        "hairpin-agent status in the pod: {status}"
    );
    let (out, dump) = exec("dump");
    assert!(
        out.status.success() && !dump.trim().is_empty(),
        "hairpin-agent dump in the pod: {dump}"
    );
    doctor_passes_in_the_pod(&kn, agent_pod);
}

/// `hairpin-agent doctor` in the agent pod: it reads the chart's HAIRPIN_CGROUP_PATH
/// as the agent does (the node's hierarchy at the hostPath, not the pod's own
/// /sys/fs/cgroup), exits 0, and every check is ok but those this pod cannot pass.
fn doctor_passes_in_the_pod(kn: &KubeletNode, agent_pod: &str) {
    let out = kn.agent_exec(agent_pod, &["doctor"]);
    let doctor = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "hairpin-agent doctor in the pod: {}\n{doctor}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let status_of = |check: &str| {
        doctor
            .lines()
            .find(|l| l.split_whitespace().next() == Some(check))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("absent")
            .to_string()
    };
    for check in [
        "kernel",
        "bpf",
        "ebpf_object",
        "capabilities",
        "agent",
        "relay",
        "kernel_path",
        "link_order",
    ] {
        assert_eq!(status_of(check), "ok", "doctor's {check}:\n{doctor}");
    }
    // The checks this pod cannot pass, each for its reason: the simulated node is a
    // cgroup below the machine's root (the kubelet's cgroupRoot, which the chart
    // mounts), so cgroup2 warns that processes outside it are not seen; the image
    // holds the agent alone, no iptables-save or nft to read kube-proxy's rules; the
    // scenario's Services carry no ipMode and the release writes no CoreDNS.
    let not_ok: Vec<(&str, &str)> = doctor
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?, w.next()?))
        })
        .filter(|(_, s)| ["warn", "fail", "skip"].contains(s))
        .collect();
    eprintln!("doctor in the pod, not ok: {not_ok:?}");
    assert_eq!(
        not_ok,
        [
            ("cgroup2", "warn"),
            ("kube_proxy_mode", "skip"),
            ("kube_proxy_frontends", "skip"),
            ("ip_mode", "skip"),
            ("coredns", "skip"),
        ],
        "doctor in the pod:\n{doctor}"
    );
    let node_cgroup = kn.runtime.cgroup().file_name().expect("a cgroup name");
    assert!(
        doctor.contains(&format!("/{}", node_cgroup.to_string_lossy())),
        "doctor's cgroup2 does not name the node's cgroup:\n{doctor}"
    );
}

/// kubeadm's CoreDNS objects (its Corefile), and an Ingress whose host the chart's
/// CoreDNS writer publishes.
fn kubeadm_coredns_and_an_ingress(c: &hairpin_tests::cluster::Cluster) {
    let mut objects = kube_dns_objects(INGRESS_IP4);
    objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "coredns", "namespace": "kube-system"},
        "data": {"Corefile": KUBEADM_COREFILE}}));
    objects.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                 "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}},
                              "spec": {"containers": [{"name": "coredns",
                                  "image": "registry.k8s.io/coredns/coredns:v1.14.7"}]}}}}));
    c.kubectl_apply(&objects);
    c.ensure_namespace("shop");
    c.kubectl_apply(&[
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "shop"},
        "spec": {"ingressClassName": "nginx", "rules": [{"host": "shop.example.com"}]}}),
    ]);
    c.set_ingress_lb("shop", "shop", vip(&["203.0.113.10"]));
}

/// docs/upgrade.md's `helm upgrade` while a client pod dials the kernel path's LB
/// every 20 ms: the DaemonSet rolls to the next release's image (the same tree built
/// with the next version string, `cargo xtask test`'s [`AGENT_NEXT_IMAGE`]), the new
/// pod runs that version, no request fails or goes without its header meanwhile (the
/// pinned datapath outlives the old agent), and the rollout waits out no TTL.
#[test]
fn daemonset_upgrade_while_a_client_pod_dials() {
    let Some(next) = next_agent_version() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no {AGENT_NEXT_IMAGE} in podman's storage: `cargo xtask test` builds it"
        );
        eprintln!(
            "skipped: no {AGENT_NEXT_IMAGE} (`cargo xtask image --agent-version 0.2.0 --tag {AGENT_NEXT_IMAGE}`)"
        );
        return;
    };
    let installed = chart_app_version();
    assert_ne!(
        next, installed,
        "{AGENT_NEXT_IMAGE} is the installed version"
    );
    let Some(kn) = KubeletNode::start() else {
        return;
    };
    let (old, pod_ip) = kn.installed_with_client(&[]);
    assert_eq!(
        kn.agent_versions(&old),
        (format!("hairpin-agent {installed}"), installed.clone()),
        "the installed agent's version"
    );
    let c = &kn.rn.cluster;
    // The dialer: one line per request, H (header naming the pod), N (a reply without
    // one: nginx's "broken header"), F (no connection), until /stop exists.
    let script = "while [ ! -e /stop ]; do \
        r=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 2 203.0.113.10 80); rc=$?; \
        case \"$r\" in *client=POD:*) echo H;; *) if [ $rc = 0 ]; then echo N; else echo F; fi;; esac; \
        /bin/busybox usleep 20000; done"
        .replace("POD", &pod_ip);
    let dialer = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", c.admin_kubeconfig().display()))
        .args([
            "exec",
            "-n",
            "clients",
            "client",
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the dialer");
    std::thread::sleep(Duration::from_secs(1));

    // docs/upgrade.md's command, the new release's chart in place of the OCI one.
    let doc = std::fs::read_to_string(hairpin_tests::repo::workspace().join("docs/upgrade.md"))
        .expect("docs/upgrade.md");
    assert!(
        doc.contains("helm upgrade hairpin oci://ghcr.io/hairpin-dev/charts/hairpin --version NEW -n hairpin-system --reset-then-reuse-values"),
        "docs/upgrade.md's upgrade command changed: update this scenario"
    );
    let (new_image, next) = kn.runtime.import_next_agent();
    let dir = tempfile::tempdir().expect("tempdir");
    let chart = dir.path().join("hairpin");
    hairpin_tests::helm::chart_as_version(&chart, &next);
    let upgraded = Instant::now();
    hairpin_tests::helm::helm(&[
        "cluster-upgrade".into(),
        c.admin_kubeconfig().display().to_string(),
        chart.display().to_string(),
        RELEASE_NS.into(),
        "--reset-then-reuse-values".into(),
    ]);
    kn.kubectl_ok(&[
        "-n",
        RELEASE_NS,
        "rollout",
        "status",
        "ds/hairpin",
        "--timeout=120s",
    ]);
    let rollout = upgraded.elapsed();
    eprintln!(
        "helm upgrade -> rollout of the node done: {:.1} s",
        rollout.as_secs_f64()
    );
    let new = kn.wait_ready(
        RELEASE_NS,
        "app.kubernetes.io/component=agent",
        Duration::from_secs(30),
    );
    assert_ne!(
        new["metadata"]["uid"], old["metadata"]["uid"],
        "the pod was not replaced"
    );
    assert_eq!(new["spec"]["containers"][0]["image"], new_image.as_str());
    // The new pod runs the next version: its binary and the agent process serving
    // the datapath it adopted.
    assert_eq!(
        kn.agent_versions(&new),
        (format!("hairpin-agent {next}"), next.clone()),
        "the upgraded agent's version"
    );
    // The successor adopted the pinned datapath at once: a rollout that waited for
    // the old agent's heartbeat to go stale would take the datapath TTL (the
    // chart's default, 10 min) and fail `rollout status --timeout=120s` above.
    assert!(
        rollout < Duration::from_secs(60),
        "the rollout took {rollout:?}"
    );
    // Requests after the new agent is Ready, then stop the dialer.
    std::thread::sleep(Duration::from_secs(2));
    no_request_missed(&kn, dialer);
}

/// Stops the client pod's dialer and checks what it saw: enough requests, each with
/// its header.
fn no_request_missed(kn: &KubeletNode, dialer: std::process::Child) {
    kn.kubectl_ok(&[
        "exec",
        "-n",
        "clients",
        "client",
        "--",
        "/bin/busybox",
        "touch",
        "/stop",
    ]);
    let out = dialer.wait_with_output().expect("the dialer");
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = |c: &str| lines.lines().filter(|l| l.trim() == c).count();
    let (h, n, f) = (count("H"), count("N"), count("F"));
    eprintln!("during the upgrade: {h} requests with a header, {n} without, {f} failed");
    assert!(
        h > 50,
        "too few requests to say anything: {lines:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        (n, f),
        (0, 0),
        "requests without a header or failed during the rollout"
    );
}

/// `helm test`, then README's `helm uninstall`: the test hook and the pre-delete
/// hooks run as pods on the node, and afterwards the node has no hairpin program, pin or
/// relay address, and the client pod's requests are as before hairpin (the ingress
/// refuses them for want of a header: the original problem).
#[test]
fn daemonset_test_then_uninstall_leaves_the_node_clean() {
    let Some(kn) = KubeletNode::start() else {
        return;
    };
    let c = &kn.rn.cluster;
    kubeadm_coredns_and_an_ingress(c);
    let before = corefile_of(c);
    // The test hook checks a proxied LB from a pod (README, `tests.target`).
    kn.installed_with_client(&[
        "tests.target=203.0.113.10:80",
        "coredns.mode=corefile",
        "names.domains=example.com",
    ]);
    let started = Instant::now();
    while !corefile_of(c).contains("shop.example.com") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the CoreDNS writer's pods wrote nothing: {}",
            corefile_of(c)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let kubeconfig = c.admin_kubeconfig().display().to_string();
    let tested =
        hairpin_tests::helm::helm(&["cluster-test".into(), kubeconfig.clone(), RELEASE_NS.into()]);
    // Helm fails the call when a test pod fails; it passed, on this node's kubelet.
    assert_eq!(
        tested["release"]["release"]["status"], "deployed",
        "helm test: {tested}"
    );
    assert!(
        kn.runtime.kubelet_log().contains("hairpin-test"),
        "the kubelet never ran the test pod"
    );
    let node = &kn.rn.node;
    let links = || {
        hairpin_tests::sh::run(&[
            "bpftool",
            "cgroup",
            "show",
            kn.runtime.cgroup().to_str().expect("utf-8 path"),
        ])
        .lines()
        .filter(|l| l.contains("connect") || l.contains("sock_ops"))
        .count()
    };
    assert!(
        links() > 0,
        "no hairpin program on the node's cgroup while installed"
    );
    let uninstalled = Instant::now();
    let out =
        hairpin_tests::helm::helm(&["cluster-uninstall".into(), kubeconfig, RELEASE_NS.into()]);
    eprintln!(
        "helm uninstall (pre-delete hooks as pods): {:.1} s",
        uninstalled.elapsed().as_secs_f64()
    );
    let hooks = out["release"].to_string();
    assert!(
        hooks.contains("pre-delete"),
        "the release had no pre-delete hook: {hooks}"
    );
    assert!(
        kn.runtime.kubelet_log().contains("hairpin-uninstall"),
        "the kubelet never ran the pre-delete hook's pod"
    );
    // The agent pod goes with the DaemonSet; then nothing of hairpin is left.
    let started = Instant::now();
    while !kn
        .pods(RELEASE_NS, "app.kubernetes.io/component=agent")
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the agent pod stays"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(links(), 0, "hairpin programs left on the node's cgroup");
    let pins = kn
        .runtime
        .run(&["sh", "-c", "ls -A /sys/fs/bpf/hairpin 2>/dev/null"]);
    assert!(
        String::from_utf8_lossy(&pins.stdout).trim().is_empty(),
        "pins left: {}",
        String::from_utf8_lossy(&pins.stdout)
    );
    let addrs = hairpin_tests::sh::run_in(&node.node_ns, &["ip", "addr", "show", "dev", "lo"]);
    assert!(
        !addrs.contains("169.254.104.1"),
        "the relay address stays: {addrs}"
    );
    assert_eq!(
        corefile_of(c),
        before,
        "CoreDNS's Corefile is not as before"
    );
    // As before hairpin: the ingress pod gets no header, answers nothing and logs
    // the original problem.
    let broken = || kn.ingress_log().matches("broken header").count();
    let broken_before = broken();
    let started = Instant::now();
    loop {
        match kn.request_from("clients", "client", "203.0.113.10") {
            Err(_) => break,
            Ok(line) => assert!(
                started.elapsed() < Duration::from_secs(10),
                "a header after uninstall: {line}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        broken() > broken_before,
        "the ingress pod logged no broken header for the request without one:\n{}",
        kn.ingress_log()
    );
}
