//! Fallbacks for nodes or clusters where the eBPF path cannot attach, and for
//! names rather than IPs: a managed block in the node's /etc/hosts, and CoreDNS
//! rewrites that send a LoadBalancer's hostnames to the hairpin relay.
//!
//! Everything here is sans-IO text transformation over validated [`hostname::Hostname`]s,
//! except [`hosts::write_in_place`] and [`hosts_writer`], the thin edges that touch a file.

pub mod coredns;
pub mod hostname;
pub mod hosts;
pub mod hosts_writer;
pub mod names;
mod names_gateway;
mod names_ingress;

#[cfg(test)]
mod proptests;
