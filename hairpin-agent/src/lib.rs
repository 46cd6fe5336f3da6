//! hairpin-agent: the per-node DaemonSet that makes in-cluster traffic to the
//! cluster's own PROXY-protocol LoadBalancers carry the header the ingress expects.
//!
//! Layout follows the architecture: deciding what should exist is plain functions
//! over plain data (`frontends`, `proxy_header`, ...); the edges (`ebpf`, `relay`)
//! are thin and tested for real.

pub mod admin;
pub mod cli;
pub mod clients;
pub mod ebpf;
pub mod fallback;
pub mod frontends;
pub mod k8s;
pub mod kernel;
pub mod metrics;
pub mod mode;
pub mod name_relay;
pub mod names_link;
pub mod proxy_header;
pub mod reconcile;
pub mod relay;
pub mod resources;
pub mod run;
pub mod run_args;
pub mod sources;
pub mod state;
pub mod static_source;
