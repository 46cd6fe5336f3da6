//! `cargo xtask demo --cluster` through its own entry point
//! (`hairpin_tests::cluster::demo::run`, which the demo binary calls): it starts,
//! the requests fail without the agent and carry the true client with it, `kubectl
//! get svc` with the printed kubeconfig lists the LB, and everything is gone after.

use std::time::Duration;

use hairpin_tests::cluster::demo::{self, LB, SERVICE};

#[test]
fn the_cluster_demo_starts_shows_the_header_and_tears_down() {
    if !hairpin_tests::privileges::datapath_tests_can_run(module_path!()) {
        return;
    }
    let mut seen = None;
    let Some(outcome) = demo::run(|d| {
        let svc = d.kubectl(&["get", "svc", "-A", "-o", "wide"]);
        seen = Some((
            d.node.node_ns.clone(),
            d.node.dir.clone(),
            server_address(&d.kubeconfig()),
            svc,
        ));
    }) else {
        return;
    };
    let (netns, dir, server, svc) = seen.expect("the demo held");
    assert!(outcome.ok, "{outcome:?}");
    assert!(
        !outcome.without.0.ok() && !outcome.without.1.ok(),
        "without the agent the PROXY-protocol ingress refuses both: {outcome:?}"
    );
    let svc = svc.expect("kubectl get svc with the demo's kubeconfig");
    let (ns, name) = SERVICE;
    assert!(
        svc.lines()
            .any(|l| l.starts_with(ns) && l.contains(name) && l.contains(LB)),
        "kubectl get svc lists {ns}/{name} with {LB}:\n{svc}"
    );
    // Torn down: the node's namespace and directory are gone, and the API server
    // the kubeconfig names no longer answers.
    let netns_list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        !String::from_utf8_lossy(&netns_list.stdout).contains(&netns),
        "{netns} still exists"
    );
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(
        std::net::TcpStream::connect_timeout(&server, Duration::from_secs(2)).is_err(),
        "the API server's address {server} still accepts connections"
    );
}

/// The `server:` of a kubeconfig the demo wrote (`https://127.0.0.1:PORT`).
fn server_address(kubeconfig: &std::path::Path) -> std::net::SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).expect("the demo's kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no server address in {text}"))
}
