//! Issue 22, through the real watch protocol: every Node's addresses are never a
//! LoadBalancer's, and every Node's names (and the API server's) are never
//! published, in the source both binaries run (`k8s::watch_cluster`). A Service
//! whose status names another node's address, or a platform endpoint, beside its
//! real LB: only the real LB is a frontend, each refusal named in the decision.
//! An Ingress under a listed domain claiming another node's name: not routed.
//!
//! Issue 31: what a Node says about itself is its own kubelet's word. One lying
//! Node (a tenant's LB address as its ExternalIP, 0.0.0.0/0 as its pod network, a
//! tenant's host name in its addresses) changes nothing for that LB or name when
//! `--lb-cidrs` names the LoadBalancer ranges, and the passed-over claims are
//! Warning Events on that Node.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use hairpin_agent::{
    k8s::{self, Desired, KubeSource},
    names::{NameScope, NameSkipReason, ScopeRule},
};
use hairpin_tests::{
    fakeapi::{FakeApi, digitalocean_service},
    kube_source::{self, now, until},
};
use serde_json::json;

/// The source both binaries run, watching `api` with `defaults` and publishing
/// names under example.com.
fn watch_names(api: &FakeApi, defaults: k8s::Defaults) -> KubeSource {
    let scope = NameScope::new(&["example.com"], "cluster.local").expect("scope");
    kube_source::start(api, defaults, scope).0
}

/// What `source` sends once it routes `host`.
async fn routed(source: &KubeSource, host: &str) -> Arc<Desired> {
    let mut rx = source.desired.clone();
    until(
        &mut rx,
        Duration::from_secs(10),
        &format!("{host} routed"),
        |s| s.apply.routes.iter().any(|r| r.host.as_str() == host),
    )
    .await;
    now(&rx)
}

/// The LB addresses among the frontends, each once, sorted.
fn frontend_ips(s: &Desired) -> Vec<String> {
    let ips: BTreeSet<String> = s.apply.frontends.iter().map(|f| f.ip.to_string()).collect();
    ips.into_iter().collect()
}

// Fake API: the decision in process, no node; could move to real_cluster (Node objects are plain API writes there).
#[tokio::test]
async fn other_nodes_addresses_and_names_are_refused() {
    let api = FakeApi::start();
    api.put_node(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-2.example.com"},
        "spec": {"podCIDRs": ["10.244.2.0/24"]},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "192.0.2.12"},
            {"type": "ExternalIP", "address": "198.51.100.12"},
            {"type": "Hostname", "address": "w2.example.com"}]}}));
    let mut svc = digitalocean_service();
    // The real LB, another node's external address, a pod of another node and the
    // NAT64 spelling of the metadata endpoint.
    svc["status"]["loadBalancer"]["ingress"] = json!([
        {"ip": "198.51.100.12"}, {"ip": "10.244.2.7"}, {"ip": "64:ff9b::a9fe:a9fe"},
        {"ip": "203.0.113.10"}]);
    api.apply(svc);
    for host in ["worker-2.example.com", "w2.example.com", "shop.example.com"] {
        api.apply(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": host.replace('.', "-"), "namespace": "tenant-a",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"rules": [{"host": host}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
        );
    }
    let source = watch_names(&api, k8s::Defaults::default());
    let s = routed(&source, "shop.example.com").await;
    assert_eq!(
        frontend_ips(&s),
        ["203.0.113.10"],
        "{:?}",
        s.apply.frontends
    );
    let decisions: Vec<_> = s.report.decisions.iter().map(|d| d.to_status()).collect();
    let decision = serde_json::to_string(&decisions).expect("json");
    for named in [
        "an address Node worker-2.example.com reports in status.addresses[type=ExternalIP]",
        "in the pod network Node worker-2.example.com reports in spec.podCIDRs[0]",
        "the instance metadata endpoint",
    ] {
        assert!(decision.contains(named), "{named} not named in {decision}");
    }
    // A Node's name is refused; the DNS names its kubelet reports are not names of
    // Nodes (issue 31), so w2.example.com is routed like any listed name.
    assert_eq!(
        s.apply
            .routes
            .iter()
            .map(|r| r.host.as_str())
            .collect::<Vec<_>>(),
        ["shop.example.com", "w2.example.com"]
    );
    assert!(
        s.report
            .route_skips
            .iter()
            .any(|k| k.message.contains("worker-2.example.com")
                && k.reason == NameSkipReason::Refused(ScopeRule::NodeName)),
        "{:?}",
        s.report.route_skips
    );
}

