//! The datapath on a simulated node: real programs attached at a real cgroup,
//! kube-proxy-style DNAT, nginx and haproxy requiring the PROXY protocol.
//! Each assertion carries the server's log line or response body as evidence.

use std::time::Duration;

use hairpin_tests::{
    agent::{Agent, all_frontends},
    client::{from_host, from_pod, url},
    node::{NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, SimNode},
    privileges::datapath_tests_can_run,
    servers::{nginx_access_log, nginx_error_log, start_haproxy, start_nginx},
};
use nix::sys::signal::Signal;

macro_rules! require_privileges {
    () => {
        if !datapath_tests_can_run(module_path!()) {
            return;
        }
    };
}

#[test]
fn without_hairpin_pod_and_node_get_an_empty_reply_and_nginx_logs_broken_header() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    for (who, reply) in [
        ("pod", from_pod(&node, &url("203.0.113.10", 80, "/"))),
        ("node", from_host(&node, &url("203.0.113.10", 80, "/"))),
        (
            "pod v6",
            from_pod(&node, &url("2001:db8:ffff::10", 80, "/")),
        ),
    ] {
        assert_eq!(
            reply.code, 52,
            "{who}: expected curl's empty reply (52): {reply:?}"
        );
    }
    let errors = nginx_error_log(&node);
    assert_eq!(
        errors.matches("broken header").count(),
        3,
        "nginx should reject all three connections:\n{errors}"
    );
    assert!(errors.contains("while reading PROXY protocol"), "{errors}");
}

#[test]
fn with_hairpin_pod_and_node_requests_carry_the_true_client() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());

    let pod = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        pod.ok(),
        "pod request failed: {pod:?}\nagent:\n{}",
        agent.log()
    );
    assert!(
        pod.body.starts_with(&format!("client={POD_IP4}:")),
        "nginx must see the pod's IP as the PROXY source: {}",
        pod.body
    );
    assert!(
        pod.body.trim_end().ends_with("dst=203.0.113.10:80"),
        "{}",
        pod.body
    );

    let host = from_host(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        host.ok(),
        "node request failed: {host:?}\nagent:\n{}",
        agent.log()
    );
    assert!(
        host.body.starts_with(&format!("client={NODE_IP4}:")),
        "{}",
        host.body
    );
    assert!(
        host.body.trim_end().ends_with("dst=203.0.113.10:80"),
        "{}",
        host.body
    );

    let access = nginx_access_log(&node);
    assert!(
        access.contains(&format!("pp_client={POD_IP4}:")),
        "{access}"
    );
    assert!(
        access.contains(&format!("pp_client={NODE_IP4}:")),
        "{access}"
    );
    assert!(access.contains("pp_dst=203.0.113.10:80"), "{access}");
    assert!(!nginx_error_log(&node).contains("broken header"));
}

#[test]
fn ipv6_and_proxy_v2_frontends_work_from_pod_and_node() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());
    let cases = [
        ("2001:db8:ffff::10", "v1"),
        ("203.0.113.12", "v2"),
        ("2001:db8:ffff::12", "v2"),
    ];
    for (lb, version) in cases {
        let (pod_ip, node_ip) = if lb.contains(':') {
            (POD_IP6, NODE_IP6)
        } else {
            (POD_IP4, NODE_IP4)
        };
        for (who, reply, client) in [
            ("pod", from_pod(&node, &url(lb, 80, "/")), pod_ip),
            ("node", from_host(&node, &url(lb, 80, "/")), node_ip),
        ] {
            assert!(
                reply.ok(),
                "{who} -> {lb} ({version}): {reply:?}\nagent:\n{}",
                agent.log()
            );
            assert!(
                reply.body.starts_with(&format!("client={client}:")),
                "{who} -> {lb}: {}",
                reply.body
            );
            assert!(
                reply.body.trim_end().ends_with(&format!("dst={lb}:80")),
                "{who} -> {lb}: {}",
                reply.body
            );
        }
    }
    let access = nginx_access_log(&node);
    assert_eq!(access.lines().count(), 6, "{access}");
    assert!(!nginx_error_log(&node).contains("broken header"));
}

