//! The relay's slots: however many frontends the tenants publish, the relay holds a
//! handful of listeners on privileged ports, so the node's ephemeral ports stay the
//! node's; a connect goes only to its own frontend's slot, through every restart;
//! a slot or a listener that does not check out is never a target.
//!
//! The traffic is `hairpin-load`: an upstream behind the LB ports that answers with
//! the header it received and counts connections whose header names another LB than
//! the one the client dialled (`want`), and a pod client dialling each frontend in
//! turn (`each`).
//!
//! Cost: three simulated nodes; 1,100 relayed connections for the narrowed range;
//! 8 agent starts under a 30 s dialling loop for the restart loop (about 60,000
//! connections, 9,000 of them relayed); three file changes and 8 relayed connections
//! for the quarantine; about 31 s of wall time on two cores (the four tests run side
//! by side).

use std::time::Duration;

use hairpin_tests::{
    agent::{Agent, FrontendSpec, frontends_yaml, status},
    load::{Helper, UPSTREAM_PORT, pod_client, start_upstream},
    node::{INGRESS_IP4, NODE_IP4, POD_IP4, SimNode},
    require_privileges,
    sh::{output_in, run_in},
};
use nix::sys::signal::Signal;

/// A tenant's LoadBalancer with many ports, none of the default LBs.
const MANY_LB: &str = "203.0.113.40";
/// Its first port.
const FIRST_PORT: u16 = 10_000;

/// Programs kube-proxy's DNAT for `MANY_LB` ports `FIRST_PORT..FIRST_PORT + n` to the
/// upstream, as for a Service with that many ports: for the node's own processes (the
/// relay) and for pods (their connects while no agent runs).
fn lb_ports(node: &SimNode, n: u16) {
    for chain in ["OUTPUT", "PREROUTING"] {
        lb_ports_in(node, chain, n);
    }
}

fn lb_ports_in(node: &SimNode, chain: &str, n: u16) {
    let range = format!("{FIRST_PORT}:{}", FIRST_PORT + n - 1);
    let to = format!("{INGRESS_IP4}:{UPSTREAM_PORT}");
    run_in(
        &node.node_ns,
        &[
            "iptables",
            "-t",
            "nat",
            "-I",
            chain,
            "1",
            "-d",
            MANY_LB,
            "-p",
            "tcp",
            "--dport",
            &range,
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ],
    );
}

/// `MANY_LB:port` for each of `ports`.
fn targets(ports: impl Iterator<Item = u16>) -> Vec<String> {
    ports.map(|p| format!("{MANY_LB}:{p}")).collect()
}

/// The frontends for `ports` of `MANY_LB`.
fn many(ports: Vec<u16>) -> FrontendSpec {
    FrontendSpec {
        ip: MANY_LB,
        ports,
        version: "v1",
    }
}

/// `hairpin-load each`'s summary as (key, count) pairs.
fn summary(line: &str) -> Vec<(String, u64)> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

fn count(summary: &[(String, u64)], key: &str) -> u64 {
    summary
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {key} in {summary:?}"))
}

/// One connection from the pod to each of `targets`, with `SECONDS` of cycling (0:
/// one round); the summary.
fn each_from_pod(node: &SimNode, seconds: u64, targets: &[String]) -> Helper {
    let seconds = seconds.to_string();
    let mut args = vec!["each", POD_IP4, seconds.as_str()];
    args.extend(targets.iter().map(String::as_str));
    pod_client(node, &args)
}

/// The node's listening TCP ports, from `ss`.
fn listening_ports(node: &SimNode) -> Vec<(String, u16)> {
    let out = run_in(&node.node_ns, &["ss", "-Hltn"]);
    out.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|local| {
            let (ip, port) = local.rsplit_once(':')?;
            Some((ip.to_string(), port.parse().ok()?))
        })
        .collect()
}

