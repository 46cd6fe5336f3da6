//! TCP Fast Open: what goes to the relay and what is a counted miss, with and
//! without CAP_PERFMON.

use super::*;

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

/// The capture frontends over IPv4 and IPv6, v1, on port 80.
fn capture_v1_both() -> [FrontendSpec; 2] {
    [spec(CAPTURE_LB4, "v1"), spec(CAPTURE_LB6, "v1")]
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
    let programs = program_names(&s);
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
