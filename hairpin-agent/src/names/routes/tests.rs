use std::net::IpAddr;

use k8s_openapi::api::networking::v1::Ingress;
use kube::api::DynamicObject;
use serde::Deserialize;

use super::*;
use crate::{model::Frontend, names::scope::ScopeRule};

const INGRESSES: &str = include_str!("../../../tests/fixtures/ingresses/two-controllers.yaml");
const GATEWAYS: &str = include_str!("../../../tests/fixtures/gateways/envoy-gateway.yaml");

#[derive(Deserialize)]
struct List<T> {
    items: Vec<T>,
}

fn ingresses() -> Vec<Ingress> {
    yaml_serde::from_str::<List<Ingress>>(INGRESSES)
        .expect("ingress fixture")
        .items
}

fn gateway_objects() -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    let items = yaml_serde::from_str::<List<DynamicObject>>(GATEWAYS)
        .expect("gateway fixture")
        .items;
    items
        .into_iter()
        .partition(|o| o.types.as_ref().is_some_and(|t| t.kind == "Gateway"))
}

fn fe(ip: &str, port: u16, version: ProxyVersion) -> Frontend {
    Frontend {
        ip: ip.parse().expect("ip"),
        port,
        version,
        source: crate::model::Origin::Service(crate::model::ServiceName::new("for", ip)),
        first_speaker: Default::default(),
        path: Default::default(),
    }
}

/// What the Service decision proxies: both controllers' LBs, not the plain one (.99).
fn frontends() -> Frontends {
    use ProxyVersion::{V1, V2};
    let mut set = Frontends::new();
    for f in [
        fe("203.0.113.10", 80, V1),
        fe("203.0.113.10", 443, V1),
        fe("203.0.113.11", 443, V2),
        fe("203.0.113.11", 80, V2),
        fe("2001:db8:ffff::11", 80, V2),
        fe("203.0.113.12", 443, V1),
        fe("203.0.113.13", 80, V1),
    ] {
        set.insert(f).expect("one frontend per address");
    }
    set
}

