//! `cargo xtask demo`: builds a simulated node, shows a pod's and the node's request
//! to the cluster's own PROXY-protocol LoadBalancer failing without hairpin and
//! succeeding with it, with nginx's log naming the true client, then cleans up.
//!
//! `--cluster` (`cargo xtask demo --cluster`): the same on a real control plane and
//! real kube-proxy (hairpin_tests::cluster::demo), held until Ctrl-C so it can be
//! looked at with kubectl, then torn down.

use std::time::Duration;

use hairpin_tests::{
    agent::{Agent, spec},
    client::{Reply, from_host, from_pod, url},
    node::{NODE_IP4, POD_IP4, SimNode},
    servers::{nginx_access_log, nginx_error_log, start_nginx},
};

const LB: &str = "203.0.113.10";

fn show(who: &str, reply: &Reply) {
    if reply.ok() {
        println!("  {who:<5} -> 200, body: {}", reply.body.trim_end());
    } else {
        println!(
            "  {who:<5} -> curl exit {} ({})",
            reply.code,
            reply.stderr.trim_end()
        );
    }
}

/// nginx quotes the bytes it could not parse, CR and LF included: show the last
/// `broken header` entry on one line, escaped.
fn broken_header_entry(log: &str) -> String {
    let Some(start) = log.rfind("broken header") else {
        return "(none)".into();
    };
    let rest = &log[start..];
    let end = rest
        .find("while reading PROXY protocol")
        .map_or(rest.len(), |i| i + 28);
    rest[..end].replace('\r', "\\r").replace('\n', "\\n")
}

/// `--cluster`: runs the demo on the real components and waits for Ctrl-C (or
/// SIGTERM) before tearing it down; exits 1 when the requests were not as expected.
fn cluster_demo() {
    use nix::sys::signal::{SigSet, Signal};
    // Blocked before any thread starts (they inherit the mask), so the signal is
    // taken by the wait below and the teardown runs in full.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    if let Err(e) = signals.thread_block() {
        eprintln!("cannot block SIGINT and SIGTERM: {e}");
        std::process::exit(1);
    }
    let outcome = hairpin_tests::cluster::demo::run(|_| {
        println!("\nRunning. Press Ctrl-C to stop the agent, kube-proxy and the control plane.");
        if let Err(e) = signals.wait() {
            eprintln!("waiting for Ctrl-C: {e}");
        }
    });
    match outcome {
        Some(o) if o.ok => {
            println!("hairpin works: the ingress saw the pod's and the node's real addresses.");
        }
        Some(_) => {
            eprintln!("the demo did not get the expected replies; see above");
            std::process::exit(1);
        }
        None => {
            eprintln!("the real Kubernetes components are missing: run `cargo xtask k8s`");
            std::process::exit(1);
        }
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("the demo builds network namespaces and attaches BPF programs: run it as root");
        std::process::exit(1);
    }
    if std::env::args().skip(1).any(|a| a == "--cluster") {
        cluster_demo();
        return;
    }
    println!("Building a simulated node:");
    println!(
        "  pod {POD_IP4} --veth-- node {NODE_IP4} --veth-- ingress pod (nginx, listen 80 proxy_protocol)"
    );
    println!(
        "  kube-proxy-style DNAT: LoadBalancer {LB}:80 -> ingress:80 (PREROUTING and OUTPUT)\n"
    );
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let target = url(LB, 80, "/");

    println!("1. Without hairpin, curl {target}:");
    show("pod", &from_pod(&node, &target));
    show("node", &from_host(&node, &target));
    println!(
        "  nginx error.log: {}\n",
        broken_header_entry(&nginx_error_log(&node))
    );

    println!("2. With hairpin-agent running (frontend {LB}:80, PROXY v1):");
    let mut agent = Agent::start(&node, &[spec(LB, "v1")]);
    let pod = from_pod(&node, &target);
    let host = from_host(&node, &target);
    show("pod", &pod);
    show("node", &host);
    let access = nginx_access_log(&node);
    println!("  nginx access.log:");
    for line in access.lines() {
        println!("    {line}");
    }
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let _ = agent.wait(Duration::from_secs(30));

    let ok = pod.ok() && host.ok() && pod.body.contains(POD_IP4) && host.body.contains(NODE_IP4);
    drop(node);
    println!("\nCleaned up the simulated node.");
    if ok {
        println!("hairpin works: the ingress saw the pod's and the node's real addresses.");
    } else {
        eprintln!("the demo did not get the expected replies; see above");
        std::process::exit(1);
    }
}
