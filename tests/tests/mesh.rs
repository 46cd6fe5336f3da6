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
//! destination) and exactly one header arrives, naming the pod. The same on `path:
//! relay`. Without the proxy, the kernel path takes the pod's connections again. Every
//! test runs over IPv4 and then IPv6 on the same dual-stack node (the harness installs
//! the redirect rules' ip6tables twins and the proxy on 127.0.0.1 and ::1, as meshes do
//! in a dual-stack pod).
//!
//! With the cache of "no listener here" per network namespace on (the harness's agents
//! run with `--mesh-listener-cache on`, as `auto` is at the node's cgroup root), a
//! proxy that starts listening after a pod's connects were cached as unmeshed is seen
//! by the next one (Istio's sidecar, ambient's ztunnel from a cgroup of its own);
//! below the root `auto` leaves the cache off, and a proxy opened from outside the
//! attached cgroup is still probed for.
//!
//! Cost: twelve simulated nodes with one Envoy each (the tests run in parallel), two to
//! six requests each; about 15 s of wall time.

use std::net::{IpAddr, SocketAddr};

use hairpin_tests::{
    agent::{Agent, status},
    client::{Reply, from_pod, url},
    mesh::{Mesh, MeshShape},
    node::{POD_IP4, POD_IP6, SimNode},
    require_privileges,
    servers::{Server, nginx_access_log, start_nginx},
    wait::eventually,
};
use serde_json::Value;

/// nginx behind LBs on the default path (v1) and asking for the relay (v2), IPv4 and
/// IPv6.
const FRONTENDS: &str = "frontends:\n\
    - ip: \"203.0.113.10\"\n  ports: [80]\n  proxyProtocol: v1\n\
    - ip: \"203.0.113.12\"\n  ports: [80]\n  proxyProtocol: v2\n  path: relay\n\
    - ip: \"2001:db8:ffff::10\"\n  ports: [80]\n  proxyProtocol: v1\n\
    - ip: \"2001:db8:ffff::12\"\n  ports: [80]\n  proxyProtocol: v2\n  path: relay\n";

/// One address family's pod address and LBs.
struct Family {
    /// `IPv4` or `IPv6`, for failure messages.
    name: &'static str,
    pod: &'static str,
    /// On the default path, v1.
    default_lb: &'static str,
    /// Asking for the relay, v2.
    relay_lb: &'static str,
}

/// IPv4 first, then IPv6: a test's counters after family `i` count `i + 1` requests.
const FAMILIES: [Family; 2] = [
    Family {
        name: "IPv4",
        pod: POD_IP4,
        default_lb: "203.0.113.10",
        relay_lb: "203.0.113.12",
    },
    Family {
        name: "IPv6",
        pod: POD_IP6,
        default_lb: "2001:db8:ffff::10",
        relay_lb: "2001:db8:ffff::12",
    },
];

/// `ip:port` as Envoy and the agent write it (`[v6]:port`).
fn sock(ip: &str, port: u16) -> String {
    SocketAddr::new(ip.parse().expect("a literal address"), port).to_string()
}

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

/// The pod's request to the default-path LB, over IPv4 and then IPv6: the connect
/// program saw the proxy's listener (127.0.0.1, then ::1) and sent the connect to the
/// relay, which the proxy dialled; one header, naming the pod.
fn default_path_sends_one_header(shape: MeshShape) {
    let (node, _nginx, agent, mesh) = meshed(shape);
    for (i, f) in FAMILIES.iter().enumerate() {
        let reply = from_pod(&node, &url(f.default_lb, 80, "/"));
        assert_one_header(shape, &reply, f, f.default_lb, &node, &mesh, &agent);
        wait_proxied(&mesh, &relay_listener(&node, f.default_lb), f.pod);
        let s = status(&node);
        let requests = i as u64 + 1;
        let context = format!("{} {}: {s}", shape.name(), f.name);
        assert_eq!(
            kernel_counter(&s, "kernel_fallback_mesh"),
            requests,
            "{context}"
        );
        assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{context}");
        assert_eq!(kernel_counter(&s, "redirected"), requests, "{context}");
    }
}

