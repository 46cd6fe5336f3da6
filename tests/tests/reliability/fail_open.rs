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

/// The relay holds no port per frontend (one listener per family, on a privileged
/// port; a frontend is served on a slot that no socket binds), so a port squatted on
/// the listen address takes nothing from a frontend. What a frontend can lack is a
/// slot of its family: with `--listen-address` of IPv4 only, an IPv6 frontend fails
/// with an error naming it and the flag, in the log and /status; no map entry sends
/// its connects anywhere, so its traffic takes the pre-hairpin path (fail open),
/// while the IPv4 frontend is relayed on a slot of the IPv4 address. The error is
/// permanent (no retry helps before the flags change): said once.
#[test]
fn a_frontend_without_a_slot_of_its_family_is_skipped_and_fails_open() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // A squatter on the listen address, where per-frontend listeners used to bind:
    // at a privileged port (one at a slot port, 1024 up, gets the address refused at
    // start, `tests/tests/neighbours.rs`).
    run_in(
        &node.node_ns,
        &["ip", "addr", "add", &format!("{RELAY_IP4}/32"), "dev", "lo"],
    );
    let squat = format!("{RELAY_IP4}:1000");
    let mut squatter = Helper::in_netns(&node.node_ns, &["serve", &squat]);
    assert_eq!(squatter.line(), "listening");
    let mut extra = RELAY.to_vec();
    extra.extend(["--listen-address", RELAY_IP4]);
    let mut agent = Agent::start_with(
        &node,
        &[spec("203.0.113.10", "v1"), spec("2001:db8:ffff::12", "v2")],
        &extra,
    );
    let good = frontend_status(&node, "203.0.113.10");
    let bad = frontend_status(&node, "2001:db8:ffff::12");
    let entries = dump_entries(&node, "listener");
    let proxied = from_pod(&node, &url("203.0.113.10", 80, "/"));
    let skipped = from_pod(&node, &url("2001:db8:ffff::12", 80, "/"));
    eprintln!(
        "no slot of the family: status {bad}; map {entries:?}; proxied frontend {:?}, \
         skipped frontend curl exit {}",
        proxied.body.trim(),
        skipped.code
    );
    assert_eq!(good["state"], "active", "{good}");
    assert_eq!(bad["state"], "failed", "{bad}");
    let reason = bad["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("IPv6") && reason.contains("--listen-address"),
        "{reason}"
    );
    assert_eq!(
        entries,
        vec![("203.0.113.10:80".to_string(), "#0:1024".to_string())]
    );
    assert!(
        proxied.ok() && proxied.body.starts_with(&format!("client={POD_IP4}:")),
        "{proxied:?}"
    );
    assert_eq!(skipped.code, 52, "pre-hairpin path expected: {skipped:?}");
    assert!(nginx_error_log(&node).contains("broken header"));
    // Past a few retries' time, the error is still said once.
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.log();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("frontend not proxied") && l.contains("2001:db8:ffff::12"))
            .count(),
        1,
        "said once, not on every retry\n{log}"
    );
    squatter.kill();
    agent.stop();
}

/// Holds every port the relay's listener may take (`PRIVILEGED_PORTS`, 512-1023) on
/// the IPv6 wildcard address (IPv6 only) in the node's network namespace, as another
/// node service's listeners would: a listener on `[::]` takes the port on every IPv6
/// address. Killed with it.
struct PortHolder(std::process::Child);

impl PortHolder {
    fn ipv6_privileged(node: &SimNode) -> PortHolder {
        let script = "import socket, sys\n\
            held = []\n\
            for port in range(512, 1024):\n\
            \x20   s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n\
            \x20   s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)\n\
            \x20   s.bind(('::', port))\n\
            \x20   s.listen(1)\n\
            \x20   held.append(s)\n\
            print('held', len(held), flush=True)\n\
            sys.stdin.read()\n";
        let mut child =
            hairpin_tests::sh::command_in(&node.node_ns, None, &["python3", "-c", script])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("run python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
            &mut line,
        )
        .expect("the holder's line");
        assert_eq!(
            line.trim(),
            "held 512",
            "the holder did not hold every port"
        );
        PortHolder(child)
    }
}