/// The domains the fixtures' names are under.
fn scope() -> NameScope {
    NameScope::new(&["example.com", "example.net"], "cluster.local").expect("scope")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn summary(routes: &NameRoutes) -> Vec<String> {
    routes
        .routes
        .iter()
        .map(|r| {
            format!(
                "{} {} {:?} {} <- {}",
                r.host, r.lb, r.ports, r.version, r.source
            )
        })
        .collect()
}

#[test]
fn each_host_goes_to_its_own_ingress_controllers_lb() {
    let got = name_routes(&ingresses(), &[], &[], &frontends(), &scope());
    assert_eq!(
        summary(&got),
        [
            "*.shop.example.com 203.0.113.10 [80, 443] v1 <- Ingress shop/shop",
            "admin.shop.example.com 203.0.113.10 [80, 443] v1 <- Ingress shop/shop",
            "registry.example.com 203.0.113.11 [80, 443] v2 <- Ingress registry/registry",
            "registry.example.com 2001:db8:ffff::11 [80] v2 <- Ingress registry/registry",
            "shop.example.com 203.0.113.10 [80, 443] v1 <- Ingress shop/shop",
        ]
    );
}

#[test]
fn every_left_out_host_says_which_object_and_field() {
    let got = name_routes(&ingresses(), &[], &[], &frontends(), &scope());
    let mut skips: Vec<(NameSkipReason, &str)> = got
        .skips
        .iter()
        .map(|s| (s.reason, s.message.as_str()))
        .collect();
    skips.sort();
    let want = [
        (
            NameSkipReason::InvalidHostname,
            "Ingress staging/shop-copy: spec.rules[1].host: hostname \"bad_name.example.com\": \
             expected only letters, digits, '-' and '.', got '_'",
        ),
        (
            NameSkipReason::NoLoadBalancerIp,
            "Ingress aws/elb: spec.rules[0].host: host aws.example.com has no loadbalancer ip in the object's status",
        ),
        (
            NameSkipReason::NoLoadBalancerIp,
            "Ingress shop/pending: spec.rules[0].host: host new.example.com has no loadbalancer ip in the object's status",
        ),
        (
            NameSkipReason::NotProxied,
            "Ingress it/intranet: spec.rules[0].host: host intranet.example.com is on loadbalancer 203.0.113.99, \
             which is not a proxied frontend",
        ),
        (
            NameSkipReason::Conflict,
            "Ingress staging/shop-copy: spec.rules[0].host: host shop.example.com is claimed on loadbalancer \
             203.0.113.10 by Ingress shop/shop, which is older; Ingress staging/shop-copy asks for 203.0.113.11 \
             and loses it",
        ),
    ];
    assert_eq!(skips, want);
}

#[test]
fn input_order_does_not_change_the_result() {
    let mut reversed = ingresses();
    reversed.reverse();
    assert_eq!(
        name_routes(&reversed, &[], &[], &frontends(), &scope()),
        name_routes(&ingresses(), &[], &[], &frontends(), &scope())
    );
}

#[test]
fn gateway_listeners_and_accepted_admitted_routes_use_the_gateways_address() {
    let (gateways, routes) = gateway_objects();
    let got = name_routes(&[], &gateways, &routes, &frontends(), &scope());
    assert_eq!(
        summary(&got),
        [
            "*.apps.example.net 203.0.113.12 [443] v1 <- Gateway envoy-gateway-system/public",
            "db.apps.example.net 203.0.113.12 [443] v1 <- TLSRoute data/db",
            "docs.example.net 203.0.113.12 [443] v1 <- HTTPRoute docs/docs",
            "reports.internal.example.net 203.0.113.13 [80] v1 <- Gateway platform/internal",
            "shop.apps.example.net 203.0.113.12 [443] v1 <- TLSRoute tenant-a/squat",
            // tenant-a/rejected is older and names it too, but its Gateway refused it.
            "wiki.internal.example.net 203.0.113.13 [80] v1 <- HTTPRoute platform/wiki",
        ]
    );
    let mut reasons: Vec<(NameSkipReason, String)> = got
        .skips
        .iter()
        .map(|s| (s.reason, s.message.clone()))
        .collect();
    reasons.sort();
    let want: Vec<(NameSkipReason, &str)> = vec![
        (
            NameSkipReason::InvalidHostname,
            "HTTPRoute docs/docs: spec.hostnames[2]: hostname \"docs example.net\": expected only \
             letters, digits, '-' and '.', got ' '",
        ),
        (
            NameSkipReason::NoLoadBalancerIp,
            "Gateway edge/edge: spec.listeners[0].hostname: host edge.example.net has no \
             loadbalancer ip in the object's status",
        ),
        (
            NameSkipReason::ParentNotFound,
            "TLSRoute data/db: spec.parentRefs[1]: expected an existing gateway, got data/missing",
        ),
        (
            NameSkipReason::RouteNotAccepted,
            "HTTPRoute tenant-a/pending: status.parents: expected Gateway \
             envoy-gateway-system/public to have accepted spec.parentRefs[0] (an entry for it \
             with condition Accepted True), got no entry for it",
        ),
        (
            NameSkipReason::RouteNotAccepted,
            "HTTPRoute tenant-a/rejected: status.parents: expected Gateway platform/internal to \
             have accepted spec.parentRefs[0] (an entry for it with condition Accepted True), \
             got Accepted False (reason NotAllowedByListeners)",
        ),
        (
            NameSkipReason::RouteNotAllowedByListeners,
            "HTTPRoute data/reports: spec.parentRefs[0]: no listener of Gateway platform/internal \
             admits HTTPRoute from namespace data: listener reports \
             allowedRoutes.namespaces.from is Selector, which hairpin does not evaluate (it does \
             not watch Namespace labels): expected Same or All",
        ),
        (
            NameSkipReason::RouteNotAllowedByListeners,
            "HTTPRoute tenant-a/forged: spec.parentRefs[0]: no listener of Gateway \
             platform/internal admits HTTPRoute from namespace tenant-a: listener http \
             allowedRoutes.namespaces.from is Same: expected the route in namespace platform; \
             listener reports allowedRoutes.namespaces.from is Selector, which hairpin does not \
             evaluate (it does not watch Namespace labels): expected Same or All",
        ),
        (
            NameSkipReason::RouteHostnameNotOnListener,
            "TLSRoute tenant-a/squat: spec.hostnames[1]: host billing.example.net is not served \
             by Gateway envoy-gateway-system/public: expected a name within the hostname of a \
             listener that admits the route (listener tls-apps *.apps.example.net)",
        ),
    ];
    let got_reasons: Vec<(NameSkipReason, &str)> =
        reasons.iter().map(|(r, m)| (*r, m.as_str())).collect();
    assert_eq!(got_reasons, want);
    // Every skip of a route or Gateway carries the object, for its Warning Event.
    let forged = got
        .skips
        .iter()
        .find(|s| s.message.starts_with("HTTPRoute tenant-a/forged"))
        .and_then(|s| s.object.clone())
        .expect("object");
    assert_eq!(
        (
            forged.kind.as_str(),
            forged.namespace.as_str(),
            forged.name.as_str()
        ),
        ("HTTPRoute", "tenant-a", "forged")
    );
    assert_eq!(forged.api_version, "gateway.networking.k8s.io/v1");
    assert!(got.skips.iter().all(|s| s.object.is_some()));
}

/// One HTTPRoute in `ns` on Gateway `platform/internal` (fixture) with `status`.
fn route_on_internal(ns: &str, section: Option<&str>, accepted: Option<&str>) -> DynamicObject {
    let mut parent = serde_json::json!({"name": "internal", "namespace": "platform"});
    if let Some(s) = section {
        parent["sectionName"] = s.into();
    }
    let mut obj = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": ns, "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"parentRefs": [parent.clone()], "hostnames": ["r.internal.example.net"]},
    });
    if let Some(status) = accepted {
        obj["status"] = serde_json::json!({"parents": [{
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "parentRef": parent,
            "conditions": [{"type": "Accepted", "status": status, "reason": "Accepted"}],
        }]});
    }
    serde_json::from_value(obj).expect("route")
}

