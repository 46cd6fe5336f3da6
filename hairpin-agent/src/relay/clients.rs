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
//! CNI, Azure CNI, Calico and Cilium cluster-pool IPAM) the pods of this node are
//! learned one by one ([`LearnedClients`]), and a peer not yet learned is held
//! for [`LEARN_GRACE`] before it is refused: a pod may connect before the
//! kubelet has published its address.

use std::{
    collections::HashSet,
    fmt,
    net::IpAddr,
    str::FromStr,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use ipnet::IpNet;
use tokio::sync::Notify;

/// How long a connection from a peer the policy may still learn is held before it
/// is refused: long enough for the kubelet to publish a new pod's address and the
/// watch to deliver it.
pub const LEARN_GRACE: Duration = Duration::from_secs(3);

/// The networks whose clients a relay accepts, plus the single addresses learned
/// at run time (this node's pods). Fails closed: what is not listed is refused.
#[derive(Clone, Debug, Default)]
pub struct ClientPolicy {
    allowed: Vec<IpNet>,
    any: bool,
    learned: Option<LearnedClients>,
}

/// What the policy says of one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Allowed,
    /// Refused.
    Refused,
    /// Not known yet, and the policy learns: wait ([`ClientPolicy::learn`]).
    Unknown,
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

    /// Also accepts the single addresses in `learned`, as it learns them.
    pub fn learning(mut self, learned: LearnedClients) -> ClientPolicy {
        self.learned = Some(learned);
        self
    }

    /// The addresses learned at run time, when the policy learns.
    pub fn learned(&self) -> Option<&LearnedClients> {
        self.learned.as_ref()
    }

    /// What the policy says of `peer` now. IPv4-mapped IPv6 peers (dual-stack
    /// listeners) are judged by their IPv4 address.
    pub fn verdict(&self, peer: IpAddr) -> Verdict {
        let peer = peer.to_canonical();
        if self.any || self.allowed.iter().any(|net| net.contains(&peer)) {
            return Verdict::Allowed;
        }
        match &self.learned {
            Some(l) if l.contains(peer) => Verdict::Allowed,
            Some(_) => Verdict::Unknown,
            None => Verdict::Refused,
        }
    }

    /// Whether a connection from `peer` may be relayed now.
    pub fn allows(&self, peer: IpAddr) -> bool {
        self.verdict(peer) == Verdict::Allowed
    }

    /// Waits at most `grace` for `peer` to be learned; whether it may be relayed.
    pub async fn learn(&self, peer: IpAddr, grace: Duration) -> bool {
        let peer = peer.to_canonical();
        let Some(learned) = &self.learned else {
            return self.allows(peer);
        };
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Registered before the check, so a change between the two wakes us.
            let changed = learned.inner.changed.notified();
            if self.allows(peer) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.allows(peer);
            }
        }
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

/// Single client addresses learned at run time (this node's pods, from the Pods
/// whose `spec.nodeName` is this node), shared by every listener. Replaced whole
/// on each change; waiters are woken.
#[derive(Clone, Debug, Default)]
pub struct LearnedClients {
    inner: Arc<Learned>,
}

#[derive(Debug, Default)]
struct Learned {
    addresses: RwLock<HashSet<IpAddr>>,
    changed: Notify,
}

impl LearnedClients {
    /// Replaces the learned addresses with `addresses`.
    pub fn replace(&self, addresses: HashSet<IpAddr>) {
        let addresses = addresses.into_iter().map(|a| a.to_canonical()).collect();
        *self
            .inner
            .addresses
            .write()
            .unwrap_or_else(PoisonError::into_inner) = addresses;
        self.inner.changed.notify_waiters();
    }

    /// Whether `peer` is learned.
    pub fn contains(&self, peer: IpAddr) -> bool {
        self.inner
            .addresses
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&peer.to_canonical())
    }

    /// How many addresses are learned.
    pub fn len(&self) -> usize {
        self.inner
            .addresses
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
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

    #[test]
    fn learned_addresses_pass_and_others_are_unknown_until_refused() {
        let learned = LearnedClients::default();
        let p = policy(&["192.0.2.1/32"]).learning(learned.clone());
        let pod: IpAddr = "10.0.3.7".parse().expect("ip");
        assert_eq!(
            p.verdict("192.0.2.1".parse().expect("ip")),
            Verdict::Allowed
        );
        assert_eq!(p.verdict(pod), Verdict::Unknown);
        learned.replace(HashSet::from([pod]));
        assert_eq!(
            p.verdict("::ffff:10.0.3.7".parse().expect("ip")),
            Verdict::Allowed
        );
        assert_eq!(learned.len(), 1);
        assert_eq!(p.to_string(), "192.0.2.1/32,this node's pods");
        learned.replace(HashSet::new());
        assert_eq!(p.verdict(pod), Verdict::Unknown, "a pod gone is forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_learned_within_the_grace_is_served_and_others_refused_after_it() {
        let learned = LearnedClients::default();
        let p = ClientPolicy::default().learning(learned.clone());
        let pod: IpAddr = "10.0.3.7".parse().expect("ip");
        let waiting = tokio::spawn({
            let p = p.clone();
            async move { p.learn(pod, LEARN_GRACE).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        learned.replace(HashSet::from([pod]));
        assert!(waiting.await.expect("join"), "learned within the grace");

        let start = tokio::time::Instant::now();
        assert!(
            !p.learn("198.51.100.9".parse().expect("ip"), LEARN_GRACE)
                .await
        );
        assert_eq!(
            start.elapsed(),
            LEARN_GRACE,
            "refused once the grace is over"
        );
        let fixed = policy(&["10.0.0.0/8"]);
        assert!(
            !fixed
                .learn("198.51.100.9".parse().expect("ip"), LEARN_GRACE)
                .await
        );
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
