//! The kernel path on a simulated node: with `--kernel-path on`, the connect
//! programs leave the destination alone and the kernel writes the PROXY header on
//! the client's own socket (sock_ops + sk_msg), in front of its first bytes. Real
//! nginx (`listen ... proxy_protocol`) and haproxy (`accept-proxy`) say what the
//! header carried; the relay must see none of these connections.

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpListener},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use hairpin_agent::{model::ProxyVersion, relay::header::Header};
use hairpin_tests::{
    agent::{Agent, CappedAgent, DAEMONSET_CAPS, FrontendSpec, admin_get, all_frontends, status},
    client::{KeepAlive, Reply, assert_true_client, from_host, from_pod, url},
    node::{LbRule, POD_IP4, POD_IP6, SimNode, default_lbs},
    pod::cap_number,
    privileges::datapath_tests_can_run,
    servers::{
        BANNER_PORT, banner_client, banner_server, nginx_access_log, nginx_error_log,
        start_haproxy, start_nginx,
    },
    sh::command_in,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// The source address of a host process's socket towards the LBs: the node's address
/// on the interface its route to them uses (in the simulated node, the uplink towards
/// the ingress namespace; on a real node, usually its InternalIP). The kernel path
/// names the socket's own address; the relay names `--node-ip` instead.
const NODE_UPLINK4: &str = "198.51.100.1";
/// The same for IPv6.
const NODE_UPLINK6: &str = "2001:db8:2::1";

const KERNEL_PATH_ON: &[&str] = &["--kernel-path", "on"];

macro_rules! require_privileges {
    () => {
        if !datapath_tests_can_run(module_path!()) {
            return;
        }
    };
}

/// `read()` once `done` holds for it, or after 3 s whatever it is: servers log a
/// request after answering it, so a log can lag the reply.
fn eventually(read: impl Fn() -> String, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut text = read();
    while !done(&text) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        text = read();
    }
    text
}

fn kernel_counter(status: &Value, name: &str) -> u64 {
    status["counters"]["kernel"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no kernel counter {name}: {}", status["counters"]))
}

/// Every `kernel_missed_*` counter is zero: no connection went without its header.
fn assert_no_misses(status: &Value) {
    let kernel = status["counters"]["kernel"]
        .as_object()
        .expect("kernel counters");
    for (name, n) in kernel {
        if name.starts_with("kernel_missed_") {
            assert_eq!(n.as_u64(), Some(0), "{name}: {kernel:?}");
        }
    }
}

#[test]
fn pod_and_node_requests_get_the_header_from_the_kernel_v1_v2_v4_v6() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let cases = [
        ("203.0.113.10", POD_IP4, NODE_UPLINK4),
        ("2001:db8:ffff::10", POD_IP6, NODE_UPLINK6),
        ("203.0.113.12", POD_IP4, NODE_UPLINK4),
        ("2001:db8:ffff::12", POD_IP6, NODE_UPLINK6),
    ];
    for (lb, pod_ip, node_ip) in cases {
        let pod = from_pod(&node, &url(lb, 80, "/"));
        assert_true_client("pod", &pod, pod_ip, lb, &agent);
        let host = from_host(&node, &url(lb, 80, "/"));
        assert_true_client("node", &host, node_ip, lb, &agent);
    }
    let access = eventually(
        || nginx_access_log(&node),
        |a| a.lines().count() == 2 * cases.len(),
    );
    assert_eq!(access.lines().count(), 2 * cases.len(), "{access}");
    assert!(!nginx_error_log(&node).contains("broken header"));
    // The kernel wrote every header: the relay accepted nothing and no connect was
    // rewritten to it.
    assert!(
        !agent.log().contains("accepted"),
        "the relay must not see these:\n{}",
        agent.log()
    );
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 8, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 0, "{s}");
    assert_no_misses(&s);
    // Every socket that entered the sockets map left it: the fill the connect
    // programs compare with the map's limit is back to zero.
    assert_eq!(kernel_counter(&s, "kernel_sockets_entered"), 8, "{s}");
    assert_eq!(wait_counter(&node, "kernel_sockets_left", 8), 8, "{s}");
}

#[test]
fn a_dual_stack_socket_reaching_an_ipv4_lb_through_a_mapped_address_gets_a_tcp4_header() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    // curl opens an AF_INET6 socket for ::ffff:203.0.113.10: connect6 marks it with
    // the IPv4 frontend, and its (mapped) local address becomes a TCP4 source.
    let target = "http://[::ffff:203.0.113.10]:80/";
    assert_true_client(
        "pod",
        &from_pod(&node, target),
        POD_IP4,
        "203.0.113.10",
        &agent,
    );
    assert_true_client(
        "node",
        &from_host(&node, target),
        NODE_UPLINK4,
        "203.0.113.10",
        &agent,
    );
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 2, "{s}");
    assert_no_misses(&s);
}

#[test]
fn haproxy_accept_proxy_takes_the_kernels_v1_and_v2_headers() {
    require_privileges!();
    let node = SimNode::new();
    let haproxy = start_haproxy(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    // 203.0.113.11 is proxied with v1, 2001:db8:ffff::11 with v2.
    for (lb, pod_ip, node_ip) in [
        ("203.0.113.11", POD_IP4, NODE_UPLINK4),
        ("2001:db8:ffff::11", POD_IP6, NODE_UPLINK6),
    ] {
        assert_true_client(
            "pod",
            &from_pod(&node, &url(lb, 80, "/")),
            pod_ip,
            lb,
            &agent,
        );
        assert_true_client(
            "node",
            &from_host(&node, &url(lb, 80, "/")),
            node_ip,
            lb,
            &agent,
        );
    }
    let needles = [
        format!("haproxy client={POD_IP4}:"),
        format!("haproxy client={NODE_UPLINK4}:"),
        format!("haproxy client={POD_IP6}:"),
        format!("haproxy client={NODE_UPLINK6}:"),
        "dst=203.0.113.11:80 status=200".to_string(),
        "dst=2001:db8:ffff::11:80 status=200".to_string(),
    ];
    let log = eventually(|| haproxy.log(), |l| needles.iter().all(|n| l.contains(n)));
    for needle in &needles {
        assert!(log.contains(needle), "haproxy log lacks {needle:?}:\n{log}");
    }
    assert!(!agent.log().contains("accepted"), "{}", agent.log());
}

/// LBs DNATed to a raw capture server on port 9000 of the ingress namespace: v1 on
/// port 80 and v2 on port 81, over IPv4 and over an IPv6 address with two zero runs
/// of equal length (the first becomes `::`).
const CAPTURE_LB4: &str = "203.0.113.20";
const CAPTURE_LB6: &str = "2001:db8:0:0:1:0:0:20";
const CAPTURE_PORT: u16 = 9000;

/// Accepts `n` connections in `netns` on CAPTURE_PORT, answering each HTTP request
/// with a small response; sends what each connection carried up to the end of its
/// request head. With `fast_open`, the listener takes TCP Fast Open data.
fn capture_server(netns: &str, n: usize, fast_open: bool) -> mpsc::Receiver<Vec<u8>> {
    let counted = segment_capture_server(netns, n, fast_open);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for (got, _) in counted {
            if tx.send(got).is_err() {
                return;
            }
        }
    });
    rx
}

