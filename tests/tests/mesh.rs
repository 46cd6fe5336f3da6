//! A pod behind a mesh's outbound-redirecting proxy (`hairpin_tests::mesh`: Istio's
//! sidecar passing TCP through or proxying HTTP, Linkerd's HTTP-detecting proxy,
//! Istio ambient's proxy outside the pod's cgroup), calling its own cluster's LB.
//!
//! On the kernel path a header written on the pod's own socket would go into the
//! proxy, and the proxy's socket would get another: the ingress would read the second
//! where the request should be. The connect programs look, on a kernel-path frontend
//! hit, for a listener on the mesh's outbound capture port (15001, Linkerd's 4140) on
//! loopback in the pod's own network namespace; found, the connect takes the relay
//! (`kernel_fallback_mesh`): the proxy dials the frontend's relay slot (its original
//! destination) and exactly one header arrives, naming the pod. The same on `path: relay`. Without the proxy, the
//! kernel path takes the pod's connections again.
//!
//! Cost: nine simulated nodes with one Envoy each (the tests run in parallel), one to
//! three requests each; about 15 s of wall time.

use hairpin_tests::{
    agent::{Agent, status},
    client::{Reply, from_pod, url},
    mesh::{Mesh, MeshShape},
    node::{POD_IP4, SimNode},
    require_privileges,
    servers::{Server, nginx_access_log, start_nginx},
    wait::eventually,
};
use serde_json::Value;

/// nginx behind two LBs: 203.0.113.10 on the default path (v1), 203.0.113.12 asking
/// for the relay (v2).
const FRONTENDS: &str = "frontends:\n\
    - ip: \"203.0.113.10\"\n  ports: [80]\n  proxyProtocol: v1\n\
    - ip: \"203.0.113.12\"\n  ports: [80]\n  proxyProtocol: v2\n  path: relay\n";

/// A node with nginx and an agent on its defaults (the kernel path where it can
/// run), and `shape` installed in its pod.
fn meshed(shape: MeshShape) -> (SimNode, Server, Agent, Mesh) {
    let node = SimNode::new();
    let nginx = start_nginx(&node);
    // The harness's agents keep the relay unless told: this is the product's default.
    let agent = Agent::start_with_frontends_yaml(&node, FRONTENDS, &["--kernel-path", "auto"]);
    let mesh = Mesh::install(&node, shape);
    (node, nginx, agent, mesh)
}

/// The pod's request to 203.0.113.10 on the default path: the connect program saw
/// the proxy's listener and sent the connect to the relay, which the proxy dialled;
/// one header, naming the pod.
fn default_path_sends_one_header(shape: MeshShape) {
    let (node, _nginx, agent, mesh) = meshed(shape);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_one_header(shape, &reply, "203.0.113.10", &node, &mesh, &agent);
    wait_proxied(&mesh, &relay_listener(&node, "203.0.113.10:80"));
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_mesh"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 1, "{s}");
}

/// A kernel counter from `status`.
fn kernel_counter(s: &Value, name: &str) -> u64 {
    s["counters"]["kernel"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name}: {}", s["counters"]))
}

