//! The agent going (SIGKILL, SIGTERM) on both paths: traffic never broken, an
//! in-flight transfer completed, and `cleanup` leaving the node as before.

use super::*;

pub(super) fn after_kill_9_traffic_is_never_broken_and_cleanup_leaves_it_as_before(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = path.start(&node);
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
    // The kernel path adds a sock_ops program (its sk_msg program hangs on the
    // sockets map, not on the cgroup).
    let sock_ops = usize::from(path == Path::Kernel);
    assert_eq!(attached.matches("sock_ops").count(), sock_ops, "{attached}");
    let before = Carried::read(&node);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    path.assert_carried(&node, &before, 1, &agent);

    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    // The pinned links stay for the next agent. The kernel path needs no process:
    // pod and node still get their header. The relay is gone, and a connect is sent
    // to a listener only while it listens: traffic goes as before hairpin, neither
    // refused nor hung.
    assert_eq!(node.attached_programs(), attached);
    let replies = [
        (
            "pod",
            POD_IP4,
            from_pod(&node, &url("203.0.113.10", 80, "/")),
        ),
        (
            "node",
            path.host_client(false),
            from_host(&node, &url("203.0.113.10", 80, "/")),
        ),
    ];
    for (who, client, reply) in &replies {
        match path {
            Path::Kernel => assert_true_client(who, reply, client, "203.0.113.10", &agent),
            Path::Relay => assert_eq!(
                reply.code, 52,
                "{who}: pre-hairpin behaviour expected: {reply:?}"
            ),
        }
    }
    // `cleanup` removes the datapath: nothing attached, traffic as before hairpin.
    hairpin_tests::cli::run_node_cleanup(&node);
    let attached = node.attached_programs();
    assert!(
        !attached.contains("connect") && !attached.contains("sock_ops"),
        "still attached after cleanup: {attached}"
    );
    for (who, reply) in [
        ("pod", from_pod(&node, &url("203.0.113.10", 80, "/"))),
        ("node", from_host(&node, &url("203.0.113.10", 80, "/"))),
    ] {
        assert_eq!(
            reply.code, 52,
            "{who}: pre-hairpin behaviour expected: {reply:?}"
        );
    }
    let broken = if path == Path::Kernel { 2 } else { 4 };
    let errors = eventually(
        || nginx_error_log(&node),
        |e| e.matches("broken header").count() == broken,
    );
    assert_eq!(errors.matches("broken header").count(), broken, "{errors}");
}

pub(super) fn sigterm_lets_an_in_flight_transfer_complete(path: Path) {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = path.start(&node);
    let before = Carried::read(&node);
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
            out.to_str().expect("utf-8 path"),
            &url("203.0.113.10", 80, "/slow"),
        ],
    )
    .spawn()
    .expect("start curl");
    // On the relay path the agent must drain it; on the kernel path it runs on the
    // client's own socket, which the agent's exit does not touch.
    path.wait_carried(&node, &before, 1);
    path.assert_carried(&node, &before, 1, &agent);
    std::thread::sleep(Duration::from_millis(500));
    agent.signal(Signal::SIGTERM);
    // A rollout: the datapath is kept for the next agent.
    agent.wait_for_log("datapath kept", Duration::from_secs(5));
    agent.wait_for_log("draining", Duration::from_secs(5));
    // The accept loops close their listeners as they see the stop, just after.
    std::thread::sleep(Duration::from_millis(300));
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    match path {
        // The relay stopped listening as it began to drain: a new connect is not sent
        // to it and takes the pre-hairpin path.
        Path::Relay => assert_eq!(
            fresh.code, 52,
            "new connections must not reach a draining relay: {fresh:?}"
        ),
        // The kernel path needs no process: a new connect still gets its header.
        Path::Kernel => {
            assert_true_client("pod, draining", &fresh, POD_IP4, "203.0.113.10", &agent)
        }
    }
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