#[test]
fn a_dual_stack_socket_reaching_an_ipv4_lb_through_a_mapped_address_is_redirected() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());
    // curl opens an AF_INET6 socket for ::ffff:203.0.113.10: connect6 sees a mapped
    // address and must use the IPv4 frontend's listener.
    for (who, reply, client) in [
        (
            "pod",
            from_pod(&node, "http://[::ffff:203.0.113.10]:80/"),
            POD_IP4,
        ),
        (
            "node",
            from_host(&node, "http://[::ffff:203.0.113.10]:80/"),
            NODE_IP4,
        ),
    ] {
        assert!(reply.ok(), "{who}: {reply:?}\nagent:\n{}", agent.log());
        assert!(
            reply.body.starts_with(&format!("client={client}:")),
            "{who}: {}",
            reply.body
        );
        assert!(
            reply.body.trim_end().ends_with("dst=203.0.113.10:80"),
            "{who}: {}",
            reply.body
        );
    }
}

#[test]
fn haproxy_accept_proxy_takes_v1_and_v2_headers() {
    require_privileges!();
    let node = SimNode::new();
    let haproxy = start_haproxy(&node);
    let agent = Agent::start(&node, &all_frontends());
    // 203.0.113.11 is proxied with v1, 2001:db8:ffff::11 with v2.
    for (lb, pod_ip, node_ip) in [
        ("203.0.113.11", POD_IP4, NODE_IP4),
        ("2001:db8:ffff::11", POD_IP6, NODE_IP6),
    ] {
        let pod = from_pod(&node, &url(lb, 80, "/"));
        assert!(pod.ok(), "pod -> {lb}: {pod:?}\nagent:\n{}", agent.log());
        assert!(
            pod.body.starts_with(&format!("client={pod_ip}:")),
            "{}",
            pod.body
        );
        assert!(
            pod.body.trim_end().ends_with(&format!("dst={lb}:80")),
            "{}",
            pod.body
        );
        let host = from_host(&node, &url(lb, 80, "/"));
        assert!(host.ok(), "node -> {lb}: {host:?}");
        assert!(
            host.body.starts_with(&format!("client={node_ip}:")),
            "{}",
            host.body
        );
    }
    let log = haproxy.log();
    for needle in [
        format!("haproxy client={POD_IP4}:"),
        format!("haproxy client={NODE_IP4}:"),
        format!("haproxy client={POD_IP6}:"),
        format!("haproxy client={NODE_IP6}:"),
        "dst=203.0.113.11:80 status=200".to_string(),
        "dst=2001:db8:ffff::11:80 status=200".to_string(),
    ] {
        assert!(
            log.contains(&needle),
            "haproxy log lacks {needle:?}:\n{log}"
        );
    }
}

#[test]
fn destinations_that_are_not_proxied_are_untouched() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());
    // Another port of a proxied IP, and another IP: both lead to the plain server,
    // which would answer 400 to a PROXY header it does not expect.
    for target in [url("203.0.113.10", 81, "/"), url("203.0.113.99", 80, "/")] {
        for (who, reply) in [
            ("pod", from_pod(&node, &target)),
            ("node", from_host(&node, &target)),
        ] {
            assert!(reply.ok(), "{who} -> {target}: {reply:?}");
            assert!(
                reply.body.starts_with("plain remote="),
                "{who} -> {target}: {}",
                reply.body
            );
        }
    }
    assert!(
        !agent.log().contains("accepted"),
        "the relay must not see these:\n{}",
        agent.log()
    );
}

