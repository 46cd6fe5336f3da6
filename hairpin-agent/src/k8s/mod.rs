//! Kubernetes-facing decisions, kept pure: which LoadBalancer frontends need a PROXY header,
//! decided from Service objects alone. The watcher that feeds them lives elsewhere.

pub mod annotations;
pub mod decide;
pub mod decision;
pub mod desired;
pub mod provider_eval;
pub mod providers;

pub use decide::{Defaults, decide, service_key};
pub use decision::{Decision, Outcome, Rule, Skip, SkipReason};
pub use desired::{Conflict, DesiredState, decide_all};
