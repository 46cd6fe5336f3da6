//! Connections the kernel path hands to the relay: a full sockets map, MPTCP,
//! server-speaks-first frontends and frontends asking for the relay (`path: relay`).

use super::*;

// ---- Fallbacks and known gaps ------------------------------------------------------
//
// Where the connect program can tell that the kernel could not write the header (a
// full sockets map, an MPTCP subflow), it sends the socket to the relay. What it
// cannot see on this kernel (TCP Fast Open data) goes without a header, and each such
// connection is counted: these tests pin that the misses are never silent.

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
    let mut holder = silent_connection(&node);
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

/// One HTTP/1.0 request from the pod over an MPTCP socket; the reply's body.
fn mptcp_get(node: &SimNode, lb: &str) -> String {
    let out = mptcp_from_pod(node, lb);
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
    let entries = dump_entries(&node, "path");
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

    let entries = dump_entries(&node, "path");
    assert!(
        entries.contains(&("203.0.113.12:80".into(), "relay (hairpin.dev/path)".into())),
        "{entries:?}"
    );
    assert!(
        entries.contains(&("203.0.113.10:80".into(), "kernel v1".into())),
        "{entries:?}"
    );
}

/// Listens on the mesh capture port on loopback, IPv4 and IPv6 (a dual-stack
/// wildcard would answer both probes; these are the addresses a sidecar takes),
/// writes the file it is given once listening, then waits to be killed.
const CAPTURE_LISTENER: &str = r#"
import socket, sys, time
held = []
for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    s = socket.socket(family)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 15001))
    s.listen(16)
    held.append(s)
open(sys.argv[1], "w").write("listening")
time.sleep(600)
"#;

/// The mesh cache (on in the harness, as at the node's cgroup root): the pod's
/// second connect to a kernel-path LB skips the probes for a mesh's capture listener
/// (`kernel_mesh_cached`), then a process in the pod starts listening on 15001 and
/// the very next connect, IPv4 and IPv6, finds it and takes the relay
/// (`kernel_fallback_mesh`): sock_ops' listen callback made the cached "no listener"
/// stale. Its header is the relay's, naming the pod. Without the callback's write
/// the kernel would mark that connect (`kernel_marked` 6, not 4).
#[test]
fn a_capture_listener_after_a_cached_none_sends_the_pods_connects_to_the_relay() {
    require_privileges!();
    let (node, _nginx, agent) = kernel_path_node();
    let cases = [("203.0.113.10", POD_IP4), ("2001:db8:ffff::10", POD_IP6)];
    for (lb, pod_ip) in cases {
        for _ in 0..2 {
            let reply = from_pod(&node, &url(lb, 80, "/"));
            assert_true_client("pod, no listener", &reply, pod_ip, lb, &agent);
        }
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_marked"), 4, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_mesh_cached"), 2, "{s}");
    let ready = node.dir.join("capture-listener.ready");
    let mut listener = node.spawn_in_pod(&[
        "python3",
        "-c",
        CAPTURE_LISTENER,
        ready.to_str().expect("utf-8 path"),
    ]);
    let listening = hairpin_tests::wait::wait_until(Duration::from_secs(10), || ready.exists());
    assert!(listening.is_some(), "the capture listener never listened");
    for (lb, pod_ip) in cases {
        let reply = from_pod(&node, &url(lb, 80, "/"));
        assert_true_client("pod, a capture listener", &reply, pod_ip, lb, &agent);
    }
    let s = status(&node);
    let _ = listener.kill();
    let _ = listener.wait();
    assert_eq!(kernel_counter(&s, "kernel_fallback_mesh"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 4, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_mesh_cached"), 2, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 2, "{s}");
    assert_no_misses(&s);
}