/// As [`capture_server`], with the number of data segments each connection had
/// received once its request head was in (`tcpi_data_segs_in`).
fn segment_capture_server(
    netns: &str,
    n: usize,
    fast_open: bool,
) -> mpsc::Receiver<(Vec<u8>, u32)> {
    use std::os::fd::AsRawFd;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let ns = format!("/run/netns/{netns}");
    std::thread::spawn(move || {
        // This thread alone moves into the ingress namespace.
        let f = std::fs::File::open(&ns).expect("open netns");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let listener = TcpListener::bind(("::", CAPTURE_PORT)).expect("bind capture port");
        if fast_open {
            let queue: libc::c_int = 16;
            // SAFETY: a valid listening socket and a c_int option value.
            let rc = unsafe {
                libc::setsockopt(
                    listener.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_FASTOPEN,
                    (&raw const queue).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "TCP_FASTOPEN: {}", std::io::Error::last_os_error());
        }
        ready_tx.send(()).expect("ready");
        for _ in 0..n {
            let (mut conn, _) = listener.accept().expect("accept");
            conn.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut got = Vec::new();
            let mut buf = [0u8; 16384];
            // Up to the end of the request head (a v2 header's signature holds a
            // blank line of its own, so look after the request line).
            while !request_head_complete(&got) {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            // SAFETY: tcp_info is plain data; the kernel fills at most `len` bytes.
            let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            // SAFETY: a valid socket, and a buffer of `len` bytes.
            let rc = unsafe {
                libc::getsockopt(
                    conn.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_INFO,
                    (&raw mut info).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
            );
            if tx.send((got, info.tcpi_data_segs_in)).is_err() {
                return;
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("capture server ready");
    rx
}

/// Whether `got` holds a whole request head (after whatever header precedes it).
fn request_head_complete(got: &[u8]) -> bool {
    got.windows(4)
        .position(|w| w == b"GET ")
        .is_some_and(|at| got[at..].windows(4).any(|w| w == b"\r\n\r\n"))
}

/// The source port a header names (v1: the fifth field; v2: after both addresses).
fn header_source_port(got: &[u8], version: ProxyVersion, v6: bool) -> u16 {
    match version {
        ProxyVersion::V1 => {
            let line = got.split(|b| *b == b'\r').next().expect("a line");
            let line = std::str::from_utf8(line).expect("ascii header");
            line.split(' ')
                .nth(4)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no source port in {line:?}"))
        }
        ProxyVersion::V2 => {
            let at = 16 + if v6 { 32 } else { 8 };
            u16::from_be_bytes([got[at], got[at + 1]])
        }
    }
}

/// The default LBs and the capture LBs.
fn capture_node() -> SimNode {
    let mut lbs = default_lbs();
    for (lb_ip, lb_port) in [
        (CAPTURE_LB4, 80),
        (CAPTURE_LB4, 81),
        (CAPTURE_LB6, 80),
        (CAPTURE_LB6, 81),
    ] {
        lbs.push(LbRule {
            lb_ip,
            lb_port,
            backend_port: CAPTURE_PORT,
            name: "capture/raw:http",
        });
    }
    SimNode::with_lbs(&lbs)
}

/// The capture frontends: v1 and v2, over IPv4 and IPv6.
fn capture_specs() -> [FrontendSpec; 4] {
    [
        FrontendSpec {
            ip: CAPTURE_LB4,
            ports: vec![80],
            version: "v1",
        },
        FrontendSpec {
            ip: CAPTURE_LB4,
            ports: vec![81],
            version: "v2",
        },
        FrontendSpec {
            ip: CAPTURE_LB6,
            ports: vec![80],
            version: "v1",
        },
        FrontendSpec {
            ip: CAPTURE_LB6,
            ports: vec![81],
            version: "v2",
        },
    ]
}

/// A pod and a host request to each of [`capture_specs`]' frontends: the bytes ahead
/// of each request are exactly the relay's encoder's header, and the kernel wrote
/// every one of them. `log` is the agent's log, for the failure messages.
fn assert_capture_headers_equal_the_relays_encoder(node: &SimNode, log: impl Fn() -> String) {
    let cases = [
        (CAPTURE_LB4, 80, ProxyVersion::V1),
        (CAPTURE_LB4, 81, ProxyVersion::V2),
        (CAPTURE_LB6, 80, ProxyVersion::V1),
        (CAPTURE_LB6, 81, ProxyVersion::V2),
    ];
    let captured = capture_server(&node.ingress_ns, 2 * cases.len(), false);
    for (lb, port, version) in cases {
        let v6 = lb.contains(':');
        let lb_ip: IpAddr = lb.parse().expect("lb ip");
        for (who, client, reply) in [
            (
                "pod",
                if v6 { POD_IP6 } else { POD_IP4 },
                from_pod(node, &url(lb, port, "/")),
            ),
            (
                "node",
                if v6 { NODE_UPLINK6 } else { NODE_UPLINK4 },
                from_host(node, &url(lb, port, "/")),
            ),
        ] {
            assert!(reply.ok(), "{who} -> {lb}:{port}: {reply:?}\n{}", log());
            let got = captured
                .recv_timeout(Duration::from_secs(5))
                .expect("a captured connection");
            let sport = header_source_port(&got, version, v6);
            let client: IpAddr = client.parse().expect("client ip");
            let want = Header::new(
                version,
                SocketAddr::new(client, sport),
                SocketAddr::new(lb_ip, port),
            );
            let want = want.as_bytes();
            assert!(
                got.starts_with(want) && got[want.len()..].starts_with(b"GET / HTTP/1.1\r\n"),
                "{who} -> {lb}:{port} {version}: the kernel wrote\n  {:?}\nthe relay's encoder writes\n  {:?}",
                got.escape_ascii().to_string(),
                want.escape_ascii().to_string()
            );
        }
    }
}

#[test]
fn the_kernels_header_bytes_equal_the_relays_encoder() {
    require_privileges!();
    let node = capture_node();
    let agent = Agent::start_with(&node, &capture_specs(), KERNEL_PATH_ON);
    assert_capture_headers_equal_the_relays_encoder(&node, || agent.log());
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_no_misses(&s);
}

#[test]
fn with_only_the_daemonsets_capabilities_the_kernel_path_loads_and_writes_v1_and_v2_headers() {
    require_privileges!();
    let node = capture_node();
    let agent = CappedAgent::start(&node, &capture_specs(), KERNEL_PATH_ON, &DAEMONSET_CAPS);
    let want = DAEMONSET_CAPS
        .iter()
        .fold(0u64, |m, c| m | (1 << cap_number(c)));
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(agent.caps(set), want, "{set}: only {DAEMONSET_CAPS:?}");
    }
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}\n{}", agent.log());
    let programs: Vec<&str> = s["attachment"]["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    // bpf_skc_to_mptcp_sock, bpf_skc_to_tcp_sock and bpf_probe_read_kernel need
    // CAP_PERFMON: the connect programs that use them fall back to the plain marking
    // ones, and the agent says what that leaves uncovered.
    assert_eq!(
        programs,
        [
            "hairpin_connect4_kernel",
            "hairpin_connect6_kernel",
            "hairpin_sockops",
            "hairpin_setsockopt",
            "hairpin_sk_msg"
        ],
        "{s}"
    );
    let log = agent.log();
    assert!(
        log.contains("need CAP_PERFMON")
            && log.contains("sendto(MSG_FASTOPEN) connections")
            && log.contains("(kernel_missed_data_first)"),
        "{log}"
    );
    // Pinning needs no capability beyond these (and write access to the directory).
    assert!(
        s["kernel_path"]["sockets_map_pin"]
            .as_str()
            .is_some_and(|p| Path::new(p).exists()),
        "the sockets map is pinned under the DaemonSet's capabilities: {s}\n{}",
        agent.log()
    );
    assert_capture_headers_equal_the_relays_encoder(&node, || agent.log());
    // /metrics and /status read the counters through the agent's own map
    // descriptor (opening the map by id would need CAP_SYS_ADMIN).
    assert_eq!(
        kernel_counter(&status(&node), "kernel_headers_written"),
        8,
        "status shows the kernel counters without CAP_SYS_ADMIN"
    );
    let metrics = admin_get(&node, "/metrics");
    let event = |name: &str| format!("hairpin_kernel_events_total{{event=\"{name}\"}} ");
    assert!(
        metrics.contains(&format!("{}8\n", event("kernel_headers_written"))),
        "{metrics}"
    );
    for miss in [
        "kernel_missed_insert",
        "kernel_missed_data_first",
        "kernel_missed_push",
        "kernel_missed_write",
    ] {
        assert!(
            metrics.contains(&format!("{}0\n", event(miss))),
            "{miss}: {metrics}"
        );
    }
}

#[test]
fn destinations_that_are_not_proxied_are_untouched() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    // Another port of a proxied IP, and another IP: the plain server would answer
    // 400 to a header it does not expect.
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
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 0, "{s}");
    assert!(!agent.log().contains("accepted"), "{}", agent.log());
}

/// How the agent goes away between the two requests of a keep-alive connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGKILL.
    Kill,
    /// SIGKILL, then a new agent starts.
    KillAndRestart,
    /// SIGTERM: a graceful exit, as in a rollout.
    Term,
}

/// Entries in the kernel path's sockets map, read with bpftool.
fn sockets_in_map(node: &SimNode) -> usize {
    let s = status(node);
    let id = s["kernel_path"]["sockets_map_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no sockets map: {s}"));
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "id", &id.to_string()])
        .output()
        .expect("run bpftool");
    let dump: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bpftool map dump: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    dump.as_array().map_or(0, Vec::len)
}

