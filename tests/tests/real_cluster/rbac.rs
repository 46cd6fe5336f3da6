//! RBAC for real: the agent with exactly the chart's permissions is what every other
//! test here runs; with one rule taken out of the chart's ClusterRole, the real
//! authorizer refuses the call and the agent's log names the permission, and the
//! agent never reports ready.

use std::time::Duration;

use hairpin_tests::{agent::admin_get, node::KubeProxyMode};

use crate::RealNode;

#[test]
fn a_permission_removed_from_the_chart_is_named_in_the_agents_error() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Iptables) else {
        return;
    };
    let agent = rn.spawn_agent(&[], |objects| {
        let role = objects
            .iter_mut()
            .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "hairpin")
            .expect("the chart's ClusterRole");
        let rules = role["rules"].as_array_mut().expect("rules");
        let before = rules.len();
        rules.retain(|r| !r["resources"].to_string().contains("\"services\""));
        assert_eq!(rules.len(), before - 1, "one rule grants services");
    });
    agent.wait_for_log("cannot list resource", Duration::from_secs(30));
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("cannot list resource"))
        .expect("the refusal");
    assert!(
        line.contains("services"),
        "the error names the resource: {line}"
    );
    assert!(
        log.contains("system:serviceaccount:hairpin-system:hairpin"),
        "the error names the account: {log}"
    );
    assert!(!log.contains("agent ready"), "{log}");
    let ready = admin_get(&rn.node, "/readyz");
    assert!(!ready.contains("\"ok\""), "{ready}");
}
