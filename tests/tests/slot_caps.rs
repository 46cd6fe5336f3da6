//! The relay's slots under churn (SECURITY.md): a retired frontend keeps its slot
//! for three minutes, so fresh (IP, port) pairs fill the slots while the old ones
//! wait out their quarantine. One namespace churning must not make another
//! namespace's new frontends fail, and a full slot space must not fail the frontends
//! the kernel path serves, which need a slot only for the sockets it cannot take.
//!
//! Both cases shrink the slots map (`--max-frontends 16`: 32 slots) so it fills with
//! a few dozen frontends; real programs, real relay, nginx behind the LB.
//! The Services come from the fake API server (the simulated node has no API
//! server of its own); the kernel-path case uses the frontends file.

use std::time::Duration;

use hairpin_tests::{
    agent::{Agent, status},
    client::{from_pod, url},
    fakeapi::{FakeApi, digitalocean_service},
    node::{POD_IP4, SimNode},
    require_privileges,
    servers::start_nginx,
    wait::wait_until,
};
use serde_json::{Value, json};

/// `/status`'s entry for `ip:port`: its state and reason.
fn frontend(node: &SimNode, ip: &str, port: u16) -> Option<(String, String)> {
    let s = status(node);
    s["frontends"].as_array()?.iter().find_map(|f| {
        (f["ip"] == ip && f["port"] == port).then(|| {
            (
                f["state"].as_str().unwrap_or_default().to_string(),
                f["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

/// A LoadBalancer Service `name` in namespace `ns` at `ip` with `ports`, PROXY v1.
fn service(ns: &str, name: &str, ip: &str, ports: &[u16]) -> Value {
    let mut svc = digitalocean_service();
    svc["metadata"]["name"] = json!(name);
    svc["metadata"]["namespace"] = json!(ns);
    svc["metadata"]["uid"] = json!(format!("uid-{ns}-{name}"));
    svc["metadata"]["annotations"] = json!({"hairpin.dev/proxy-protocol": "v1"});
    svc["spec"]["ports"] = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "port": p, "protocol": "TCP", "targetPort": 80}))
        .collect();
    svc["status"]["loadBalancer"]["ingress"][0]["ip"] = json!(ip);
    svc
}

/// Issue: one namespace changing its Service's ports every few seconds filled every
/// slot through the quarantine, and every other namespace's new frontends failed.
/// Now a namespace's retired slots count against its cap (twice
/// `--max-frontends-per-namespace`): the churn waits for its own slots.
#[test]
fn one_namespace_churning_ports_through_the_quarantine_leaves_another_namespaces_new_frontends_live()
 {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    let kubeconfig = api.node_kubeconfig(&node);
    api.apply(service(
        "churn",
        "churn",
        "203.0.113.11",
        &[2001, 2002, 2003, 2004],
    ));
    let mut agent = Agent::start_kube(
        &node,
        &kubeconfig,
        &[
            "--kernel-path",
            "off",
            "--max-frontends",
            "16",
            "--max-frontends-per-namespace",
            "4",
        ],
    );
    agent.wait_for_log("agent ready", Duration::from_secs(20));
    // Eight rounds of four fresh ports: 32 slots on the old code, all of the map.
    for round in 1..=8u16 {
        let ports: Vec<u16> = (1..=4).map(|i| 2000 + 10 * round + i).collect();
        api.apply(service("churn", "churn", "203.0.113.11", &ports));
        let seen = wait_until(Duration::from_secs(10), || {
            ports
                .iter()
                .all(|p| frontend(&node, "203.0.113.11", *p).is_some())
        });
        assert!(seen.is_some(), "round {round} not applied\n{}", agent.log());
    }
    let (state, reason) = frontend(&node, "203.0.113.11", 2081).expect("the last round's");
    assert_eq!(state, "failed", "past its cap of slots: {reason}");
    assert!(
        reason.contains("namespace churn holds 8 relay slots"),
        "{reason}"
    );
    // Another namespace's new Service: live, relayed, the pod's header right.
    api.apply(service(
        "ingress-nginx",
        "ingress-nginx-controller",
        "203.0.113.10",
        &[80, 443],
    ));
    let live = wait_until(Duration::from_secs(10), || {
        frontend(&node, "203.0.113.10", 80).is_some_and(|(s, _)| s == "active")
    });
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        live.is_some(),
        "another namespace's frontend: {:?}\n{}",
        frontend(&node, "203.0.113.10", 80),
        agent.log()
    );
    assert!(
        reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
        "{reply:?}"
    );
    agent.stop();
}

/// Issue: a kernel-path frontend was made live only after a slot was bound, so a
/// full slot space failed it too. Now it goes live without a slot (only the sockets
/// the kernel path cannot take need one) and the kernel writes its header.
#[test]
fn a_kernel_path_frontend_goes_live_while_every_slot_is_taken() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let relayed = |ports: std::ops::RangeInclusive<u16>| -> String {
        ports
            .map(|p| {
                format!(
                    "- ip: \"203.0.113.11\"\n  ports: [{p}]\n  proxyProtocol: v1\n  path: relay\n"
                )
            })
            .collect()
    };
    let mut agent = Agent::start_with_frontends_yaml(
        &node,
        &format!("frontends:\n{}", relayed(2001..=2016)),
        &["--kernel-path", "auto", "--max-frontends", "16"],
    );
    let wait_active = |ip: &str, port: u16| {
        wait_until(Duration::from_secs(10), || {
            frontend(&node, ip, port).is_some_and(|(s, _)| s == "active")
        })
    };
    assert!(
        wait_active("203.0.113.11", 2016).is_some(),
        "{}",
        agent.log()
    );
    // Sixteen others: the first sixteen's slots are in their quarantine, all 32 taken.
    agent
        .replace_frontends(&format!("frontends:\n{}", relayed(3001..=3016)))
        .expect("write the file");
    assert!(
        wait_active("203.0.113.11", 3016).is_some(),
        "{}",
        agent.log()
    );
    // One of them makes room in the frontends map for a kernel-path frontend.
    agent
        .replace_frontends(&format!(
            "frontends:\n{}- ip: \"203.0.113.10\"\n  ports: [80]\n  proxyProtocol: v1\n",
            relayed(3001..=3015)
        ))
        .expect("write the file");
    let live = wait_active("203.0.113.10", 80);
    let seen = frontend(&node, "203.0.113.10", 80);
    assert!(live.is_some(), "{seen:?}\n{}", agent.log());
    let (_, reason) = seen.expect("listed");
    assert!(
        reason.contains("no relay slot for the sockets the kernel path cannot take"),
        "{reason}"
    );
    let s = status(&node);
    let entry = s["frontends"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["ip"] == "203.0.113.10"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry["listener"], Value::Null, "{entry}");
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
        "the kernel writes the header: {reply:?}\n{}",
        agent.log()
    );
    agent.stop();
}
