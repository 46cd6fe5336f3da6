//! Hosts of Gateway API objects: Gateway `spec.listeners[].hostname` and the
//! `spec.hostnames[]` of routes (HTTPRoute, TLSRoute, GRPCRoute) attached to a
//! Gateway through `spec.parentRefs`, each tied to that Gateway's
//! `status.addresses[]` of type `IPAddress`.
//!
//! A route's hostname counts for a Gateway only when all of these hold, since
//! whoever may create a route in one namespace must not steer names through a
//! Gateway that does not serve them:
//!
//! - **accepted**: the route's `status.parents[]` has an entry for that parentRef
//!   with condition `Accepted` `True` (written by the Gateway's controller);
//! - **allowed**: a listener the parentRef attaches to (by `sectionName` and `port`,
//!   else all) admits the route's namespace by `allowedRoutes.namespaces.from`:
//!   `Same` (the default) or `All`. `Selector` needs Namespace labels, which the
//!   agent does not watch: such listeners admit nothing here. It must take the
//!   route's kind too (`allowedRoutes.kinds`, else the listener protocol's kinds).
//!   Checked even when the status says Accepted, as a status can be written by any
//!   controller;
//! - **on a listener**: the hostname lies within the hostname of one of the
//!   admitting listeners (or one of them has none).
//!
//! Read from [`DynamicObject`]s through the few fields used here, rather than the
//! `gateway-api` crate: its 0.22 release is built on kube 4 / k8s-openapi 0.28, and
//! the agent is on kube 5 / k8s-openapi 0.29, whose types it cannot share. These
//! fields have been stable since Gateway API v1.0.

use std::net::IpAddr;

use kube::api::DynamicObject;
use serde::Deserialize;