/// Opens a keep-alive connection, gets one answer, stops the agent as `stop` says,
/// asks again on the same connection; the two answers (the second `None` when the
/// connection did not survive) and the agent running at the end, if any.
fn answers_across(
    node: &SimNode,
    extra: &[&str],
    stop: Stop,
) -> (String, Option<String>, Agent, Option<Agent>) {
    let mut agent = Agent::start_with(node, &all_frontends(), extra);
    let client = KeepAlive::start(node, &node.dir.join("ka"), 2);
    let first = client.answer(1);
    assert!(
        !first.is_empty(),
        "no first answer\nagent:\n{}",
        agent.log()
    );
    if extra == KERNEL_PATH_ON {
        // The header is out and acknowledged: the socket has left the map, and its
        // later writes take the plain TCP path.
        let deadline = Instant::now() + Duration::from_secs(5);
        while sockets_in_map(node) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(sockets_in_map(node), 0, "the socket must leave the map");
    }
    let signal = if stop == Stop::Term {
        Signal::SIGTERM
    } else {
        Signal::SIGKILL
    };
    agent.signal(signal);
    let status = agent.wait(Duration::from_secs(30));
    if stop == Stop::Term {
        assert!(status.success(), "{}", agent.log());
    }
    let next =
        (stop == Stop::KillAndRestart).then(|| Agent::start_with(node, &all_frontends(), extra));
    let second = Some(client.answer(2)).filter(|s| !s.is_empty());
    (first, second, agent, next)
}

/// No connect or sock_ops program of a gone agent is attached at the node's cgroup
/// (the kernel releases its links within a second).
fn assert_nothing_attached(node: &SimNode) {
    let mut attached = node.attached_programs();
    for _ in 0..50 {
        if !attached.contains("connect") && !attached.contains("sock_ops") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        attached = node.attached_programs();
    }
    assert!(
        !attached.contains("connect") && !attached.contains("sock_ops"),
        "still attached after the agent went: {attached}"
    );
}

/// The second answer repeats the first: same connection, same header, same port.
fn assert_survived(first: &str, second: Option<&str>, agent: &Agent) {
    assert!(
        first.starts_with(&format!("client={POD_IP4}:")),
        "{first}\nagent:\n{}",
        agent.log()
    );
    assert_eq!(second, Some(first), "the connection must outlive the agent");
    assert!(!agent.log().contains("accepted"), "{}", agent.log());
}

#[test]
fn an_established_keep_alive_connection_keeps_answering_after_the_agent_is_killed() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let (first, second, agent, _) = answers_across(&node, KERNEL_PATH_ON, Stop::Kill);
    assert_survived(&first, second.as_deref(), &agent);
    // The datapath outlives the agent: its pinned links stay attached, and a new
    // connection still gets its header from the kernel, with no agent running.
    let attached = node.attached_programs();
    assert!(
        attached.contains("connect") && attached.contains("sock_ops"),
        "{attached}"
    );
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod, no agent", &fresh, POD_IP4, "203.0.113.10", &agent);
    let pod_lines = |a: &str| a.matches(&format!("pp_client={POD_IP4}:")).count();
    let access = eventually(|| nginx_access_log(&node), |a| pod_lines(a) == 3);
    assert_eq!(pod_lines(&access), 3, "{access}");
}

#[test]
fn a_keep_alive_connection_outlives_a_killed_and_restarted_agent_and_a_graceful_exit() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let (first, second, agent, next) = answers_across(&node, KERNEL_PATH_ON, Stop::KillAndRestart);
    assert_survived(&first, second.as_deref(), &agent);
    // The new agent serves new connections through the kernel path again.
    let next = next.expect("the restarted agent");
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &fresh, POD_IP4, "203.0.113.10", &next);
    // The counters are the node datapath's, pinned with it: the killed agent's first
    // request and this one.
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 2);
    drop(next);

    // A rollout: SIGTERM, the agent drains and exits.
    let _ = std::fs::remove_dir_all(node.dir.join("ka"));
    let (first, second, agent, _) = answers_across(&node, KERNEL_PATH_ON, Stop::Term);
    assert_survived(&first, second.as_deref(), &agent);
}

#[test]
fn a_relayed_keep_alive_connection_does_not_survive_the_agent_being_killed() {
    require_privileges!();
    // The same scenario through the relay path (the default): the relay lives in the
    // agent process, so its connections die with it. This is what the kernel path fixes.
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let (first, second, agent, _) = answers_across(&node, &[], Stop::Kill);
    assert!(
        first.starts_with(&format!("client={POD_IP4}:")),
        "{first}\nagent:\n{}",
        agent.log()
    );
    assert_eq!(
        second, None,
        "a relayed connection cannot outlive the relay"
    );
}

#[test]
fn status_and_metrics_show_the_kernel_path_and_its_counters() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let _agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    assert!(from_pod(&node, &url("203.0.113.10", 80, "/")).ok());
    let s = status(&node);
    assert_eq!(s["kernel_path"]["configured"], "on", "{s}");
    assert_eq!(s["kernel_path"]["state"], "on", "{s}");
    assert!(s["kernel_path"]["sockets_map_id"].is_u64(), "{s}");
    let frontends = s["frontends"].as_array().expect("frontends");
    assert_eq!(frontends.len(), 6, "{s}");
    for f in frontends {
        assert_eq!(f["state"], "active", "{f}");
        assert_eq!(f["path"], "kernel", "{f}");
    }
    let programs: Vec<&str> = s["attachment"]["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        programs,
        [
            "hairpin_connect4_kernel_perfmon",
            "hairpin_connect6_kernel_perfmon",
            "hairpin_sockops",
            "hairpin_setsockopt",
            "hairpin_sk_msg"
        ],
        "{s}"
    );
    let metrics = admin_get(&node, "/metrics");
    for line in [
        "hairpin_kernel_events_total{event=\"kernel_headers_written\"} 1",
        "hairpin_kernel_events_total{event=\"kernel_marked\"} 1",
        "hairpin_kernel_events_total{event=\"kernel_missed_push\"} 0",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
}