/// A kernel counter from `status`.
fn kernel_counter(s: &Value, name: &str) -> u64 {
    s["counters"]["kernel"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name}: {}", s["counters"]))
}

/// Where connects to `lb`:80 are sent, its relay slot (a port of the relay's address
/// that names the frontend), from `status`, as the proxy writes it: what it dials.
fn relay_listener(node: &SimNode, lb: &str) -> String {
    let s = status(node);
    let lb: IpAddr = lb.parse().expect("a literal address");
    s["frontends"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| {
            f["ip"].as_str().and_then(|ip| ip.parse::<IpAddr>().ok()) == Some(lb) && f["port"] == 80
        })
        .and_then(|f| f["listener"].as_str())
        .and_then(|l| l.parse::<SocketAddr>().ok())
        .map(|l| l.to_string())
        .unwrap_or_else(|| panic!("no relay slot for {lb} port 80: {s}"))
}

/// Waits (3 s) until the proxy logged a connection to `original_dst`, which it
/// dialled, from the pod's address `pod` in the ambient shape; that line.
fn wait_proxied(mesh: &Mesh, original_dst: &str, pod: &str) -> String {
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
        // The port-less half of `[pod]:port`.
        let from = sock(pod, 0);
        let from = from.strip_suffix(":0").expect("port 0");
        assert!(
            line.contains(&format!("from={from}:")),
            "the ambient proxy dials from the pod's address: {line}"
        );
    }
    line
}

/// The pod's request to the LB asking for the relay, through the proxy, over IPv4 and
/// then IPv6: one header, naming the pod and the LB it dialled.
fn relay_path_sends_one_header(shape: MeshShape) {
    let (node, _nginx, agent, mesh) = meshed(shape);
    for f in &FAMILIES {
        let reply = from_pod(&node, &url(f.relay_lb, 80, "/"));
        assert_one_header(shape, &reply, f, f.relay_lb, &node, &mesh, &agent);
        // Through the proxy, which dialled the LB's relay slot.
        wait_proxied(&mesh, &relay_listener(&node, f.relay_lb), f.pod);
    }
}

