//! A host as one object claims it, before frontends and other claims are
//! consulted ([`super::routes::resolve`] settles them), and the hosts left out.

use std::{fmt, net::IpAddr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub(crate) use super::object::ObjectId;
use super::{caps::CapRule, hostname::Hostname, scope::ScopeRule};

/// Why a host was not routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NameSkipReason {
    /// The field's value is not a valid DNS name.
    InvalidHostname,
    /// The name is outside `--names-domains` or always refused: the rule it broke.
    Refused(ScopeRule),
    /// The object has no LoadBalancer IP in its status yet (or only hostnames).
    NoLoadBalancerIp,
    /// The object's LB IP is not a proxied frontend: no header is needed there.
    NotProxied,
    /// A route's parent Gateway is not known.
    ParentNotFound,
    /// A route's parent Gateway has not accepted it: no `status.parents[]` entry for
    /// that parentRef with condition `Accepted` `True`.
    RouteNotAccepted,
    /// None of the parent Gateway's listeners the route attaches to admits it: not
    /// the route's namespace (`allowedRoutes.namespaces.from`, or only through a
    /// `Selector` this agent cannot evaluate), or not its kind.
    RouteNotAllowedByListeners,
    /// The route's hostname matches no hostname of the listeners that admit it.
    RouteHostnameNotOnListener,
    /// The object could not be read (a Gateway API object of an unexpected shape).
    Unreadable,
    /// An older object claims the same host on another LB and keeps it.
    Conflict,
    /// Withheld by `--max-names-per-namespace` or `--max-names`: the cap it hit.
    Capped(CapRule),
}

impl NameSkipReason {
    /// The rule's name when a tenant's object asked for something refused
    /// (a Warning Event on it), `None` for the ordinary states (no LB yet, not
    /// proxied, `--names-domains` empty).
    pub(crate) fn warning_rule(self) -> Option<&'static str> {
        match self {
            // Not the object's fault: the operator's or the API server's state.
            NameSkipReason::Refused(ScopeRule::NoDomains | ScopeRule::ApiServerPending) => None,
            NameSkipReason::Refused(rule) => Some(rule.event_reason()),
            NameSkipReason::RouteNotAccepted => Some("RouteNotAcceptedByGateway"),
            NameSkipReason::RouteNotAllowedByListeners => Some("RouteNotAllowedByListeners"),
            NameSkipReason::RouteHostnameNotOnListener => Some("RouteHostnameNotOnListener"),
            NameSkipReason::InvalidHostname => Some("InvalidHostname"),
            NameSkipReason::Conflict => Some("HostnameConflict"),
            NameSkipReason::Capped(rule) => Some(rule.event_reason()),
            NameSkipReason::NoLoadBalancerIp
            | NameSkipReason::NotProxied
            | NameSkipReason::ParentNotFound
            | NameSkipReason::Unreadable => None,
        }
    }
}

/// One host (or object) left out, with a sentence naming the object and field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameSkip {
    /// Machine-readable reason.
    pub reason: NameSkipReason,
    /// `Kind ns/name: field: what happened`.
    pub message: String,
    /// The Kubernetes object at fault, when there is one (not for the frontends file).
    pub object: Option<ObjectId>,
}

impl fmt::Display for NameSkip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A host claimed by an object, before the frontends and other claims are consulted.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    /// The object's creationTimestamp: older objects win conflicts.
    pub created: Option<Time>,
    /// `Kind ns/name`.
    pub source: String,
    /// The Kubernetes object, when the claim comes from one.
    pub object: Option<ObjectId>,
    /// The field the host came from, e.g. `spec.rules[0].host`.
    pub field: String,
    /// The validated host.
    pub host: Hostname,
    /// The object's LoadBalancer IPs.
    pub lbs: Vec<IpAddr>,
}
