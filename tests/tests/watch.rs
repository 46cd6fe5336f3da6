//! The Kubernetes source against recorded objects served over real HTTP by the
//! fake API server: add, modify, delete, 410 Gone, dropped watches and an outage,
//! with the last known state kept throughout (fail static), and Events written by
//! the Lease holder only. Each scenario has a deadline; nothing waits unbounded.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use hairpin_agent::{
    k8s::{self, Desired, KubeSource},
    names::NameScope,
    status::Metrics,
};
use hairpin_tests::{
    fakeapi::{FakeApi, recorded},
    kube_source::{self, now, until},
};
use serde_json::{Value, json};
use tokio::sync::watch;

/// A recorded Service. Most fixtures are ingress-nginx's controller Service on
/// some provider, so each is renamed after its fixture to coexist in one cluster.
fn service(name: &str) -> Value {
    let mut svc = recorded(&format!("services/{name}.yaml"));
    if name != "digitalocean" {
        svc["metadata"]["name"] = json!(name);
    }
    svc
}

fn start(api: &FakeApi) -> (KubeSource, Metrics) {
    kube_source::start(api, k8s::Defaults::default(), NameScope::none())
}

fn addrs(s: &Desired) -> Vec<SocketAddr> {
    s.apply
        .frontends
        .iter()
        .map(|f| SocketAddr::new(f.ip, f.port))
        .collect()
}

const DO_HTTP: &str = "203.0.113.10:80";
const DO_HTTPS: &str = "203.0.113.10:443";

// Fake API: the watch layer in process, no node, in milliseconds; against the real server: real_cluster/lb.rs.
#[tokio::test]
async fn add_modify_delete_flow_through_to_the_frontends() {
    let api = FakeApi::start();
    api.apply(service("clusterip"));
    let (source, _m) = start(&api);
    let mut rx = source.desired.clone();
    until(&mut rx, Duration::from_secs(5), "initial sync", |_| true).await;
    assert!(
        now(&rx).apply.frontends.is_empty(),
        "a ClusterIP Service proxies nothing"
    );

    let started = Instant::now();
    api.apply(service("digitalocean"));
    until(&mut rx, Duration::from_secs(2), "DO Service added", |s| {
        addrs(s) == vec![DO_HTTP.parse().unwrap(), DO_HTTPS.parse().unwrap()]
    })
    .await;
    eprintln!("watch event -> desired frontends: {:?}", started.elapsed());
    let d = now(&rx).report.decisions.clone();
    assert!(
        d.iter().any(
            |d| d.to_status().object == "Service ingress-nginx/ingress-nginx-controller"
                && d.reason() == "Proxied"
        ),
        "{d:?}"
    );

    // Our annotation turns it off: modify.
    let mut off = service("digitalocean");
    off["metadata"]["annotations"]["hairpin.dev/proxy-protocol"] = json!("off");
    api.apply(off.clone());
    until(&mut rx, Duration::from_secs(2), "annotation off", |s| {
        s.apply.frontends.is_empty()
    })
    .await;

    // Back on with v2, then delete.
    let mut v2 = service("digitalocean");
    v2["metadata"]["annotations"]["hairpin.dev/proxy-protocol"] = json!("v2");
    api.apply(v2.clone());
    until(&mut rx, Duration::from_secs(2), "v2", |s| {
        s.apply
            .frontends
            .iter()
            .all(|f| f.version == hairpin_agent::ProxyVersion::V2)
            && s.apply.frontends.len() == 2
    })
    .await;
    api.delete(&v2);
    until(&mut rx, Duration::from_secs(2), "deleted", |s| {
        s.apply.frontends.is_empty() && s.report.decisions.is_empty()
    })
    .await;
}

// Fake API: a 410 Gone at a chosen step (a real server compacts on its own schedule).
#[tokio::test]
async fn a_410_gone_relists_without_emptying_the_frontends() {
    let api = FakeApi::start();
    api.apply(service("digitalocean"));
    let (source, metrics) = start(&api);
    let mut rx = source.desired.clone();
    until(&mut rx, Duration::from_secs(5), "synced with DO", |s| {
        s.apply.frontends.len() == 2
    })
    .await;

    // Record every snapshot from here: none may be empty.
    let mut seen = source.desired.clone();
    let watcher = tokio::spawn(async move {
        let mut min = usize::MAX;
        while tokio::time::timeout(Duration::from_secs(3), seen.changed())
            .await
            .is_ok_and(|r| r.is_ok())
        {
            min = min.min(
                seen.borrow_and_update()
                    .as_ref()
                    .map_or(0, |d| d.apply.frontends.len()),
            );
        }
        min
    });
    api.expire_watches();
    api.apply(service("scaleway"));
    until(
        &mut rx,
        Duration::from_secs(5),
        "Scaleway after re-list",
        |s| s.apply.frontends.len() > 2,
    )
    .await;
    let min = watcher.await.expect("watcher");
    assert!(
        min >= 2,
        "the frontends were emptied during the re-list (min {min})"
    );
    let relists = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch="))
        .count();
    assert!(
        relists >= 2,
        "expected a second list after 410: {:?}",
        api.requests()
    );
    assert!(
        metrics
            .render()
            .contains("hairpin_watch_restarts_total{resource=\"services\"}"),
        "{}",
        metrics.render()
    );
}