#[test]
fn with_the_kernel_path_off_status_says_so_and_frontends_take_the_relay() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "off", "{s}");
    for f in s["frontends"].as_array().expect("frontends") {
        assert_eq!(f["path"], "ebpf", "{f}");
    }
    assert_eq!(kernel_counter(&s, "redirected"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
}

// ---- Fallbacks and known gaps ------------------------------------------------------
//
// Where the connect program can tell that the kernel could not write the header (a
// full sockets map, an MPTCP subflow), it sends the socket to the relay. What it
// cannot see on this kernel (TCP Fast Open data) goes without a header, and each such
// connection is counted: these tests pin that the misses are never silent.

/// Waits until the kernel counter `name` reaches `want`; its last value.
fn wait_counter(node: &SimNode, name: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = kernel_counter(&status(node), name);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn curl_with_tcp_fast_open_is_sent_to_the_relay_and_gets_its_header() {
    require_privileges!();
    let node = capture_node();
    // The ingress and the pod do Fast Open: curl --tcp-fastopen sets
    // TCP_FASTOPEN_CONNECT, so with a cookie its request would ride on the SYN,
    // ahead of any header the kernel could write. The setsockopt program marks the
    // socket and the connect program sends it to the relay instead.
    for ns in [&node.ingress_ns, &node.pod_ns] {
        hairpin_tests::sh::run_in(ns, &["sysctl", "-qw", "net.ipv4.tcp_fastopen=3"]);
    }
    let agent = Agent::start_with(&node, &capture_v1(), KERNEL_PATH_ON);
    let captured = capture_server(&node.ingress_ns, 2, true);
    for _ in 0..2 {
        let reply = Reply::from_output(hairpin_tests::sh::output_in(
            &node.pod_ns,
            Some(&node.pod_cgroup()),
            &[
                "curl",
                "-sS",
                "--max-time",
                "10",
                "--tcp-fastopen",
                &url(CAPTURE_LB4, 80, "/"),
            ],
        ));
        assert!(reply.ok(), "{reply:?}\n{}", agent.log());
        let got = captured
            .recv_timeout(Duration::from_secs(5))
            .expect("a captured connection");
        assert_pods_v1_header(&got, CAPTURE_LB4);
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_fastopen"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
    assert_no_misses(&s);
}

#[test]
fn a_full_sockets_map_sends_new_connects_to_the_relay_until_a_slot_frees() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with(
        &node,
        &all_frontends(),
        &["--kernel-path", "on", "--kernel-path-sockets", "1"],
    );
    // An established connection that has not written yet holds the one slot.
    let mut holder = command_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["bash", "-c", "exec 3<>/dev/tcp/203.0.113.10/80; sleep 30"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the holder");
    let entered = wait_counter(&node, "kernel_sockets_entered", 1);
    assert_eq!(entered, 1, "{}", agent.log());
    // The map is at its limit: the connect program sends the next connect to the
    // relay, which writes the header.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_full"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 1, "{s}");
    assert_no_misses(&s);
    // The holder closes without writing: its slot is free again, and the next
    // connection takes the kernel path.
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        wait_counter(&node, "kernel_sockets_left", 1),
        1,
        "a closed socket leaves the fill\n{}",
        agent.log()
    );
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_fallback_full"), 1, "{s}");
    assert_eq!(wait_counter(&node, "kernel_sockets_left", 2), 2, "{s}");
    assert_no_misses(&status(&node));
}

/// Whether this kernel has MPTCP on in `netns`.
fn mptcp_enabled(netns: &str) -> bool {
    let out = hairpin_tests::sh::output_in(netns, None, &["sysctl", "-n", "net.mptcp.enabled"]);
    String::from_utf8_lossy(&out.stdout).trim() == "1"
}

/// One HTTP/1.0 request from the pod over an MPTCP socket; the reply's body.
fn mptcp_get(node: &SimNode, lb: &str) -> String {
    let family = if lb.contains(':') {
        "AF_INET6"
    } else {
        "AF_INET"
    };
    let py = format!(
        r#"
import socket
s = socket.socket(socket.{family}, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
s.settimeout(5)
s.connect(("{lb}", 80))
s.sendall(b"GET / HTTP/1.0\r\nHost: lb\r\n\r\n")
reply = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    reply += chunk
print(reply.decode(errors="replace").split("\r\n\r\n", 1)[-1].strip())
"#
    );
    let out = hairpin_tests::sh::output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["python3", "-c", &py],
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

#[test]
fn an_mptcp_client_is_sent_to_the_relay_and_gets_its_header() {
    require_privileges!();
    let node = SimNode::new();
    if !mptcp_enabled(&node.pod_ns) {
        eprintln!("SKIPPED {}: this kernel has no MPTCP", module_path!());
        return;
    }
    let _nginx = start_nginx(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    // An MPTCP subflow looks like TCP to the connect program, but a sockhash refuses
    // it, so the kernel could never write its header: the program asks whether the
    // socket is a subflow and sends it to the relay, which it reaches as plain TCP.
    for (lb, pod_ip) in [("203.0.113.10", POD_IP4), ("2001:db8:ffff::10", POD_IP6)] {
        let body = mptcp_get(&node, lb);
        assert!(
            body.starts_with(&format!("client={pod_ip}:"))
                && body.ends_with(&format!("dst={lb}:80")),
            "MPTCP -> {lb}: {body}\n{}",
            agent.log()
        );
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_mptcp"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
    assert_no_misses(&s);
    // Plain TCP still takes the kernel path.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
}

// ---- TCP Fast Open ------------------------------------------------------------------
//
// With a cookie, a Fast Open client's first bytes ride on the SYN (or, for
// sendto(MSG_FASTOPEN), wait for the handshake inside tcp_sendmsg, where sk_msg never
// runs): the kernel could never put a header ahead of them. The setsockopt program
// marks sockets that set TCP_FASTOPEN_CONNECT, and with CAP_PERFMON the connect
// programs read tcp_sock itself; such sockets go to the relay, whose listener takes
// no SYN data, so the client's kernel sends the bytes after the handshake.

/// One connection per `kind@lb` argument from a Python client, each sending an HTTP
/// request and reading the reply: `tfo_connect` (TCP_FASTOPEN_CONNECT, then connect
/// and send), `tfo_cleared` (TCP_FASTOPEN_CONNECT set, then set back to 0),
/// `msg_fastopen` (sendto with MSG_FASTOPEN) or `plain`.
const FAST_OPEN_CLIENT: &str = r#"
import socket, struct, sys
req = b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n"
def conn(kind, lb):
    s = socket.socket(socket.AF_INET6 if ":" in lb else socket.AF_INET, socket.SOCK_STREAM)
    if kind == "msg_fastopen":
        # Blocking (a non-blocking one without a cookie fails with EINPROGRESS),
        # bounded by the kernel's own send timeout.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 5, 0))
        s.sendto(req, socket.MSG_FASTOPEN, (lb, 80))
        s.settimeout(5)
    else:
        s.settimeout(5)
        if kind in ("tfo_connect", "tfo_cleared"):
            s.setsockopt(socket.IPPROTO_TCP, 30, 1)  # TCP_FASTOPEN_CONNECT
        if kind == "tfo_cleared":
            s.setsockopt(socket.IPPROTO_TCP, 30, 0)
        s.connect((lb, 80))
        s.sendall(req)
    return s.recv(4096)
for arg in sys.argv[1:]:
    kind, lb = arg.split("@")
    print(kind, lb, conn(kind, lb).split(b"\r\n")[0].decode())
"#;

/// Runs [`FAST_OPEN_CLIENT`] in the pod for `conns` (`kind@lb`), and returns what the
/// capture server received on each, in order.
fn fast_open_clients(
    node: &SimNode,
    captured: &mpsc::Receiver<Vec<u8>>,
    conns: &[&str],
) -> Vec<Vec<u8>> {
    let mut argv = vec!["python3", "-c", FAST_OPEN_CLIENT];
    argv.extend_from_slice(conns);
    let out = hairpin_tests::sh::output_in(&node.pod_ns, Some(&node.pod_cgroup()), &argv);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{conns:?}: {text}");
    assert_eq!(
        text.matches(" HTTP/1.1 200 OK").count(),
        conns.len(),
        "{conns:?}: {text}"
    );
    conns
        .iter()
        .map(|c| {
            captured
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("no captured connection for {c}"))
        })
        .collect()
}

/// `got` starts with exactly the v1 header the relay's encoder writes for the pod
/// reaching `lb` port 80, then the request.
fn assert_pods_v1_header(got: &[u8], lb: &str) {
    let v6 = lb.contains(':');
    let pod: IpAddr = if v6 { POD_IP6 } else { POD_IP4 }.parse().expect("pod ip");
    let lb_ip: IpAddr = lb.parse().expect("lb ip");
    assert!(
        got.starts_with(b"PROXY "),
        "no header: {}",
        got.escape_ascii()
    );
    let sport = header_source_port(got, ProxyVersion::V1, v6);
    let want = Header::new(
        ProxyVersion::V1,
        SocketAddr::new(pod, sport),
        SocketAddr::new(lb_ip, 80),
    );
    let want = want.as_bytes();
    assert!(
        got.starts_with(want) && got[want.len()..].starts_with(b"GET / HTTP/1.1\r\n"),
        "got\n  {:?}\nwant\n  {:?}",
        got.escape_ascii().to_string(),
        want.escape_ascii().to_string()
    );
}

/// The capture frontends over IPv4 and IPv6, v1, on port 80.
fn capture_v1_both() -> [FrontendSpec; 2] {
    [
        FrontendSpec {
            ip: CAPTURE_LB4,
            ports: vec![80],
            version: "v1",
        },
        FrontendSpec {
            ip: CAPTURE_LB6,
            ports: vec![80],
            version: "v1",
        },
    ]
}

/// A capture node whose ingress and pod do Fast Open, where the pod already holds a
/// cookie for both capture LBs: fetched before any agent runs, by one MSG_FASTOPEN
/// connection to each (no cookie yet: its data follows the handshake), which the
/// capture server `captured` (expecting `n` more) receives without a header.
fn fast_open_node_with_cookies(n: usize) -> (SimNode, mpsc::Receiver<Vec<u8>>) {
    let node = capture_node();
    for ns in [&node.ingress_ns, &node.pod_ns] {
        hairpin_tests::sh::run_in(ns, &["sysctl", "-qw", "net.ipv4.tcp_fastopen=3"]);
    }
    let captured = capture_server(&node.ingress_ns, 2 + n, true);
    let conns = [
        format!("msg_fastopen@{CAPTURE_LB4}"),
        format!("msg_fastopen@{CAPTURE_LB6}"),
    ];
    let conns: Vec<&str> = conns.iter().map(String::as_str).collect();
    for got in fast_open_clients(&node, &captured, &conns) {
        assert!(got.starts_with(b"GET / "), "{}", got.escape_ascii());
    }
    let metrics = hairpin_tests::sh::run_in(&node.pod_ns, &["ip", "tcp_metrics", "show"]);
    for lb in [CAPTURE_LB4, "2001:db8::1:0:0:20"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(&format!("{lb} ")) && l.contains("fo_cookie")),
            "the pod holds no Fast Open cookie for {lb}:\n{metrics}"
        );
    }
    (node, captured)
}

#[test]
fn with_only_the_daemonsets_capabilities_tcp_fastopen_connect_goes_to_the_relay_and_msg_fastopen_is_a_counted_miss()
 {
    require_privileges!();
    let (node, captured) = fast_open_node_with_cookies(5);
    let agent = CappedAgent::start(&node, &capture_v1_both(), KERNEL_PATH_ON, &DAEMONSET_CAPS);
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}\n{}", agent.log());
    let tfo4 = format!("tfo_connect@{CAPTURE_LB4}");
    let tfo6 = format!("tfo_connect@{CAPTURE_LB6}");
    let cleared4 = format!("tfo_cleared@{CAPTURE_LB4}");
    let cleared6 = format!("tfo_cleared@{CAPTURE_LB6}");
    let msg4 = format!("msg_fastopen@{CAPTURE_LB4}");
    let got = fast_open_clients(&node, &captured, &[&tfo4, &tfo6, &cleared4, &cleared6]);
    // TCP_FASTOPEN_CONNECT with a cookie held: relayed, the header names the pod.
    assert_pods_v1_header(&got[0], CAPTURE_LB4);
    assert_pods_v1_header(&got[1], CAPTURE_LB6);
    // Set back to 0: the kernel path, which writes the same header.
    assert_pods_v1_header(&got[2], CAPTURE_LB4);
    assert_pods_v1_header(&got[3], CAPTURE_LB6);
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_fastopen"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 2, "{s}");
    assert_no_misses(&s);
    // Known gap, pinned: without CAP_PERFMON a connect program cannot see
    // MSG_FASTOPEN, so with the cookie its data rides on the SYN without a header,
    // and is counted.
    let got = fast_open_clients(&node, &captured, &[&msg4]);
    assert!(
        got[0].starts_with(b"GET / "),
        "known gap: MSG_FASTOPEN data has no header: {}",
        got[0].escape_ascii()
    );
    assert_eq!(
        wait_counter(&node, "kernel_missed_data_first", 1),
        1,
        "the miss must be counted\n{}",
        agent.log()
    );
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_fastopen"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 3, "{s}");
}

#[test]
fn with_cap_perfmon_tcp_fastopen_connect_and_msg_fastopen_go_to_the_relay_and_get_their_header() {
    require_privileges!();
    let (node, captured) = fast_open_node_with_cookies(7);
    // A socket that set TCP_FASTOPEN_CONNECT before the agent attached: the
    // setsockopt program never saw it, the connect program reads tcp_sock's bit.
    let early = format!(
        r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(5)
s.setsockopt(socket.IPPROTO_TCP, 30, 1)
print("set", flush=True)
sys.stdin.readline()
s.connect(("{CAPTURE_LB4}", 80))
s.sendall(b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n")
print(s.recv(4096).split(b"\r\n")[0].decode(), flush=True)
"#
    );
    let mut early = command_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["python3", "-c", &early],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the early client");
    let mut early_out = std::io::BufReader::new(early.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut early_out, &mut line).expect("read");
    assert_eq!(line.trim(), "set");
    let agent = Agent::start_with(&node, &capture_v1_both(), KERNEL_PATH_ON);
    let s = status(&node);
    let programs: Vec<&str> = s["attachment"]["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(
        programs.contains(&"hairpin_connect4_kernel_perfmon"),
        "{s}\n{}",
        agent.log()
    );
    let conns = [
        format!("tfo_connect@{CAPTURE_LB4}"),
        format!("tfo_connect@{CAPTURE_LB6}"),
        format!("msg_fastopen@{CAPTURE_LB4}"),
        format!("msg_fastopen@{CAPTURE_LB6}"),
        format!("tfo_cleared@{CAPTURE_LB4}"),
        format!("tfo_cleared@{CAPTURE_LB6}"),
    ];
    let conns: Vec<&str> = conns.iter().map(String::as_str).collect();
    let got = fast_open_clients(&node, &captured, &conns);
    for (g, c) in got.iter().zip(&conns) {
        let lb = c.split('@').nth(1).expect("lb");
        assert_pods_v1_header(g, lb);
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_fastopen"), 4, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 4, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 2, "{s}");
    assert_no_misses(&s);
    // The early socket connects now.
    early
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("write");
    line.clear();
    std::io::BufRead::read_line(&mut early_out, &mut line).expect("read");
    assert_eq!(line.trim(), "HTTP/1.1 200 OK", "{}", agent.log());
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .expect("the early connection");
    assert_pods_v1_header(&got, CAPTURE_LB4);
    let _ = early.wait();
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_fallback_fastopen"), 5, "{s}");
    assert_no_misses(&s);
}

#[test]
fn a_host_socket_whose_source_is_the_lb_address_itself_names_the_node_ip() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // As kube-proxy's IPVS mode binds LB addresses on kube-ipvs0: the LB address is
    // local, so a host socket connecting to it takes it as its source. The header
    // names --node-ip instead, as the relay does for host processes.
    hairpin_tests::sh::run_in(
        &node.node_ns,
        &["ip", "addr", "add", "203.0.113.10/32", "dev", "lo"],
    );
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let host = from_host(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client(
        "node",
        &host,
        hairpin_tests::node::NODE_IP4,
        "203.0.113.10",
        &agent,
    );
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
}

// ---- Server-speaks-first frontends ------------------------------------------------

// A server-speaks-first LB (an SMTP-like banner server behind a PROXY-aware
// frontend, `servers::banner_server`) on port 25 of CAPTURE_LB4, DNATed to
// BANNER_PORT in the ingress.

/// The frontends file with the nginx LB (client first) and the banner LB, whose
/// entry says `first_speaker` when given.
fn banner_frontends(first_speaker: Option<&str>) -> String {
    let mut s = format!(
        "frontends:\n- ip: \"203.0.113.10\"\n  ports: [80]\n  proxyProtocol: v1\n\
         - ip: \"{CAPTURE_LB4}\"\n  ports: [25]\n  proxyProtocol: v1\n  name: mail\n"
    );
    if let Some(who) = first_speaker {
        s.push_str(&format!("  firstSpeaker: {who}\n"));
    }
    s
}

/// Waits until /status lists `addr` with `reason` (None: no reason); the status.
fn wait_frontend_reason(node: &SimNode, addr: (&str, u16), reason: Option<&str>) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(node);
        let found = s["frontends"].as_array().and_then(|fs| {
            fs.iter()
                .find(|f| f["ip"] == addr.0 && f["port"] == addr.1)
                .cloned()
        });
        let now = found
            .as_ref()
            .map(|f| f["reason"].as_str().map(str::to_string));
        if now == Some(reason.map(str::to_string)) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_server_first_frontend_takes_the_relay_while_client_first_ones_keep_the_kernel_path() {
    require_privileges!();
    let mut lbs = default_lbs();
    lbs.push(LbRule {
        lb_ip: CAPTURE_LB4,
        lb_port: 25,
        backend_port: BANNER_PORT,
        name: "mail/banner:smtp",
    });
    let node = SimNode::with_lbs(&lbs);
    let _nginx = start_nginx(&node);
    let headers = banner_server(&node.ingress_ns, 2);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);

    // Without the setting, the kernel path takes the banner frontend too: the client
    // waits for the banner and the server for the header, which never comes.
    std::fs::write(&agent.frontends, banner_frontends(None)).expect("frontends");
    agent.signal(Signal::SIGHUP);
    let s = wait_frontend_reason(
        &node,
        (CAPTURE_LB4, 25),
        Some("kernel: the client speaks first"),
    );
    let talk = banner_client(&node.pod_ns, &node.pod_cgroup(), CAPTURE_LB4, 25);
    assert!(
        !talk.starts_with("220"),
        "no banner without a header: {talk}\n{s}"
    );
    let got = headers
        .recv_timeout(Duration::from_secs(5))
        .expect("a connection");
    assert_eq!(got, "", "no header reached the server");
    assert_eq!(kernel_counter(&status(&node), "kernel_marked"), 1);

    // firstSpeaker: server. The entry is rewritten to the relay path; nginx's
    // frontend keeps the kernel path.
    std::fs::write(&agent.frontends, banner_frontends(Some("server"))).expect("frontends");
    agent.signal(Signal::SIGHUP);
    let relay_why = "relay: the server speaks first (the kernel writes the header only ahead \
                     of the client's first bytes)";
    let s = wait_frontend_reason(&node, (CAPTURE_LB4, 25), Some(relay_why));
    let by_addr = |ip: &str, port: u16| {
        s["frontends"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["ip"] == ip && f["port"] == port))
            .cloned()
            .unwrap_or_else(|| panic!("no frontend {ip}:{port}: {s}"))
    };
    let mail = by_addr(CAPTURE_LB4, 25);
    assert_eq!(mail["path"], "ebpf", "{mail}");
    assert_eq!(mail["reason"], relay_why, "{mail}");
    let web = by_addr("203.0.113.10", 80);
    assert_eq!(web["path"], "kernel", "{web}");
    assert_eq!(web["reason"], "kernel: the client speaks first", "{web}");

    let before = status(&node);
    let talk = banner_client(&node.pod_ns, &node.pod_cgroup(), CAPTURE_LB4, 25);
    assert_eq!(talk, "220 banner ready|221 bye", "{}", agent.log());
    let got = headers
        .recv_timeout(Duration::from_secs(5))
        .expect("a connection");
    assert!(
        got.starts_with(&format!("PROXY TCP4 {POD_IP4} {CAPTURE_LB4} ")) && got.ends_with(" 25"),
        "the relay's header names the pod: {got:?}"
    );
    // A client-first frontend still gets the kernel's header.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let after = status(&node);
    let delta = |name: &str| kernel_counter(&after, name) - kernel_counter(&before, name);
    assert_eq!(
        delta("redirected"),
        1,
        "the banner connection is relayed: {after}"
    );
    assert_eq!(
        delta("kernel_marked"),
        1,
        "only the web connection is marked: {after}"
    );
    assert_eq!(delta("kernel_headers_written"), 1, "{after}");
    assert_no_misses(&after);

    // dump shows each entry's path from the map itself.
    let dump = Command::new(hairpin_tests::agent::agent_bin())
        .args(["dump", "--output", "json"])
        .env("HAIRPIN_ADMIN_SOCKET", node.dir.join("admin.sock"))
        .output()
        .expect("run dump");
    let dump: Value = serde_json::from_slice(&dump.stdout).expect("dump json");
    let entries: Vec<(String, String)> = dump["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .filter_map(|m| m["entries"].as_array())
        .flatten()
        .map(|e| {
            (
                e["frontend"].as_str().unwrap_or("").to_string(),
                e["path"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        entries.contains(&(
            format!("{CAPTURE_LB4}:25"),
            "relay (server speaks first)".into()
        )),
        "{entries:?}"
    );
    assert!(
        entries.contains(&("203.0.113.10:80".into(), "kernel v1".into())),
        "{entries:?}"
    );
}

/// Drops `caps` from this thread's effective set (capabilities are per thread).
fn drop_effective_caps(caps: &[u32]) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data words, as the ABI says.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()),
            0
        );
        for cap in caps {
            data[(cap / 32) as usize].effective &= !(1 << (cap % 32));
        }
        assert_eq!(
            libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()),
            0,
            "capset: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn the_counters_read_through_the_agents_own_descriptor_without_cap_sys_admin() {
    require_privileges!();
    let Some(object) = hairpin_agent::datapath::embedded_object() else {
        panic!("the agent was built without its BPF object: run cargo xtask build-ebpf first");
    };
    // A thread of its own: dropping capabilities affects this thread only.
    std::thread::spawn(move || {
        let d = hairpin_agent::datapath::Datapath::load(object, 0x68).expect("load");
        let id = d
            .kernel_ids()
            .counters_map_id
            .expect("the counters map has an id");
        let reader = d.counters_reader().expect("a reader");
        // As the DaemonSet runs the agent: CAP_BPF and CAP_NET_ADMIN, no
        // CAP_SYS_ADMIN (21) and no CAP_PERFMON (38).
        drop_effective_caps(&[21, 38]);
        let by_id = hairpin_agent::datapath::kernel_objects::read_counters(id);
        assert!(
            by_id.is_err(),
            "opening a map by id needs CAP_SYS_ADMIN: {by_id:?}"
        );
        let names: Vec<&str> = reader.read().into_iter().map(|(n, _)| n).collect();
        assert!(
            names.contains(&"kernel_fallback_full") && names.contains(&"kernel_missed_insert"),
            "{names:?}"
        );
    })
    .join()
    .expect("the reader works without CAP_SYS_ADMIN");
}

// ---- SIGTERM and sockets that have not written yet --------------------------------
//
// On SIGTERM the connect programs detach first; sock_ops and sk_msg stay until the
// sockets map is empty, within `--drain-timeout`. Past it, or after a SIGKILL, the map
// and sk_msg live on through the map's pin (`--bpf-pin-dir`), so an established socket
// that has not written yet still gets its header; without a pin they go with the agent
// and it never would.

/// A pod client to the v1 capture frontend that connects at once and writes its
/// request only once `dir/go` exists (at most about 10 s later), then reads the reply.
fn late_writer(node: &SimNode, dir: &Path) -> Child {
    std::fs::create_dir_all(dir).expect("client dir");
    let d = dir.display();
    let script = format!(
        r#"exec 3<>/dev/tcp/{CAPTURE_LB4}/80
for _ in $(seq 500); do [ -e {d}/go ] && break; sleep 0.02; done
printf 'GET / HTTP/1.1\r\nHost: lb\r\n\r\n' >&3
cat <&3 > {d}/reply
"#
    );
    command_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["bash", "-c", &script],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the client")
}

/// An agent on the capture node's v1 frontend with `extra`, a capture server for `n`
/// connections, and a [`late_writer`] in `<node dir>/<name>`; returns once the
/// client's socket has entered the sockets map.
fn agent_and_a_late_writer(
    node: &SimNode,
    extra: &[&str],
    n: usize,
    name: &str,
) -> (Agent, mpsc::Receiver<Vec<u8>>, std::path::PathBuf, Child) {
    let agent = Agent::start_with(node, &capture_v1(), extra);
    let captured = capture_server(&node.ingress_ns, n, false);
    let dir = node.dir.join(name);
    let client = late_writer(node, &dir);
    assert_eq!(
        wait_counter(node, "kernel_sockets_entered", 1),
        1,
        "{}",
        agent.log()
    );
    (agent, captured, dir, client)
}

/// The [`late_writer`] in `dir` got its answer. Its reply file exists from the moment
/// its `cat` starts: the answer in it is waited for.
fn assert_late_writer_answered(dir: &Path) {
    let reply = eventually(
        || std::fs::read_to_string(dir.join("reply")).unwrap_or_default(),
        |r| r.contains("ok"),
    );
    assert!(
        reply.contains("ok"),
        "the client gets its answer: {reply:?}"
    );
}

/// `got` is the [`late_writer`]'s request behind the exact v1 header naming the pod.
fn assert_late_writers_header(got: &[u8], what: &str, log: &str) {
    let sport = header_source_port(got, ProxyVersion::V1, false);
    let want = Header::new(
        ProxyVersion::V1,
        SocketAddr::new(POD_IP4.parse().expect("pod ip"), sport),
        SocketAddr::new(CAPTURE_LB4.parse().expect("lb ip"), 80),
    );
    assert!(
        got.starts_with(want.as_bytes())
            && got[want.as_bytes().len()..].starts_with(b"GET / HTTP/1.1\r\n"),
        "{what}: {}\nagent:\n{log}",
        got.escape_ascii(),
    );
}

/// The capture node's v1 IPv4 frontend only.
fn capture_v1() -> [FrontendSpec; 1] {
    [FrontendSpec {
        ip: CAPTURE_LB4,
        ports: vec![80],
        version: "v1",
    }]
}

/// Whether process `pid` is still running (not exited, not a zombie awaiting its wait).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

#[test]
fn sigterm_waits_for_an_established_socket_to_write_its_header() {
    require_privileges!();
    let node = capture_node();
    let drain_timeout = Duration::from_secs(10);
    // Without a pin the datapath goes with the agent: SIGTERM detaches the connect
    // programs and waits for the sockets map to empty (with one, it is kept for the
    // next agent and nothing waits).
    let (mut agent, captured, dir, mut client) = agent_and_a_late_writer(
        &node,
        &[
            "--kernel-path",
            "on",
            "--drain-timeout",
            "10s",
            "--bpf-pin-dir",
            "none",
        ],
        1,
        "late",
    );
    let term = Instant::now();
    agent.signal(Signal::SIGTERM);
    agent.wait_for_log(
        "waiting for kernel-path sockets to write their header in_map=1",
        Duration::from_secs(5),
    );
    // The client writes 1 s after SIGTERM: the agent must still be there.
    std::thread::sleep(Duration::from_secs(1).saturating_sub(term.elapsed()));
    assert!(
        running(agent.pid()),
        "the agent left before the socket wrote:\n{}",
        agent.log()
    );
    let wrote = term.elapsed();
    std::fs::write(dir.join("go"), "").expect("go");
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("nothing captured\nagent:\n{}", agent.log()));
    let status = agent.wait(drain_timeout + Duration::from_secs(5));
    let exited = term.elapsed();
    assert!(status.success(), "{}", agent.log());
    assert_late_writers_header(
        &got,
        "the header must go out during the drain",
        &agent.log(),
    );
    // It exits once the socket has left the map: after the write, well before the
    // drain timeout.
    assert!(
        exited > wrote && exited < Duration::from_secs(5),
        "wrote at {wrote:?}, exited at {exited:?}:\n{}",
        agent.log()
    );
    let log = agent.log();
    assert!(
        log.contains("kernel-path sockets map empty") && log.contains("kernel_unwritten=0"),
        "{log}"
    );
    assert!(!log.contains("without their PROXY header"), "{log}");
    assert_late_writer_answered(&dir);
    let _ = client.kill();
    let _ = client.wait();
}

#[test]
fn without_a_pin_sigterm_gives_up_at_the_drain_timeout_and_says_a_socket_goes_without_its_header() {
    require_privileges!();
    let node = capture_node();
    let (mut agent, captured, dir, mut client) = agent_and_a_late_writer(
        &node,
        &[
            "--kernel-path",
            "on",
            "--drain-timeout",
            "2s",
            "--bpf-pin-dir",
            "none",
        ],
        1,
        "never",
    );
    let s = status(&node);
    assert!(s["kernel_path"]["sockets_map_pin"].is_null(), "{s}");
    let map_id = s["kernel_path"]["sockets_map_id"]
        .as_u64()
        .expect("the sockets map's id");
    let term = Instant::now();
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(10));
    let exited = term.elapsed();
    assert!(status.success(), "{}", agent.log());
    assert!(
        exited >= Duration::from_secs(2) && exited < Duration::from_secs(4),
        "the agent must wait out the drain timeout, no more: {exited:?}\n{}",
        agent.log()
    );
    let log = agent.log();
    assert!(
        log.contains("go without their PROXY header unwritten=1")
            && log.contains("kernel_unwritten=1"),
        "the socket left without its header must be logged:\n{log}"
    );
    // And that is what happens: written once the map is gone (the kernel frees it
    // after the process exits), it has no header.
    let gone = Instant::now();
    while map_exists(map_id) && gone.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!map_exists(map_id), "the sockets map outlived the agent");
    // The id goes first; the map's sockets leave it (and lose its sk_msg program) in
    // the kernel's deferred free after an RCU grace period. A write before that still
    // got its header in 2 of about 10 runs of this suite: give the free its time.
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(dir.join("go"), "").expect("go");
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .expect("a captured connection");
    assert!(got.starts_with(b"GET / "), "{}", got.escape_ascii());
    let _ = client.kill();
    let _ = client.wait();
}

