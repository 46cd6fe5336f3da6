//! SIGTERM and sockets that have not written yet: the drain waits for them, gives up
//! at its timeout and says so, or the pinned datapath writes their header.

use super::*;

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
    node.spawn_in_pod(&["bash", "-c", &script])
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
    // The late writer's request comes seconds after its accept (an agent's kill or
    // drain first): the server's usual 5 s would cut it off in a slow VM (seen once
    // on 6.1 under load as an empty capture).
    let captured = patient_capture_server(&node.ingress_ns, n, false, Duration::from_secs(30));
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
        .join(format!("v{}", hairpin_ebpf::PIN_LAYOUT))
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
