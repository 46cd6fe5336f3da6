//! Which peers the relays serve: this node's processes and its pods, never the
//! world. A relay listener sits on a node address; without this check anyone who
//! can reach that address could use it to reach the LoadBalancer's backends from
//! inside the cluster, past the LB's own source ranges.

use std::{fmt, net::IpAddr, str::FromStr};

use ipnet::IpNet;

/// The networks whose clients a relay accepts. Empty means everyone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientPolicy {
    allowed: Vec<IpNet>,
}

impl ClientPolicy {
    /// A policy accepting clients from `allowed` only (empty: everyone).
    pub fn new(allowed: Vec<IpNet>) -> ClientPolicy {
        ClientPolicy { allowed }
    }

    /// Whether a connection from `peer` may be relayed. IPv4-mapped IPv6 peers
    /// (dual-stack listeners) are judged by their IPv4 address.
    pub fn allows(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.allowed.is_empty() || self.allowed.iter().any(|net| net.contains(&peer))
    }
}

impl fmt::Display for ClientPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allowed.is_empty() {
            return f.write_str("any");
        }
        let nets: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
        f.write_str(&nets.join(","))
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
    fn empty_allows_all_and_says_so() {
        let p = ClientPolicy::default();
        assert!(p.allows("198.51.100.7".parse().expect("ip")));
        assert_eq!(p.to_string(), "any");
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