/// How the agent leaves a socket established but not yet written behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leave {
    /// SIGKILL (as an OOM kill or a node-level crash).
    Kill,
    /// SIGTERM (a rollout).
    Term,
}

/// An established pod socket that has not written when the agent goes away as
/// `leave` says: the pinned datapath keeps its sockets map and sk_msg, so its late
/// write gets the exact header; the links stay too, so a new connect gets its header
/// as well; the next agent adopts it all.
fn a_socket_left_unwritten_gets_its_header_from_the_pinned_datapath(leave: Leave) {
    let node = capture_node();
    let (mut agent, captured, dir, mut client) = agent_and_a_late_writer(
        &node,
        &["--kernel-path", "on", "--drain-timeout", "1s"],
        3,
        "late",
    );
    let s = status(&node);
    let pin = node
        .pin_dir()
        .join("v1")
        .join("maps")
        .join("HAIRPIN_SOCKETS");
    assert_eq!(
        s["kernel_path"]["sockets_map_pin"].as_str(),
        pin.to_str(),
        "{s}\n{}",
        agent.log()
    );
    assert!(pin.exists(), "{}", agent.log());
    match leave {
        Leave::Kill => {
            agent.signal(Signal::SIGKILL);
            let _ = agent.wait(Duration::from_secs(10));
        }
        Leave::Term => {
            agent.signal(Signal::SIGTERM);
            let status = agent.wait(Duration::from_secs(10));
            assert!(status.success(), "{}", agent.log());
            let log = agent.log();
            assert!(log.contains("datapath kept"), "{log}");
            assert!(!log.contains("without their PROXY header"), "{log}");
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(dir.join("go"), "").expect("go");
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("nothing captured\nagent:\n{}", agent.log()));
    assert_late_writers_header(
        &got,
        "the late write must get its header from the pinned datapath",
        &agent.log(),
    );
    assert_late_writer_answered(&dir);
    // A connect made now, with no agent, is marked all the same.
    let fresh = from_pod(&node, &url(CAPTURE_LB4, 80, "/"));
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("the fresh connect was not captured: {fresh:?}"));
    assert!(got.starts_with(b"PROXY TCP4 "), "{}", got.escape_ascii());
    let _ = client.kill();
    let _ = client.wait();
    // The next agent adopts the datapath: the same pinned sockets map.
    let mut next = Agent::start_with(&node, &capture_v1(), KERNEL_PATH_ON);
    next.wait_for_log("adopted the pinned link", Duration::from_secs(10));
    assert!(pin.exists(), "{}", next.log());
}