/// Where connects to `frontend` are sent, its relay slot (a port of the relay's
/// address that names the frontend), from `status`: what the proxy dials.
fn relay_listener(node: &SimNode, frontend: &str) -> String {
    let s = status(node);
    s["frontends"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| format!("{}:{}", f["ip"].as_str().unwrap_or(""), f["port"]) == frontend)
        .and_then(|f| f["listener"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no relay slot for {frontend}: {s}"))
}

/// Waits (3 s) until the proxy logged a connection to `original_dst`, which it
/// dialled, from the pod's address in the ambient shape; that line.
fn wait_proxied(mesh: &Mesh, original_dst: &str) -> String {
    let want = format!("original_dst={original_dst} upstream={original_dst} ");
    let text = eventually(|| mesh.proxied().join("\n"), |t| t.contains(&want));
    let line = text
        .lines()
        .find(|l| l.contains(&want))
        .unwrap_or_else(|| {
            panic!(
                "{}: the proxy never dialled {original_dst}:\n{}",
                mesh.shape().name(),
                mesh.proxy_log()
            )
        })
        .to_string();
    if mesh.shape() == MeshShape::Ambient {
        assert!(
            line.contains(&format!("from={POD_IP4}:")),
            "the ambient proxy dials from the pod's address: {line}"
        );
    }
    line
}

/// The pod's request to 203.0.113.12 (`path: relay`) through the proxy: one header,
/// naming the pod and the LB it dialled.
fn relay_path_sends_one_header(shape: MeshShape) {
    let (node, _nginx, agent, mesh) = meshed(shape);
    let reply = from_pod(&node, &url("203.0.113.12", 80, "/"));
    assert_one_header(shape, &reply, "203.0.113.12", &node, &mesh, &agent);
    // Through the proxy, which dialled the relay slot of 203.0.113.12:80.
    wait_proxied(&mesh, &relay_listener(&node, "203.0.113.12:80"));
}

/// `reply` came back whole and its header named the pod and `lb`:80, and nginx logged
/// no second header.
fn assert_one_header(
    shape: MeshShape,
    reply: &Reply,
    lb: &str,
    node: &SimNode,
    mesh: &Mesh,
    agent: &Agent,
) {
    let context = || {
        format!(
            "{}: {reply:?}\naccess log:\n{}\nproxy:\n{}\nagent:\n{}",
            shape.name(),
            nginx_access_log(node),
            mesh.proxy_log(),
            agent.log()
        )
    };
    assert!(reply.ok(), "{}", context());
    assert!(
        reply.body.starts_with(&format!("client={POD_IP4}:"))
            && reply.body.trim_end().ends_with(&format!("dst={lb}:80")),
        "{}",
        context()
    );
    assert!(
        !nginx_access_log(node).contains("\"PROXY "),
        "{}",
        context()
    );
}

#[test]
fn istio_sidecar_tcp_default_path_sends_one_header() {
    require_privileges!();
    default_path_sends_one_header(MeshShape::IstioTcp);
}

#[test]
fn istio_sidecar_tcp_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::IstioTcp);
}

#[test]
fn istio_sidecar_http_default_path_sends_one_header() {
    require_privileges!();
    default_path_sends_one_header(MeshShape::IstioHttp);
}

#[test]
fn istio_sidecar_http_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::IstioHttp);
}

#[test]
fn linkerd_default_path_sends_one_header() {
    require_privileges!();
    default_path_sends_one_header(MeshShape::Linkerd);
}

#[test]
fn linkerd_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::Linkerd);
}

#[test]
fn ambient_default_path_sends_one_header() {
    require_privileges!();
    default_path_sends_one_header(MeshShape::Ambient);
}

#[test]
fn ambient_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::Ambient);
}

#[test]
fn without_the_proxy_the_kernel_path_takes_the_pods_connections() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with_frontends_yaml(&node, FRONTENDS, &["--kernel-path", "auto"]);
    let lb = "203.0.113.10";
    let request = |kernel: u64, mesh: u64| {
        let reply = from_pod(&node, &url(lb, 80, "/"));
        assert!(
            reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
            "{reply:?}\n{}",
            agent.log()
        );
        let s = status(&node);
        assert_eq!(kernel_counter(&s, "kernel_headers_written"), kernel, "{s}");
        assert_eq!(kernel_counter(&s, "kernel_fallback_mesh"), mesh, "{s}");
    };
    // No proxy yet: the kernel writes the header.
    request(1, 0);
    let mesh = Mesh::install(&node, MeshShape::IstioTcp);
    request(1, 1);
    // The sidecar gone (its listener closed, its rules deleted): the kernel again.
    drop(mesh);
    request(2, 1);
}
