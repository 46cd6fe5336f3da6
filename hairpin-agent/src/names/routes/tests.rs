use std::net::IpAddr;

use k8s_openapi::api::networking::v1::Ingress;
use kube::api::DynamicObject;
use serde::Deserialize;

use super::*;
use crate::model::Frontend;

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
        source: format!("Service for {ip}"),
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
    ] {
        set.insert(f).expect("one frontend per address");
    }
    set
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
    let got = name_routes(&ingresses(), &[], &[], &frontends());
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
    let got = name_routes(&ingresses(), &[], &[], &frontends());
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
        name_routes(&reversed, &[], &[], &frontends()),
        name_routes(&ingresses(), &[], &[], &frontends())
    );
}

#[test]
fn gateway_listeners_and_attached_routes_use_the_gateways_address() {
    let (gateways, routes) = gateway_objects();
    let got = name_routes(&[], &gateways, &routes, &frontends());
    assert_eq!(
        summary(&got),
        [
            "*.apps.example.net 203.0.113.12 [443] v1 <- Gateway envoy-gateway-system/public",
            "db.apps.example.net 203.0.113.12 [443] v1 <- TLSRoute data/db",
            "docs.example.net 203.0.113.12 [443] v1 <- HTTPRoute docs/docs",
        ]
    );
    let mut reasons: Vec<(NameSkipReason, String)> = got
        .skips
        .iter()
        .map(|s| (s.reason, s.message.clone()))
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:#?}");
    assert_eq!(reasons[0].0, NameSkipReason::InvalidHostname);
    assert!(
        reasons[0]
            .1
            .starts_with("HTTPRoute docs/docs: spec.hostnames[2]: hostname \"docs example.net\""),
        "{}",
        reasons[0].1
    );
    assert_eq!(reasons[1].0, NameSkipReason::NoLoadBalancerIp);
    assert!(
        reasons[1]
            .1
            .starts_with("Gateway edge/edge: spec.listeners[0].hostname")
    );
    assert_eq!(
        reasons[2],
        (
            NameSkipReason::ParentNotFound,
            "TLSRoute data/db: spec.parentRefs[1]: expected an existing gateway, got data/missing"
                .into()
        )
    );
}

#[test]
fn lookup_prefers_exact_then_one_label_wildcards_and_checks_the_port() {
    let got = name_routes(&ingresses(), &[], &[], &frontends());
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
    let got = resolve(vec![claim], &frontends);
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