#[test]
fn a_socket_not_yet_written_when_the_agent_is_killed_gets_its_header_from_the_pinned_datapath() {
    require_privileges!();
    a_socket_left_unwritten_gets_its_header_from_the_pinned_datapath(Leave::Kill);
}

#[test]
fn a_socket_not_yet_written_when_the_agent_exits_on_sigterm_gets_its_header_from_the_pinned_datapath()
 {
    require_privileges!();
    a_socket_left_unwritten_gets_its_header_from_the_pinned_datapath(Leave::Term);
}

#[test]
fn cleanup_removes_a_killed_agents_datapath_and_traffic_goes_as_before_hairpin() {
    require_privileges!();
    let node = capture_node();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let map_id = status(&node)["kernel_path"]["sockets_map_id"]
        .as_u64()
        .expect("the sockets map's id");
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    assert!(map_exists(map_id), "kept by its pin");
    let attached = node.attached_programs();
    assert!(attached.contains("connect"), "{attached}");
    let run = hairpin_tests::cli::run_node_cleanup(&node);
    let steps: Vec<(String, String)> = run.json()["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_string(),
                s["outcome"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let count = |name: &str| {
        steps
            .iter()
            .filter(|(n, o)| n == name && o == "removed")
            .count()
    };
    // Five links (detached, then unpinned), five programs, eight maps, the layout
    // directory and the pin directory.
    assert_eq!(
        (
            count("pinned-link"),
            count("pinned-program"),
            count("pinned-map"),
            count("pinned-layout"),
            count("pinned-maps")
        ),
        (5, 5, 8, 1, 1),
        "{}",
        run.stdout
    );
    assert!(steps.iter().all(|(_, o)| o == "removed"), "{}", run.stdout);
    assert!(!node.pin_dir().exists());
    assert_nothing_attached(&node);
    let gone = Instant::now();
    while map_exists(map_id) && gone.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!map_exists(map_id), "the kernel must free the unpinned map");
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(fresh.code, 52, "pre-hairpin behaviour expected: {fresh:?}");
}

#[test]
fn a_pin_dir_bind_mounted_from_the_hosts_bpffs_as_the_daemonset_does_is_pinned_into() {
    require_privileges!();
    // The DaemonSet mounts the host's /sys/fs/bpf/hairpin at the same path: the pin
    // directory is then a mount point of a directory of the bpf filesystem.
    let node = capture_node();
    let host_dir = node.bpffs().join("host-hairpin");
    std::fs::create_dir_all(&host_dir).expect("the host's directory");
    let in_pod = node.dir.join("pod-sys-fs-bpf-hairpin");
    std::fs::create_dir_all(&in_pod).expect("the mount point");
    hairpin_tests::sh::run(&[
        "mount",
        "--bind",
        host_dir.to_str().expect("utf-8 path"),
        in_pod.to_str().expect("utf-8 path"),
    ]);
    // Unmounted however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(in_pod.clone());
    let mut agent = Agent::start_with(
        &node,
        &capture_v1(),
        &[
            "--kernel-path",
            "on",
            "--bpf-pin-dir",
            in_pod.to_str().expect("utf-8 path"),
        ],
    );
    let s = status(&node);
    let map = Path::new("v1").join("maps").join("HAIRPIN_SOCKETS");
    assert_eq!(
        s["kernel_path"]["sockets_map_pin"].as_str(),
        in_pod.join(&map).to_str(),
        "{s}\n{}",
        agent.log()
    );
    for pin in [map.clone(), Path::new("v1").join("links").join("connect4")] {
        assert!(
            host_dir.join(&pin).exists(),
            "{} is on the host's side",
            pin.display()
        );
    }
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(10)).success(),
        "{}",
        agent.log()
    );
    assert!(
        host_dir.join(&map).exists(),
        "a rollout's SIGTERM keeps the datapath for the next agent"
    );
}

