//! Two CoreDNS writers and their Lease, then `hairpin-agent uninstall` with exactly
//! the chart's pre-delete hook RBAC, against the real API server:
//!
//! - two `coredns-writer` replicas (as the chart's Deployment runs them, each with
//!   its pod name as its identity and the writer's ServiceAccount token): only the
//!   Lease holder writes the Corefile; when it stops (SIGKILL, as a node lost), the
//!   other takes the Lease over and writes the next change;
//! - the uninstall Job's command, with the Job's environment and the
//!   `hairpin-uninstall` ServiceAccount's token bound by the hook's Roles (real Helm
//!   renders them), and the node cleanup's first step with `hairpin-cleanup`'s:
//!   with the ConfigMap `update` taken out of the hook's kube-system Role the
//!   uninstall fails naming the verb, the resource and the account; with the chart's
//!   Role back it completes, and the Corefile is byte for byte what kubeadm wrote
//!   before hairpin, the workloads and the writer's Lease gone.
//!
//! The control plane alone runs here (no kube-proxy, no datapath): the writers and
//! the hooks only speak to the API server.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::agent_bin,
    cluster::{
        Cluster, Proc,
        dns::{corefile_of, kube_dns_objects},
        objects::{chart_objects, workload_env},
    },
    fakeapi::KUBEADM_COREFILE,
    node::{INGRESS_IP4, SimNode},
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    coordination::v1::Lease,
};
use serde_json::{Value, json};

use crate::{RELEASE_NS, ingress_nginx_lb, vip};

/// The chart values of this scenario: kubeadm's Corefile written in place.
fn flags() -> Vec<String> {
    [
        "--set",
        "coredns.mode=corefile",
        "--set",
        "names.domains=example.com",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn one_writer_holds_the_lease_the_other_takes_over_and_uninstall_restores_the_corefile() {
    if !hairpin_tests::privileges::datapath_tests_can_run(module_path!()) {
        return;
    }
    let node = SimNode::for_real_kube_proxy();
    let Some(c) = Cluster::start(&node) else {
        return;
    };
    let flags = flags();
    // kubeadm's CoreDNS objects, the chart as installed, an ingress controller's LB
    // and an Ingress whose host is in names.domains.
    let mut objects = kube_dns_objects(INGRESS_IP4);
    objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "coredns", "namespace": "kube-system"},
        "data": {"Corefile": KUBEADM_COREFILE}}));
    c.kubectl_apply(&objects);
    c.ensure_namespace(RELEASE_NS);
    c.kubectl_apply(&chart_objects(RELEASE_NS, &flags));
    ingress_nginx_lb(&c, "ingress-nginx-controller", &[], &["203.0.113.10"]);
    ingress(&c, "shop", "shop.example.com");
    two_writers_hand_the_lease_over(&c, &node);
    uninstall_with_the_hooks_rbac(&c, &node, &flags);
}

/// Two writer replicas: one holder writes, the other follows; the holder lost, the
/// other takes the Lease over and writes the next name. Both stopped at the end (the
/// Deployment's pods stop with it: the uninstall deletes it).
fn two_writers_hand_the_lease_over(c: &Cluster, node: &SimNode) {
    let mut writers = [
        start_writer(c, node, "hairpin-coredns-a"),
        start_writer(c, node, "hairpin-coredns-b"),
    ];
    let text = until_corefile(c, "shop.example.com", &writers);
    let holder = lease_holder(c);
    let (held, other) = match holder.as_str() {
        "hairpin-coredns-a" => (0, 1),
        "hairpin-coredns-b" => (1, 0),
        h => panic!("the Lease is held by {h:?}, not a writer"),
    };
    eprintln!("{holder} holds the Lease and wrote:\n{text}");
    assert!(
        writers[held]
            .log_text()
            .contains("CoreDNS rewrites written"),
        "{}",
        writers[held].log_text()
    );
    assert!(
        !writers[other]
            .log_text()
            .contains("CoreDNS rewrites written"),
        "the follower wrote CoreDNS:\n{}",
        writers[other].log_text()
    );

    // The holder is lost: the follower takes the Lease over and writes the next name.
    writers[held].kill();
    let stopped = Instant::now();
    ingress(c, "cart", "cart.example.com");
    until_corefile(c, "cart.example.com", &writers);
    let next = lease_holder(c);
    eprintln!(
        "{next} took over and wrote the next name {:.1} s after the holder stopped",
        stopped.elapsed().as_secs_f64()
    );
    assert_ne!(next, holder, "the Lease did not change hands");
    assert!(
        writers[other]
            .log_text()
            .contains("CoreDNS rewrites written")
    );
    writers[other].kill();
}

