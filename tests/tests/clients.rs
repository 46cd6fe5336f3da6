//! The relays' default client policy: with no `--allowed-clients`, the agent reads
//! its Node's `spec.podCIDRs` and serves those, its own addresses and loopback. A pod
//! outside them is refused (reset at accept, counted); the node's own processes are
//! served; `status` says where the policy came from.

use std::{path::PathBuf, time::Duration};

use hairpin_tests::{
    agent::Agent,
    cli::{admin_socket, run_cli},
    client::{from_host, from_pod, url},
    fakeapi::{FakeApi, fixture},
    node::{NODE_IP4, POD_IP4, SimNode},
    privileges::datapath_tests_can_run,
    servers::start_nginx,
    sh::run_in,
};
use serde_json::{Value, json};

fn node_object(pod_cidrs: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "sim-node", "resourceVersion": "1"},
           "spec": {"podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs}})
}

/// A node with its DO Service proxied and its Node object carrying `pod_cidrs`.
fn start(node: &SimNode, api: &FakeApi, pod_cidrs: Option<&[&str]>) -> Agent {
    if let Some(c) = pod_cidrs {
        api.put_node(node_object(c));
    }
    api.apply(fixture(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
        "../hairpin-agent/tests/fixtures/services/digitalocean.yaml",
    )));
    let kubeconfig = node.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let sock = admin_socket(node);
    let mut agent = Agent::start_kube(
        node,
        &kubeconfig,
        &["--admin-socket", sock.to_str().expect("utf-8 path")],
    );
    agent.wait_for_log("agent ready", Duration::from_secs(20));
    agent
}

fn status_clients(node: &SimNode) -> Value {
    run_cli(node, &["status", "--output", "json"]).json()["status"]["clients"].clone()
}

/// The relays' refused-clients counter, from the agent's /metrics.
fn refused(node: &SimNode) -> u64 {
    let text = run_in(
        &node.node_ns,
        &["curl", "-sS", "http://127.0.0.1:9901/metrics"],
    );
    text.lines()
        .find_map(|l| l.strip_prefix("hairpin_relay_refused_clients_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no refused-clients counter in:\n{text}"))
}

#[test]
fn the_nodes_pod_cidrs_are_the_default_and_other_peers_are_refused() {
    if !datapath_tests_can_run(module_path!()) {
        return;
    }
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let target = url("203.0.113.10", 80, "/");

    // The pod's own CIDR: served.
    let api = FakeApi::start_in_netns(&node.node_ns);
    let agent = start(&node, &api, Some(&["192.0.2.0/24", "2001:db8:1::/64"]));
    let pod = from_pod(&node, &target);
    assert!(
        pod.body.starts_with(&format!("client={POD_IP4}:")),
        "{pod:?}\n{}",
        agent.log()
    );
    let clients = status_clients(&node);
    assert_eq!(
        clients["allowed"],
        "192.0.2.0/24,2001:db8:1::/64,192.0.2.1/32,2001:db8:1::1/128,127.0.0.0/8,::1/128",
        "{clients}"
    );
    assert!(
        clients["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("Node sim-node spec.podCIDRs")),
        "{clients}"
    );
    drop(agent);
    drop(api);

    // Another node's CIDR: this pod is not in it, so the relay refuses it (an RST at
    // accept: curl reports a failed connect, a reset or an empty reply, by timing), while host processes, from the
    // node's own address, are still served.
    let api = FakeApi::start_in_netns(&node.node_ns);
    let agent = start(&node, &api, Some(&["10.244.7.0/24"]));
    let pod = from_pod(&node, &target);
    assert!(
        matches!(pod.code, 7 | 52 | 56),
        "a pod outside the Node's pod CIDRs must be refused: {pod:?}\n{}",
        agent.log()
    );
    let host = from_host(&node, &target);
    assert!(
        host.body.starts_with(&format!("client={NODE_IP4}:")),
        "{host:?}"
    );
    assert_eq!(refused(&node), 1, "counted once");
    assert!(
        agent
            .log()
            .contains("client outside the relay client policy: refused"),
        "the refusal is logged: {}",
        agent.log()
    );
}

#[test]
fn without_pod_cidrs_the_relays_stay_open_and_say_why() {
    if !datapath_tests_can_run(module_path!()) {
        return;
    }
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    // Calico-style: the Node has no pod CIDRs.
    let _agent = start(&node, &api, Some(&[]));
    let pod = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(pod.ok(), "{pod:?}");
    let clients = status_clients(&node);
    assert_eq!(clients["allowed"], "any", "{clients}");
    assert!(
        clients["source"]
            .as_str()
            .is_some_and(|s| s.contains("Node sim-node has no spec.podCIDRs")),
        "{clients}"
    );
    let report = run_cli(&node, &["doctor", "--output", "json"]).json();
    let check = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "clients")
        .cloned()
        .expect("a clients check");
    assert_eq!(check["status"], "warn", "{check}");
}