/// `reply` came back whole and its header named `f`'s pod and `lb`:80, and nginx
/// logged no second header.
fn assert_one_header(
    shape: MeshShape,
    reply: &Reply,
    f: &Family,
    lb: &str,
    node: &SimNode,
    mesh: &Mesh,
    agent: &Agent,
) {
    let context = || {
        format!(
            "{} {} -> {lb}: {reply:?}\naccess log:\n{}\nproxy:\n{}\nagent:\n{}",
            shape.name(),
            f.name,
            nginx_access_log(node),
            mesh.proxy_log(),
            agent.log()
        )
    };
    assert!(reply.ok(), "{}", context());
    assert!(
        reply.body.starts_with(&format!("client={}:", f.pod))
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

/// Over IPv4 and then IPv6: the kernel writes the header, the sidecar installed sends
/// the connects to the relay, the sidecar gone gives them back to the kernel.
#[test]
fn without_the_proxy_the_kernel_path_takes_the_pods_connections() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with_frontends_yaml(&node, FRONTENDS, &["--kernel-path", "auto"]);
    let request = |f: &Family, kernel: u64, mesh: u64| {
        let reply = from_pod(&node, &url(f.default_lb, 80, "/"));
        assert!(
            reply.ok() && reply.body.starts_with(&format!("client={}:", f.pod)),
            "{}: {reply:?}\n{}",
            f.name,
            agent.log()
        );
        let s = status(&node);
        let context = format!("{}: {s}", f.name);
        assert_eq!(
            kernel_counter(&s, "kernel_headers_written"),
            kernel,
            "{context}"
        );
        assert_eq!(
            kernel_counter(&s, "kernel_fallback_mesh"),
            mesh,
            "{context}"
        );
    };
    let [v4, v6] = &FAMILIES;
    // No proxy yet: the kernel writes the header.
    request(v4, 1, 0);
    request(v6, 2, 0);
    let mesh = Mesh::install(&node, MeshShape::IstioTcp);
    request(v4, 2, 1);
    request(v6, 2, 2);
    // The sidecar gone (its listener closed, its rules deleted): the kernel again.
    drop(mesh);
    request(v4, 3, 2);
    request(v6, 4, 2);
}

/// The pod's request to the default-path LB: answered, with a header naming the pod.
fn request_through_the_kernel_path(node: &SimNode, agent: &Agent, f: &Family) {
    let reply = from_pod(node, &url(f.default_lb, 80, "/"));
    assert!(
        reply.ok() && reply.body.starts_with(&format!("client={}:", f.pod)),
        "{}: {reply:?}\n{}",
        f.name,
        agent.log()
    );
}

/// With the cache on (`--mesh-listener-cache on`: every process of the simulated node
/// runs inside the cgroup the agent attached at), over IPv4 and then IPv6: the pod's
/// first connect probes and finds no proxy, the second skips the probes
/// (`kernel_mesh_cached`). Then `shape`'s proxy starts listening (Istio's sidecar
/// from the pod's cgroup, ambient's ztunnel from a cgroup of its own, as its in-pod
/// listener is opened by ztunnel's own pod), and the very next connect sees it:
/// sock_ops' listen callback made the cached "no listener" stale. One header.
fn a_listener_after_a_cached_none_gets_one_header(shape: MeshShape) {
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with_frontends_yaml(
        &node,
        FRONTENDS,
        &["--kernel-path", "auto", "--mesh-listener-cache", "on"],
    );
    for f in &FAMILIES {
        request_through_the_kernel_path(&node, &agent, f);
        request_through_the_kernel_path(&node, &agent, f);
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 4, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_mesh_cached"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_fallback_mesh"), 0, "{s}");
    let mesh = Mesh::install(&node, shape);
    for (i, f) in FAMILIES.iter().enumerate() {
        let reply = from_pod(&node, &url(f.default_lb, 80, "/"));
        assert_one_header(shape, &reply, f, f.default_lb, &node, &mesh, &agent);
        wait_proxied(&mesh, &relay_listener(&node, f.default_lb), f.pod);
        let s = status(&node);
        let context = format!("{} {}: {s}", shape.name(), f.name);
        assert_eq!(
            kernel_counter(&s, "kernel_fallback_mesh"),
            i as u64 + 1,
            "{context}"
        );
        assert_eq!(kernel_counter(&s, "kernel_mesh_cached"), 2, "{context}");
        assert_eq!(kernel_counter(&s, "kernel_headers_written"), 4, "{context}");
    }
}

#[test]
fn istio_sidecar_listening_after_a_cached_none_gets_one_header() {
    require_privileges!();
    a_listener_after_a_cached_none_gets_one_header(MeshShape::IstioTcp);
}

#[test]
fn ambient_ztunnel_listening_after_a_cached_none_gets_one_header() {
    require_privileges!();
    a_listener_after_a_cached_none_gets_one_header(MeshShape::Ambient);
}

/// Attached below the hierarchy's root (as every simulated node is), the default
/// `--mesh-listener-cache auto` (the harness's agents otherwise run with `on`)
/// leaves the cache off: a proxy opened from a cgroup
/// outside the attached one (a ztunnel whose pod lies outside it) runs no sock_ops
/// program of hairpin's, so nothing would tell a cached "no listener" that it
/// listens. Every connect probes, and after the proxy starts the pod's connect still
/// gets one header.
#[test]
fn below_the_root_a_proxy_from_outside_the_cgroup_is_probed_for() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with_frontends_yaml(
        &node,
        FRONTENDS,
        &["--kernel-path", "auto", "--mesh-listener-cache", "auto"],
    );
    let [v4, _] = &FAMILIES;
    request_through_the_kernel_path(&node, &agent, v4);
    request_through_the_kernel_path(&node, &agent, v4);
    let outside = node.outside_cgroup();
    let mesh = Mesh::install_from(&node, MeshShape::Ambient, &outside);
    let reply = from_pod(&node, &url(v4.default_lb, 80, "/"));
    assert_one_header(
        MeshShape::Ambient,
        &reply,
        v4,
        v4.default_lb,
        &node,
        &mesh,
        &agent,
    );
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_mesh"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_mesh_cached"), 0, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 2, "{s}");
}