/// The uninstall Job's command and the node cleanup's first step, each with its
/// hook ServiceAccount: with one permission less it fails naming it; with the
/// chart's RBAC it completes and kubeadm's Corefile is back byte for byte.
fn uninstall_with_the_hooks_rbac(c: &Cluster, node: &SimNode, flags: &[String]) {
    // The pre-delete hooks' ServiceAccounts and Roles as Helm creates them (weight
    // -10) and the node cleanup DaemonSet (-5; no Node carries its selector's
    // kubernetes.io/os label here, so it is rolled out on zero nodes).
    let hooks = hook_objects(flags);
    let job_env = workload_env(&hooks, "Job", RELEASE_NS, "hairpin-uninstall-0");
    let ds = hooks
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the node cleanup DaemonSet");
    let await_env = container_env(&ds["spec"]["template"]["spec"]["initContainers"][0]);

    // One permission less: the kube-system Role without `update` on the ConfigMap.
    let mut fewer = hooks.clone();
    let role = fewer
        .iter_mut()
        .find(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == "kube-system")
        .expect("the hook's kube-system Role");
    role["rules"][0]["verbs"] = json!(["get"]);
    c.kubectl_apply(&without_job(&fewer));
    let cleanup = spawn_as(
        c,
        node,
        "hairpin-cleanup",
        "await-agents",
        &["uninstall"],
        &await_env,
    );
    let (code, report) = run_as(c, node, "hairpin-uninstall", &job_env);
    eprintln!("uninstall without configmaps update (exit {code}):\n{report}");
    assert_eq!(code, 1, "{report}");
    for needle in [
        "cannot update resource \"configmaps\"",
        "system:serviceaccount:hairpin-system:hairpin-uninstall",
        "kube-system",
    ] {
        assert!(
            report.contains(needle),
            "the report names {needle}:\n{report}"
        );
    }
    assert!(corefile_of(c).contains("cart.example.com"));

    // The chart's own Role back: the same command completes.
    c.kubectl_apply(&without_job(&hooks));
    let (code, report) = run_as(c, node, "hairpin-uninstall", &job_env);
    eprintln!("uninstall with the chart's RBAC (exit {code}):\n{report}");
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        corefile_of(c),
        KUBEADM_COREFILE,
        "the Corefile is kubeadm's, byte for byte"
    );
    let status = wait_exit(cleanup, Duration::from_secs(30));
    assert!(
        status.success(),
        "the node cleanup's await-agents step: {status}"
    );
    c.block_on(async {
        let ds: kube::Api<DaemonSet> = kube::Api::namespaced(c.client(), RELEASE_NS);
        let dep: kube::Api<Deployment> = kube::Api::namespaced(c.client(), RELEASE_NS);
        let leases: kube::Api<Lease> = kube::Api::namespaced(c.client(), RELEASE_NS);
        assert!(ds.get_opt("hairpin").await.expect("get").is_none());
        assert!(dep.get_opt("hairpin-coredns").await.expect("get").is_none());
        assert!(
            leases
                .get_opt("hairpin-coredns")
                .await
                .expect("get")
                .is_none()
        );
    });
}

/// An Ingress `name` in namespace shop for `host`, its status the ingress LB's.
fn ingress(c: &Cluster, name: &str, host: &str) {
    c.ensure_namespace("shop");
    c.kubectl_apply(&[
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"ingressClassName": "nginx", "rules": [{"host": host}]}}),
    ]);
    c.set_ingress_lb("shop", name, vip(&["203.0.113.10"]));
}

/// Waits until the Corefile names `name`; fails with the writers' logs.
fn until_corefile(c: &Cluster, name: &str, writers: &[Proc]) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let text = corefile_of(c);
        if text.contains(name) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no rewrite for {name}: {text}\n{}",
            writers
                .iter()
                .map(|w| format!("{}:\n{}", w.name, w.log_text()))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The writer Lease's holder.
