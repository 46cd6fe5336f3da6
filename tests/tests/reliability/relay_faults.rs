//! Faults on a relayed connection: an upstream reset, a client vanishing, an idle
//! client black-holed.

use super::*;

/// Polls the agent's relay counters (5 s at most) until `counters.relay.<group>[kind]`
/// (`upstream_errors` or `client_errors`) reaches `want`; returns the relay counters.
fn wait_relay_errors(node: &SimNode, group: &str, kind: &str, want: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let counters = cli_status(node)["counters"]["relay"].clone();
        if counters[group][kind] == want || Instant::now() > deadline {
            return counters;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An upstream that resets mid-stream (after two exchanges on the connection): the
/// client sees a reset at once, not a hang, and the relay keeps no descriptor.
#[test]
fn an_upstream_reset_mid_stream_reaches_the_client_at_once() {
    require_privileges!();
    let node = SimNode::with_lbs(&load_lbs());
    let _upstream = start_upstream(&node);
    let agent = Agent::start_with(&node, &[spec(LOAD_LB4, "v1"), spec(LOAD_LB6, "v2")], RELAY);
    let pid = agent.pid();
    let base = footprint(pid);
    const ROUNDS: usize = 10;
    let mut worst = 0u64;
    for (lb, src) in [(LOAD_LB4, POD_IP4), (LOAD_LB6, POD_IP6)] {
        for _ in 0..ROUNDS {
            let mut client = pod_client(&node, &["reset", &addr(lb, 80), src]);
            let ended = client.line();
            client.wait_success(Duration::from_secs(5));
            let ms: u64 = ended
                .rsplit("after_ms=")
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            worst = worst.max(ms);
            assert!(
                ended.starts_with("ended reset "),
                "{lb}: the client must see the upstream's reset: {ended}\nagent:\n{}",
                agent.log()
            );
            assert!(
                ms < 2_000,
                "{lb}: the reset took {ms} ms to reach the client"
            );
        }
    }
    let (after, settled) = wait_for_fds(pid, base.fds, Duration::from_secs(5));
    let counters = wait_relay_errors(&node, "upstream_errors", "reset", 2 * ROUNDS as u64);
    eprintln!(
        "upstream reset x{}: client saw the reset within {worst} ms (worst); agent {base} -> \
         {after} (settled in {settled:?}); relay counters {counters}",
        2 * ROUNDS
    );
    assert_eq!(after.fds, base.fds, "descriptors leaked: {after}");
    assert_eq!(
        counters["upstream_errors"]["reset"],
        2 * ROUNDS as u64,
        "{counters}"
    );
    assert_eq!(counters["active_connections"], 0, "{counters}");
}

/// Clients that vanish mid-stream, killed with nothing unread (FIN) and while
/// receiving (reset): the relay closes the upstream side at once and keeps nothing.
#[test]
fn a_client_vanishing_mid_stream_closes_the_upstream_side() {
    require_privileges!();
    let node = SimNode::with_lbs(&load_lbs());
    let _upstream = start_upstream(&node);
    let agent = Agent::start_with(&node, &[spec(LOAD_LB4, "v1")], RELAY);
    let pid = agent.pid();
    let base = footprint(pid);
    let target = addr(LOAD_LB4, 80);

    // 50 idle connections, then the client process is killed: its kernel sends FINs.
    let mut idle = pod_client(&node, &["hold", &target, "50", "1", POD_IP4]);
    assert!(idle.line().starts_with("open 50 "));
    assert_eq!(held_connections(&node.ingress_ns, UPSTREAM_PORT), 50);
    let killed = Instant::now();
    idle.kill();
    let idle_closed = wait_until(Duration::from_secs(5), || {
        held_connections(&node.ingress_ns, UPSTREAM_PORT) == 0
    });

    // One connection receiving a stream: unread bytes make the kernel send a reset.
    let mut receiving = pod_client(&node, &["stream", &target]);
    assert_eq!(receiving.line(), "receiving");
    assert_eq!(held_connections(&node.ingress_ns, UPSTREAM_PORT), 1);
    let killed_streaming = Instant::now();
    receiving.kill();
    let stream_closed = wait_until(Duration::from_secs(5), || {
        held_connections(&node.ingress_ns, UPSTREAM_PORT) == 0
    });

    let (after, settled) = wait_for_fds(pid, base.fds, Duration::from_secs(5));
    eprintln!(
        "client vanished: 50 idle connections closed upstream in {:?}, a streaming one in \
         {:?}; agent {base} -> {after} (settled in {settled:?})",
        idle_closed.map(|_| killed.elapsed()),
        stream_closed.map(|_| killed_streaming.elapsed()),
    );
    assert!(
        idle_closed.is_some(),
        "upstream connections outlived their idle clients: {} still held\nagent:\n{}",
        held_connections(&node.ingress_ns, UPSTREAM_PORT),
        agent.log()
    );
    assert!(
        stream_closed.is_some(),
        "the upstream stream outlived its client\nagent:\n{}",
        agent.log()
    );
    assert_eq!(after.fds, base.fds, "descriptors leaked: {after}");
    // The streaming client's reset is the client's, not an upstream failure.
    let relay = &wait_relay_errors(&node, "client_errors", "reset", 1);
    assert_eq!(relay["client_errors"]["reset"], 1, "{relay}");
    assert_no_upstream_errors(relay);
}

fn assert_no_upstream_errors(relay: &serde_json::Value) {
    let upstream = relay["upstream_errors"]
        .as_object()
        .expect("upstream_errors");
    assert!(
        upstream.values().all(|v| v == 0),
        "client-side failures counted as upstream errors: {relay}"
    );
}

/// A client that vanishes without a FIN or a reset (its pod black-holed, as when a
/// pod's network namespace goes away under it) while its connections sit idle: the
/// relay's TCP keepalive (`--relay-keepalive 1s`: probes after 1 s idle, every 1 s,
/// 3 unanswered drop it) closes both sides within seconds. Without keepalive the
/// load upstream and the relay would hold them for as long as the agent runs.
#[test]
fn idle_connections_of_a_black_holed_client_are_dropped_by_keepalive() {
    require_privileges!();
    let node = SimNode::with_lbs(&load_lbs());
    let _upstream = start_upstream(&node);
    let agent = Agent::start_with(
        &node,
        &[spec(LOAD_LB4, "v1")],
        &["--relay-keepalive", "1s", "--kernel-path", "off"],
    );
    let base = footprint(agent.pid());
    let target = addr(LOAD_LB4, 80);
    let mut idle = pod_client(&node, &["hold", &target, "20", "1", POD_IP4]);
    assert!(idle.line().starts_with("open 20 "));
    assert_eq!(held_connections(&node.ingress_ns, UPSTREAM_PORT), 20);
    // Still held after several keepalive periods while the client answers the probes.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        held_connections(&node.ingress_ns, UPSTREAM_PORT),
        20,
        "keepalive dropped connections whose client was alive\n{}",
        agent.log()
    );
    // The pod stops answering anything: no FIN, no reset ever reaches the relay.
    run_in(&node.pod_ns, &["iptables", "-I", "INPUT", "-j", "DROP"]);
    let holed = Instant::now();
    let dropped = wait_until(Duration::from_secs(20), || {
        held_connections(&node.ingress_ns, UPSTREAM_PORT) == 0
    });
    let (after, settled) = wait_for_fds(agent.pid(), base.fds, Duration::from_secs(5));
    eprintln!(
        "black-holed client: 20 idle relayed connections dropped {:?} after the pod went \
         silent; agent {base} -> {after} (settled in {settled:?})",
        dropped.map(|_| holed.elapsed()),
    );
    assert!(
        dropped.is_some(),
        "{} connections of a silent client still held upstream after 20 s\n{}",
        held_connections(&node.ingress_ns, UPSTREAM_PORT),
        agent.log()
    );
    assert_eq!(after.fds, base.fds, "descriptors leaked: {after}");
    let relay = &wait_relay_errors(&node, "client_errors", "timeout", 20);
    assert_eq!(relay["client_errors"]["timeout"], 20, "{relay}");
    assert_no_upstream_errors(relay);
    idle.kill();
}
