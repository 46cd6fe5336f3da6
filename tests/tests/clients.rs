//! The relays' default client policy: with no `--allowed-clients`, the agent reads
//! its Node's `spec.podCIDRs` and serves those, its own addresses and loopback. A pod
//! outside them is refused (reset at accept, counted); the node's own processes are
//! served; `status` says where the policy came from.

use std::time::Duration;

use hairpin_tests::{
    agent::Agent,
    cli::{admin_socket, doctor_check, run_cli},
    client::{Reply, assert_true_client, from_host, from_pod, url},
    fakeapi::{FakeApi, digitalocean_service},
    node::{NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, SimNode},
    require_privileges,
    servers::start_nginx,
    sh::{output_in, run_in},
};
use serde_json::{Value, json};

fn node_object(pod_cidrs: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "sim-node", "resourceVersion": "1"},
           "spec": {"podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs}})
}

/// A node with its DO Service proxied and its Node object carrying `pod_cidrs`.
fn start(node: &SimNode, api: &FakeApi, pod_cidrs: Option<&[&str]>) -> Agent {
    start_with(node, api, pod_cidrs, &[])
}

fn start_with(node: &SimNode, api: &FakeApi, pod_cidrs: Option<&[&str]>, extra: &[&str]) -> Agent {
    if let Some(c) = pod_cidrs {
        api.put_node(node_object(c));
    }
    api.apply(digitalocean_service());
    let kubeconfig = api.node_kubeconfig(node);
    let sock = admin_socket(node);
    let mut args = vec!["--admin-socket", sock.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    let mut agent = Agent::start_kube_default_clients(node, &kubeconfig, &args);
    agent.wait_for_log("agent ready", Duration::from_secs(20));
    agent
}

fn status_clients(node: &SimNode) -> Value {
    run_cli(node, &["status", "--output", "json"]).json()["status"]["clients"].clone()
}

/// `status`'s clients, asserted to have learned `pods` pods (and `ranges` ranges,
/// when given) from a synced source; `why` says where they come from.
fn assert_learned(node: &SimNode, pods: u64, ranges: Option<u64>, why: &str) -> Value {
    let clients = status_clients(node);
    let learned = &clients["learned"];
    assert_eq!(
        (learned["pods"].as_u64(), learned["synced"].as_bool()),
        (Some(pods), Some(true)),
        "{why}: {clients}"
    );
    if let Some(ranges) = ranges {
        assert_eq!(learned["ranges"].as_u64(), Some(ranges), "{why}: {clients}");
    }
    clients
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

// Fake API: a Node with and without podCIDRs swapped in one run; could move to real_cluster (the real Node carries podCIDRs there).
#[test]
fn the_nodes_pod_cidrs_are_the_default_and_other_peers_are_refused() {
    require_privileges!();
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
        "192.0.2.0/24,2001:db8:1::/64,192.0.2.1/32,2001:db8:1::1/128,169.254.104.1/32,\
         169.254.104.2/32,fd68:6169:7270:696e::1/128,fd68:6169:7270:696e::2/128,127.0.0.0/8,\
         ::1/128",
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
        pod.refused(),
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

/// curl from `netns` (outside every attached cgroup: an off-node peer) to `url`.
fn curl_from(netns: &str, url: &str, host: &str) -> Reply {
    Reply::from_output(output_in(
        netns,
        None,
        &[
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-H",
            &format!("Host: {host}"),
            url,
        ],
    ))
}

/// The pod's host routes out of its veth, as Calico, the AWS VPC CNI and Azure CNI
/// install them (`ip route add|del <pod>/32 dev vpod`).
fn pod_host_routes(node: &SimNode, op: &str) {
    run_in(
        &node.node_ns,
        &["ip", "route", op, &format!("{POD_IP4}/32"), "dev", "vpod"],
    );
    run_in(
        &node.node_ns,
        &[
            "ip",
            "-6",
            "route",
            op,
            &format!("{POD_IP6}/128"),
            "dev",
            "vpod",
        ],
    );
}

/// Where a Node has no pod CIDRs (the AWS VPC CNI, Azure CNI, Calico and Cilium
/// cluster-pool IPAM), the relays read this node's pods from its own routes (no Pod
/// is read from the API) and serve nobody else: a pod without its host route is
/// refused at once, served once the route is there, a host process is served, and
/// a peer off the node, with routes to every address the relays listen on, is
/// reset at each of them: the frontend's relay listener (v4 and v6 link-local
/// defaults), the name relay on its address and the hairpin Service's target ports
/// on the node IP.
// Fake API: a Node without podCIDRs, which the real control plane here always sets (its NodeIPAM); could move with a second Node.
#[test]
fn without_pod_cidrs_this_nodes_pods_are_learned_and_off_node_peers_are_refused() {
    require_privileges!();
    let mut node = SimNode::new();
    let peer = node.add_off_node_peer();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    // Calico-style: the Node has no pod CIDRs. Names under example.net are routed
    // (an Ingress on the DO LB), so the name relay listens too.
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "shop", "resourceVersion": "1",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"rules": [{"host": "shop.example.net"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
    );
    let mut agent = start_with(
        &node,
        &api,
        Some(&[]),
        &["--mode", "both", "--names-domains", "example.net"],
    );
    agent.wait_for_log("name relay listening", Duration::from_secs(20));
    let target = url("203.0.113.10", 80, "/");

    // No host route for the pod yet (only the node's connected /24 on vpod, which
    // other machines could share): refused at once, not held.
    let started = std::time::Instant::now();
    let early = from_pod(&node, &target);
    assert!(
        early.refused() && started.elapsed() < Duration::from_secs(2),
        "a pod not in the node's routes is refused at once: {early:?} after {:?}",
        started.elapsed()
    );
    pod_host_routes(&node, "add");
    std::thread::sleep(Duration::from_millis(300));
    let learned = from_pod(&node, &target);
    assert!(
        learned.body.starts_with(&format!("client={POD_IP4}:")),
        "a pod with its host route is served: {learned:?}\n{}",
        agent.log()
    );
    let host = from_host(&node, &target);
    assert_true_client("host", &host, NODE_IP4, "203.0.113.10", &agent);
    let clients = assert_learned(&node, 2, None, "the pod's two host routes");
    assert!(
        clients["source"]
            .as_str()
            .is_some_and(|s| s.contains("Node sim-node has no spec.podCIDRs")
                && s.contains("links and routes")),
        "{clients}"
    );

    // Every listener, from off the node: the relay listener of the frontend (as the
    // redirect names it), the name relay and the Service target ports.
    let status = run_cli(&node, &["status", "--output", "json"]).json();
    let listener = status["status"]["frontends"]
        .as_array()
        .expect("frontends")
        .iter()
        .find(|f| f["ip"] == "203.0.113.10" && f["port"] == 80)
        .and_then(|f| f["listener"].as_str())
        .unwrap_or_else(|| panic!("no listener for 203.0.113.10:80 in {status}"))
        .to_string();
    assert!(
        listener.starts_with("169.254.104.1:"),
        "the relay listens on the link-local default, not the node IP: {listener}"
    );
    // The name relay's listener for port 80: a privileged port (the connect
    // programs send the names port there), as status says.
    let name_listener = status["status"]["names"]["redirects"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["dialled"] == "169.254.104.1:80"))
        .and_then(|r| r["listener"].as_str())
        .unwrap_or_else(|| panic!("no names redirect for 169.254.104.1:80 in {status}"))
        .to_string();
    // The names port itself: nothing listens there (an off-node peer's connect
    // meets no program), so the kernel refuses it.
    let names_port = curl_from(&peer, "http://169.254.104.1:80/", "shop.example.net");
    assert_eq!(names_port.code, 7, "{names_port:?}");
    let before = refused(&node);
    let targets = [
        format!("http://{listener}/"),
        format!("http://{name_listener}/"),
        format!("http://{NODE_IP4}:880/"),
        format!("http://[{NODE_IP6}]:880/"),
    ];
    let replies: Vec<(String, Reply)> = std::thread::scope(|s| {
        let running: Vec<_> = targets
            .iter()
            .map(|t| s.spawn(|| (t.clone(), curl_from(&peer, t, "shop.example.net"))))
            .collect();
        running
            .into_iter()
            .map(|h| h.join().expect("curl thread"))
            .collect()
    });
    for (t, reply) in &replies {
        assert!(
            reply.refused(),
            "an off-node peer must not be served at {t}: {reply:?}\n{}",
            agent.log()
        );
        assert!(!reply.body.contains("client="), "{t}: {reply:?}");
    }
    assert_eq!(
        refused(&node) - before,
        targets.len() as u64,
        "each attempt reached a listener and was refused by the policy (not a missing route)"
    );
    // The pod is still served after the refusals; a pod whose route is gone is
    // forgotten.
    assert!(from_pod(&node, &target).ok());
    pod_host_routes(&node, "del");
    std::thread::sleep(Duration::from_millis(300));
    let gone = from_pod(&node, &target);
    assert!(
        gone.refused(),
        "a pod whose route is gone is refused: {gone:?}"
    );
}

/// With a frontends file and no `--allowed-clients` there is no pod network to
/// serve: the relays serve the node itself only (fail closed), and `status` and
/// `doctor` say how to widen it.
#[test]
fn a_file_source_without_allowed_clients_serves_the_node_only() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_without_pod_network(
        &node,
        &[hairpin_tests::agent::spec("203.0.113.10", "v1")],
    );
    let target = url("203.0.113.10", 80, "/");
    let pod = from_pod(&node, &target);
    assert!(pod.refused(), "{pod:?}");
    let host = from_host(&node, &target);
    assert_true_client("host", &host, NODE_IP4, "203.0.113.10", &agent);
    assert_learned(&node, 0, Some(0), "no CNI shape on this node's routes");
    let report = run_cli(&node, &["doctor", "--output", "json"]).json();
    let check = doctor_check(&report, "clients");
    assert_eq!(check["status"], "warn", "{check}");
}
