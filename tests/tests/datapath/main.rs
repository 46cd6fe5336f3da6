//! The datapath on a simulated node: real programs attached at a real cgroup,
//! kube-proxy-style DNAT (iptables and nftables), nginx and haproxy requiring the
//! PROXY protocol. Each assertion carries the server's log line or response body as
//! evidence.
//!
//! Every case runs on both paths (the `relay_path` and `kernel_path` modules at the
//! end): the relay path (the default: the connect programs send the client to the
//! agent's relay, which writes the header) and the kernel path (`--kernel-path on`:
//! the kernel writes the header on the client's own socket). Each case also asserts
//! which path carried its connections, from the agent's counters.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::{Agent, all_frontends, status},
    client::{Reply, assert_plain_server_answers, assert_true_client, from_host, from_pod, url},
    node::{LbRule, NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, SimNode, default_lbs},
    require_privileges,
    servers::{
        BANNER_PORT, banner_client, banner_server, nginx_access_log, nginx_error_log,
        start_haproxy, start_nginx,
    },
    wait::eventually,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Which path carries the proxied connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `--kernel-path off`: the connect programs rewrite the destination to the
    /// agent's relay, which connects upstream and writes the header.
    Relay,
    /// The default configuration (`--kernel-path auto`, on this kernel: on): the
    /// destination is left alone and the kernel writes the header on the client's
    /// own socket, ahead of its first bytes.
    Kernel,
}

