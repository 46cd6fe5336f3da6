//! End to end with the Kubernetes source: a Service appearing in the (recorded, fake)
//! API server's watch stream makes the simulated node's request succeed, and its
//! deletion takes the redirect away again. The convergence time is measured and
//! printed; the target (p99 under one second) is checked by `cargo xtask bench`,
//! not here, so this test asserts only a generous bound.

use std::time::Duration;

use hairpin_tests::{
    agent::Agent,
    client::{from_host, from_pod, url},
    fakeapi::{FakeApi, digitalocean_service},
    node::{NODE_IP4, POD_IP4, SimNode},
    require_privileges,
    servers::{nginx_error_log, start_nginx},
    wait::wait_until,
};

// Fake API: the relay path on the hand-written node rules; the same on the real server and kube-proxy: real_cluster/lb.rs.
#[test]
fn a_service_appearing_in_the_watch_stream_makes_the_request_succeed() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    let kubeconfig = api.node_kubeconfig(&node);
    let mut agent = Agent::start_kube(&node, &kubeconfig, &[]);
    agent.wait_for_log("agent ready", Duration::from_secs(20));

    let target = url("203.0.113.10", 80, "/");
    assert_eq!(
        from_pod(&node, &target).code,
        52,
        "nothing proxied before the Service exists"
    );

    api.apply(digitalocean_service());
    let took = wait_until(Duration::from_secs(10), || from_pod(&node, &target).ok())
        .unwrap_or_else(|| panic!("the request never succeeded\nagent:\n{}", agent.log()));
    eprintln!("convergence (watch event -> pod request succeeds, 20 ms polling): {took:?}");
    let pod = from_pod(&node, &target);
    assert!(
        pod.body.starts_with(&format!("client={POD_IP4}:")),
        "{}",
        pod.body
    );
    let host = from_host(&node, &target);
    assert!(
        host.body.starts_with(&format!("client={NODE_IP4}:")),
        "{}",
        host.body
    );

    // The Lease holder (the only agent here) wrote the decision as an Event.
    let events = api.events();
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Proxied"
                && e["regarding"]["name"] == "ingress-nginx-controller"),
        "{events:#?}"
    );

    api.delete(&digitalocean_service());
    let gone = wait_until(Duration::from_secs(10), || {
        from_pod(&node, &target).code == 52
    })
    .unwrap_or_else(|| panic!("the redirect outlived the Service\nagent:\n{}", agent.log()));
    eprintln!("removal (watch event -> pre-hairpin path): {gone:?}");
    assert!(nginx_error_log(&node).contains("broken header"));
    agent.wait_for_log("frontend retired", Duration::from_secs(5));
}
