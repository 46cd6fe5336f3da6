//! Name routing on a simulated node: the agent's name relay routes by TLS SNI and
//! HTTP Host to two LoadBalancers, and its /etc/hosts block is read by a real
//! resolver in a private mount namespace. Each assertion carries the backend's
//! body (which echoes the PROXY header) as evidence.
//!
//! One test binary, a module per concern: `hosts_block` (the managed hosts block and
//! the name caps), `routing` (SNI and Host routing from the node, pods and Gateway
//! routes), `ports` (the names ports held by others and later wildcard binds).

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::{Agent, FrontendSpec, NAMES_UNDER_EXAMPLE_COM, spec},
    cli::{admin_socket, doctor_check, run_cli},
    fakeapi::{FakeApi, digitalocean_service, recorded},
    load::Helper,
    names_support::{
        curl_resolved_from_pod, lbs_with_tls, node_with_hosts, sh_with_hosts_file, start_tls_nginx,
    },
    node::{NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, RELAY_IP4, SimNode},
    require_privileges,
    servers::{Server, start_haproxy, start_nginx},
    sh::run_in,
};

/// Two LBs, each with its own names: ingress-nginx (v1) and "haproxy" (v2).
const FRONTENDS_WITH_HOSTS: &str = "frontends:
- ip: \"203.0.113.10\"
  ports: [80, 443]
  proxyProtocol: v1
  name: ingress-nginx
  hosts: [a.example.com, \"*.apps.example.com\"]
- ip: \"203.0.113.11\"
  ports: [80, 443]
  proxyProtocol: v2
  name: haproxy
  hosts: [b.example.com]
";

/// Starts the agent, then gives it the names through a reload of its frontends
/// file (the path the static source takes on every edit).
fn agent_with_names(node: &SimNode, extra: &[&str], ready: &str) -> Agent {
    // `both`: these tests exercise the name relay beside eBPF; `auto` (the default)
    // runs it only where the programs cannot attach (see tests/modes.rs).
    agent_with_names_in(node, "both", extra, ready)
}

/// As [`agent_with_names`], in `mode`.
fn agent_with_names_in(node: &SimNode, mode: &str, extra: &[&str], ready: &str) -> Agent {
    let specs = [
        FrontendSpec {
            ip: "203.0.113.10",
            ports: vec![80, 443],
            version: "v1",
        },
        FrontendSpec {
            ip: "203.0.113.11",
            ports: vec![80, 443],
            version: "v2",
        },
    ];
    // The names are under example.com: list it, as an operator would.
    let mut args = vec!["--mode", mode, "--names-domains", "example.com"];
    args.extend_from_slice(extra);
    let mut agent = Agent::start_with(node, &specs, &args);
    fs::write(&agent.frontends, FRONTENDS_WITH_HOSTS).expect("write frontends with hosts");
    agent.wait_for_log(ready, Duration::from_secs(10));
    agent
}

/// Bytes of a node's hosts file that hairpin must keep exactly, including a last
/// line without a newline and a byte that is not UTF-8.
const NODE_HOSTS: &[u8] =
    b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n# kubelet-managed below\n10.9.9.9 keep-me \xe9\n192.0.2.1\tnode-1";

/// A node with both LBs served (plain nginx, and TLS for the names on :443) and its
/// hosts file holding [`NODE_HOSTS`]: the node, the servers and the file.
fn node_with_tls_and_hosts() -> (SimNode, Server, Server, PathBuf) {
    let node = SimNode::with_lbs(&lbs_with_tls());
    let nginx = start_nginx(&node);
    let tls = start_tls_nginx(&node);
    let hosts = node.dir.join("hosts");
    fs::write(&hosts, NODE_HOSTS).expect("write hosts");
    (node, nginx, tls, hosts)
}

/// Runs `script` as a host process whose resolver reads `hosts`; its `count` lines
/// of output, the run having succeeded (else the agent's and TLS server's logs).
fn host_lines(
    node: &SimNode,
    hosts: &Path,
    script: &str,
    count: usize,
    (agent, tls): (&Agent, &Server),
) -> Vec<String> {
    let got = sh_with_hosts_file(node, hosts, script);
    assert!(
        got.ok(),
        "{got:?}\nagent:\n{}\ntls:\n{}",
        agent.log(),
        tls.log()
    );
    let lines: Vec<String> = got.body.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), count, "{}", got.body);
    lines
}

/// Asserts that `line`, what a backend echoed, names the node's IP as the true
/// client (after `prefix`, the TLS server's own) and `dst` as the LB.
fn assert_from_node(line: &str, prefix: &str, dst: &str) {
    assert!(
        line.starts_with(&format!("{prefix}client={NODE_IP4}:")) && line.ends_with(dst),
        "a host process -> the node IP as the PROXY source, to {dst}: {line}"
    );
}

mod hosts_block;
mod ports;
mod routing;