// Fake API: the watch connections dropped at a chosen step.
#[tokio::test]
async fn a_dropped_watch_resumes_and_sees_later_changes() {
    let api = FakeApi::start();
    let (source, _m) = start(&api);
    let mut rx = source.desired.clone();
    until(&mut rx, Duration::from_secs(5), "sync", |_| true).await;
    api.disconnect_watches();
    api.apply(service("digitalocean"));
    until(&mut rx, Duration::from_secs(5), "DO after reconnect", |s| {
        s.apply.frontends.len() == 2
    })
    .await;
}

// Fake API: an outage (500 to every call) at a chosen step; real_cluster/restart.rs kills the real one.
#[tokio::test]
async fn an_api_outage_keeps_the_last_known_state() {
    let api = FakeApi::start();
    api.apply(service("digitalocean"));
    let (source, metrics) = start(&api);
    let mut rx = source.desired.clone();
    until(&mut rx, Duration::from_secs(5), "sync", |s| {
        s.apply.frontends.len() == 2
    })
    .await;

    api.set_down(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        addrs(&now(&rx)),
        vec![DO_HTTP.parse().unwrap(), DO_HTTPS.parse().unwrap()],
        "fail static"
    );
    let restarts = metrics.render();
    assert!(
        restarts.contains("hairpin_watch_restarts_total{resource=\"services\"}"),
        "{restarts}\n{:#?}",
        api.requests()
    );

    api.set_down(false);
    api.apply(service("scaleway"));
    // The watcher's backoff grows during the outage: allow for its next attempt.
    until(&mut rx, Duration::from_secs(20), "recovered", |s| {
        s.apply.frontends.len() > 2
    })
    .await;
}

// Fake API: the decision report in process, no node; the real server's Events: real_cluster/events.rs.
#[tokio::test]
async fn invalid_annotations_are_reported_and_do_not_block_others() {
    let api = FakeApi::start();
    api.apply(service("invalid-version"));
    api.apply(service("digitalocean"));
    let (source, _m) = start(&api);
    let mut rx = source.desired.clone();
    until(&mut rx, Duration::from_secs(5), "sync", |_| true).await;
    let s = now(&rx);
    assert_eq!(s.apply.frontends.len(), 2, "{s:?}");
    let invalid = s
        .report
        .decisions
        .iter()
        .find(|d| d.reason() == "InvalidAnnotation")
        .expect("an invalid decision");
    assert!(invalid.is_warning());
    assert!(
        invalid.summary().contains("hairpin.dev/proxy-protocol"),
        "{}",
        invalid.summary()
    );
}

// Fake API: counts every Event write the holder makes (the fake records each request).
#[tokio::test]
async fn the_lease_holder_publishes_one_event_per_decision_change() {
    let api = FakeApi::start();
    api.apply(service("digitalocean"));
    let (source, _m) = start(&api);
    let c = api.client();
    let (leader_tx, leader_rx) = watch::channel(false);
    let lease = k8s::LeaseConfig {
        namespace: "hairpin-system".into(),
        name: "hairpin-agent".into(),
        identity: "node-a".into(),
        duration: Duration::from_secs(15),
        renew_every: Duration::from_millis(200),
    };
    tokio::spawn(k8s::run_lease(c.clone(), lease.clone(), leader_tx));
    // A second agent on another node contends for the same Lease.
    let (other_tx, mut other_rx) = watch::channel(false);
    tokio::spawn(k8s::run_lease(
        c.clone(),
        k8s::LeaseConfig {
            identity: "node-b".into(),
            ..lease
        },
        other_tx,
    ));
    tokio::spawn(k8s::publish_events(
        c,
        "node-a".into(),
        source.services.clone(),
        source.desired.clone(),
        leader_rx.clone(),
    ));

    let deadline = Instant::now() + Duration::from_secs(5);
    while api.events().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leaders = [*leader_rx.borrow(), *other_rx.borrow_and_update()];
    assert_eq!(
        leaders.iter().filter(|l| **l).count(),
        1,
        "exactly one holder: {leaders:?}; leases {:?}",
        api.leases()
    );
    let events = api.events();
    if leaders[0] {
        assert_eq!(events.len(), 1, "one Event for one decision: {events:#?}");
        let e = &events[0];
        assert_eq!(e["reason"], "Proxied");
        assert_eq!(e["regarding"]["name"], "ingress-nginx-controller");
        assert!(
            e["note"].as_str().unwrap_or("").contains("203.0.113.10:80"),
            "{e}"
        );
    } else {
        assert!(
            events.is_empty(),
            "a follower must not write Events: {events:#?}"
        );
    }
    let lease = api
        .leases()
        .get("hairpin-system/hairpin-agent")
        .cloned()
        .expect("lease created");
    assert!(
        matches!(
            lease["spec"]["holderIdentity"].as_str(),
            Some("node-a" | "node-b")
        ),
        "{lease}"
    );
}