/// With the node namespace's ephemeral range narrowed to 100 ports and one Service
/// of `n` ports relayed: the agent gets ready and stays so, holds no port of the
/// range (its listeners are on privileged ports, one per family), the node's own
/// outbound connections and its readiness probe get ports, and every frontend is
/// served with a header naming the pod and the very port it dialled.
fn the_node_keeps_its_ephemeral_ports(n: u16) {
    require_privileges!();
    let node = SimNode::new();
    let _upstream = start_upstream(&node);
    lb_ports(&node, n);
    let (low, high) = (40_000u16, 40_099u16);
    run_in(
        &node.node_ns,
        &[
            "sysctl",
            "-qw",
            &format!("net.ipv4.ip_local_port_range={low} {high}"),
        ],
    );
    let agent = Agent::start_with(
        &node,
        &[many((FIRST_PORT..FIRST_PORT + n).collect())],
        &["--kernel-path", "off"],
    );
    let listening = listening_ports(&node);
    let in_range: Vec<_> = listening
        .iter()
        .filter(|(_, p)| (low..=high).contains(p))
        .collect();
    assert!(
        in_range.is_empty(),
        "{n} frontends: listeners in the node's ephemeral range {in_range:?}"
    );
    assert!(
        listening.len() <= 4,
        "{n} frontends: a handful of listeners in all, got {listening:?}"
    );
    // The node's own connects (a host process, outside hairpin's cgroup) and the
    // kubelet's readiness probe (a TCP connect to the admin address) take ports of
    // the narrowed range: each must get one.
    let direct = format!("{INGRESS_IP4}:{UPSTREAM_PORT}");
    let mut own = Helper::in_netns(&node.node_ns, &["each", NODE_IP4, "0", &direct, &direct]);
    let own = summary(&own.line());
    assert_eq!(
        count(&own, "errors"),
        0,
        "{n} frontends: the node's own connects {own:?}"
    );
    let ready = output_in(
        &node.node_ns,
        None,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "http://127.0.0.1:9901/readyz",
        ],
    );
    assert!(
        ready.status.success() && String::from_utf8_lossy(&ready.stdout).contains("\"ready\":true"),
        "{n} frontends: readiness {ready:?}"
    );
    // Every frontend relayed, each to its own LB port.
    let all = targets(FIRST_PORT..FIRST_PORT + n);
    let mut pod = each_from_pod(&node, 0, &all);
    let got = summary(&pod.line());
    assert_eq!(
        count(&got, "ok"),
        u64::from(n),
        "{n} frontends: {got:?}\n{}",
        agent.log()
    );
    let s = status(&node);
    let active = s["frontends"]
        .as_array()
        .expect("frontends")
        .iter()
        .filter(|f| f["state"] == "active")
        .count();
    assert_eq!(active, usize::from(n), "{s}");
    eprintln!(
        "ephemeral range {low}-{high}: {n} relayed frontends, listeners {listening:?}, node's own connects {own:?}, pod {got:?}"
    );
}

#[test]
fn with_100_ports_of_ephemeral_range_a_service_of_100_ports_leaves_them_to_the_node() {
    the_node_keeps_its_ephemeral_ports(100);
}

#[test]
fn with_100_ports_of_ephemeral_range_a_service_of_1000_ports_leaves_them_to_the_node() {
    the_node_keeps_its_ephemeral_ports(1000);
}

/// Agents started and stopped (SIGKILL and SIGTERM in turn) eight times over one
/// pinned datapath while a pod dials 400 relayed frontends in turn without pause.
/// Each agent gets another set of 300 (ten frontends leave and ten arrive, in
/// reversed order every other time), so slots handed out afresh in file order would
/// collide with the ones the last agent's adopted entries name. The upstream counts
/// every connection whose header names another LB than the one the client dialled:
/// none may. Connections while no agent runs go as before hairpin (no header).
#[test]
fn restarting_the_agent_never_sends_a_connection_to_another_frontends_lb() {
    require_privileges!();
    let node = SimNode::new();
    let mut upstream = start_upstream(&node);
    const SET: u16 = 300;
    const ROUNDS: u16 = 8;
    lb_ports(&node, SET + 10 * ROUNDS);
    let round = |r: u16| {
        let mut ports: Vec<u16> = (FIRST_PORT + 10 * r..FIRST_PORT + 10 * r + SET).collect();
        if r % 2 == 1 {
            ports.reverse();
        }
        frontends_yaml(&[many(ports)])
    };
    // Dialled throughout: every port any round proxies.
    let all = targets(FIRST_PORT..FIRST_PORT + SET + 10 * ROUNDS);
    let mut client = each_from_pod(&node, 30, &all);
    for r in 0..ROUNDS {
        let mut agent =
            Agent::start_with_frontends_yaml(&node, &round(r), &["--kernel-path", "off"]);
        std::thread::sleep(Duration::from_millis(1500));
        if r % 2 == 0 {
            agent.signal(Signal::SIGKILL);
        } else {
            agent.signal(Signal::SIGTERM);
        }
        let _ = agent.wait(Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(300));
    }
    let got = summary(&client.line());
    upstream.tell("count");
    let at_server = loop {
        let line = upstream.line();
        if line.starts_with("count ") {
            break summary(&line);
        }
        eprintln!("upstream: {line}");
    };
    eprintln!("restart loop: client {got:?}, upstream {at_server:?}");
    assert_eq!(count(&at_server, "misrouted"), 0, "{at_server:?}");
    assert_eq!(count(&got, "misrouted"), 0, "{got:?}");
    assert!(
        count(&got, "ok") >= 200,
        "the agents relayed some of the connections: {got:?}"
    );
    // Every relayed connection the client saw answered was counted at the upstream;
    // a few more may have been counted there whose answer died with a killed agent.
    let answered = count(&got, "ok") + count(&got, "misrouted");
    let wanted = count(&at_server, "wanted");
    assert!(
        (answered..=answered + count(&got, "errors")).contains(&wanted),
        "every relayed connection was counted at the upstream: {wanted} there, client {got:?}"
    );
}