fn lease_holder(c: &Cluster) -> String {
    let leases: kube::Api<Lease> = kube::Api::namespaced(c.client(), RELEASE_NS);
    c.block_on(leases.get("hairpin-coredns"))
        .expect("the writer's Lease")
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

/// `hairpin-agent coredns-writer` as the chart's Deployment runs a replica named
/// `pod`: its environment (identity: the pod name), its ServiceAccount's token; a
/// short Lease and no write interval, so the hand-over fits the suite's time.
fn start_writer(c: &Cluster, node: &SimNode, pod: &'static str) -> Proc {
    let objects = chart_objects(RELEASE_NS, &flags());
    let mut env = workload_env(&objects, "Deployment", RELEASE_NS, pod);
    let sock = node.dir.join(format!("{pod}.sock"));
    for (k, v) in [
        ("HAIRPIN_ADMIN_ADDRESS", "127.0.0.1:0".to_string()),
        ("HAIRPIN_ADMIN_SOCKET", sock.display().to_string()),
        ("HAIRPIN_LEASE_DURATION", "3s".to_string()),
        ("HAIRPIN_COREDNS_MIN_WRITE_INTERVAL", "0s".to_string()),
    ] {
        env.retain(|(name, _)| name != k);
        env.push((k.to_string(), v));
    }
    let kubeconfig = node.dir.join(format!("{pod}.kubeconfig"));
    c.node_kubeconfig(
        &kubeconfig,
        &c.service_account_token(RELEASE_NS, "hairpin-coredns"),
    );
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Proc::spawn_env(
        pod,
        &node.node_ns,
        &node.dir,
        &[
            agent_bin().to_str().expect("utf-8 path"),
            "coredns-writer",
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8 path"),
            "--log",
            "hairpin_agent=debug,info",
        ],
        &env,
    )
}

/// The chart's pre-delete hook objects as real Helm renders them.
fn hook_objects(flags: &[String]) -> Vec<Value> {
    hairpin_tests::helm::render_workspace_chart(RELEASE_NS, "hairpin", flags)
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete")
        .collect()
}

/// The hooks Helm creates before the Job; the Job's own command is run here as its
/// pod would run it (no kubelet runs pods in this suite).
fn without_job(hooks: &[Value]) -> Vec<Value> {
    hooks
        .iter()
        .filter(|o| o["kind"] != "Job")
        .cloned()
        .collect()
}

/// A container's literal environment.
fn container_env(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .expect("env list")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().expect("env name").to_string(),
                e["value"].as_str().expect("a literal value").to_string(),
            )
        })
        .collect()
}

/// A kubeconfig in the node's directory with ServiceAccount `account`'s token.
fn kubeconfig_of(c: &Cluster, node: &SimNode, account: &str) -> std::path::PathBuf {
    let path = node.dir.join(format!("{account}.kubeconfig"));
    c.node_kubeconfig(&path, &c.service_account_token(RELEASE_NS, account));
    path
}

/// `hairpin-agent uninstall` with `env` as ServiceAccount `account`, to completion:
/// its exit code and its report (stdout and log).
fn run_as(c: &Cluster, node: &SimNode, account: &str, env: &[(String, String)]) -> (i32, String) {
    let kubeconfig = kubeconfig_of(c, node, account);
    let mut cmd = hairpin_tests::sh::command_in(
        &node.node_ns,
        None,
        &[
            agent_bin().to_str().expect("utf-8 path"),
            "uninstall",
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8 path"),
        ],
    );
    let out = cmd
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("HAIRPIN_UNINSTALL_TIMEOUT", "60s")
        .output()
        .expect("run hairpin-agent uninstall");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `hairpin-agent ARGS` with `env` as ServiceAccount `account`, in the background.
fn spawn_as(
    c: &Cluster,
    node: &SimNode,
    account: &str,
    name: &'static str,
    args: &[&str],
    env: &[(String, String)],
) -> Proc {
    let kubeconfig = kubeconfig_of(c, node, account);
    let bin = agent_bin();
    let mut argv = vec![bin.to_str().expect("utf-8 path")];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--kubeconfig", kubeconfig.to_str().expect("utf-8 path")]);
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Proc::spawn_env(name, &node.node_ns, &node.dir, &argv, &env)
}

/// Waits for `p` to exit; its status (fails with its log after `within`).
fn wait_exit(mut p: Proc, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = p.try_wait() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not exit:\n{}",
            p.name,
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