#[test]
fn a_pin_dir_off_bpffs_leaves_the_kernel_path_on_and_says_why_it_is_not_pinned() {
    require_privileges!();
    let node = capture_node();
    let plain = node.dir.join("not-bpffs");
    let agent = Agent::start_with(
        &node,
        &capture_v1(),
        &[
            "--kernel-path",
            "on",
            "--bpf-pin-dir",
            plain.to_str().expect("utf-8 path"),
        ],
    );
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}");
    let why = s["kernel_path"]["sockets_map_pin_error"]
        .as_str()
        .unwrap_or_else(|| panic!("no pin error in {s}"));
    assert!(why.contains("is not on a bpf filesystem"), "{why}");
    assert!(
        agent
            .log()
            .contains("the datapath is not pinned: it goes with this process"),
        "{}",
        agent.log()
    );
    let captured = capture_server(&node.ingress_ns, 1, false);
    let _ = from_pod(&node, &url(CAPTURE_LB4, 80, "/"));
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .expect("a captured connection");
    assert!(got.starts_with(b"PROXY TCP4 "), "{}", got.escape_ascii());
}

/// Whether the kernel still has map `id`.
fn map_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["map", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ---- The programs' diagnostic events (aya-log) --------------------------------------

/// The agent's log lines that came from the programs through aya-log.
fn program_events(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("hairpin_ebpf")).collect()
}