use super::{
    claims::{Claim, NameSkip, NameSkipReason, ObjectId},
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
    name: String,
    hostname: Option<String>,
    port: Option<u32>,
    protocol: String,
    allowed_routes: Option<AllowedRoutes>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct AllowedRoutes {
    namespaces: Option<RouteNamespaces>,
    kinds: Vec<RouteGroupKind>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RouteGroupKind {
    group: Option<String>,
    kind: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    from: Option<String>,
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
    status: RouteStatus,
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
    section_name: Option<String>,
    port: Option<u32>,
}

impl ParentRef {
    fn is_gateway(&self) -> bool {
        self.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
            && self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
    }

    /// Whether `self` and `other` name the same parent, defaults filled in (a
    /// controller may echo the parentRef with or without them).
    fn same_as(&self, other: &ParentRef, route_ns: &str) -> bool {
        let norm = |p: &ParentRef| {
            (
                p.group
                    .clone()
                    .filter(|g| !g.is_empty())
                    .unwrap_or_else(|| GATEWAY_GROUP.into()),
                p.kind.clone().unwrap_or_else(|| "Gateway".into()),
                p.namespace.clone().unwrap_or_else(|| route_ns.into()),
                p.name.clone(),
                p.section_name.clone(),
                p.port,
            )
        };
        norm(self) == norm(other)
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RouteStatus {
    parents: Vec<RouteParentStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RouteParentStatus {
    parent_ref: ParentRef,
    conditions: Vec<Condition>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    reason: Option<String>,
}

/// A readable Gateway: where it is published and its listeners.
struct KnownGateway {
    namespace: String,
    key: String,
    lbs: Vec<IpAddr>,
    listeners: Vec<Listener>,
}

fn identity(obj: &DynamicObject, default_kind: &str) -> (String, String, ObjectId) {
    let (api_version, kind) = obj.types.as_ref().map_or_else(
        || (format!("{GATEWAY_GROUP}/v1"), default_kind.to_owned()),
        |t| (t.api_version.clone(), t.kind.clone()),
    );
    let ns = obj.metadata.namespace.as_deref().unwrap_or("default");
    let name = obj.metadata.name.as_deref().unwrap_or("");
    let id = ObjectId {
        api_version,
        kind: kind.clone(),
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: obj.metadata.uid.clone(),
    };
    (kind, format!("{ns}/{name}"), id)
}

/// Claims from Gateways (listener hostnames) and from `routes` attached to them.
/// A route's hostnames map to the addresses of each parent Gateway that accepted
/// it, admits its namespace and has a listener for the hostname (module docs);
/// every other case is a skip naming the rule.
pub(crate) fn gateway_claims<'a>(
    gateways: impl IntoIterator<Item = &'a DynamicObject>,
    routes: impl IntoIterator<Item = &'a DynamicObject>,
) -> (Vec<Claim>, Vec<NameSkip>) {
    let mut claims = Vec::new();
    let mut skips = Vec::new();
    let mut known: Vec<KnownGateway> = Vec::new();
    for gw in gateways {
        let (kind, key, object) = identity(gw, "Gateway");
        let source = format!("{kind} {key}");
        let data: GatewayData = match serde_json::from_value(gw.data.clone()) {
            Ok(d) => d,
            Err(e) => {
                skips.push(unreadable(&source, &e, &object));
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
                    object: Some(object.clone()),
                }),
            }
        }
        let from = Origin {
            obj: gw,
            source: &source,
            object: &object,
        };
        for (i, l) in data.spec.listeners.iter().enumerate() {
            if let Some(value) = &l.hostname {
                let field = format!("spec.listeners[{i}].hostname");
                from.claim(field, value, &lbs, &mut claims, &mut skips);
            }
        }
        known.push(KnownGateway {
            namespace: object.namespace.clone(),
            key,
            lbs,
            listeners: data.spec.listeners,
        });
    }
    for route in routes {
        route_claims(route, &known, &mut claims, &mut skips);
    }
    (claims, skips)
}

/// The claims of one route, through each of its parent Gateways.
fn route_claims(
    route: &DynamicObject,
    known: &[KnownGateway],
    claims: &mut Vec<Claim>,
    skips: &mut Vec<NameSkip>,
) {
    let (kind, key, object) = identity(route, "HTTPRoute");
    let source = format!("{kind} {key}");
    let data: RouteData = match serde_json::from_value(route.data.clone()) {
        Ok(d) => d,
        Err(e) => {
            skips.push(unreadable(&source, &e, &object));
            return;
        }
    };
    let skip = |reason, message: String| NameSkip {
        reason,
        message,
        object: Some(object.clone()),
    };
    let route_ns = object.namespace.as_str();
    let from = Origin {
        obj: route,
        source: &source,
        object: &object,
    };
    for (p, parent) in data.spec.parent_refs.iter().enumerate() {
        if !parent.is_gateway() {
            continue;
        }
        let parent_key = format!(
            "{}/{}",
            parent.namespace.as_deref().unwrap_or(route_ns),
            parent.name
        );
        let Some(gw) = known.iter().find(|g| g.key == parent_key) else {
            skips.push(skip(
                NameSkipReason::ParentNotFound,
                format!(
                    "{source}: spec.parentRefs[{p}]: expected an existing gateway, got {parent_key}"
                ),
            ));
            continue;
        };
        if let Err(got) = acceptance(&data.status, parent, route_ns) {
            skips.push(skip(
                NameSkipReason::RouteNotAccepted,
                format!(
                    "{source}: status.parents: expected Gateway {parent_key} to have accepted \
                     spec.parentRefs[{p}] (an entry for it with condition Accepted True), got {got}"
                ),
            ));
            continue;
        }
        let attached: Vec<&Listener> = gw
            .listeners
            .iter()
            .filter(|l| parent.section_name.as_ref().is_none_or(|s| *s == l.name))
            .filter(|l| parent.port.is_none_or(|port| l.port == Some(port)))
            .collect();
        if attached.is_empty() {
            skips.push(skip(
                NameSkipReason::RouteNotAccepted,
                format!(
                    "{source}: spec.parentRefs[{p}]: expected a listener of Gateway {parent_key}{}, got none",
                    listener_wanted(parent)
                ),
            ));
            continue;
        }
        let admitting: Vec<&Listener> = attached
            .iter()
            .copied()
            .filter(|l| admission(l, &gw.namespace, &object).is_ok())
            .collect();
        if admitting.is_empty() {
            let why: Vec<String> = attached
                .iter()
                .filter_map(|l| admission(l, &gw.namespace, &object).err())
                .map(|e| e.to_string())
                .collect();
            skips.push(skip(
                NameSkipReason::RouteNotAllowedByListeners,
                format!(
                    "{source}: spec.parentRefs[{p}]: no listener of Gateway {parent_key} admits \
                     {kind} from namespace {route_ns}: {}",
                    why.join("; ")
                ),
            ));
            continue;
        }
        for (i, value) in data.spec.hostnames.iter().enumerate() {
            let field = format!("spec.hostnames[{i}]");
            if let Ok(host) = Hostname::parse(value)
                && !admitting.iter().any(|l| on_listener(l, &host))
            {
                let names: Vec<String> = admitting
                    .iter()
                    .filter_map(|l| l.hostname.as_ref().map(|h| format!("{} {h}", l.name)))
                    .collect();
                skips.push(skip(
                    NameSkipReason::RouteHostnameNotOnListener,
                    format!(
                        "{source}: {field}: host {host} is not served by Gateway {parent_key}: \
                         expected a name within the hostname of a listener that admits the \
                         route (listener {})",
                        names.join(", listener ")
                    ),
                ));
                continue;
            }
            from.claim(field, value, &gw.lbs, claims, skips);
        }
    }
}

/// What a route's `status.parents` says for a parent instead of `Accepted` `True`.
#[derive(Debug, thiserror::Error)]
enum NotAccepted {
    /// No entry names the parent.
    #[error("no entry for it")]
    NoEntry,
    /// The first entry's Accepted condition, and its reason.
    #[error("Accepted {status}{}", reason.as_ref().map(|r| format!(" (reason {r})")).unwrap_or_default())]
    Condition {
        /// The condition's status (`False`, `Unknown`).
        status: String,
        /// The condition's reason, where it gives one.
        reason: Option<String>,
    },
    /// The first entry has no Accepted condition.
    #[error("an entry without an Accepted condition")]
    NoCondition,
}

/// Why a listener does not admit a route: the listener, the field and what it expects.
#[derive(Debug, thiserror::Error)]
enum NotAdmitted {
    /// `from: Same` and the route in another namespace.
    #[error(
        "listener {listener} allowedRoutes.namespaces.from is Same: expected the route in \
         namespace {gateway_ns}"
    )]
    OtherNamespace {
        /// The listener's name.
        listener: String,
        /// The Gateway's namespace.
        gateway_ns: String,
    },
    /// `from: Selector`, which would need Namespace labels.
    #[error(
        "listener {listener} allowedRoutes.namespaces.from is Selector, which hairpin does \
         not evaluate (it does not watch Namespace labels): expected Same or All"
    )]
    Selector {
        /// The listener's name.
        listener: String,
    },
    /// A `from` Gateway API does not define.
    #[error(
        "listener {listener} allowedRoutes.namespaces.from: expected All, Same or Selector, \
         got {from:?}"
    )]
    UnknownFrom {
        /// The listener's name.
        listener: String,
        /// What it says.
        from: String,
    },
    /// `allowedRoutes.kinds` does not list the route's kind.
    #[error("listener {listener} allowedRoutes.kinds is {kinds}: expected {kind}")]
    KindNotListed {
        /// The listener's name.
        listener: String,
        /// The kinds it lists, comma-separated.
        kinds: String,
        /// The route's kind.
        kind: String,
    },
    /// No kinds listed, and the route's kind is not one its protocol takes.
    #[error("listener {listener} (protocol {protocol}) takes {takes}: expected {kind}")]
    KindNotOfProtocol {
        /// The listener's name.
        listener: String,
        /// Its protocol.
        protocol: String,
        /// The kinds the protocol takes, comma-separated.
        takes: String,
        /// The route's kind.
        kind: String,
    },
}

