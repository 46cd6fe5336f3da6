//! `--mode` on a simulated node: `fallback` attaches nothing and a host process
//! resolving a name through the managed hosts file reaches nginx through the name
//! relay (on a link-local address put on `lo` by `--names-link`) with the right
//! PROXY header; `auto` is eBPF where it attaches and falls back to the hosts file
//! where it does not, and `status` says which path is live and why. `cleanup`, run
//! as a process on the node, restores the hosts file and removes the address.

use std::{fs, path::Path, time::Duration};

use hairpin_tests::{
    agent::{Agent, FrontendSpec, spec},
    cli::run_cli,
    names_support::{node_with_hosts, sh_with_hosts_file},
    node::{NODE_IP4, RELAY_IP4, SimNode},
    require_privileges,
    sh::run_in,
};
use serde_json::Value;

/// The link-local address the name relay gets (beside node-local-dns's .10).
const NAMES_ADDRESS: &str = "169.254.20.11";

const WITH_HOSTS: &str = "frontends:
- ip: \"203.0.113.10\"
  ports: [80]
  proxyProtocol: v1
  hosts: [a.example.com]
- ip: \"203.0.113.11\"
  ports: [80]
  proxyProtocol: v2
";

const NODE_HOSTS: &[u8] = b"127.0.0.1\tlocalhost\n# node file \xe9\n10.9.9.9 keep-me";

fn specs() -> Vec<FrontendSpec> {
    vec![spec("203.0.113.10", "v1")]
}

/// Starts the agent with `extra`, then gives it a name through a frontends reload.
fn agent_with_names(node: &SimNode, cgroup: &Path, extra: &[&str], wait: &str) -> Agent {
    // a.example.com is published only with its domain listed.
    let mut args = vec!["--names-domains", "example.com"];
    args.extend_from_slice(extra);
    let mut agent = Agent::start_with_cgroup(node, &specs(), cgroup, &args);
    fs::write(&agent.frontends, WITH_HOSTS).expect("write frontends");
    agent.wait_for_log(wait, Duration::from_secs(10));
    agent
}

/// `status --output json`, asserted ready (exit 0) in the `configured` mode with
/// `live` paths; `why` says why it is ready so.
fn status_in_mode(node: &SimNode, configured: &str, live: &[&str], why: &str) -> Value {
    let run = run_cli(node, &["status", "--output", "json"]);
    let s = run.json();
    assert_eq!(run.code, 0, "{why}: {s:#}");
    assert_eq!(s["status"]["mode"]["configured"], configured, "{s:#}");
    assert_eq!(
        s["status"]["mode"]["live"],
        serde_json::json!(live),
        "{s:#}"
    );
    s
}

fn frontend<'a>(s: &'a Value, ip: &str) -> &'a Value {
    s["status"]["frontends"]
        .as_array()
        .expect("frontends")
        .iter()
        .find(|f| f["ip"] == ip)
        .unwrap_or_else(|| panic!("no frontend {ip}: {s:#}"))
}

/// A host process resolves `a.example.com` through `hosts` and fetches it.
fn fetch_by_name(node: &SimNode, hosts: &Path, agent: &Agent) -> String {
    let got = sh_with_hosts_file(
        node,
        hosts,
        "getent hosts a.example.com && curl -sS --max-time 10 http://a.example.com/",
    );
    assert!(got.ok(), "{got:?}\nagent:\n{}", agent.log());
    got.body
}

