//! A host as one object claims it, before frontends and other claims are
//! consulted ([`super::routes::resolve`] settles them), and the hosts left out.

use std::{fmt, net::IpAddr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::hostname::Hostname;

/// Why a host was not routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NameSkipReason {
    /// The field's value is not a valid DNS name.
    InvalidHostname,
    /// The object has no LoadBalancer IP in its status yet (or only hostnames).
    NoLoadBalancerIp,
    /// The object's LB IP is not a proxied frontend: no header is needed there.
    NotProxied,
    /// A route's parent Gateway is not known.
    ParentNotFound,
    /// The object could not be read (a Gateway API object of an unexpected shape).
    Unreadable,
    /// An older object claims the same host on another LB and keeps it.
    Conflict,
}

/// One host (or object) left out, with a sentence naming the object and field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameSkip {
    /// Machine-readable reason.
    pub reason: NameSkipReason,
    /// `Kind ns/name: field: what happened`.
    pub message: String,
}

impl fmt::Display for NameSkip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A host claimed by an object, before the frontends and other claims are consulted.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The object's creationTimestamp: older objects win conflicts.
    pub created: Option<Time>,
    /// `Kind ns/name`.
    pub source: String,
    /// The field the host came from, e.g. `spec.rules[0].host`.
    pub field: String,
    /// The validated host.
    pub host: Hostname,
    /// The object's LoadBalancer IPs.
    pub lbs: Vec<IpAddr>,
}