/// `Ok` when a `status.parents[]` entry for `parent` says `Accepted` `True`;
/// otherwise what was found instead.
fn acceptance(status: &RouteStatus, parent: &ParentRef, route_ns: &str) -> Result<(), NotAccepted> {
    let entries: Vec<&RouteParentStatus> = status
        .parents
        .iter()
        .filter(|s| s.parent_ref.same_as(parent, route_ns))
        .collect();
    let accepted = |e: &&RouteParentStatus| {
        e.conditions
            .iter()
            .any(|c| c.kind == "Accepted" && c.status == "True")
    };
    if entries.iter().any(accepted) {
        return Ok(());
    }
    let Some(first) = entries.first() else {
        return Err(NotAccepted::NoEntry);
    };
    match first.conditions.iter().find(|c| c.kind == "Accepted") {
        Some(c) => Err(NotAccepted::Condition {
            status: c.status.clone(),
            reason: c.reason.clone(),
        }),
        None => Err(NotAccepted::NoCondition),
    }
}

/// `Ok` when `listener` (of a Gateway in `gateway_ns`) admits `route` (its
/// namespace and kind), else a phrase naming the listener, the field and what it
/// expects.
fn admission(listener: &Listener, gateway_ns: &str, route: &ObjectId) -> Result<(), NotAdmitted> {
    let name = &listener.name;
    let route_ns = route.namespace.as_str();
    let from = listener
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_deref())
        .unwrap_or("Same");
    match from {
        "All" => {}
        "Same" if route_ns == gateway_ns => {}
        "Same" => {
            return Err(NotAdmitted::OtherNamespace {
                listener: name.clone(),
                gateway_ns: gateway_ns.to_owned(),
            });
        }
        "Selector" => {
            return Err(NotAdmitted::Selector {
                listener: name.clone(),
            });
        }
        other => {
            return Err(NotAdmitted::UnknownFrom {
                listener: name.clone(),
                from: other.to_owned(),
            });
        }
    }
    let group = route.api_version.split_once('/').map_or("", |(g, _)| g);
    let kinds = listener
        .allowed_routes
        .as_ref()
        .map(|a| a.kinds.as_slice())
        .unwrap_or_default();
    if !kinds.is_empty() {
        let listed = kinds
            .iter()
            .any(|k| k.kind == route.kind && k.group.as_deref().unwrap_or(GATEWAY_GROUP) == group);
        if !listed {
            let names: Vec<&str> = kinds.iter().map(|k| k.kind.as_str()).collect();
            return Err(NotAdmitted::KindNotListed {
                listener: name.clone(),
                kinds: names.join(", "),
                kind: route.kind.clone(),
            });
        }
        return Ok(());
    }
    // No kinds listed: the protocol's own (Gateway API's defaults); other protocols
    // are implementation-specific and left to the Gateway's acceptance.
    let by_protocol: &[&str] = match listener.protocol.as_str() {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TLS" => &["TLSRoute"],
        "TCP" => &["TCPRoute"],
        "UDP" => &["UDPRoute"],
        _ => return Ok(()),
    };
    if by_protocol.contains(&route.kind.as_str()) {
        Ok(())
    } else {
        Err(NotAdmitted::KindNotOfProtocol {
            listener: name.clone(),
            protocol: listener.protocol.clone(),
            takes: by_protocol.join(", "),
            kind: route.kind.clone(),
        })
    }
}

