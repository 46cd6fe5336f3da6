//! What a source says should exist ([`Desired`]), and the channel it is sent on:
//! the one value the Kubernetes source and the frontends file hand the agent, the
//! Events writer and the CoreDNS writer.

use std::{net::IpAddr, sync::Arc};

use tokio::sync::watch;

use super::decide::{Decision, IgnoredClaim};
use crate::{
    model::Frontends,
    names::routes::{NameRoute, NameSkip},
    status::NameLimitsStatus,
};

/// What a source says should exist, sent whole: the Kubernetes source sends one
/// after every decision round that changed it, the frontends file one per load
/// that parsed. Shared, not copied, by everything that reads it (the agent, the
/// Events and CoreDNS writers). Split in two: what the agent makes live, and what is
/// only reported, so a change of the second never touches the datapath.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// What the agent makes live: frontends in the map and relays, name routes.
    pub apply: ToApply,
    /// What is only reported: `status`, Events, metrics.
    pub report: ToReport,
}

/// What the agent makes live.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToApply {
    /// LoadBalancer frontends to redirect and relay, one per address.
    pub frontends: Frontends,
    /// Hostnames the name relay routes to their own LB (and /etc/hosts points at it).
    pub routes: Vec<NameRoute>,
}

/// What is only reported (in `status`, Events on the objects at fault, metrics).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToReport {
    /// Hostnames left out (refused by `--names-domains` and its rules, not accepted
    /// by their Gateway, not proxied, conflicts), with the object at fault.
    pub route_skips: Vec<NameSkip>,
    /// The caps on names, and how many names they withheld by namespace.
    pub name_limits: NameLimitsStatus,
    /// Every LoadBalancer Service's decision, for `status` and Events (none from
    /// the frontends file).
    pub decisions: Vec<Decision>,
    /// The cluster DNS Service's IPs, for `check` (none from the frontends file).
    pub cluster_dns: Vec<IpAddr>,
    /// What Nodes claim that is passed over (a pod network wider than a node's
    /// share), for Events on those Nodes (none from the frontends file).
    pub ignored_node_claims: Vec<IgnoredClaim>,
}

/// The receiving end of a source: `None` until it has synced once, so the agent
/// never applies an empty set it did not mean.
pub type DesiredRx = watch::Receiver<Option<Arc<Desired>>>;
