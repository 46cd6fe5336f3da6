//! An agent replaced (SIGTERM, SIGKILL) or killed and not restarted: no new
//! connection fails, a dead agent's datapath goes inert at its TTL, and a relay
//! frontend goes as before hairpin while no relay listens.

use super::*;

#[test]
fn replacing_the_agent_by_sigterm_or_sigkill_fails_no_new_connection_and_keeps_a_keep_alive_one() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // Default flags, only the DaemonSet's capabilities.
    let start = || CappedAgent::start(&node, &all_frontends(), &[], &DAEMONSET_CAPS);
    let mut agent = start();
    let ka_dir = node.dir.join("ka");
    let ka = KeepAlive::start(&node, &ka_dir, 3);
    let first = ka.answer(1);
    assert!(
        first.starts_with(&format!("client={POD_IP4}:")),
        "{first}\n{}",
        agent.log()
    );
    let v4 = Connector::start(&node, "203.0.113.10", "v4");
    let v6 = Connector::start(&node, "2001:db8:ffff::12", "v6");
    v4.wait_more(20);
    v6.wait_more(20);

    // A rollout: SIGTERM, wait for the exit, the next agent a second later.
    agent.stop();
    assert!(agent.log().contains("datapath kept"), "{}", agent.log());
    std::thread::sleep(Duration::from_secs(1));
    v4.wait_more(10);
    let mut agent = start();
    assert!(
        agent.log().contains("adopted the pinned link"),
        "{}",
        agent.log()
    );
    v4.wait_more(20);
    assert_eq!(
        ka.answer(2),
        first,
        "the keep-alive connection across SIGTERM"
    );

    // A crash: SIGKILL, the next agent a second later.
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    v4.wait_more(10);
    let agent = start();
    v4.wait_more(20);
    v6.wait_more(20);
    assert_eq!(
        ka.answer(3),
        first,
        "the keep-alive connection across SIGKILL"
    );

    let (v4, v6) = (v4.finish(), v6.finish());
    let (bad4, bad6) = (failed(&v4, POD_IP4), failed(&v6, POD_IP6));
    eprintln!(
        "connections across SIGTERM and SIGKILL replacements: {} v4, {} v6; failed {} and {}",
        v4.len(),
        v6.len(),
        bad4.len(),
        bad6.len()
    );
    assert!(
        v4.len() >= 80 && v6.len() >= 40,
        "too few connections: {} {}",
        v4.len(),
        v6.len()
    );
    assert!(
        bad4.is_empty() && bad6.is_empty(),
        "failed: {bad4:?} {bad6:?}\n{}",
        agent.log()
    );
    // nginx saw the true client on every one of them.
    let access = nginx_access_log(&node);
    assert!(
        !access.contains("pp_client= ") && !access.contains("pp_client=-"),
        "a request without a header reached nginx:\n{access}"
    );
}

#[test]
fn a_killed_agent_not_restarted_keeps_writing_headers_until_the_ttl_then_traffic_goes_as_before_hairpin()
 {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let _haproxy = start_haproxy(&node);
    let (agent, killed) = killed_agent(&node, "6s");
    // No agent: the kernel path still writes the exact header, v1 and v2, v4 and v6,
    // to nginx and haproxy.
    for (lb, ip) in [
        ("203.0.113.10", POD_IP4),
        ("2001:db8:ffff::10", POD_IP6),
        ("203.0.113.11", POD_IP4),
        ("2001:db8:ffff::11", POD_IP6),
        ("203.0.113.12", POD_IP4),
        ("2001:db8:ffff::12", POD_IP6),
    ] {
        let reply = from_pod(&node, &url(lb, 80, "/"));
        assert_true_client("pod, no agent", &reply, ip, lb, &agent);
    }
    // TLS: openssl's ClientHello goes out behind the header too (nginx, speaking
    // plain HTTP here, answers 400 and logs the header's client).
    let out = hairpin_tests::sh::output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &[
            "bash",
            "-c",
            "openssl s_client -connect 203.0.113.12:80 -servername lb </dev/null >/dev/null 2>&1; true",
        ],
    );
    assert!(out.status.success());
    let tls_logged = |a: &str| {
        a.lines()
            .any(|l| l.contains(&format!("pp_client={POD_IP4}:")) && l.contains("\" 400 "))
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !tls_logged(&nginx_access_log(&node)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        tls_logged(&nginx_access_log(&node)),
        "{}",
        nginx_access_log(&node)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "the checks took too long for the TTL"
    );
    assert_eq!(pinned_counter(&node, "expired"), 0);
    // Past the TTL the connect programs leave traffic alone: as before hairpin.
    std::thread::sleep(
        Duration::from_secs(6).saturating_sub(killed.elapsed()) + Duration::from_millis(500),
    );
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(
        reply.code, 52,
        "pre-hairpin behaviour past the TTL: {reply:?}"
    );
    assert_eq!(pinned_counter(&node, "expired"), 1);
    // The programs are still attached (the TTL disarms them; cleanup removes them).
    assert!(!attached(&node).is_empty());
}

#[test]
fn a_relay_frontend_goes_as_before_hairpin_while_no_relay_listens() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // The relay path for every frontend: each connect goes to a listener only while
    // it listens.
    let mut agent = Agent::start_with(&node, &all_frontends(), &["--kernel-path", "off"]);
    ready(&mut agent);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod, relay", &reply, POD_IP4, "203.0.113.10", &agent);
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    // The programs stay (pinned) and the heartbeat is fresh, but the listener is gone:
    // the connect is not sent to it (no refusal, no hang) and reaches nginx as
    // before hairpin, which refuses it for its missing header.
    let started = Instant::now();
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(reply.code, 52, "pre-hairpin behaviour: {reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a hang: {:?}",
        started.elapsed()
    );
    assert_eq!(pinned_counter(&node, "relay_down"), 1);
    assert!(!attached(&node).is_empty());
    // The next agent serves it again.
    let mut next = Agent::start_with(&node, &all_frontends(), &["--kernel-path", "off"]);
    ready(&mut next);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod, relay again", &reply, POD_IP4, "203.0.113.10", &next);
}