/// Whether the route hostname `host` lies within `listener`'s hostname: any name
/// when it has none; that exact name; or, for `*.example.com`, a name (or
/// wildcard) under `example.com` (a Gateway API wildcard matches one or more labels).
fn on_listener(listener: &Listener, host: &Hostname) -> bool {
    let Some(value) = &listener.hostname else {
        return true;
    };
    let Ok(l) = Hostname::parse(value) else {
        return false;
    };
    if !l.is_wildcard() {
        return !host.is_wildcard() && host.as_str() == l.as_str();
    }
    let under = host
        .base()
        .strip_suffix(l.base())
        .is_some_and(|rest| rest.ends_with('.'));
    under || (host.is_wildcard() && host.base() == l.base())
}

fn listener_wanted(parent: &ParentRef) -> String {
    match (&parent.section_name, parent.port) {
        (Some(s), Some(port)) => format!(" named {s} on port {port}"),
        (Some(s), None) => format!(" named {s}"),
        (None, Some(port)) => format!(" on port {port}"),
        (None, None) => String::new(),
    }
}

/// The object a claim comes from.
struct Origin<'a> {
    obj: &'a DynamicObject,
    source: &'a str,
    object: &'a ObjectId,
}

impl Origin<'_> {
    fn claim(
        &self,
        field: String,
        value: &str,
        lbs: &[IpAddr],
        claims: &mut Vec<Claim>,
        skips: &mut Vec<NameSkip>,
    ) {
        match Hostname::parse(value) {
            Ok(host) => claims.push(Claim {
                created: self.obj.metadata.creation_timestamp.clone(),
                source: self.source.to_owned(),
                object: Some(self.object.clone()),
                field,
                host,
                lbs: lbs.to_vec(),
            }),
            Err(e) => skips.push(NameSkip {
                reason: NameSkipReason::InvalidHostname,
                message: format!("{}: {field}: {e}", self.source),
                object: Some(self.object.clone()),
            }),
        }
    }
}

fn unreadable(source: &str, e: &serde_json::Error, object: &ObjectId) -> NameSkip {
    NameSkip {
        reason: NameSkipReason::Unreadable,
        message: format!("{source}: expected a gateway api object: {e}"),
        object: Some(object.clone()),
    }
}
