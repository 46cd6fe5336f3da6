//! What an agent that cannot reach the API server at start does with the datapath
//! an earlier agent left (SECURITY.md): it cannot tell a deleted Service's frontend
//! from a live one, so it vouches for none of them. It does not beat the adopted
//! heartbeat until it has applied what the API lists: the earlier agent's frontends
//! live on that agent's last beat and go as before hairpin at its TTL, as with no
//! agent at all. Once the API answers, the Services that exist are proxied again and
//! a deleted one's frontend never comes back. An outage after the first list drops
//! nothing.
//!
//! Bounded: a TTL of 8 s; about 40 s in all.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::Agent,
    client::{from_pod, url},
    fakeapi::{FakeApi, digitalocean_service},
    node::{POD_IP4, SimNode},
    require_privileges,
    servers::start_nginx,
    wait::wait_until,
};
use nix::sys::signal::Signal;
use serde_json::json;

/// The heartbeat's TTL for both agents.
const TTL: Duration = Duration::from_secs(8);

const FLAGS: &[&str] = &["--kernel-path", "off", "--datapath-ttl", "8s"];

/// Whether the pod's connection to `lb`:80 got hairpin's header naming the pod.
fn proxied(node: &SimNode, lb: &str) -> bool {
    let reply = from_pod(node, &url(lb, 80, "/"));
    reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:"))
}

/// Whether the pod's connection to `lb`:80 went as before hairpin: to the ingress,
/// which expects a header and closes the connection without one (curl 52).
fn as_before_hairpin(node: &SimNode, lb: &str) -> bool {
    from_pod(node, &url(lb, 80, "/")).code == 52
}

/// The fake API server stands in for the cluster's: a real API server cannot be
/// made unreachable on cue between two steps of a test.
#[test]
fn an_agent_that_cannot_list_services_at_start_keeps_no_deleted_services_frontend_past_the_ttl() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    let kubeconfig = api.node_kubeconfig(&node);
    api.apply(digitalocean_service());
    let mut gone = digitalocean_service();
    gone["metadata"]["name"] = json!("shop");
    gone["metadata"]["namespace"] = json!("shop");
    gone["metadata"]["uid"] = json!("uid-shop");
    gone["metadata"]["annotations"] = json!({"hairpin.dev/proxy-protocol": "v2"});
    gone["spec"]["ports"] =
        json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]);
    gone["status"]["loadBalancer"]["ingress"][0]["ip"] = json!("203.0.113.12");
    api.apply(gone.clone());

    let mut first = Agent::start_kube(&node, &kubeconfig, FLAGS);
    first.wait_for_log("agent ready", Duration::from_secs(20));
    for lb in ["203.0.113.10", "203.0.113.12"] {
        assert!(
            wait_until(Duration::from_secs(10), || proxied(&node, lb)).is_some(),
            "{lb} not proxied by the first agent\n{}",
            first.log()
        );
    }
    // The first agent dies; its datapath stays pinned. While no agent runs, the
    // shop's Service is deleted and the API server becomes unreachable.
    first.signal(Signal::SIGKILL);
    first.wait(Duration::from_secs(10));
    let killed = Instant::now();
    api.delete(&gone);
    api.set_down(true);

    let mut second = Agent::start_kube(&node, &kubeconfig, FLAGS);
    // Within the first agent's TTL the adopted datapath still serves (the second
    // agent's relay answers its slots).
    assert!(
        wait_until(Duration::from_secs(3), || proxied(&node, "203.0.113.10")).is_some(),
        "within the TTL\n{}",
        second.log()
    );
    assert!(
        killed.elapsed() < TTL,
        "the checks took too long for the TTL"
    );
    // Past it, with the Services still unlisted: as before hairpin, the deleted
    // Service's frontend first of all (on the old code the second agent beat the
    // heartbeat and kept it relayed for as long as the API stayed away).
    std::thread::sleep(TTL.saturating_sub(killed.elapsed()) + Duration::from_secs(1));
    assert!(
        as_before_hairpin(&node, "203.0.113.12"),
        "the deleted Service's frontend is still redirected {:?} after the last agent that \
         listed Services died\n{}",
        killed.elapsed(),
        second.log()
    );
    assert!(as_before_hairpin(&node, "203.0.113.10"));

    // The API server answers: the Service that exists is proxied again, the deleted
    // one's frontend is gone for good.
    api.set_down(false);
    second.wait_for_log("agent ready", Duration::from_secs(40));
    assert!(
        wait_until(Duration::from_secs(10), || proxied(&node, "203.0.113.10")).is_some(),
        "not proxied once the API answered\n{}",
        second.log()
    );
    assert!(as_before_hairpin(&node, "203.0.113.12"));

    // An outage after the first list drops nothing: past the TTL, still proxied.
    api.set_down(true);
    std::thread::sleep(TTL + Duration::from_secs(2));
    assert!(
        proxied(&node, "203.0.113.10"),
        "an outage after the first list dropped a live Service's frontend\n{}",
        second.log()
    );
    api.set_down(false);
    second.stop();
}
