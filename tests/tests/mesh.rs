//! A pod behind a mesh's outbound-redirecting proxy (`hairpin_tests::mesh`: Istio's
//! sidecar passing TCP through or proxying HTTP, Linkerd's HTTP-detecting proxy,
//! Istio ambient's proxy outside the pod's cgroup), calling its own cluster's LB.
//!
//! What these tests state today (issue 30): on the default path (the kernel path,
//! `--kernel-path auto`) the pod's own socket is marked for the LB and gets a header
//! on its way into the proxy, and the proxy's socket gets another, so the ingress reads
//! the second header where the request should be (or, where the proxy parses HTTP, the
//! proxy reads the first as a bad request); on `path: relay` the pod's connect
//! goes to the relay's listener, the proxy dials that, and exactly one header arrives,
//! naming the pod. The default-path tests assert the failure as it stands; the fix
//! turns them into successes.

use hairpin_tests::{
    agent::Agent,
    client::{Reply, from_pod, url},
    mesh::{Mesh, MeshShape},
    node::{POD_IP4, SimNode},
    require_privileges,
    servers::{Server, nginx_access_log, start_nginx},
    wait::eventually,
};

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

/// The pod's request to 203.0.113.10 on the default path fails. Where the proxy
/// passes the bytes through (Istio's TCP passthrough; Linkerd's, which finds no HTTP in
/// a stream that starts with the header; ambient's), the ingress reads the proxy's
/// header, then the pod's own header as the request line, and answers 400: nginx's
/// access log shows the second header, naming the pod, where the request should be.
/// Where the proxy parses HTTP (Istio's HTTP connection manager), the proxy itself
/// reads the pod's header as the request line and answers 400; the request never
/// reaches the ingress.
fn default_path_fails(shape: MeshShape) {
    let (node, _nginx, agent, mesh) = meshed(shape);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    let context = |log: &str| {
        format!(
            "{}: {reply:?}\naccess log:\n{log}\nproxy:\n{}\nagent:\n{}",
            shape.name(),
            mesh.proxy_log(),
            agent.log()
        )
    };
    assert!(!reply.body.starts_with("client="), "{}", context(""));
    if shape == MeshShape::IstioHttp {
        assert_eq!(reply.body.trim(), "Bad Request", "{}", context(""));
        let log = nginx_access_log(&node);
        assert!(log.is_empty(), "{}", context(&log));
        return;
    }
    let second = format!("\"PROXY TCP4 {POD_IP4} 203.0.113.10 ");
    let log = eventually(|| nginx_access_log(&node), |l| l.contains(&second));
    let line = log
        .lines()
        .find(|l| l.contains(&second))
        .unwrap_or_else(|| {
            panic!(
                "nginx never read the pod's header as a request: {}",
                context(&log)
            )
        });
    assert!(line.contains("\" 400 "), "nginx answers 400: {line}");
    // The second header is the proxy's: it dialled the LB itself.
    wait_proxied(&mesh, "203.0.113.10:80");
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
    // Through the proxy, which dialled the relay's listener for 203.0.113.12:80.
    let listener = agent
        .log()
        .lines()
        .find(|l| l.contains("listener started") && l.contains("frontend=203.0.113.12:80"))
        .and_then(|l| l.split("local=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no relay listener for 203.0.113.12:80:\n{}", agent.log()));
    wait_proxied(&mesh, &listener);
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
fn istio_sidecar_tcp_default_path_fails() {
    require_privileges!();
    default_path_fails(MeshShape::IstioTcp);
}

#[test]
fn istio_sidecar_tcp_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::IstioTcp);
}

#[test]
fn istio_sidecar_http_default_path_fails() {
    require_privileges!();
    default_path_fails(MeshShape::IstioHttp);
}

#[test]
fn istio_sidecar_http_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::IstioHttp);
}

#[test]
fn linkerd_default_path_fails() {
    require_privileges!();
    default_path_fails(MeshShape::Linkerd);
}

#[test]
fn linkerd_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::Linkerd);
}

#[test]
fn ambient_default_path_fails() {
    require_privileges!();
    default_path_fails(MeshShape::Ambient);
}

#[test]
fn ambient_relay_path_sends_one_header() {
    require_privileges!();
    relay_path_sends_one_header(MeshShape::Ambient);
}
