//! Names rather than IPs: which hostnames lead to which LoadBalancer, and the ways
//! clients are pointed at the name relay for them — a managed block in the node's
//! /etc/hosts, CoreDNS rewrites (their text; [`crate::k8s::coredns`] writes them),
//! and the names address on a link.
//!
//! Owns: hostname validation, which names may be published at all ([`scope`]:
//! `--names-domains` and the names always refused) and how many ([`caps`]:
//! per namespace and in all), claims from Ingress and Gateway
//! objects and the routes they resolve to, the hosts block and its writer, the
//! Corefile text, the names link, and the name relay ([`relay`]), which routes by
//! TLS SNI or HTTP Host.
//! Everything but [`hosts_writer`], [`hosts::write_in_place`], [`link`] and
//! [`relay`] is sans-IO. Does not touch the BPF datapath nor the Kubernetes API.

pub(crate) mod caps;
pub(crate) mod claims;
pub mod corefile;
pub(crate) mod gateway;
pub(crate) mod hostname;
pub mod hosts;
pub(crate) mod hosts_writer;
pub(crate) mod ingress;
pub(crate) mod link;
pub(crate) mod nat;
pub(crate) mod object;
pub(crate) mod relay;
pub(crate) mod routes;
pub(crate) mod scope;

pub use hostname::Hostname;
pub use hosts_writer::{HostsReport, cleanup as remove_hosts_block, sync as write_hosts_block};
pub use relay::{Peek, http_host::parse_host, sni::parse_sni};
pub use routes::{NameRoute, NameSkipReason};
pub use scope::{NameScope, ScopeRule};

#[cfg(test)]
mod proptests;
