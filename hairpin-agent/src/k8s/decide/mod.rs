//! The pure deciders: plain functions from API objects to what should exist, unit-
//! tested with recorded objects. Nothing here performs I/O.
//!
//! - [`service`]: one Service -> the frontends it asks for, and why ([`decision`]).
//! - [`annotations`], [`providers`], [`provider_eval`]: our annotation and the
//!   cloud providers' PROXY-protocol annotations.
//! - [`desired`]: every Service -> one frontend per LB address (the oldest Service
//!   wins a conflict) and the hostnames routed to them.
//! - [`lb_address`]: which LoadBalancer addresses may be redirected at all.
//! - [`cluster_dns`]: which Service is the cluster DNS, for `check`.
//! - [`nodes`]: what the Nodes report about themselves, as far as it is believed.

pub(crate) mod annotations;
pub(crate) mod cluster_dns;
pub(crate) mod decision;
pub(crate) mod desired;
pub(crate) mod lb_address;
pub(crate) mod nodes;
pub(crate) mod provider_eval;
pub(crate) mod providers;
pub(crate) mod service;

pub(crate) use decision::Decision;
pub(crate) use decision::SkipReason;
pub(crate) use desired::decide_all;
pub(crate) use nodes::IgnoredClaim;
pub(crate) use service::Defaults;
