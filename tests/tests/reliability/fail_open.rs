//! Frontends that cannot be served fail open: a listener port that cannot be had,
//! more frontends than the map holds.

use super::*;

/// The status entry for frontend `ip:80`.
fn frontend_status(node: &SimNode, ip: &str) -> serde_json::Value {
    let status = cli_status(node);
    status["frontends"]
        .as_array()
        .expect("frontends")
        .iter()
        .find(|f| f["ip"] == ip && f["port"] == 80)
        .cloned()
        .unwrap_or_else(|| panic!("no status entry for {ip}:80: {status}"))
}

/// Relay listeners take ephemeral ports on the listen address (reconcile.rs, relay.rs:
/// `bind(ip, 0)`), so "its port is taken" means no free port is left there: the node
/// namespace's ephemeral range is narrowed to two ports and another process holds one.
/// The first frontend gets the other; the second fails with an error naming it, in
/// the log and /status; no map entry points at a listener that is not there, so its
/// traffic takes the pre-hairpin path (fail open) while the first is relayed. The
/// agent retries it on its own (1 s, 2 s, 4 s ... up to 30 s apart) and says the
/// error once; once a port is free again a retry makes it live without any change
/// or signal.
#[test]
fn a_frontend_whose_listener_cannot_bind_is_skipped_and_fails_open() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let range = |r: &str| {
        run_in(
            &node.node_ns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv4.ip_local_port_range={r}"),
            ],
        )
    };
    range("47000 47001");
    // The relays' address, as an earlier agent left it on lo.
    run_in(
        &node.node_ns,
        &["ip", "addr", "add", &format!("{RELAY_IP4}/32"), "dev", "lo"],
    );
    let squat = format!("{RELAY_IP4}:47000");
    let mut squatter = Helper::in_netns(&node.node_ns, &["serve", &squat]);
    assert_eq!(squatter.line(), "listening");
    let mut agent = Agent::start_with(
        &node,
        &[spec("203.0.113.10", "v1"), spec("203.0.113.12", "v2")],
        RELAY,
    );
    // Back to the default so upstream connects and clients have ports again.
    range("32768 60999");

    let good = frontend_status(&node, "203.0.113.10");
    let bad = frontend_status(&node, "203.0.113.12");
    let entries = dump_entries(&node, "listener");
    let proxied = from_pod(&node, &url("203.0.113.10", 80, "/"));
    let skipped = from_pod(&node, &url("203.0.113.12", 80, "/"));
    let log = agent.log();
    eprintln!(
        "listener port unavailable: status {bad}; map {entries:?}; proxied frontend {:?}, \
         skipped frontend curl exit {}",
        proxied.body.trim(),
        skipped.code
    );
    assert_eq!(good["state"], "active", "{good}");
    assert_eq!(bad["state"], "failed", "{bad}");
    let reason = bad["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("for frontend 203.0.113.12:80") && reason.contains("in use"),
        "{reason}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("frontend not proxied") && l.contains("203.0.113.12:80")),
        "{log}"
    );
    assert_eq!(
        entries,
        vec![("203.0.113.10:80".to_string(), format!("{RELAY_IP4}:47001"))]
    );
    assert!(
        proxied.ok() && proxied.body.starts_with(&format!("client={POD_IP4}:")),
        "{proxied:?}"
    );
    assert_eq!(skipped.code, 52, "pre-hairpin path expected: {skipped:?}");
    assert!(nginx_error_log(&node).contains("broken header"));

    // The port is free again: the agent's own retry picks it up, no signal, no change.
    let freed = Instant::now();
    squatter.kill();
    let retried = wait_until(Duration::from_secs(40), || {
        from_pod(&node, &url("203.0.113.12", 80, "/")).ok()
    });
    let log = agent.log();
    assert!(retried.is_some(), "not retried on its own\n{log}");
    eprintln!(
        "listener port unavailable: live again {:?} after the port was freed",
        freed.elapsed()
    );
    assert_eq!(frontend_status(&node, "203.0.113.12")["state"], "active");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("frontend not proxied") && l.contains("203.0.113.12:80"))
            .count(),
        1,
        "the error is said once, not on every retry\n{log}"
    );
    agent.stop();
}

/// More frontends than the map holds. The capacity is MAX_FRONTENDS (65,536) by
/// default; that many listeners need more descriptors than this machine's hard
/// RLIMIT_NOFILE (20,000) allows one process, so the agent runs with
/// `--max-frontends 64` (the same map, sized at load) and 65 frontends. The
/// excess one (the last in order, [2001:db8:ffff::12]:80) fails with a clear error,
/// has no map entry and no listener, and its traffic takes the pre-hairpin path; the
/// other 64 are live and relay.
#[test]
fn more_frontends_than_the_map_holds_fail_open_for_the_excess() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    const CAPACITY: usize = 64;
    // 203.0.113.10:80 and 2001:db8:ffff::10:80 are real LBs (DNATed to nginx); 62
    // fillers on 203.0.113.30; the 65th, last in order, is the real 2001:db8:ffff::12:80.
    let specs = [
        spec("203.0.113.10", "v1"),
        FrontendSpec {
            ip: "203.0.113.30",
            ports: (1..=62).collect(),
            version: "v1",
        },
        spec("2001:db8:ffff::10", "v1"),
        spec("2001:db8:ffff::12", "v2"),
    ];
    let capacity = CAPACITY.to_string();
    let agent = Agent::start_with(&node, &specs, &["--max-frontends", &capacity]);
    let status = cli_status(&node);
    let frontends = status["frontends"].as_array().expect("frontends");
    let failed: Vec<&serde_json::Value> = frontends
        .iter()
        .filter(|f| f["state"] != "active")
        .collect();
    let entries = dump_entries(&node, "listener");
    let v4 = from_pod(&node, &url("203.0.113.10", 80, "/"));
    let v6 = from_pod(&node, &url("2001:db8:ffff::10", 80, "/"));
    let excess = from_pod(&node, &url("2001:db8:ffff::12", 80, "/"));
    eprintln!(
        "map full: {} frontends, {} live, {} map entries, failed {failed:?}",
        frontends.len(),
        frontends.len() - failed.len(),
        entries.len()
    );
    assert_eq!(frontends.len(), CAPACITY + 1);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["ip"], "2001:db8:ffff::12");
    let reason = failed[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("map is full") && reason.contains(&capacity),
        "{reason}"
    );
    assert!(failed[0]["listener"].is_null(), "{}", failed[0]);
    assert_eq!(entries.len(), CAPACITY);
    assert!(!entries.iter().any(|(f, _)| f.contains("2001:db8:ffff::12")));
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("frontend not proxied") && l.contains("2001:db8:ffff::12")),
        "{}",
        agent.log()
    );
    assert!(
        v4.ok() && v4.body.starts_with(&format!("client={POD_IP4}:")),
        "{v4:?}"
    );
    assert!(
        v6.ok() && v6.body.starts_with(&format!("client={POD_IP6}:")),
        "{v6:?}"
    );
    assert_eq!(excess.code, 52, "pre-hairpin path expected: {excess:?}");
}
