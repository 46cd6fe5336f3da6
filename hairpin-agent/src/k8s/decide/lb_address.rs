//! Which LoadBalancer addresses hairpin may redirect. A Service's
//! `status.loadBalancer.ingress[].ip` is written by a cloud controller, but also by
//! anyone who can update a Service's status, and hairpin redirects that address for
//! every pod on every node: an entry naming `127.0.0.1`, the metadata endpoint
//! `169.254.169.254`, this node's kubelet or a Service's cluster IP would take those
//! over. Such addresses are refused, whatever asked for them.

use std::{collections::BTreeMap, net::IpAddr};

use ipnet::IpNet;

/// The addresses refused besides the built-in classes, and an optional allowlist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LbAddressPolicy {
    /// Networks never redirected, each with what it is (this node's addresses, the
    /// pod and service networks the operator listed).
    pub reserved: Vec<(IpNet, String)>,
    /// When not empty, only addresses inside these networks are redirected
    /// (`--lb-cidrs`: the ranges the cloud hands out for LoadBalancers).
    pub allowed: Vec<IpNet>,
    /// Every Service's cluster IPs, by address, naming the Service: a cluster IP is
    /// never a LoadBalancer's (filled per decision round from the Service cache).
    pub cluster_ips: BTreeMap<IpAddr, String>,
}

impl LbAddressPolicy {
    /// Why `ip` may not be redirected, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<String> {
        if let Some(class) = builtin_refusal(ip) {
            return Some(format!("{ip} is {class}"));
        }
        let ip = ip.to_canonical();
        if let Some(service) = self.cluster_ips.get(&ip) {
            return Some(format!("{ip} is the cluster IP of Service {service}"));
        }
        if let Some((net, what)) = self.reserved.iter().find(|(n, _)| n.contains(&ip)) {
            return Some(format!("{ip} is {what} ({net})"));
        }
        if !self.allowed.is_empty() && !self.allowed.iter().any(|n| n.contains(&ip)) {
            let list: Vec<String> = self.allowed.iter().map(IpNet::to_string).collect();
            return Some(format!(
                "{ip} is outside the load balancer ranges of --lb-cidrs ({})",
                list.join(", ")
            ));
        }
        None
    }
}

/// The classes no LoadBalancer address can belong to, whatever the policy.
pub fn builtin_refusal(ip: IpAddr) -> Option<&'static str> {
    let ip = ip.to_canonical();
    if ip.is_unspecified() {
        return Some("the unspecified address");
    }
    if ip.is_loopback() {
        return Some("a loopback address");
    }
    if ip.is_multicast() {
        return Some("a multicast address");
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    if link_local {
        return Some(
            "a link-local address (metadata endpoints and node-local services live there)",
        );
    }
    if let IpAddr::V4(v4) = ip
        && v4.is_broadcast()
    {
        return Some("the broadcast address");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn addresses_no_load_balancer_has_are_refused() {
        let p = LbAddressPolicy::default();
        for (addr, class) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
        ] {
            let why = p.refusal(ip(addr)).unwrap_or_default();
            assert!(why.contains(class), "{addr}: {why}");
        }
        assert_eq!(p.refusal(ip("203.0.113.10")), None);
        assert_eq!(p.refusal(ip("2001:db8::10")), None);
    }

    #[test]
    fn reserved_networks_and_the_allowlist_are_honoured() {
        let p = LbAddressPolicy {
            reserved: vec![
                (
                    "192.0.2.1/32".parse().expect("net"),
                    "this node's address".into(),
                ),
                (
                    "10.96.0.0/12".parse().expect("net"),
                    "the service network".into(),
                ),
            ],
            allowed: vec!["203.0.113.0/24".parse().expect("net")],
            cluster_ips: BTreeMap::from([(ip("203.0.113.99"), "default/kubernetes".into())]),
        };
        assert_eq!(
            p.refusal(ip("203.0.113.99")).as_deref(),
            Some("203.0.113.99 is the cluster IP of Service default/kubernetes")
        );
        assert_eq!(
            p.refusal(ip("192.0.2.1")).as_deref(),
            Some("192.0.2.1 is this node's address (192.0.2.1/32)")
        );
        assert_eq!(
            p.refusal(ip("10.96.0.10")).as_deref(),
            Some("10.96.0.10 is the service network (10.96.0.0/12)")
        );
        assert_eq!(
            p.refusal(ip("198.51.100.7")).as_deref(),
            Some("198.51.100.7 is outside the load balancer ranges of --lb-cidrs (203.0.113.0/24)")
        );
        assert_eq!(p.refusal(ip("203.0.113.10")), None);
    }
}
