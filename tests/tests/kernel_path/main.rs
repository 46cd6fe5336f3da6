//! The kernel path on a simulated node: with `--kernel-path on`, the connect
//! programs leave the destination alone and the kernel writes the PROXY header on
//! the client's own socket (sock_ops + sk_msg), in front of its first bytes. Real
//! nginx (`listen ... proxy_protocol`) and haproxy (`accept-proxy`) say what the
//! header carried; the relay must see none of these connections.
//!
//! One test binary, a module per concern: `headers` (the header's bytes, v1 and v2,
//! IPv4 and IPv6, as nginx and haproxy read them), `capture` (the raw capture server
//! those tests read with), `survival` (established connections when the agent goes),
//! `status` (status, metrics, counters, the programs' events), `fallbacks` (what is
//! handed to the relay, and why), `fast_open` (TCP Fast Open), `drain` (SIGTERM and
//! sockets not yet written), `pinning` (the pinned datapath's directory and cleanup).

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpListener},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use hairpin_agent::{ProxyVersion, relay::Header};
use hairpin_tests::{
    agent::{
        Agent, CappedAgent, DAEMONSET_CAPS, FrontendSpec, admin_get, all_frontends, spec, status,
    },
    cli::dump_entries,
    client::{
        KeepAlive, Reply, assert_plain_server_answers, assert_true_client, from_host, from_pod,
        mptcp_enabled, mptcp_from_pod, url,
    },
    node::{LbRule, POD_IP4, POD_IP6, SimNode, default_lbs},
    pod::cap_number,
    require_privileges,
    servers::{
        BANNER_PORT, Server, banner_client, banner_server, nginx_access_log, nginx_error_log,
        start_haproxy, start_nginx,
    },
    sh::{command_in, enter_netns},
    wait::eventually,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// The source address of a host process's socket towards the LBs: the node's address
/// on the interface its route to them uses (in the simulated node, the uplink towards
/// the ingress namespace; on a real node, usually its InternalIP). The kernel path
/// names the socket's own address; the relay names `--node-ip` instead.
const NODE_UPLINK4: &str = "198.51.100.1";
/// The same for IPv6.
const NODE_UPLINK6: &str = "2001:db8:2::1";

const KERNEL_PATH_ON: &[&str] = &["--kernel-path", "on"];

fn kernel_counter(status: &Value, name: &str) -> u64 {
    status["counters"]["kernel"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no kernel counter {name}: {}", status["counters"]))
}

/// Every `kernel_missed_*` counter is zero: no connection went without its header.
fn assert_no_misses(status: &Value) {
    let kernel = status["counters"]["kernel"]
        .as_object()
        .expect("kernel counters");
    for (name, n) in kernel {
        if name.starts_with("kernel_missed_") {
            assert_eq!(n.as_u64(), Some(0), "{name}: {kernel:?}");
        }
    }
}

/// Waits until the kernel counter `name` reaches `want`; its last value.
fn wait_counter(node: &SimNode, name: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = kernel_counter(&status(node), name);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the kernel still has map `id`.
fn map_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["map", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// No connect or sock_ops program of a gone agent is attached at the node's cgroup
/// (the kernel releases its links within a second).
fn assert_nothing_attached(node: &SimNode) {
    let mut attached = node.attached_programs();
    for _ in 0..50 {
        if !attached.contains("connect") && !attached.contains("sock_ops") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        attached = node.attached_programs();
    }
    assert!(
        !attached.contains("connect") && !attached.contains("sock_ops"),
        "still attached after the agent went: {attached}"
    );
}

/// A pod connection to 203.0.113.10:80 that is established and never writes (it
/// holds a sockets-map slot until killed).
fn silent_connection(node: &SimNode) -> Child {
    node.spawn_in_pod(&["bash", "-c", "exec 3<>/dev/tcp/203.0.113.10/80; sleep 30"])
}

/// The names of the programs `status` says are attached.
fn program_names(status: &Value) -> Vec<&str> {
    status["attachment"]["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect()
}

/// A simulated node with nginx, and an agent on all its frontends with the kernel
/// path on.
fn kernel_path_node() -> (SimNode, Server, Agent) {
    let node = SimNode::new();
    let nginx = start_nginx(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    (node, nginx, agent)
}

mod capture;
mod drain;
mod fallbacks;
mod fast_open;
mod headers;
mod pinning;
mod status;
mod survival;

use capture::*;
