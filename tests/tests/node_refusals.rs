//! Issue 22, through the real watch protocol: every Node's addresses are never a
//! LoadBalancer's, and every Node's names (and the API server's) are never
//! published, in the source both binaries run (`k8s::watch::spawn`). A Service
//! whose status names another node's address, or a platform endpoint, beside its
//! real LB: only the real LB is a frontend, each refusal named in the decision.
//! An Ingress under a listed domain claiming another node's name: not routed.

use std::time::{Duration, Instant};

use hairpin_agent::{
    k8s::{
        self,
        source::{Desired, DesiredRx},
    },
    names::{routes::NameSkipReason, scope::NameScope, scope::ScopeRule},
    status::metrics::Metrics,
};
use hairpin_tests::fakeapi::{FakeApi, digitalocean_service};
use serde_json::json;

async fn until(rx: &mut DesiredRx, what: &str, pred: impl Fn(&Desired) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if rx.borrow_and_update().as_deref().is_some_and(&pred) {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, rx.changed()).await.is_err() {
            panic!("{what}: not within 10 s; last sent: {:?}", *rx.borrow());
        }
    }
}

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
    let client =
        kube::Client::try_from(kube::Config::new(api.url().parse().expect("url"))).expect("client");
    let source = k8s::watch::spawn(
        client,
        k8s::Defaults::default(),
        NameScope::new(&["example.com"], "cluster.local").expect("scope"),
        Metrics::default(),
        std::sync::Arc::new(|_, _| {}),
    );
    let mut rx = source.desired.clone();
    until(&mut rx, "shop.example.com routed", |s| {
        s.routes
            .iter()
            .any(|r| r.host.as_str() == "shop.example.com")
    })
    .await;
    let s = rx.borrow().clone().expect("synced");
    let ips: std::collections::BTreeSet<String> =
        s.frontends.iter().map(|f| f.ip.to_string()).collect();
    assert_eq!(
        ips,
        ["203.0.113.10".to_string()].into(),
        "{:?}",
        s.frontends
    );
    let decisions: Vec<_> = s.decisions.iter().map(|d| d.to_status()).collect();
    let decision = serde_json::to_string(&decisions).expect("json");
    for named in [
        "an address of Node worker-2.example.com",
        "the pod network of Node worker-2.example.com",
        "the instance metadata endpoint",
    ] {
        assert!(decision.contains(named), "{named} not named in {decision}");
    }
    assert_eq!(
        s.routes.iter().map(|r| r.host.as_str()).collect::<Vec<_>>(),
        ["shop.example.com"]
    );
    for host in ["worker-2.example.com", "w2.example.com"] {
        assert!(
            s.route_skips.iter().any(|k| k.message.contains(host)
                && k.reason == NameSkipReason::Refused(ScopeRule::NodeName)),
            "{host}: {:?}",
            s.route_skips
        );
    }
}
