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
    agent::{Agent, FrontendSpec, all_frontends},
    client::{Reply, from_host, from_pod, url},
    node::{LbRule, POD_IP4, POD_IP6, SimNode, default_lbs},
    privileges::datapath_tests_can_run,
    servers::{nginx_access_log, nginx_error_log, start_haproxy, start_nginx},
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

/// `GET path` on the agent's admin socket.
fn admin_get(node: &SimNode, path: &str) -> String {
    let sock = node.dir.join("admin.sock");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "--unix-socket"])
        .arg(&sock)
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "GET {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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

fn status(node: &SimNode) -> Value {
    serde_json::from_str(&admin_get(node, "/status")).expect("status is json")
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

fn assert_true_client(who: &str, reply: &Reply, client: &str, lb: &str, agent: &Agent) {
    assert!(
        reply.ok(),
        "{who} -> {lb}: {reply:?}\nagent:\n{}",
        agent.log()
    );
    assert!(
        reply.body.starts_with(&format!("client={client}:")),
        "{who} -> {lb}: the header must name {client}: {}",
        reply.body
    );
    assert!(
        reply.body.trim_end().ends_with(&format!("dst={lb}:80")),
        "{who} -> {lb}: {}",
        reply.body
    );
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
    let (ready_tx, ready_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let ns = format!("/run/netns/{netns}");
    std::thread::spawn(move || {
        // This thread alone moves into the ingress namespace.
        let f = std::fs::File::open(&ns).expect("open netns");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let listener = TcpListener::bind(("::", CAPTURE_PORT)).expect("bind capture port");
        if fast_open {
            use std::os::fd::AsRawFd;
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
            let mut buf = [0u8; 4096];
            // Up to the end of the request head (a v2 header's signature holds a
            // blank line of its own, so look after the request line).
            while !request_head_complete(&got) {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
            );
            if tx.send(got).is_err() {
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

#[test]
fn the_kernels_header_bytes_equal_the_relays_encoder() {
    require_privileges!();
    let node = capture_node();
    let specs = [
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
    ];
    let agent = Agent::start_with(&node, &specs, KERNEL_PATH_ON);
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
                from_pod(&node, &url(lb, port, "/")),
            ),
            (
                "node",
                if v6 { NODE_UPLINK6 } else { NODE_UPLINK4 },
                from_host(&node, &url(lb, port, "/")),
            ),
        ] {
            assert!(
                reply.ok(),
                "{who} -> {lb}:{port}: {reply:?}\n{}",
                agent.log()
            );
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
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_no_misses(&s);
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

/// A keep-alive client in the pod: one request on a connection to 203.0.113.10:80,
/// then, once `dir/go` exists, a second request on the same connection. Each body is
/// written to `dir/first` and `dir/second`.
fn keep_alive_client(node: &SimNode, dir: &Path) -> Child {
    let d = dir.display();
    let script = format!(
        r#"exec 3<>/dev/tcp/203.0.113.10/80
req() {{
    printf 'GET /%s HTTP/1.1\r\nHost: lb\r\n\r\n' "$1" >&3
    len=0
    while IFS= read -r line <&3; do
        line=${{line%$'\r'}}
        [ -z "$line" ] && break
        case "$line" in [Cc]ontent-[Ll]ength:*) len=${{line#*: }};; esac
    done
    [ "$len" -gt 0 ] && IFS= read -r -N "$len" body <&3 && printf '%s' "$body"
}}
req one > {d}/first.tmp; mv {d}/first.tmp {d}/first
while [ ! -e {d}/go ]; do sleep 0.05; done
req two > {d}/second.tmp; mv {d}/second.tmp {d}/second
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
    .expect("start the keep-alive client")
}

/// Waits for `file` to exist, at most `within`; its contents.
fn wait_file(file: &Path, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(s) = std::fs::read_to_string(file) {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
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
    let dir = node.dir.join("ka");
    std::fs::create_dir_all(&dir).expect("client dir");
    let mut agent = Agent::start_with(node, &all_frontends(), extra);
    let mut client = keep_alive_client(node, &dir);
    let first = wait_file(&dir.join("first"), Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no first answer\nagent:\n{}", agent.log()));
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
    std::fs::write(dir.join("go"), "").expect("go");
    let second = wait_file(&dir.join("second"), Duration::from_secs(10)).filter(|s| !s.is_empty());
    let _ = client.kill();
    let _ = client.wait();
    (first, second, agent, next)
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
    // And the agent left nothing attached: no connect, no sock_ops program.
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
        "still attached after SIGKILL: {attached}"
    );
    // A new connection takes the pre-hairpin path, as before hairpin.
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(fresh.code, 52, "pre-hairpin behaviour expected: {fresh:?}");
    let pod_lines = |a: &str| a.matches(&format!("pp_client={POD_IP4}:")).count();
    let access = eventually(|| nginx_access_log(&node), |a| pod_lines(a) == 2);
    assert_eq!(pod_lines(&access), 2, "{access}");
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
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
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
            "hairpin_connect4_kernel",
            "hairpin_connect6_kernel",
            "hairpin_sockops",
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

// ---- Known gaps, counted ----------------------------------------------------------
//
// The kernel path cannot yet put every connection on the relay when it cannot write
// the header. Until it does, each such connection must be counted: these tests pin
// that the misses are never silent.

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
fn tcp_fast_open_data_leaves_without_the_header_and_is_counted() {
    require_privileges!();
    let node = capture_node();
    // The ingress accepts Fast Open: the first connection gets a cookie, the second
    // carries its request in the SYN, before sk_msg can see the socket.
    hairpin_tests::sh::run_in(
        &node.ingress_ns,
        &["sysctl", "-qw", "net.ipv4.tcp_fastopen=3"],
    );
    let agent = Agent::start_with(
        &node,
        &[FrontendSpec {
            ip: CAPTURE_LB4,
            ports: vec![80],
            version: "v1",
        }],
        KERNEL_PATH_ON,
    );
    let captured = capture_server(&node.ingress_ns, 2, true);
    let fast_open = || {
        Reply::from_output(hairpin_tests::sh::output_in(
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
        ))
    };
    // A non-blocking first write after the handshake takes the sk_msg path.
    let first = fast_open();
    assert!(first.ok(), "{first:?}\n{}", agent.log());
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .expect("first connection");
    assert!(got.starts_with(b"PROXY TCP4 "), "{}", got.escape_ascii());
    // With the cookie, the data rides on the SYN.
    let second = fast_open();
    assert!(second.ok(), "{second:?}");
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .expect("second connection");
    assert!(
        got.starts_with(b"GET / "),
        "known gap: fast open data has no header: {}",
        got.escape_ascii()
    );
    assert_eq!(
        wait_counter(&node, "kernel_missed_data_first", 1),
        1,
        "the miss must be counted\n{}",
        agent.log()
    );
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
}

#[test]
fn a_full_sockets_map_is_counted_as_a_miss() {
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
    let marked = wait_counter(&node, "kernel_marked", 1);
    assert_eq!(marked, 1, "{}", agent.log());
    std::thread::sleep(Duration::from_millis(200));
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        reply.code, 52,
        "known gap: no room in the map, no header: {reply:?}"
    );
    assert_eq!(
        wait_counter(&node, "kernel_missed_insert", 1),
        1,
        "the miss must be counted\n{}",
        agent.log()
    );
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