impl Path {
    /// The agent's extra `run` arguments.
    fn args(self) -> &'static [&'static str] {
        match self {
            Path::Relay => &["--kernel-path", "off"],
            Path::Kernel => &["--kernel-path", "auto"],
        }
    }

    /// Starts the agent with the node's frontends on this path.
    fn start(self, node: &SimNode) -> Agent {
        Agent::start_with(node, &all_frontends(), self.args())
    }

    /// The client a host process's header names. The relay names `--node-ip`; the
    /// kernel names the socket's own source address, the node's address on its
    /// route to the LBs (in the simulated node, the uplink towards the ingress).
    fn host_client(self, v6: bool) -> &'static str {
        match (self, v6) {
            (Path::Relay, false) => NODE_IP4,
            (Path::Relay, true) => NODE_IP6,
            (Path::Kernel, false) => "198.51.100.1",
            (Path::Kernel, true) => "2001:db8:2::1",
        }
    }

    /// Asserts that exactly `n` connections since `before` took this path and none
    /// the other: for the kernel, `n` sockets marked and `n` headers written, no
    /// connect redirected and nothing accepted by the relay; for the relay, the
    /// reverse.
    fn assert_carried(self, node: &SimNode, before: &Carried, n: u64, agent: &Agent) {
        let now = Carried::read(node);
        let delta = now.since(before);
        let want = match self {
            Path::Relay => Carried {
                headers_written: 0,
                marked: 0,
                redirected: n,
                relay_connections: n,
            },
            Path::Kernel => Carried {
                headers_written: n,
                marked: n,
                redirected: 0,
                relay_connections: 0,
            },
        };
        assert_eq!(
            delta,
            want,
            "{self:?} path: {n} connections expected on it\nstatus counters: {}\nagent:\n{}",
            status(node)["counters"],
            agent.log()
        );
    }

    /// From the pod and from the node, a request for `target` (through `lb`) carries
    /// the true client; `what` names the case in messages.
    fn assert_pod_and_node(
        self,
        node: &SimNode,
        lb: &str,
        target: &str,
        what: &str,
        agent: &Agent,
    ) {
        // An IPv4-mapped target is an IPv4 connection: its clients are IPv4.
        let v6 = lb.contains(':');
        let pod_ip = if v6 { POD_IP6 } else { POD_IP4 };
        let pod = from_pod(node, target);
        assert_true_client(&format!("pod ({what})"), &pod, pod_ip, lb, agent);
        let host = from_host(node, target);
        let host_ip = self.host_client(v6);
        assert_true_client(&format!("node ({what})"), &host, host_ip, lb, agent);
    }

    /// Waits until at least `n` connections since `before` took this path.
    fn wait_carried(self, node: &SimNode, before: &Carried, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let d = Carried::read(node).since(before);
            let seen = match self {
                Path::Relay => d.relay_connections,
                Path::Kernel => d.headers_written,
            };
            if seen >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{self:?} path: {n} connections expected: {d:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The counters that say which path carried a connection, from `/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Carried {
    /// `counters.kernel.kernel_headers_written`: headers the kernel wrote.
    headers_written: u64,
    /// `counters.kernel.kernel_marked`: connects left for the kernel to write.
    marked: u64,
    /// `counters.kernel.redirected`: connects sent to the relay.
    redirected: u64,
    /// `counters.relay.connections`: connections the relay accepted.
    relay_connections: u64,
}

impl Carried {
    fn read(node: &SimNode) -> Carried {
        let s = status(node);
        let get = |v: &Value, what: &str| {
            v.as_u64()
                .unwrap_or_else(|| panic!("no {what}: {}", s["counters"]))
        };
        let kernel = |name: &str| get(&s["counters"]["kernel"][name], name);
        Carried {
            headers_written: kernel("kernel_headers_written"),
            marked: kernel("kernel_marked"),
            redirected: kernel("redirected"),
            relay_connections: get(&s["counters"]["relay"]["connections"], "relay connections"),
        }
    }

    fn since(&self, before: &Carried) -> Carried {
        Carried {
            headers_written: self.headers_written - before.headers_written,
            marked: self.marked - before.marked,
            redirected: self.redirected - before.redirected,
            relay_connections: self.relay_connections - before.relay_connections,
        }
    }
}

/// Path-independent: no agent runs.
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

fn with_hairpin_pod_and_node_requests_carry_the_true_client(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
    let host_ip = path.host_client(false);

    path.assert_pod_and_node(
        &node,
        "203.0.113.10",
        &url("203.0.113.10", 80, "/"),
        "v1",
        &agent,
    );
    path.assert_carried(&node, &before, 2, &agent);

    let access = eventually(|| nginx_access_log(&node), |a| a.lines().count() == 2);
    assert!(
        access.contains(&format!("pp_client={POD_IP4}:")),
        "{access}"
    );
    assert!(
        access.contains(&format!("pp_client={host_ip}:")),
        "{access}"
    );
    assert!(access.contains("pp_dst=203.0.113.10:80"), "{access}");
    assert!(!nginx_error_log(&node).contains("broken header"));
}

fn ipv6_and_proxy_v2_frontends_work_from_pod_and_node(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
    let cases = [
        ("2001:db8:ffff::10", "v1"),
        ("203.0.113.12", "v2"),
        ("2001:db8:ffff::12", "v2"),
    ];
    for (lb, version) in cases {
        path.assert_pod_and_node(&node, lb, &url(lb, 80, "/"), version, &agent);
    }
    path.assert_carried(&node, &before, 6, &agent);
    let access = eventually(|| nginx_access_log(&node), |a| a.lines().count() == 6);
    assert_eq!(access.lines().count(), 6, "{access}");
    assert!(!nginx_error_log(&node).contains("broken header"));
}

fn a_dual_stack_socket_reaching_an_ipv4_lb_through_a_mapped_address_carries_the_true_client(
    path: Path,
) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
    // curl opens an AF_INET6 socket for ::ffff:203.0.113.10: connect6 sees a mapped
    // address and must use the IPv4 frontend (its listener on the relay path; a TCP4
    // header from the mapped source on the kernel path).
    let target = "http://[::ffff:203.0.113.10]:80/";
    path.assert_pod_and_node(&node, "203.0.113.10", target, "mapped", &agent);
    path.assert_carried(&node, &before, 2, &agent);
}

fn haproxy_accept_proxy_takes_v1_and_v2_headers(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let haproxy = start_haproxy(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
    // 203.0.113.11 is proxied with v1, 2001:db8:ffff::11 with v2.
    for lb in ["203.0.113.11", "2001:db8:ffff::11"] {
        path.assert_pod_and_node(&node, lb, &url(lb, 80, "/"), "haproxy", &agent);
    }
    path.assert_carried(&node, &before, 4, &agent);
    let needles = [
        format!("haproxy client={POD_IP4}:"),
        format!("haproxy client={}:", path.host_client(false)),
        format!("haproxy client={POD_IP6}:"),
        format!("haproxy client={}:", path.host_client(true)),
        "dst=203.0.113.11:80 status=200".to_string(),
        "dst=2001:db8:ffff::11:80 status=200".to_string(),
    ];
    let log = eventually(|| haproxy.log(), |l| needles.iter().all(|n| l.contains(n)));
    for needle in &needles {
        assert!(log.contains(needle), "haproxy log lacks {needle:?}:\n{log}");
    }
}

fn pod_and_node_requests_carry_the_true_client_through_nftables_dnat(path: Path) {
    require_privileges!();
    // kube-proxy's nftables mode: the same LBs as a `kube-proxy` table's verdict map,
    // no iptables rules at all.
    let node = SimNode::nftables();
    let _nginx = start_nginx(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
    let cases = [
        ("203.0.113.10", "v1"),
        ("2001:db8:ffff::10", "v1"),
        ("203.0.113.12", "v2"),
        ("2001:db8:ffff::12", "v2"),
    ];
    for (lb, version) in cases {
        path.assert_pod_and_node(&node, lb, &url(lb, 80, "/"), version, &agent);
    }
    path.assert_carried(&node, &before, 8, &agent);
    // Another port of a proxied IP, DNATed by the same map, is left alone.
    let before = Carried::read(&node);
    for (who, reply) in [
        ("pod", from_pod(&node, &url("203.0.113.10", 81, "/"))),
        ("node", from_host(&node, &url("203.0.113.10", 81, "/"))),
    ] {
        assert!(reply.ok(), "{who} -> :81: {reply:?}");
        assert!(reply.body.starts_with("plain remote="), "{}", reply.body);
    }
    path.assert_carried(&node, &before, 0, &agent);
    // The plain server logs to the same file, without a PROXY client.
    let lines = |a: &str, proxied: bool| {
        a.lines()
            .filter(|l| l.starts_with("pp_client=-:") != proxied)
            .count()
    };
    let access = eventually(
        || nginx_access_log(&node),
        |a| lines(a, true) == 8 && lines(a, false) == 2,
    );
    assert_eq!(
        (lines(&access, true), lines(&access, false)),
        (8, 2),
        "{access}"
    );
    assert!(!nginx_error_log(&node).contains("broken header"));
}

fn destinations_that_are_not_proxied_are_untouched(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
    // Another port of a proxied IP, and another IP: both lead to the plain server,
    // which would answer 400 to a PROXY header it does not expect.
    for target in [url("203.0.113.10", 81, "/"), url("203.0.113.99", 80, "/")] {
        assert_plain_server_answers(&node, &target);
    }
    // Neither path saw them: nothing redirected, marked, written or accepted.
    path.assert_carried(&node, &before, 0, &agent);
    assert!(
        !agent.log().contains("accepted"),
        "the relay must not see these:\n{}",
        agent.log()
    );
}

/// Two requests on one keep-alive connection from the pod; curl's reply.
fn two_requests_on_one_connection(node: &SimNode, target: &str) -> Reply {
    Reply::from_output(hairpin_tests::sh::output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["curl", "-sS", "--max-time", "10", target, target],
    ))
}

fn no_loop_each_connection_is_carried_once(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = path.start(&node);
    let before = Carried::read(&node);
    const N: usize = 5;
    let target = url("203.0.113.10", 80, "/");
    for _ in 0..N {
        let r = two_requests_on_one_connection(&node, &target);
        assert!(r.ok(), "{r:?}\nagent:\n{}", agent.log());
        assert_eq!(
            r.body.matches(&format!("client={POD_IP4}:")).count(),
            2,
            "{}",
            r.body
        );
    }
    // One connection per pair of requests, on this path only: the relay's own
    // upstream connections are not redirected again (a loop would show the relay
    // accepting them), and the kernel writes one header per connection, not one
    // per write.
    path.assert_carried(&node, &before, N as u64, &agent);
    let access = eventually(|| nginx_access_log(&node), |a| a.lines().count() == 2 * N);
    let lines: Vec<&str> = access.lines().collect();
    assert_eq!(lines.len(), 2 * N, "{access}");
    // A second header would reach nginx as the second request's line (a 400).
    assert!(
        lines
            .iter()
            .all(|l| l.contains(&format!("pp_client={POD_IP4}:"))
                && l.contains("\"GET / HTTP/1.1\" 200")),
        "{access}"
    );
    let mut sources: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    sources.sort_unstable();
    sources.dedup();
    assert_eq!(sources.len(), N, "one header per connection: {access}");

    agent.stop();
    let log = agent.log();
    let (accepted, redirected, skipped) = match path {
        Path::Relay => (N, N, N),
        // The kernel path never redirects, so there is no relay upstream to skip.
        Path::Kernel => (0, 0, 0),
    };
    assert_eq!(log.matches("accepted").count(), accepted, "{log}");
    // The kernel's own count, logged at exit: connects redirected, and the relay's
    // upstream connects skipped by their mark.
    assert_eq!(
        logged_counter(&log, "redirected"),
        redirected as u64,
        "{log}"
    );
    assert_eq!(
        logged_counter(&log, "skipped_bypass_mark"),
        skipped as u64,
        "{log}"
    );
}

fn a_client_sending_its_own_proxy_header_cannot_spoof_its_address(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = path.start(&node);
    let before = Carried::read(&node);
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
    let access = eventually(|| nginx_access_log(&node), logged);
    assert!(logged(&access), "{access}\nagent:\n{}", agent.log());
    path.assert_carried(&node, &before, 1, &agent);
}

// ---- A server-speaks-first frontend ---------------------------------------------

/// The banner LB (an SMTP-like server behind a PROXY-aware frontend), DNATed to
/// BANNER_PORT in the ingress.
const BANNER_LB: &str = "203.0.113.20";

fn a_server_first_frontend_works_through_the_relay(path: Path) {
    require_privileges!();
    let mut lbs = default_lbs();
    lbs.push(LbRule {
        lb_ip: BANNER_LB,
        lb_port: 25,
        backend_port: BANNER_PORT,
        name: "mail/banner:smtp",
    });
    let node = SimNode::with_lbs(&lbs);
    let headers = banner_server(&node.ingress_ns, 2);
    // The kernel writes a header only ahead of the client's first bytes, which a
    // server-speaks-first client sends only after the banner: with `firstSpeaker:
    // server` the frontend takes the relay on both paths.
    let yaml = format!(
        "frontends:\n- ip: \"{BANNER_LB}\"\n  ports: [25]\n  proxyProtocol: v1\n  \
         name: mail\n  firstSpeaker: server\n"
    );
    let agent = Agent::start_with_frontends_yaml(&node, &yaml, path.args());
    let before = Carried::read(&node);
    for (who, ns, cgroup, client) in [
        ("pod", &node.pod_ns, node.pod_cgroup(), POD_IP4),
        // Relayed, so the header names --node-ip on both paths.
        ("node", &node.node_ns, node.host_cgroup(), NODE_IP4),
    ] {
        let talk = banner_client(ns, &cgroup, BANNER_LB, 25);
        assert_eq!(
            talk,
            "220 banner ready|221 bye",
            "{who}\nagent:\n{}",
            agent.log()
        );
        let got = headers
            .recv_timeout(Duration::from_secs(5))
            .expect("a connection");
        assert!(
            got.starts_with(&format!("PROXY TCP4 {client} {BANNER_LB} ")) && got.ends_with(" 25"),
            "{who}: the relay's header names {client}: {got:?}"
        );
    }
    Path::Relay.assert_carried(&node, &before, 2, &agent);
}

/// The kernel counter `name` from the agent's `kernel counters` line at exit.
fn logged_counter(log: &str, name: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("kernel counters"))
        .unwrap_or_else(|| panic!("no kernel counters logged:\n{log}"));
    line.split(|c: char| c.is_whitespace() || c == '"')
        .map(|t| t.trim_start_matches("counters="))
        .find_map(|t| t.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

mod agent_exit;

use agent_exit::{
    after_kill_9_traffic_is_never_broken_and_cleanup_leaves_it_as_before,
    sigterm_lets_an_in_flight_transfer_complete,
};

/// Each case on both paths: `relay_path::<case>` and `kernel_path::<case>`.
macro_rules! on_both_paths {
    ($($case:ident),* $(,)?) => {
        mod relay_path {
            $(
                #[test]
                fn $case() {
                    super::$case(super::Path::Relay)
                }
            )*
        }
        mod kernel_path {
            $(
                #[test]
                fn $case() {
                    super::$case(super::Path::Kernel)
                }
            )*
        }
    };
}

on_both_paths!(
    with_hairpin_pod_and_node_requests_carry_the_true_client,
    ipv6_and_proxy_v2_frontends_work_from_pod_and_node,
    a_dual_stack_socket_reaching_an_ipv4_lb_through_a_mapped_address_carries_the_true_client,
    haproxy_accept_proxy_takes_v1_and_v2_headers,
    pod_and_node_requests_carry_the_true_client_through_nftables_dnat,
    destinations_that_are_not_proxied_are_untouched,
    no_loop_each_connection_is_carried_once,
    after_kill_9_traffic_is_never_broken_and_cleanup_leaves_it_as_before,
    sigterm_lets_an_in_flight_transfer_complete,
    a_client_sending_its_own_proxy_header_cannot_spoof_its_address,
    a_server_first_frontend_works_through_the_relay,
);