#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario on one simulated node, read in order"
)]
#[test]
fn fallback_mode_attaches_nothing_and_names_reach_the_lb_through_the_name_relay() {
    require_privileges!();
    let (node, _nginx, hosts) = node_with_hosts(NODE_HOSTS);
    // What the agent writes, and so what `cleanup` is told to undo.
    let written = [
        "--hosts-file",
        hosts.to_str().expect("utf-8 path"),
        "--names-link",
        "lo",
        "--names-address",
        NAMES_ADDRESS,
    ];
    let mut agent = agent_with_names(
        &node,
        &node.cgroup,
        &[&["--mode", "fallback"], written.as_slice()].concat(),
        "hosts file updated",
    );
    let attached = node.attached_programs();
    assert!(
        !attached.contains("connect"),
        "fallback attaches nothing: {attached}"
    );
    assert!(
        agent.log().contains("--mode fallback: no programs loaded"),
        "{}",
        agent.log()
    );
    let lo = run_in(&node.node_ns, &["ip", "-4", "addr", "show", "dev", "lo"]);
    assert!(lo.contains(&format!("{NAMES_ADDRESS}/32")), "{lo}");

    let body = fetch_by_name(&node, &hosts, &agent);
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [NAMES_ADDRESS, "a.example.com"],
        "{body}"
    );
    assert!(
        lines[1].starts_with(&format!("client={NODE_IP4}:")),
        "host process -> the node IP as PROXY source: {body}"
    );
    assert!(lines[1].ends_with("dst=203.0.113.10:80"), "{body}");

    let s = status_in_mode(&node, "fallback", &["hosts"], "ready without programs");
    assert!(s["status"]["attachment"].is_null(), "{s:#}");
    let named = frontend(&s, "203.0.113.10");
    assert_eq!(named["path"], "hosts", "{s:#}");
    assert_eq!(named["state"], "fallback", "{s:#}");
    assert_eq!(named["listener"], format!("{NAMES_ADDRESS}:80"), "{s:#}");
    let unnamed = frontend(&s, "203.0.113.11");
    assert_eq!(unnamed["path"], "none", "{s:#}");
    assert_eq!(unnamed["state"], "failed", "{s:#}");
    assert_eq!(
        s["status"]["names"]["link_note"],
        format!("added {NAMES_ADDRESS} to lo"),
        "{s:#}"
    );
    // Without programs the names ports go through the agent's own nftables table:
    // nothing binds NAMES_ADDRESS:80 itself (see names.rs for a later 0.0.0.0 bind).
    assert!(
        s["status"]["names"]["redirect"]
            .as_str()
            .is_some_and(|r| r.contains("nftables")),
        "{s:#}"
    );
    let table = run_in(&node.node_ns, &["nft", "list", "table", "ip", "hairpin"]);
    assert!(
        table.contains(&format!(
            "ip daddr {NAMES_ADDRESS} tcp dport 80 dnat to {NAMES_ADDRESS}:"
        )),
        "{table}"
    );

    // SIGTERM keeps the block and the address for the next agent...
    agent.stop();
    assert_ne!(fs::read(&hosts).expect("read"), NODE_HOSTS);
    // ...`cleanup` removes both, and a second run finds nothing and still exits 0.
    let args = [
        &["cleanup"],
        written.as_slice(),
        &[
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--output",
            "json",
        ],
    ]
    .concat();
    let first = run_cli(&node, &args);
    assert_eq!(first.code, 0, "{first:?}");
    let report = first.json();
    let steps = |field: &str| -> Vec<&str> {
        report["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|s| s[field].as_str().unwrap_or(""))
            .collect()
    };
    let (outcomes, names) = (steps("outcome"), steps("name"));
    // The hosts block, the relays' four listen addresses (the agent's defaults, two
    // per family: the listener's and one more for slots; on lo here), the names address, the names ports' nftables table (ip; no ip6), no pinned
    // map (the kernel path was off); the
    // Lease needs the API.
    assert_eq!(
        names,
        [
            "hosts",
            "listen-address",
            "listen-address",
            "listen-address",
            "listen-address",
            "names-address",
            "names-nat",
            "names-nat",
            "pinned-maps",
            "lease"
        ],
        "{report:#}"
    );
    assert_eq!(
        outcomes,
        [
            "removed", "removed", "removed", "removed", "removed", "removed", "removed", "absent",
            "absent", "skipped"
        ],
        "{report:#}"
    );
    let tables = run_in(&node.node_ns, &["nft", "list", "tables"]);
    assert!(!tables.contains("hairpin"), "{tables}");
    assert_eq!(fs::read(&hosts).expect("read"), NODE_HOSTS, "byte for byte");
    let lo = run_in(&node.node_ns, &["ip", "-4", "addr", "show", "dev", "lo"]);
    assert!(
        !lo.contains(NAMES_ADDRESS) && !lo.contains(RELAY_IP4),
        "{lo}"
    );
    let again = run_cli(&node, &args);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        again.json()["steps"][0]["outcome"],
        "absent",
        "{}",
        again.stdout
    );
    assert_eq!(
        again.json()["steps"][1]["outcome"],
        "absent",
        "{}",
        again.stdout
    );
}

