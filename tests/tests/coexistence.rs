//! Coexistence with another cgroup connect program at the same cgroup, as
//! Cilium's socket load balancer would have at the cgroup v2 root.
//!
//! The "foreign" program here is the socket-LB stand-in (`hairpin_tests::socket_lb`:
//! connect4/connect6 programs of a few instructions, owned by the test process),
//! which rewrites a service address straight to a backend the way a socket LB does. hairpin attaches beside it with bpf_links: both stay attached,
//! neither replaces the other. The order matters: a socket LB that runs first and
//! rewrites the LB IP itself leaves nothing for hairpin to see, so hairpin's connect
//! links go before every program already there where the kernel orders cgroup links
//! (`BPF_F_BEFORE`); without ordering (simulated with `--link-order append`) the
//! socket LB attached first still hides the LB IP. `tests/tests/socket_lb.rs` covers
//! the kernel path, status and doctor beside a socket LB.

use std::net::SocketAddr;

use hairpin_tests::{
    agent::{Agent, FrontendSpec, spec},
    client::{from_pod, url},
    node::{INGRESS_IP4, NGINX_PLAIN_PORT, NGINX_PP_PORT, POD_IP4, SimNode},
    require_privileges,
    servers::{nginx_error_log, start_nginx},
    socket_lb::{Rule, SocketLb},
};

/// The foreign program: the socket-LB stand-in, rewriting each `(service, backend)`,
/// linked after whatever is at the node's cgroup.
fn foreign(node: &SimNode, rewrites: &[(&str, SocketAddr)]) -> SocketLb {
    let rules: Vec<Rule> = rewrites
        .iter()
        .map(|(from, to)| Rule::Rewrite(from.parse().expect("addr"), *to))
        .collect();
    SocketLb::attach(&node.cgroup, &rules).expect("attach the foreign program")
}

fn backend(port: u16) -> SocketAddr {
    SocketAddr::new(INGRESS_IP4.parse().expect("ip"), port)
}

fn hairpin_frontends() -> Vec<FrontendSpec> {
    vec![spec("203.0.113.10", "v1")]
}

#[test]
fn hairpin_attaches_beside_another_program_and_both_work() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // The socket LB serves a ClusterIP-like VIP (203.0.113.99:80) by rewriting it to
    // the plain backend; it knows nothing of 203.0.113.10.
    let other = foreign(&node, &[("203.0.113.99:80", backend(NGINX_PLAIN_PORT))]);
    let before = node.attached_programs();
    let mut agent = Agent::start(&node, &hairpin_frontends());
    let during = node.attached_programs();
    assert_eq!(before.matches("cgroup_inet").count(), 2, "{before}");
    assert_eq!(
        during.matches("cgroup_inet").count(),
        4,
        "hairpin must add, not replace:\n{during}"
    );

    // Each program does its own job.
    let hp = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        hp.ok() && hp.body.starts_with(&format!("client={POD_IP4}:")),
        "{hp:?}"
    );
    let lb = from_pod(&node, &url("203.0.113.99", 80, "/"));
    // Rewritten in the socket, so no NAT: the backend sees the pod itself.
    assert_eq!(
        lb.body.trim_end(),
        format!("plain remote={POD_IP4}"),
        "{lb:?}"
    );

    // hairpin leaving (SIGTERM keeps its datapath for the next agent; `cleanup`
    // removes it) takes only its own links away.
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait(std::time::Duration::from_secs(30)).success());
    assert_eq!(node.attached_programs().matches("cgroup_inet").count(), 4);
    hairpin_tests::cli::run_node_cleanup(&node);
    let after = node.attached_programs();
    assert_eq!(
        after.matches("cgroup_inet").count(),
        2,
        "the other program must survive:\n{after}"
    );
    let lb = from_pod(&node, &url("203.0.113.99", 80, "/"));
    assert!(lb.ok(), "{lb:?}");
    drop(other);
}

#[test]
fn a_socket_lb_attached_first_no_longer_hides_the_lb_ip_from_hairpin() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // Attached first, it rewrites the LB IP itself to the ingress backend, as
    // Cilium's socket LB does for LoadBalancer IPs (bpf-lb-sock). hairpin's links
    // go before every program already there (BPF_F_BEFORE), so its program sees the
    // LB IP and sends the connect to the relay; the socket LB then sees the relay's
    // address, which is none of its services.
    let _other = foreign(&node, &[("203.0.113.10:80", backend(NGINX_PP_PORT))]);
    let agent = Agent::start(&node, &hairpin_frontends());
    let r = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        r.ok() && r.body.starts_with(&format!("client={POD_IP4}:")),
        "{r:?}\n{}",
        agent.log()
    );
    assert!(!nginx_error_log(&node).contains("broken header"));
}

#[test]
fn without_link_ordering_a_socket_lb_attached_first_hides_the_lb_ip_from_hairpin() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let _other = foreign(&node, &[("203.0.113.10:80", backend(NGINX_PP_PORT))]);
    // As on a kernel that does not order cgroup links: hairpin's links are appended,
    // the socket LB runs first, and hairpin's program sees the backend address.
    let agent = Agent::start_with(&node, &hairpin_frontends(), &["--link-order", "append"]);
    let r = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(
        r.code,
        52,
        "expected the pre-hairpin failure (header missing): {r:?}\n{}",
        agent.log()
    );
    assert!(nginx_error_log(&node).contains("broken header"));
    assert!(
        !agent.log().contains("accepted"),
        "hairpin never saw the connect:\n{}",
        agent.log()
    );
}

#[test]
fn hairpin_attached_first_wins_over_a_later_socket_lb() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &hairpin_frontends());
    // Attached after hairpin: it sees the relay listener's address, not the LB IP.
    let _other = foreign(&node, &[("203.0.113.10:80", backend(NGINX_PP_PORT))]);
    let r = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        r.ok() && r.body.starts_with(&format!("client={POD_IP4}:")),
        "{r:?}\n{}",
        agent.log()
    );
}