#[test]
fn a_route_counts_only_when_accepted_and_in_a_namespace_the_listener_admits() {
    let (gateways, _) = gateway_objects();
    let one = |route: DynamicObject| {
        let got = name_routes(&[], &gateways, &[route], &frontends(), &scope());
        let routed = got
            .routes
            .iter()
            .any(|r| r.host.as_str() == "r.internal.example.net");
        let reasons: Vec<NameSkipReason> = got
            .skips
            .iter()
            .filter(|s| s.message.starts_with("HTTPRoute"))
            .map(|s| s.reason)
            .collect();
        (routed, reasons)
    };
    // Same namespace as the Gateway, accepted: routed.
    assert_eq!(
        one(route_on_internal("platform", Some("http"), Some("True"))),
        (true, vec![])
    );
    // Accepted False, or no status at all: not.
    assert_eq!(
        one(route_on_internal("platform", Some("http"), Some("False"))),
        (false, vec![NameSkipReason::RouteNotAccepted])
    );
    assert_eq!(
        one(route_on_internal("platform", Some("http"), None)),
        (false, vec![NameSkipReason::RouteNotAccepted])
    );
    // Another namespace on a `Same` listener, even with an Accepted status: not.
    assert_eq!(
        one(route_on_internal("tenant-a", Some("http"), Some("True"))),
        (false, vec![NameSkipReason::RouteNotAllowedByListeners])
    );
    // A sectionName the Gateway has no listener for.
    let (routed, reasons) = one(route_on_internal("platform", Some("nope"), Some("True")));
    assert!(!routed);
    assert_eq!(reasons, vec![NameSkipReason::RouteNotAccepted]);
}

#[test]
fn a_route_kind_the_listener_does_not_take_is_not_admitted() {
    let (gateways, _) = gateway_objects();
    // An HTTPRoute on the public Gateway's TLS listener (kinds: TLSRoute).
    let route: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "parentRefs": [{"name": "public", "namespace": "envoy-gateway-system", "sectionName": "tls-apps"}],
            "hostnames": ["web.apps.example.net"],
        },
        "status": {"parents": [{
            "parentRef": {"name": "public", "namespace": "envoy-gateway-system", "sectionName": "tls-apps"},
            "conditions": [{"type": "Accepted", "status": "True"}],
        }]},
    }))
    .expect("route");
    let got = name_routes(&[], &gateways, &[route], &frontends(), &scope());
    let skip = got
        .skips
        .iter()
        .find(|s| s.message.starts_with("HTTPRoute shop/web"))
        .expect("skip");
    assert_eq!(skip.reason, NameSkipReason::RouteNotAllowedByListeners);
    assert!(
        skip.message
            .ends_with("listener tls-apps allowedRoutes.kinds is TLSRoute: expected HTTPRoute"),
        "{}",
        skip.message
    );
}