#[test]
fn the_relays_own_upstream_connection_is_not_redirected_again() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start(&node, &all_frontends());
    const N: usize = 5;
    for _ in 0..N {
        let r = from_pod(&node, &url("203.0.113.10", 80, "/"));
        assert!(r.ok(), "{r:?}");
    }
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(30)).success());
    let log = agent.log();
    // One accepted connection per request: a loop would show the relay accepting
    // its own upstream connections.
    assert_eq!(log.matches("accepted").count(), N, "{log}");
    // The kernel's own count: N connects redirected, N relay connects skipped by mark.
    assert!(log.contains(&format!("redirected={N}")), "{log}");
    assert!(log.contains(&format!("skipped_bypass_mark={N}")), "{log}");
    assert_eq!(nginx_access_log(&node).lines().count(), N);
}

#[test]
fn after_kill_9_nothing_stays_attached_and_traffic_is_as_before() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start(&node, &all_frontends());
    let attached = node.attached_programs();
    assert_eq!(
        attached.matches("cgroup_inet4_connect").count(),
        1,
        "{attached}"
    );
    assert_eq!(
        attached.matches("cgroup_inet6_connect").count(),
        1,
        "{attached}"
    );
    assert!(from_pod(&node, &url("203.0.113.10", 80, "/")).ok());

    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    // Link release is synchronous with the last fd closing, but be patient with the
    // kernel's deferred cleanup of the process's files.
    let mut attached = node.attached_programs();
    for _ in 0..50 {
        if !attached.contains("connect") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        attached = node.attached_programs();
    }
    assert!(
        !attached.contains("connect"),
        "still attached after SIGKILL: {attached}"
    );
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(reply.code, 52, "pre-hairpin behaviour expected: {reply:?}");
    assert!(nginx_error_log(&node).contains("broken header"));
}

#[test]
fn sigterm_lets_an_in_flight_transfer_complete() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start(&node, &all_frontends());
    // /slow is rate limited to 1 MiB/s: about three seconds of transfer.
    let out = node.dir.join("slow.out");
    let mut curl = hairpin_tests::sh::command_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &[
            "curl",
            "-sS",
            "--max-time",
            "30",
            "-o",
            out.to_str().expect("utf-8"),
            &url("203.0.113.10", 80, "/slow"),
        ],
    )
    .spawn()
    .expect("start curl");
    agent.wait_for_log("accepted", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(500));
    agent.signal(Signal::SIGTERM);
    agent.wait_for_log("redirects removed", Duration::from_secs(5));
    // While draining, new connects already take the pre-hairpin path.
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(
        fresh.code, 52,
        "new connections must not be redirected while draining: {fresh:?}"
    );
    let status = curl.wait().expect("curl");
    assert!(
        status.success(),
        "in-flight transfer failed: {status}\nagent:\n{}",
        agent.log()
    );
    let got = std::fs::metadata(&out).expect("output").len() as usize;
    assert_eq!(
        got,
        hairpin_tests::servers::SLOW_BYTES,
        "transfer truncated"
    );
    assert!(agent.wait(Duration::from_secs(30)).success());
    assert!(
        agent.log().contains("agent stopped left=0"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_client_sending_its_own_proxy_header_cannot_spoof_its_address() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());
    // bash's /dev/tcp connects like any client (through the cgroup hook), then sends
    // a forged header naming 6.6.6.6 before its request.
    let script = "exec 3<>/dev/tcp/203.0.113.10/80; \
                  printf 'PROXY TCP4 6.6.6.6 203.0.113.10 1111 80\\r\\nGET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' >&3; \
                  cat <&3";
    let out = hairpin_tests::sh::output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["bash", "-c", script],
    );
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(
        !reply.contains("6.6.6.6"),
        "the forged address reached the ingress:\n{reply}"
    );
    // nginx takes hairpin's header, then rejects the forged line as the request line.
    // (The 400 itself may not reach the client: nginx closes with the client's unread
    // bytes pending, which sends a reset that can overtake it, with or without hairpin.)
    let logged = |a: &str| {
        a.contains(&format!("pp_client={POD_IP4}:"))
            && a.contains("\"PROXY TCP4 6.6.6.6 203.0.113.10 1111 80\" 400")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut access = nginx_access_log(&node);
    while !logged(&access) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        access = nginx_access_log(&node);
    }
    assert!(logged(&access), "{access}\nagent:\n{}", agent.log());
}