#[test]
fn the_programs_log_a_fallback_naming_the_frontend_and_nothing_on_the_common_path() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // Per-connect events are debug: asked for here (`--log info`, the default,
    // shows none of them).
    let agent = Agent::start_logging(
        &node,
        &all_frontends(),
        "info,hairpin_ebpf=debug",
        &["--kernel-path", "on", "--kernel-path-sockets", "1"],
    );
    // An established connection that has not written yet holds the one slot.
    let mut holder = command_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["bash", "-c", "exec 3<>/dev/tcp/203.0.113.10/80; sleep 30"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the holder");
    assert_eq!(wait_counter(&node, "kernel_sockets_entered", 1), 1);
    assert!(program_events(&agent.log()).is_empty(), "{}", agent.log());
    // The next connect goes to the relay, and the connect program says so.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let log = eventually(|| agent.log(), |l| !program_events(l).is_empty());
    let events = program_events(&log);
    assert_eq!(events.len(), 1, "{log}");
    assert!(
        events[0].contains(" DEBUG ")
            && events[0].contains("kernel_fallback_full")
            && events[0].contains("203.0.113.10 port 80"),
        "{log}"
    );
    // A slot frees; the next connection takes the kernel path and its header is
    // written: nothing more from the programs.
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(wait_counter(&node, "kernel_sockets_left", 1), 1);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(program_events(&agent.log()).len(), 1, "{}", agent.log());
    drop(agent);

    // The relay path: a redirected connect logs nothing at the default level. (The
    // counters are the node datapath's, adopted from the agent before.)
    let agent = Agent::start_logging(&node, &all_frontends(), "info", &["--kernel-path", "off"]);
    let before = kernel_counter(&status(&node), "redirected");
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    assert_eq!(kernel_counter(&status(&node), "redirected"), before + 1);
    std::thread::sleep(Duration::from_millis(300));
    assert!(program_events(&agent.log()).is_empty(), "{}", agent.log());
}

/// The pushed header is a buffer of its own, and TCP pushes each buffer with
/// TCP_NODELAY (curl sets it, as most clients do): unless sk_msg joins it with the
/// client's first write, the server gets the header as a segment of its own, reads it
/// alone and waits for the request (two packets more per connection; the connection
/// rate measured the same either way). A first write that fits a page leaves in one
/// segment with its header; a larger one still gets the exact header ahead of all its
/// bytes.
#[test]
fn the_header_and_a_first_write_that_fits_a_page_leave_in_one_segment() {
    require_privileges!();
    let node = capture_node();
    let agent = Agent::start_with(&node, &capture_specs(), KERNEL_PATH_ON);
    let cases = [
        (CAPTURE_LB4, 80, ProxyVersion::V1),
        (CAPTURE_LB4, 81, ProxyVersion::V2),
        (CAPTURE_LB6, 80, ProxyVersion::V1),
        (CAPTURE_LB6, 81, ProxyVersion::V2),
    ];
    // Past one page with the header: the room and the request go as two buffers.
    let pad = format!("X-Pad: {}", "p".repeat(6000));
    let captured = segment_capture_server(&node.ingress_ns, 2 * cases.len(), false);
    for (lb, port, version) in cases {
        let v6 = lb.contains(':');
        let client: IpAddr = (if v6 { POD_IP6 } else { POD_IP4 }).parse().expect("ip");
        let lb_ip: IpAddr = lb.parse().expect("lb ip");
        for large in [false, true] {
            let u = url(lb, port, "/");
            let mut argv = vec!["curl", "-sS", "--max-time", "10"];
            if large {
                argv.extend(["-H", pad.as_str()]);
            }
            argv.push(&u);
            let reply = Reply::from_output(
                command_in(&node.pod_ns, Some(&node.pod_cgroup()), &argv)
                    .output()
                    .expect("run curl"),
            );
            assert!(
                reply.ok(),
                "{lb}:{port} large={large}: {reply:?}\n{}",
                agent.log()
            );
            let (got, segments) = captured
                .recv_timeout(Duration::from_secs(5))
                .expect("a captured connection");
            let sport = header_source_port(&got, version, v6);
            let want = Header::new(
                version,
                SocketAddr::new(client, sport),
                SocketAddr::new(lb_ip, port),
            );
            let want = want.as_bytes();
            assert!(
                got.starts_with(want) && got[want.len()..].starts_with(b"GET / HTTP/1.1\r\n"),
                "{lb}:{port} {version} large={large}: got\n  {:?}\nwant the header\n  {:?}",
                got.escape_ascii().to_string(),
                want.escape_ascii().to_string()
            );
            if large {
                assert!(
                    got.windows(pad.len()).any(|w| w == pad.as_bytes()),
                    "{lb}:{port} {version}: the large request arrived cut"
                );
            } else {
                assert!(
                    got.len() < 4096,
                    "{lb}:{port}: a small request: {}",
                    got.len()
                );
                assert_eq!(
                    segments, 1,
                    "{lb}:{port} {version}: header and request must arrive in one segment, came in {segments}"
                );
            }
        }
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_no_misses(&s);
}

// ==== Issue 21: `path: relay` (hairpin.dev/path) ===================================
//
// A frontend that asks for the relay takes it on a node where the kernel path is on
// (by `--kernel-path auto`, the default), while the other frontends keep the kernel
// path; the relay's header names the true client, and dump and status say why.

/// The nginx LBs over IPv4, v1 and v2, the v2 one asking for the relay.
const PATH_RELAY_FRONTENDS: &str = "frontends:\n\
    - ip: \"203.0.113.10\"\n  ports: [80]\n  proxyProtocol: v1\n\
    - ip: \"203.0.113.12\"\n  ports: [80]\n  proxyProtocol: v2\n  path: relay\n";

#[test]
fn a_frontend_asking_for_the_relay_is_relayed_on_a_kernel_path_node() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // The agent's default, spelled out: the test harness runs the relay by default.
    let agent =
        Agent::start_with_frontends_yaml(&node, PATH_RELAY_FRONTENDS, &["--kernel-path", "auto"]);
    let why = "relay: the Service asks for it (hairpin.dev/path: relay)";
    let s = wait_frontend_reason(&node, ("203.0.113.12", 80), Some(why));
    assert_eq!(s["kernel_path"]["state"], "on", "{s}");
    assert_eq!(s["kernel_path"]["configured"], "auto", "{s}");
    let by_addr = |ip: &str| {
        s["frontends"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["ip"] == ip && f["port"] == 80))
            .cloned()
            .unwrap_or_else(|| panic!("no frontend {ip}:80: {s}"))
    };
    assert_eq!(by_addr("203.0.113.12")["path"], "ebpf", "{s}");
    assert_eq!(by_addr("203.0.113.10")["path"], "kernel", "{s}");

    let before = status(&node);
    let relayed = from_pod(&node, &url("203.0.113.12", 80, "/"));
    assert_true_client("pod", &relayed, POD_IP4, "203.0.113.12", &agent);
    let kernel = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &kernel, POD_IP4, "203.0.113.10", &agent);
    let after = status(&node);
    let delta = |name: &str| kernel_counter(&after, name) - kernel_counter(&before, name);
    assert_eq!(
        delta("redirected"),
        1,
        "the path: relay connection: {after}"
    );
    assert_eq!(
        delta("kernel_marked"),
        1,
        "only the auto one is marked: {after}"
    );
    assert_eq!(delta("kernel_headers_written"), 1, "{after}");
    assert_no_misses(&after);
    assert!(!nginx_error_log(&node).contains("broken header"));

    let dump = Command::new(hairpin_tests::agent::agent_bin())
        .args(["dump", "--output", "json"])
        .env("HAIRPIN_ADMIN_SOCKET", node.dir.join("admin.sock"))
        .output()
        .expect("run dump");
    let dump: Value = serde_json::from_slice(&dump.stdout).expect("dump json");
    let entries: Vec<(String, String)> = dump["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .filter_map(|m| m["entries"].as_array())
        .flatten()
        .map(|e| {
            (
                e["frontend"].as_str().unwrap_or("").to_string(),
                e["path"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        entries.contains(&("203.0.113.12:80".into(), "relay (hairpin.dev/path)".into())),
        "{entries:?}"
    );
    assert!(
        entries.contains(&("203.0.113.10:80".into(), "kernel v1".into())),
        "{entries:?}"
    );
}
