//! A DigitalOcean-annotated LoadBalancer Service in the real API server, its status
//! patched as the cloud controller patches it, kube-proxy's real rules in front of
//! the ingress: the pod and the node get the header with their own address, on the
//! kernel path and on the relay, IPv4 and IPv6; and it stops when the Service goes.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::status,
    client::Reply,
    node::{KubeProxyMode, NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, SimNode},
    sh::output_in,
};
use serde_json::json;

use crate::{From, RealNode, do_service, names, until_reply, vip};

/// How long the agent and kube-proxy together may take from the status patch to the
/// first request with a header (kube-proxy's default minSyncPeriod is 1 s).
/// The node's address towards the ingress (its uplink): what a host process's
/// socket is bound to, so what its header names.
const NODE_UPLINK4: &str = "198.51.100.1";
/// Its IPv6 address.
const NODE_UPLINK6: &str = "2001:db8:2::1";

const CONVERGE: Duration = Duration::from_secs(15);

fn header_on_both_paths(mode: KubeProxyMode) {
    let Some(mut rn) = RealNode::start(mode) else {
        return;
    };
    rn.start_agent(&[]);
    let c = &rn.cluster;
    c.create_lb_service(&do_service(
        "ingress-nginx",
        "ingress-nginx-controller",
        &[],
    ));
    // The relayed one with `externalTrafficPolicy: Local` (its ingress pod is on this
    // node): kube-proxy's other LB chain shape.
    let mut relayed = do_service(
        "ingress-nginx",
        "ingress-relayed",
        &[("hairpin.dev/path", "relay")],
    );
    relayed.local_traffic = true;
    c.create_lb_service(&relayed);
    let patched = Instant::now();
    c.set_lb_ingress(
        "ingress-nginx",
        "ingress-nginx-controller",
        vip(&["203.0.113.10", "2001:db8:ffff::10"]),
    );
    c.set_lb_ingress(
        "ingress-nginx",
        "ingress-relayed",
        vip(&["203.0.113.11", "2001:db8:ffff::11"]),
    );
    let node = &rn.node;
    until_reply(node, From::Pod, "203.0.113.10", CONVERGE, |r| {
        names(r, POD_IP4)
    });
    eprintln!(
        "{mode:?}: status patch -> first pod request with a header: {:.2} s",
        patched.elapsed().as_secs_f64()
    );
    // A host process's header names the node: on the kernel path the address its
    // socket is bound to (the uplink, towards the LB), on the relay the node IP the
    // relay is given (`HAIRPIN_NODE_IPS`, the DaemonSet's status.hostIPs).
    for (lb, pod, host) in [
        ("203.0.113.10", POD_IP4, NODE_UPLINK4),
        ("203.0.113.11", POD_IP4, NODE_IP4),
        ("2001:db8:ffff::10", POD_IP6, NODE_UPLINK6),
        ("2001:db8:ffff::11", POD_IP6, NODE_IP6),
    ] {
        until_reply(node, From::Pod, lb, CONVERGE, |r| names(r, pod));
        until_reply(node, From::Host, lb, CONVERGE, |r| names(r, host));
    }
    // The real rules are kube-proxy's, in the mode asked for.
    assert!(
        rn.proxy.programs(&node.node_ns, "203.0.113.10"),
        "{}",
        rn.proxy.log()
    );
    // Each Service on the path it asked for.
    let s = status(node);
    let path_of = |ip: &str| {
        s["frontends"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["ip"] == ip && f["port"] == 80))
            .map(|f| f["path"].clone())
            .unwrap_or_else(|| panic!("no frontend {ip}:80: {s}"))
    };
    assert_eq!(path_of("203.0.113.10"), "kernel", "{s}");
    assert_eq!(path_of("203.0.113.11"), "ebpf", "{s}");
    assert_eq!(path_of("2001:db8:ffff::10"), "kernel", "{s}");
    assert_eq!(path_of("2001:db8:ffff::11"), "ebpf", "{s}");
}

#[test]
fn do_service_gets_the_header_under_kube_proxy_iptables() {
    header_on_both_paths(KubeProxyMode::Iptables);
}

#[test]
fn do_service_gets_the_header_under_kube_proxy_nftables() {
    header_on_both_paths(KubeProxyMode::Nftables);
}

/// One request from the pod with a one-second budget.
fn quick_pod_request(node: &SimNode, lb: &str) -> Reply {
    Reply::from_output(output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &[
            "curl",
            "-sS",
            "--max-time",
            "1",
            &format!("http://{lb}:80/"),
        ],
    ))
}

/// Polls until a pod request to `lb` no longer carries a header; the time it took.
fn until_no_header(node: &SimNode, lb: &str) -> Duration {
    let started = Instant::now();
    loop {
        let r = quick_pod_request(node, lb);
        if !names(&r, POD_IP4) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{lb}: still a header: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn annotation_removed_or_service_deleted_stops_the_header_within_a_second() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Nftables) else {
        return;
    };
    rn.start_agent(&[]);
    let c = &rn.cluster;
    c.create_lb_service(&do_service("ingress-nginx", "annotated", &[]));
    c.create_lb_service(&do_service("ingress-nginx", "deleted", &[]));
    c.set_lb_ingress("ingress-nginx", "annotated", vip(&["203.0.113.10"]));
    c.set_lb_ingress("ingress-nginx", "deleted", vip(&["203.0.113.12"]));
    for lb in ["203.0.113.10", "203.0.113.12"] {
        until_reply(&rn.node, From::Pod, lb, CONVERGE, |r| names(r, POD_IP4));
    }
    c.annotate_service(
        "ingress-nginx",
        "annotated",
        json!({ (crate::DO_PROXY_PROTOCOL): null }),
    );
    let gone = until_no_header(&rn.node, "203.0.113.10");
    eprintln!(
        "annotation removed -> no header: {:.3} s",
        gone.as_secs_f64()
    );
    assert!(gone < Duration::from_secs(1), "took {gone:?}");
    // The request now reaches nginx without one, which refuses it: the Service is
    // still there, kube-proxy still forwards, only hairpin stepped aside.
    let r = quick_pod_request(&rn.node, "203.0.113.10");
    assert!(r.refused(), "{r:?}");
    c.delete_service("ingress-nginx", "deleted");
    let gone = until_no_header(&rn.node, "203.0.113.12");
    eprintln!("Service deleted -> no header: {:.3} s", gone.as_secs_f64());
    assert!(gone < Duration::from_secs(1), "took {gone:?}");
}
