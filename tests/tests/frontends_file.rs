//! The frontends file as a running agent reads it: an edit that lists one
//! LoadBalancer address twice is refused with both entries named, and the last good
//! set stays live; the next good edit applies.

use std::time::Duration;

use hairpin_tests::{
    agent::{Agent, FrontendSpec, frontends_yaml, spec},
    cli::cli_status,
    client::{from_pod, url},
    node::{POD_IP4, SimNode},
    require_privileges,
    servers::start_nginx,
    wait::wait_until,
};

/// Replaces the file in one step, as an operator's tooling (or a ConfigMap) does.
fn replace(agent: &Agent, text: &str) {
    agent.replace_frontends(text).expect("replace frontends");
}

#[test]
fn an_address_listed_twice_is_refused_and_the_last_good_set_stays_live() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let v1 = spec("203.0.113.10", "v1");
    let mut agent = Agent::start(&node, std::slice::from_ref(&v1));
    let target = url("203.0.113.10", 80, "/");
    assert!(from_pod(&node, &target).ok(), "live before the bad edit");

    // 203.0.113.10:80 twice: once v1 (as now), once v2.
    let v2 = FrontendSpec {
        ip: "203.0.113.10",
        ports: vec![443, 80],
        version: "v2",
    };
    replace(&agent, &frontends_yaml(&[v1, v2]));
    agent.wait_for_log("keeping the last good frontends", Duration::from_secs(10));
    let log = agent.log();
    let refused = log
        .lines()
        .find(|l| l.contains("keeping the last good frontends"))
        .unwrap_or_default();
    assert!(
        refused.contains(
            "frontends[1].ports[1]: 203.0.113.10:80 is already listed at frontends[0].ports[0]"
        ),
        "{refused}"
    );
    let s = cli_status(&node);
    let source = &s["sources"][0];
    assert!(
        source["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("203.0.113.10:80 is already listed")),
        "{source}"
    );
    assert_eq!(
        source["synced"], true,
        "a bad edit does not unsync: {source}"
    );
    let frontends = s["frontends"].as_array().expect("frontends");
    assert_eq!(frontends.len(), 1, "nothing of the bad edit applied: {s:#}");
    assert_eq!(frontends[0]["port"], 80);
    assert_eq!(frontends[0]["version"], "v1");
    assert_eq!(frontends[0]["state"], "active");
    let reply = from_pod(&node, &target);
    assert!(
        reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
        "the last good set still relays: {reply:?}"
    );

    // The author says which header the address gets: the next edit applies.
    let fixed = spec("203.0.113.10", "v2");
    replace(&agent, &frontends_yaml(&[fixed]));
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = cli_status(&node);
            s["frontends"][0]["version"] == "v2" && s["sources"][0]["last_error"].is_null()
        })
        .is_some(),
        "the good edit was not applied\n{}",
        agent.log()
    );
    assert!(from_pod(&node, &target).ok());
}