impl Drop for PortHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The relay's IPv6 listener cannot bind (every port of its range taken on the
/// node): the agent starts and serves the rest (the IPv4 frontend is relayed), and
/// `status`, `/status`, `doctor` and `/metrics` name the family, the address, the
/// OS error and the fix; the IPv6 frontend is listed failed with that reason and its
/// connects go as before hairpin. The ports freed, the agent's own retry (1 s
/// doubling) serves the family, with no restart. Costs about 2 s.
#[test]
fn a_relay_listener_that_cannot_bind_is_named_in_status_and_doctor_and_the_rest_is_served() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let holder = PortHolder::ipv6_privileged(&node);
    let agent = Agent::start_with(
        &node,
        &[spec("203.0.113.10", "v1"), spec("2001:db8:ffff::12", "v2")],
        RELAY,
    );
    let status = cli_status(&node);
    let relay = &status["relay"];
    let unserved = &relay["unserved"][0];
    assert_eq!(unserved["family"], "IPv6", "{relay}");
    assert_eq!(unserved["what"], "bind", "{relay}");
    assert!(
        unserved["error"]
            .as_str()
            .is_some_and(|e| e.contains("os error 98")),
        "{relay}"
    );
    assert!(relay["unserved"].get(1).is_none(), "{relay}");
    let v4 = relay["listeners"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(v4.starts_with(&format!("{RELAY_IP4}:")), "{relay}");
    let bad = frontend_status(&node, "2001:db8:ffff::12");
    assert_eq!(bad["state"], "failed", "{bad}");
    let reason = bad["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("the relay's IPv6 listener is not served")
            && reason.contains("os error 98")
            && reason.contains("ss -ltnp"),
        "{reason}"
    );
    assert_eq!(frontend_status(&node, "203.0.113.10")["state"], "active");
    // The rest is served; the unserved family goes as before hairpin.
    let proxied = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        proxied.ok() && proxied.body.starts_with(&format!("client={POD_IP4}:")),
        "{proxied:?}\n{}",
        agent.log()
    );
    let skipped = from_pod(&node, &url("2001:db8:ffff::12", 80, "/"));
    assert_eq!(skipped.code, 52, "pre-hairpin path expected: {skipped:?}");
    // What the operator reads.
    let text = run_cli(&node, &["status"]);
    assert!(
        text.stdout
            .contains("IPv6 not served: the relay's IPv6 listener is not served on")
            && text.stdout.contains("fix: every port of 512-1023"),
        "{text:?}"
    );
    let report = run_cli(&node, &["doctor", "--output", "json"]).json();
    let check = doctor_check(&report, "relay");
    assert_eq!(check["status"], "fail", "{check}");
    let detail = check["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("os error 98") && detail.contains("not served: [2001:db8:ffff::12]:80"),
        "{check}"
    );
    let metrics = run_in(
        &node.node_ns,
        &["curl", "-sS", "http://127.0.0.1:9901/metrics"],
    );
    assert!(
        metrics.contains("hairpin_relay_listeners_unserved 1")
            && metrics.contains("hairpin_frontends_failed 1"),
        "{metrics}"
    );
    // The ports freed: served on the next retry, without a restart.
    drop(holder);
    let served = wait_until(Duration::from_secs(40), || {
        frontend_status(&node, "2001:db8:ffff::12")["state"] == "active"
    });
    assert!(served.is_some(), "{}\n{}", cli_status(&node), agent.log());
    assert!(cli_status(&node)["relay"]["unserved"].is_null());
    let relayed = from_pod(&node, &url("2001:db8:ffff::12", 80, "/"));
    assert!(
        relayed.ok() && relayed.body.starts_with(&format!("client={POD_IP6}:")),
        "{relayed:?}\n{}",
        agent.log()
    );
    assert!(
        agent.log().contains("the relay's listener is served again"),
        "{}",
        agent.log()
    );
}

/// More frontends than the map holds. The capacity is MAX_FRONTENDS (65,536) by
/// default; to keep this test small the agent runs with `--max-frontends 64` (the
/// same map, sized at load) and 65 frontends. The
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
