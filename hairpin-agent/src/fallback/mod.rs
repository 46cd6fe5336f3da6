//! Fallbacks for nodes or clusters where the eBPF path cannot attach, and for
//! names rather than IPs: a managed block in the node's /etc/hosts, and CoreDNS
//! rewrites that send a LoadBalancer's hostnames to the hairpin relay.
//!
//! Everything here is sans-IO text transformation over validated [`hostname::Hostname`]s,
//! except [`hosts::write_in_place`], the one thin edge that touches a file.

pub mod coredns;
pub mod hostname;
pub mod hosts;

#[cfg(test)]
mod proptests;