#[test]
fn auto_mode_is_ebpf_where_it_attaches_and_leaves_the_hosts_file_alone() {
    require_privileges!();
    let node = SimNode::new();
    let hosts = node.dir.join("hosts");
    fs::write(&hosts, NODE_HOSTS).expect("write hosts");
    let hosts_arg = hosts.to_str().expect("utf-8 path");
    let agent = agent_with_names(
        &node,
        &node.cgroup,
        &["--hosts-file", hosts_arg],
        "reconcile finished frontends=2",
    );
    let s = status_in_mode(&node, "auto", &["ebpf"], "ready with the programs");
    let reason = s["status"]["mode"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains("programs attached"), "{reason}");
    assert_eq!(frontend(&s, "203.0.113.10")["path"], "ebpf", "{s:#}");
    assert!(node.attached_programs().contains("hairpin_connect4"));
    assert_eq!(
        fs::read(&hosts).expect("read"),
        NODE_HOSTS,
        "{}",
        agent.log()
    );
}

#[test]
fn auto_mode_falls_back_to_the_hosts_file_when_attach_fails_and_says_why() {
    require_privileges!();
    let (node, _nginx, hosts) = node_with_hosts(NODE_HOSTS);
    let hosts_arg = hosts.to_str().expect("utf-8 path");
    // A plain directory is not a cgroup: the attach fails.
    let not_a_cgroup = node.dir.join("not-a-cgroup");
    fs::create_dir_all(&not_a_cgroup).expect("dir");
    // This kernel has no dummy link type: the address goes on lo, with a warning.
    let agent = agent_with_names(
        &node,
        &not_a_cgroup,
        &[
            "--hosts-file",
            hosts_arg,
            "--names-link",
            "hairpin0",
            "--names-address",
            NAMES_ADDRESS,
        ],
        "hosts file updated",
    );
    assert!(
        agent.log().contains("eBPF could not be used on this node"),
        "{}",
        agent.log()
    );
    assert!(!node.attached_programs().contains("connect"));
    let body = fetch_by_name(&node, &hosts, &agent);
    assert!(body.contains("dst=203.0.113.10:80"), "{body}");

    let s = status_in_mode(&node, "auto", &["hosts"], "ready on the hosts file");
    let reason = s["status"]["mode"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains("eBPF could not be used"), "{reason}");
    assert!(
        reason.contains("not-a-cgroup"),
        "the attach error names the cgroup: {reason}"
    );
    assert!(reason.contains("falling back"), "{reason}");
    assert_eq!(frontend(&s, "203.0.113.10")["path"], "hosts", "{s:#}");
    let note = s["status"]["names"]["link_note"].as_str().unwrap_or("");
    let made_dummy = run_in(&node.node_ns, &["ip", "link", "show"]).contains("hairpin0");
    if made_dummy {
        assert!(note.contains("created dummy link hairpin0"), "{note}");
    } else {
        assert!(
            note.contains("no dummy link type") && note.contains("to lo"),
            "{note}"
        );
    }
    let text = run_cli(&node, &["status"]);
    assert!(
        text.stdout.contains("mode        auto (live: hosts)"),
        "{}",
        text.stdout
    );
}
