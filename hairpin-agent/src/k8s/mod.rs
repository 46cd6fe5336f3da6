//! Kubernetes-facing decisions, kept pure: which LoadBalancer frontends need a PROXY header,
//! decided from Service objects alone (pure), and the thin edges that feed and report them:
//! the watch source, Events and the Lease.

pub mod annotations;
pub mod client;
pub mod cluster_dns;
pub mod coredns;
pub mod coredns_loop;
pub mod decide;
pub mod decision;
pub mod desired;
pub mod events;
pub mod lease;
pub mod node;
pub mod provider_eval;
pub mod providers;
pub mod watch;

pub use decide::{Defaults, decide, service_key};
pub use decision::{Decision, Outcome, Rule, Skip, SkipReason};
pub use desired::{Conflict, DesiredState, decide_all};