// Fake API: the decision in process, no node; could move to real_cluster (Node objects are plain API writes there).
#[tokio::test]
async fn a_lying_node_switches_nothing_off_and_its_ignored_claims_are_events_on_it() {
    let api = FakeApi::start();
    for n in 1..=3 {
        api.put_node(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("w{n}")},
            "spec": {"podCIDRs": [format!("10.244.{n}.0/24")]},
            "status": {"addresses": [{"type": "InternalIP", "address": format!("10.0.0.{n}")}]}}));
    }
    api.put_node(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "evil"},
        "spec": {"podCIDRs": ["0.0.0.0/0"]},
        "status": {"addresses": [
            {"type": "ExternalIP", "address": "203.0.113.10"},
            {"type": "Hostname", "address": "shop.example.com"}]}}));
    // The tenant's LoadBalancer, and one outside the operator's ranges.
    api.apply(digitalocean_service());
    let mut other = digitalocean_service();
    other["metadata"]["name"] = json!("other");
    other["metadata"]["uid"] = json!("0f0e0000-0000-4000-8000-0000000000b2");
    other["status"]["loadBalancer"]["ingress"] = json!([{"ip": "198.51.100.20"}]);
    api.apply(other);
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "tenant-a",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"rules": [{"host": "shop.example.com"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
    );
    let defaults = k8s::Defaults {
        addresses: hairpin_agent::k8s::LbAddressPolicy {
            allowed: vec!["203.0.113.0/24".parse().expect("net")],
            ..Default::default()
        },
        ..k8s::Defaults::default()
    };
    let source = watch_names(&api, defaults);
    let (_leader_tx, leader_rx) = tokio::sync::watch::channel(true);
    tokio::spawn(k8s::publish_events(
        api.client(),
        "w1".into(),
        source.services.clone(),
        source.desired.clone(),
        leader_rx,
    ));
    let s = routed(&source, "shop.example.com").await;
    // The tenant's LB is proxied although Node evil claims it; the LB outside
    // --lb-cidrs is refused by the operator's ranges, not by 0.0.0.0/0.
    assert_eq!(
        frontend_ips(&s),
        ["203.0.113.10"],
        "{:?}",
        s.report.decisions
    );
    let other = s
        .report
        .decisions
        .iter()
        .find(|d| d.service.to_string().ends_with("/other"))
        .expect("a decision for the other Service")
        .summary();
    assert!(
        other.contains("outside the load balancer ranges of --lb-cidrs"),
        "{other}"
    );
    assert!(!other.contains("evil"), "{other}");
    assert_eq!(
        s.report
            .ignored_node_claims
            .iter()
            .map(|c| (c.node.as_str(), c.claim.as_str()))
            .collect::<Vec<_>>(),
        [("evil", "spec.podCIDRs[0]=0.0.0.0/0")]
    );
    // The Warning on Node evil says why its pod network was passed over.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let warning = |e: &serde_json::Value| e["reason"] == "NodeClaimIgnored";
    while !api.events().iter().any(warning) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = api.events();
    let e = events
        .iter()
        .find(|e| warning(e))
        .unwrap_or_else(|| panic!("no NodeClaimIgnored Event: {events:#?}"));
    assert_eq!(e["type"], "Warning", "{e}");
    assert_eq!(e["regarding"]["kind"], "Node", "{e}");
    assert_eq!(e["regarding"]["name"], "evil", "{e}");
    let note = e["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("0.0.0.0/0") && note.contains("wider than a node's share (/24"),
        "{note}"
    );
}