// Fake API: the watch layer in process; real CoreDNS behind the real kube-dns Service: real_cluster/coredns.rs;
// behind RKE2's, the agent finding it: real_cluster/coredns_rke2.rs.
#[tokio::test]
async fn the_cluster_dns_service_is_found_through_the_watch() {
    let api = FakeApi::start();
    api.apply(service("clusterip"));
    let (source, _m) = start(&api);
    let mut rx = source.desired.clone();
    until(&mut rx, Duration::from_secs(5), "initial sync", |_| true).await;
    assert!(now(&rx).report.cluster_dns.is_empty(), "no DNS Service yet");

    let rke2 = recorded("cluster-dns/rke2-coredns-dual-stack.yaml");
    api.apply(rke2.clone());
    let both: Vec<std::net::IpAddr> = vec![
        "10.43.0.10".parse().unwrap(),
        "2001:cafe:43::a".parse().unwrap(),
    ];
    until(&mut rx, Duration::from_secs(2), "rke2-coredns found", |s| {
        s.report.cluster_dns == both
    })
    .await;
    // kube-dns appearing beside it wins; its removal falls back.
    let kube_dns = recorded("cluster-dns/kubeadm-kube-dns.yaml");
    api.apply(kube_dns.clone());
    until(&mut rx, Duration::from_secs(2), "kube-dns preferred", |s| {
        s.report.cluster_dns == vec!["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
    })
    .await;
    api.delete(&kube_dns);
    until(
        &mut rx,
        Duration::from_secs(2),
        "back to rke2-coredns",
        |s| s.report.cluster_dns == both,
    )
    .await;
    // A DNS Service change alone must not disturb the frontends.
    assert!(now(&rx).apply.frontends.is_empty());
}

/// A tenant's Ingress naming another tenant's Service: the Lease holder puts a Warning
/// Event naming the rule on that Ingress (not on the Service, not for the allowed
/// name), once, and the allowed name is routed.
// Fake API: counts the Warning Events per request (the fake records each request).
#[tokio::test]
async fn the_lease_holder_warns_on_an_ingress_whose_hostname_is_refused() {
    let api = FakeApi::start();
    api.apply(service("digitalocean"));
    api.apply(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": "hijack", "namespace": "tenant-a",
            "uid": "0f0e0000-0000-4000-8000-0000000000a1",
            "creationTimestamp": "2025-03-01T10:00:00Z",
        },
        "spec": {
            "ingressClassName": "nginx",
            "rules": [{"host": "api.tenant-b.svc.cluster.local"}, {"host": "shop.example.com"}],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
    }));
    let scope = NameScope::new(&["example.com"], "cluster.local").expect("scope");
    let (source, _m) = kube_source::start(&api, k8s::Defaults::default(), scope);
    let mut rx = source.desired.clone();
    until(
        &mut rx,
        Duration::from_secs(5),
        "shop.example.com routed",
        |s| {
            s.apply
                .routes
                .iter()
                .any(|r| r.host.as_str() == "shop.example.com")
        },
    )
    .await;
    assert!(
        !now(&rx)
            .apply
            .routes
            .iter()
            .any(|r| r.host.as_str().contains("svc")),
        "{:?}",
        now(&rx).apply.routes
    );
    let (_leader_tx, leader_rx) = watch::channel(true);
    tokio::spawn(k8s::publish_events(
        api.client(),
        "node-a".into(),
        source.services.clone(),
        source.desired.clone(),
        leader_rx,
    ));
    let warning = |e: &Value| e["reason"] == "HostnameRefusedClusterDomain";
    let deadline = Instant::now() + Duration::from_secs(5);
    while !api.events().iter().any(warning) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Later decision rounds must not repeat it.
    api.apply(service("clusterip"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = api.events();
    let warnings: Vec<&Value> = events.iter().filter(|e| warning(e)).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one Warning for one refusal: {events:#?}"
    );
    let e = warnings[0];
    assert_eq!(e["type"], "Warning", "{e}");
    assert_eq!(e["regarding"]["kind"], "Ingress", "{e}");
    assert_eq!(e["regarding"]["namespace"], "tenant-a", "{e}");
    assert_eq!(e["regarding"]["name"], "hijack", "{e}");
    assert_eq!(
        e["regarding"]["uid"], "0f0e0000-0000-4000-8000-0000000000a1",
        "{e}"
    );
    let note = e["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with(
            "Ingress tenant-a/hijack: spec.rules[0].host: host api.tenant-b.svc.cluster.local \
             refused (rule cluster-domain)"
        ),
        "{e}"
    );
    assert!(
        events.iter().all(|e| !e["note"]
            .as_str()
            .unwrap_or_default()
            .contains("shop.example.com")),
        "no Event for the allowed name: {events:#?}"
    );
}
