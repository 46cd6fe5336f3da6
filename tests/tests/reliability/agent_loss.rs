//! The agent killed mid-transfer and restarted: transfers end, new connects go as
//! before hairpin, and a new agent relays again within a second.

use super::*;

/// SIGKILL in the middle of a relayed transfer (the idle case is datapath.rs's
/// `after_kill_9_traffic_is_never_broken_and_cleanup_leaves_it_as_before`): the
/// client's transfer ends at once instead of hanging, the upstream side closes, the
/// pinned links stay for the next agent (bpftool), and since no relay listens, new
/// connects take the pre-hairpin path.
#[test]
fn sigkill_mid_transfer_ends_the_transfer_and_new_connects_go_as_before_hairpin() {
    require_privileges!();
    let node = SimNode::with_lbs(&load_lbs());
    let _upstream = start_upstream(&node);
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start_with(
        &node,
        &[spec(LOAD_LB4, "v1"), spec("203.0.113.10", "v1")],
        RELAY,
    );
    let attached = node.attached_programs();
    assert_eq!(
        attached.matches("cgroup_inet4_connect").count(),
        1,
        "{attached}"
    );

    let mut receiving = pod_client(&node, &["stream", &addr(LOAD_LB4, 80)]);
    assert_eq!(receiving.line(), "receiving");
    let killed_at = monotonic_ns();
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    let ended = receiving.line();
    receiving.wait_success(Duration::from_secs(5));
    let ended_ns: u64 = ended
        .rsplit("at_ns=")
        .next()
        .and_then(|v| v.parse().ok())
        .expect("at_ns");
    let ended_ms = ended_ns.saturating_sub(killed_at) as f64 / 1e6;
    let upstream_closed = wait_until(Duration::from_secs(5), || {
        held_connections(&node.ingress_ns, UPSTREAM_PORT) == 0
    });
    let attached = node.attached_programs();
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));

    eprintln!(
        "SIGKILL mid-transfer: client saw `{ended}` {ended_ms:.1} ms after the kill; upstream \
         side closed in {upstream_closed:?}; attached after: {:?}",
        attached.trim()
    );
    assert!(
        ended.starts_with("ended reset ") || ended.starts_with("ended eof "),
        "the in-flight transfer must end, not hang: {ended}"
    );
    assert!(ended_ms < 2_000.0, "the transfer took {ended_ms} ms to end");
    assert!(
        upstream_closed.is_some(),
        "the upstream side outlived the agent"
    );
    assert!(
        attached.contains("connect"),
        "the pinned links stay for the next agent: {attached}"
    );
    assert_eq!(fresh.code, 52, "pre-hairpin behaviour expected: {fresh:?}");
    assert!(nginx_error_log(&node).contains("broken header"));
}

/// Kill -9 and start again, three times: the time from spawning the new agent
/// process (fork+exec of `hairpin-agent run`) until a pod's connection is relayed
/// with its header, measured by a client retrying every 5 ms, is under one second.
#[test]
fn a_restarted_agent_relays_again_within_a_second_of_its_start() {
    require_privileges!();
    let _serial = serial();
    let node = SimNode::with_lbs(&load_lbs());
    let _upstream = start_upstream(&node);
    let specs = [spec(LOAD_LB4, "v1")];
    let mut agent = Agent::start_with(&node, &specs, RELAY);
    let target = addr(LOAD_LB4, 80);
    let mut took = Vec::new();
    for _ in 0..3 {
        agent.signal(Signal::SIGKILL);
        agent.wait(Duration::from_secs(10));
        let mut probe = pod_client(&node, &["probe", &target, "20000", POD_IP4]);
        assert_eq!(probe.line(), "probing");
        let spawned = monotonic_ns();
        agent = Agent::start_with(&node, &specs, RELAY);
        let ok = probe.line();
        probe.wait_success(Duration::from_secs(5));
        let at: u64 = ok
            .strip_prefix("ok ")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("probe: {ok}"));
        took.push(Duration::from_nanos(at.saturating_sub(spawned)));
    }
    eprintln!("restart: agent spawn -> first relayed request: {took:?}");
    let worst = took.iter().max().expect("three restarts");
    assert!(
        *worst < Duration::from_secs(1),
        "relaying resumed {worst:?} after the agent's start\nagent:\n{}",
        agent.log()
    );
}
