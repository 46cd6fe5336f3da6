//! Established connections and the agent going away: a kernel-path connection
//! keeps answering after SIGKILL, a restart and SIGTERM; a relayed one does not.

use super::*;

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