/// Each active frontend's slot (where its clients are sent), by LB port, once the
/// agent's `/status` lists exactly `ports` as active.
fn slots_once_active(node: &SimNode, ports: &[u16]) -> std::collections::BTreeMap<u16, String> {
    let mut last = serde_json::Value::Null;
    for _ in 0..100 {
        last = status(node);
        let active: std::collections::BTreeMap<u16, String> = last["frontends"]
            .as_array()
            .expect("frontends")
            .iter()
            .filter(|f| f["state"] == "active")
            .map(|f| {
                let port = u16::try_from(f["port"].as_u64().expect("port")).expect("a port");
                (port, f["listener"].as_str().unwrap_or("").to_string())
            })
            .collect();
        if active.keys().copied().eq(ports.iter().copied()) {
            return active;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the agent never had exactly {ports:?} active: {last}");
}

/// Replaces the running agent's frontends file with `ports` of `MANY_LB`.
fn replace_frontends(agent: &Agent, ports: Vec<u16>) {
    agent
        .replace_frontends(&frontends_yaml(&[many(ports)]))
        .expect("replace the frontends file");
}

#[test]
fn a_frontend_back_within_its_quarantine_takes_its_own_slot_and_no_other_frontend_does() {
    require_privileges!();
    let node = SimNode::new();
    let _upstream = start_upstream(&node);
    lb_ports(&node, 8);
    let a: Vec<u16> = (FIRST_PORT..FIRST_PORT + 4).collect();
    let b: Vec<u16> = (FIRST_PORT + 4..FIRST_PORT + 8).collect();
    let agent = Agent::start_with(&node, &[many(a.clone())], &["--kernel-path", "off"]);
    let first = slots_once_active(&node, &a);
    // A goes away: its slots retire, held for their quarantine. B comes: it must not
    // be given a slot A's clients may still be sent to.
    replace_frontends(&agent, b.clone());
    let of_b = slots_once_active(&node, &b);
    for (port, slot) in &of_b {
        assert!(
            !first.values().any(|s| s == slot),
            "{port} took {slot}, a slot of a retired frontend still in its quarantine: A {first:?}, B {of_b:?}"
        );
    }
    // A comes back within the quarantine: each of its frontends takes its own slot
    // again (what clients already sent there expect), and B keeps its own.
    let both: Vec<u16> = a.iter().chain(&b).copied().collect();
    replace_frontends(&agent, both.clone());
    let again = slots_once_active(&node, &both);
    for (port, slot) in &first {
        assert_eq!(
            again.get(port),
            Some(slot),
            "{port} came back to another slot: before {first:?}, now {again:?}"
        );
    }
    for (port, slot) in &of_b {
        assert_eq!(again.get(port), Some(slot), "{port} moved: {again:?}");
    }
    // And every one of them relays to its own LB port.
    let mut pod = each_from_pod(&node, 0, &targets(both.into_iter()));
    let got = summary(&pod.line());
    assert_eq!(count(&got, "ok"), 8, "{got:?}\n{}", agent.log());
    assert_eq!(count(&got, "misrouted"), 0, "{got:?}");
}
