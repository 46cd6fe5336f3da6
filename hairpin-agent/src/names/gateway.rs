//! Hosts of Gateway API objects: Gateway `spec.listeners[].hostname` and the
//! `spec.hostnames[]` of routes (HTTPRoute, TLSRoute, GRPCRoute) attached to a
//! Gateway through `spec.parentRefs`, each tied to that Gateway's
//! `status.addresses[]` of type `IPAddress`.
//!
//! Read from [`DynamicObject`]s through the few fields used here, rather than the
//! `gateway-api` crate: its 0.22 release is built on kube 4 / k8s-openapi 0.28, and
//! the agent is on kube 5 / k8s-openapi 0.29, whose types it cannot share. These
//! fields have been stable since Gateway API v1.0.

use std::net::IpAddr;

use kube::api::DynamicObject;
use serde::Deserialize;

use super::{
    claims::{Claim, NameSkip, NameSkipReason},
    hostname::Hostname,
};

const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GatewayData {
    spec: GatewaySpec,
    status: GatewayStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GatewaySpec {
    listeners: Vec<Listener>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Listener {
    hostname: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct GatewayStatus {
    addresses: Vec<Address>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Address {
    /// `IPAddress` (the default), `Hostname`, or an implementation-specific type.
    #[serde(rename = "type")]
    kind: Option<String>,
    value: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RouteData {
    spec: RouteSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RouteSpec {
    parent_refs: Vec<ParentRef>,
    hostnames: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ParentRef {
    group: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: String,
}

fn identity(obj: &DynamicObject, default_kind: &str) -> (String, String) {
    let kind = obj
        .types
        .as_ref()
        .map_or(default_kind, |t| t.kind.as_str())
        .to_owned();
    let ns = obj.metadata.namespace.as_deref().unwrap_or("default");
    let name = obj.metadata.name.as_deref().unwrap_or("");
    (kind, format!("{ns}/{name}"))
}

/// Claims from Gateways (listener hostnames) and from `routes` attached to them.
/// A route's hostnames map to the addresses of every Gateway it names as a parent;
/// the listener-level hostname intersection is left to the Gateway (a name the
/// Gateway rejects fails there exactly as it would through the cloud LB).
pub fn gateway_claims<'a>(
    gateways: impl IntoIterator<Item = &'a DynamicObject>,
    routes: impl IntoIterator<Item = &'a DynamicObject>,
) -> (Vec<Claim>, Vec<NameSkip>) {
    let mut claims = Vec::new();
    let mut skips = Vec::new();
    // (namespace/name, LB IPs) of every readable Gateway.
    let mut known: Vec<(String, Vec<IpAddr>)> = Vec::new();
    for gw in gateways {
        let (kind, key) = identity(gw, "Gateway");
        let source = format!("{kind} {key}");
        let data: GatewayData = match serde_json::from_value(gw.data.clone()) {
            Ok(d) => d,
            Err(e) => {
                skips.push(unreadable(&source, &e));
                continue;
            }
        };
        let mut lbs = Vec::new();
        for (i, a) in data.status.addresses.iter().enumerate() {
            if !matches!(a.kind.as_deref(), None | Some("IPAddress")) {
                continue;
            }
            match a.value.parse::<IpAddr>() {
                Ok(ip) if !lbs.contains(&ip) => lbs.push(ip),
                Ok(_) => {}
                Err(_) => skips.push(NameSkip {
                    reason: NameSkipReason::NoLoadBalancerIp,
                    message: format!(
                        "{source}: status.addresses[{i}].value: expected an ip address, got {:?}",
                        a.value
                    ),
                }),
            }
        }
        for (i, l) in data.spec.listeners.iter().enumerate() {
            if let Some(value) = &l.hostname {
                let field = format!("spec.listeners[{i}].hostname");
                push_claim(gw, &source, field, value, &lbs, &mut claims, &mut skips);
            }
        }
        known.push((key, lbs));
    }
    for route in routes {
        let (kind, key) = identity(route, "HTTPRoute");
        let source = format!("{kind} {key}");
        let data: RouteData = match serde_json::from_value(route.data.clone()) {
            Ok(d) => d,
            Err(e) => {
                skips.push(unreadable(&source, &e));
                continue;
            }
        };
        let route_ns = route.metadata.namespace.as_deref().unwrap_or("default");
        for (p, parent) in data.spec.parent_refs.iter().enumerate() {
            let is_gateway = parent.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
                && parent.kind.as_deref().unwrap_or("Gateway") == "Gateway";
            if !is_gateway {
                continue;
            }
            let parent_key = format!(
                "{}/{}",
                parent.namespace.as_deref().unwrap_or(route_ns),
                parent.name
            );
            let Some((_, lbs)) = known.iter().find(|(k, _)| *k == parent_key) else {
                skips.push(NameSkip {
                    reason: NameSkipReason::ParentNotFound,
                    message: format!(
                        "{source}: spec.parentRefs[{p}]: expected an existing gateway, got {parent_key}"
                    ),
                });
                continue;
            };
            for (i, value) in data.spec.hostnames.iter().enumerate() {
                let field = format!("spec.hostnames[{i}]");
                push_claim(route, &source, field, value, lbs, &mut claims, &mut skips);
            }
        }
    }
    (claims, skips)
}

fn push_claim(
    obj: &DynamicObject,
    source: &str,
    field: String,
    value: &str,
    lbs: &[IpAddr],
    claims: &mut Vec<Claim>,
    skips: &mut Vec<NameSkip>,
) {
    match Hostname::parse(value) {
        Ok(host) => claims.push(Claim {
            created: obj.metadata.creation_timestamp.clone(),
            source: source.to_owned(),
            field,
            host,
            lbs: lbs.to_vec(),
        }),
        Err(e) => skips.push(NameSkip {
            reason: NameSkipReason::InvalidHostname,
            message: format!("{source}: {field}: {e}"),
        }),
    }
}

fn unreadable(source: &str, e: &serde_json::Error) -> NameSkip {
    NameSkip {
        reason: NameSkipReason::Unreadable,
        message: format!("{source}: expected a gateway api object: {e}"),
    }
}
