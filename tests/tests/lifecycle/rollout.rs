//! The DaemonSet's shape: its capabilities alone tell MPTCP apart, a rollout
//! keeps the datapath, and the DaemonSet's deletion removes it with its addresses.

use super::*;

#[test]
fn with_only_the_daemonsets_capabilities_mptcp_is_told_apart_and_relayed_with_its_true_address() {
    require_privileges!();
    let node = SimNode::new();
    assert!(
        mptcp_enabled(&node.pod_ns),
        "this kernel must have MPTCP enabled"
    );
    let _nginx = start_nginx(&node);
    let agent = CappedAgent::start(&node, &all_frontends(), DEFAULTS, &DAEMONSET_CAPS);
    let s = status(&node);
    assert_eq!(
        s["kernel_path"]["mptcp_detection"],
        "notsent_lowat",
        "{s}\n{}",
        agent.log()
    );
    for (lb, ip) in [("203.0.113.10", POD_IP4), ("2001:db8:ffff::10", POD_IP6)] {
        let out = mptcp_from_pod(&node, lb);
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            body.starts_with(&format!("client={ip}:"))
                && body.trim().ends_with(&format!("dst={lb}:80")),
            "MPTCP -> {lb}: {body}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
    }
    let s = status(&node);
    let counter = |name: &str| s["counters"]["kernel"][name].as_u64().unwrap_or(0);
    assert_eq!(counter("kernel_fallback_mptcp"), 2, "{s}");
    assert_eq!(counter("kernel_missed_insert"), 0, "{s}");
    // A plain TCP socket reads TCP_NOTSENT_LOWAT 0: it keeps the kernel path.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
        "{reply:?}"
    );
    let s = status(&node);
    assert_eq!(
        s["counters"]["kernel"]["kernel_headers_written"].as_u64(),
        Some(1),
        "{s}"
    );
}

/// The relays' listen addresses in the node namespace (on `lo` here: this kernel has
/// no dummy link type for `hairpin0`).
fn listen_addresses_on_the_node(node: &SimNode) -> String {
    let out = hairpin_tests::sh::output_in(&node.node_ns, None, &["ip", "-o", "addr", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("169.254.104.1") || l.contains("fd68:6169:7270:696e::1"))
        .collect::<Vec<_>>()
        .join("\n")
}

// Fake API: the DaemonSet's rollout and deletion with no kubelet to run its pods (the kubelet suite runs the real one).
#[test]
fn a_rollout_keeps_the_datapath_and_the_daemonsets_deletion_removes_it_with_its_addresses() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = hairpin_tests::fakeapi::FakeApi::start_in_netns(&node.node_ns);
    let kubeconfig = api.node_kubeconfig(&node);
    // ingress-nginx on DigitalOcean with the PROXY protocol on; LB IP 203.0.113.10.
    api.apply(digitalocean_service());
    api.put_daemonset(recorded("daemonsets/hairpin.yaml"));
    let flags = [
        "--kernel-path",
        "auto",
        "--daemonset",
        "hairpin-system/hairpin",
    ];
    let mut agent = Agent::start_kube(&node, &kubeconfig, &flags);
    ready(&mut agent);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);

    // A rollout: the DaemonSet stays, so SIGTERM keeps everything for the next agent.
    agent.stop();
    assert!(agent.log().contains("datapath kept"), "{}", agent.log());
    assert!(!attached(&node).is_empty());
    assert!(!listen_addresses_on_the_node(&node).is_empty());
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client(
        "pod, between agents",
        &reply,
        POD_IP4,
        "203.0.113.10",
        &agent,
    );

    // The next agent adopts it; then the DaemonSet is deleted (its deletion done: a
    // 404) and the agent gets its SIGTERM.
    let mut agent = Agent::start_kube(&node, &kubeconfig, &flags);
    ready(&mut agent);
    api.remove_daemonset("hairpin-system/hairpin");
    agent.stop();
    let log = agent.log();
    assert!(
        log.contains("datapath removed") && log.contains("uninstalled"),
        "{log}"
    );
    // Nothing attached, nothing pinned, no listen address: traffic as before hairpin.
    assert!(attached(&node).is_empty(), "{:?}", attached(&node));
    let pins: Vec<_> = std::fs::read_dir(node.pin_dir())
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(pins.is_empty(), "pins left: {pins:?}");
    assert_eq!(listen_addresses_on_the_node(&node), "", "{log}");
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(reply.code, 52, "pre-hairpin behaviour: {reply:?}");
}