#[test]
fn refused_names_never_reach_routes_and_each_names_its_rule() {
    // Tenant A's Ingress names tenant B's Service, the node, the metadata server and
    // names outside the listed domains; tenant B's Ingress names its own host.
    let ingress = |ns: &str, name: &str, created: &str, lb: &str, hosts: &[&str]| -> Ingress {
        let rules: Vec<serde_json::Value> = hosts
            .iter()
            .map(|h| serde_json::json!({"host": h}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created,
                         "uid": format!("uid-{name}")},
            "spec": {"rules": rules},
            "status": {"loadBalancer": {"ingress": [{"ip": lb}]}},
        }))
        .expect("ingress")
    };
    let a = ingress(
        "tenant-a",
        "hijack",
        "2025-01-01T00:00:00Z",
        "203.0.113.10",
        &[
            "api.tenant-b.svc.cluster.local",
            "*.tenant-b.svc.cluster.local",
            "localhost",
            "intranet",
            "*.com",
            "metadata.google.internal",
            "registry-1.docker.io",
        ],
    );
    let b = ingress(
        "tenant-b",
        "api",
        "2025-02-01T00:00:00Z",
        "203.0.113.11",
        &["api.example.com"],
    );
    let got = name_routes(&[a, b], &[], &[], &frontends(), &scope());
    assert_eq!(
        summary(&got),
        ["api.example.com 203.0.113.11 [80, 443] v2 <- Ingress tenant-b/api",]
    );
    let rules: Vec<NameSkipReason> = got.skips.iter().map(|s| s.reason).collect();
    assert_eq!(
        rules,
        [
            NameSkipReason::Refused(ScopeRule::ClusterDomain),
            NameSkipReason::Refused(ScopeRule::ClusterDomain),
            NameSkipReason::Refused(ScopeRule::Localhost),
            NameSkipReason::Refused(ScopeRule::SingleLabel),
            NameSkipReason::Refused(ScopeRule::PublicSuffix),
            NameSkipReason::Refused(ScopeRule::Metadata),
            NameSkipReason::Refused(ScopeRule::OutsideDomains),
        ]
    );
    assert_eq!(
        got.skips[0].message,
        "Ingress tenant-a/hijack: spec.rules[0].host: host api.tenant-b.svc.cluster.local refused \
         (rule cluster-domain): names in the cluster domain cluster.local belong to Services and \
         Pods; expected a name outside cluster.local"
    );
    let object = got.skips[0].object.as_ref().expect("object");
    assert_eq!(
        (object.kind.as_str(), object.uid.as_deref()),
        ("Ingress", Some("uid-hijack"))
    );
}

#[test]
fn an_empty_domain_list_publishes_no_name_from_any_object() {
    let (gateways, routes) = gateway_objects();
    let got = name_routes(
        &ingresses(),
        &gateways,
        &routes,
        &frontends(),
        &NameScope::none(),
    );
    assert!(got.routes.is_empty(), "{:#?}", got.routes);
    assert!(
        got.skips
            .iter()
            .any(|s| s.reason == NameSkipReason::Refused(ScopeRule::NoDomains))
    );
}

#[test]
fn lookup_prefers_exact_then_one_label_wildcards_and_checks_the_port() {
    let got = name_routes(&ingresses(), &[], &[], &frontends(), &scope());
    let table = RouteTable::new(&got.routes);
    let lb = |name: &str, port| table.lookup(name, port).map(|r| r.lb);
    assert_eq!(lb("shop.example.com", 443), Some(ip("203.0.113.10")));
    assert_eq!(lb("SHOP.example.com.", 80), Some(ip("203.0.113.10")));
    assert_eq!(lb("www.shop.example.com", 443), Some(ip("203.0.113.10")));
    assert_eq!(lb("a.b.shop.example.com", 443), None, "one label only");
    assert_eq!(
        lb("*.shop.example.com", 443),
        None,
        "clients never ask for a wildcard"
    );
    assert_eq!(lb("registry.example.com", 80), Some(ip("203.0.113.11")));
    assert_eq!(lb("shop.example.com", 8443), None, "port not proxied");
    assert_eq!(lb("nothing.example.com", 80), None);
    assert_eq!(lb("bad name", 80), None);
    assert!(!table.is_empty());
}

#[test]
fn a_host_on_two_lbs_with_two_versions_routes_each_port_to_its_version() {
    let claim = Claim {
        created: None,
        source: "Ingress a/b".into(),
        object: None,
        field: "spec.rules[0].host".into(),
        host: Hostname::parse("x.example.com").expect("name"),
        lbs: vec![ip("203.0.113.10")],
    };
    let mut frontends = Frontends::new();
    for f in [
        fe("203.0.113.10", 80, ProxyVersion::V1),
        fe("203.0.113.10", 443, ProxyVersion::V2),
    ] {
        frontends.insert(f).expect("free");
    }
    let got = resolve(vec![claim], &frontends, &scope());
    let table = RouteTable::new(&got.routes);
    assert_eq!(
        table.lookup("x.example.com", 80).map(|r| r.version),
        Some(ProxyVersion::V1)
    );
    assert_eq!(
        table.lookup("x.example.com", 443).map(|r| r.version),
        Some(ProxyVersion::V2)
    );
}
