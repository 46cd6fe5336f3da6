//! Which peers the relays serve: this node's processes and its pods, never the
//! world. A relay listener that a peer off the node can reach (the hairpin
//! Service's target ports sit on the node IP; a link-local address is reachable
//! from the same L2 segment) would otherwise let it reach the LoadBalancer's
//! backends past the LB's own source ranges, with a header naming it as a client
//! from inside the cluster.
//!
//! The policy fails closed: an empty one serves nobody but what it lists.
//! [`ClientPolicy::any`] is the explicit opposite, for tests. Pod networks come
//! from the operator or the Node's `spec.podCIDRs`; where neither exists (EKS VPC
//! CNI, Azure CNI, Calico and Cilium cluster-pool IPAM) they are read from this
//! node's own links and routes ([`crate::podnet`]) and followed as they change
//! ([`LearnedClients`]). A peer not in them is refused at once: waiting for it to
//! be learned would let peers off the node hold places in the shared connection
//! cap, and a pod's route is in place before its containers start.

use std::{
    fmt,
    net::IpAddr,
    str::FromStr,
    sync::{Arc, PoisonError, RwLock},
};

use ipnet::IpNet;

use crate::podnet::PodNetworks;

/// The networks whose clients a relay accepts, plus the pod networks learned at
/// run time from this node's routes. Fails closed: what is not listed is refused.
#[derive(Clone, Debug, Default)]
pub struct ClientPolicy {
    allowed: Vec<IpNet>,
    any: bool,
    learned: Option<LearnedClients>,
}

impl ClientPolicy {
    /// A policy accepting clients from `allowed` only (empty: nobody).
    pub fn new(allowed: Vec<IpNet>) -> ClientPolicy {
        ClientPolicy {
            allowed,
            ..ClientPolicy::default()
        }
    }

    /// Accepts every peer. Never the agent's default; for relays whose listeners
    /// nothing else can reach (tests on loopback).
    pub fn any() -> ClientPolicy {
        ClientPolicy {
            any: true,
            ..ClientPolicy::default()
        }
    }

    /// Also accepts the pod networks in `learned`, as they change.
    pub fn learning(mut self, learned: LearnedClients) -> ClientPolicy {
        self.learned = Some(learned);
        self
    }

    /// Whether a connection from `peer` may be relayed. IPv4-mapped IPv6 peers
    /// (dual-stack listeners) are judged by their IPv4 address. Decided at once:
    /// nothing waits on a peer the policy does not know.
    pub(crate) fn allows(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.any
            || self.allowed.iter().any(|net| net.contains(&peer))
            || self.learned.as_ref().is_some_and(|l| l.contains(peer))
    }
}

impl fmt::Display for ClientPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.any {
            return f.write_str("any");
        }
        let mut parts: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
        if self.learned.is_some() {
            parts.push("this node's pods".into());
        }
        if parts.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&parts.join(","))
    }
}

/// This node's pod networks as last read from its routes, shared by every
/// listener and replaced whole on each change.
#[derive(Clone, Debug, Default)]
pub struct LearnedClients {
    inner: Arc<RwLock<PodNetworks>>,
}

impl LearnedClients {
    /// Replaces the learned networks with `networks`.
    pub fn replace(&self, networks: PodNetworks) {
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = networks;
    }

    /// Whether `peer` is in them.
    pub(crate) fn contains(&self, peer: IpAddr) -> bool {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(peer)
    }

    /// How many networks are learned (pod addresses and ranges).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let n = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        n.hosts.len() + n.ranges.len()
    }

    /// Whether none is.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Parses one `--allowed-clients` entry: a CIDR (`10.244.0.0/16`) or a bare address.
pub fn parse_net(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if let Ok(net) = IpNet::from_str(s) {
        return Ok(net.trunc());
    }
    IpAddr::from_str(s)
        .map(IpNet::from)
        .map_err(|_| format!("expected a CIDR such as 10.244.0.0/16 or an address, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(nets: &[&str]) -> ClientPolicy {
        ClientPolicy::new(nets.iter().map(|n| parse_net(n).expect("net")).collect())
    }

    #[test]
    fn empty_allows_nobody_and_any_is_explicit() {
        let p = ClientPolicy::default();
        assert!(!p.allows("198.51.100.7".parse().expect("ip")));
        assert!(!p.allows("127.0.0.1".parse().expect("ip")));
        assert_eq!(p.to_string(), "none");
        let any = ClientPolicy::any();
        assert!(any.allows("198.51.100.7".parse().expect("ip")));
        assert_eq!(any.to_string(), "any");
    }

    fn networks(hosts: &[&str], ranges: &[&str]) -> PodNetworks {
        PodNetworks {
            hosts: hosts.iter().map(|h| h.parse().expect("ip")).collect(),
            ranges: ranges.iter().map(|r| r.parse().expect("net")).collect(),
            ..PodNetworks::default()
        }
    }

    #[test]
    fn learned_networks_pass_and_others_are_refused_at_once() {
        let learned = LearnedClients::default();
        let p = policy(&["192.0.2.1/32"]).learning(learned.clone());
        let pod: IpAddr = "10.0.3.7".parse().expect("ip");
        assert!(p.allows("192.0.2.1".parse().expect("ip")));
        assert!(!p.allows(pod), "not learned yet: refused, never held");
        learned.replace(networks(&["10.0.3.7"], &["10.0.1.0/24"]));
        assert!(p.allows("::ffff:10.0.3.7".parse().expect("ip")));
        assert!(p.allows("10.0.1.200".parse().expect("ip")));
        assert!(!p.allows("10.0.2.1".parse().expect("ip")));
        assert_eq!(learned.len(), 2);
        assert_eq!(p.to_string(), "192.0.2.1/32,this node's pods");
        learned.replace(PodNetworks::default());
        assert!(!p.allows(pod), "a pod gone is forgotten");
        assert!(learned.is_empty());
    }

    #[test]
    fn only_listed_networks_pass() {
        let p = policy(&["10.244.1.0/24", "192.0.2.1", "fd00:10::/64"]);
        for ok in ["10.244.1.7", "192.0.2.1", "fd00:10::5", "::ffff:10.244.1.9"] {
            assert!(p.allows(ok.parse().expect("ip")), "{ok}");
        }
        for no in ["10.244.2.7", "192.0.2.2", "203.0.113.5", "2001:db8::1"] {
            assert!(!p.allows(no.parse().expect("ip")), "{no}");
        }
    }

    #[test]
    fn entries_are_normalised_and_bad_ones_named() {
        assert_eq!(
            parse_net("10.244.1.9/24").expect("net").to_string(),
            "10.244.1.0/24"
        );
        let err = parse_net("10.244.1.0/33").expect_err("bad prefix");
        assert!(err.contains("\"10.244.1.0/33\""), "{err}");
    }
}
