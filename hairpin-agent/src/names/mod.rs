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
pub mod hostname;
pub mod hosts;
pub mod hosts_writer;
pub(crate) mod ingress;
pub(crate) mod link;
pub(crate) mod nat;
pub(crate) mod object;
pub mod relay;
pub mod routes;
pub mod scope;

#[cfg(test)]
mod proptests;
