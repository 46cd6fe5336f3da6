//! Which LoadBalancer addresses hairpin may redirect. A Service's
//! `status.loadBalancer.ingress[].ip` is written by a cloud controller, but also by
//! anyone who can update a Service's status, and hairpin redirects that address for
//! every pod on every node: an entry naming `127.0.0.1`, the metadata endpoint
//! `169.254.169.254`, this node's kubelet or a Service's cluster IP would take those
//! over. Such addresses are refused, whatever asked for them.
//!
//! One table for every source (Service status, the frontends file; Gateway and
//! Ingress names only ever lead to a frontend that passed it) and both binaries
//! (`run`, `coredns-writer`): [`builtin_refusal`] for the classes and
//! [`PLATFORM_ENDPOINTS`] no LoadBalancer can be, then [`LbAddressPolicy`] for
//! what the node and the operator add. IPv6 spellings of an IPv4 address are
//! judged as that address: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
//! (`::a.b.c.d`), NAT64 (`64:ff9b::/96`, RFC 6052; `64:ff9b:1::/48`, RFC 8215, at
//! every prefix length RFC 6052 section 2.2 allows an operator to carve from it;
//! the operator's own NAT64 prefixes from `--nat64-prefixes`) and 6to4
//! (`2002:AABB:CCDD::/48`, RFC 3056): a DNS64 resolver or a NAT64 gateway turns
//! each back into the IPv4 endpoint.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

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
    /// What the cluster's Nodes report as their own addresses and pod networks,
    /// each naming the Node and field (filled per decision round). A Node's status
    /// is its own kubelet's word, so these yield to `allowed` (see [`Self::refusal`]).
    pub node_claims: Vec<(IpNet, String)>,
    /// The operator's NAT64 prefixes (`--nat64-prefixes`): an address inside one is
    /// also judged as the IPv4 address it embeds (RFC 6052 section 2.2).
    pub nat64: Vec<ipnet::Ipv6Net>,
}

impl LbAddressPolicy {
    /// Why `ip` may not be redirected, or `None` when it may.
    pub(crate) fn refusal(&self, ip: IpAddr) -> Option<String> {
        if let Some(class) = builtin_refusal_with(ip, &self.nat64) {
            return Some(format!("{ip} is {class}"));
        }
        let ip = ip.to_canonical();
        if let Some(service) = self.cluster_ips.get(&ip) {
            return Some(format!("{ip} is the cluster IP of Service {service}"));
        }
        if let Some((net, what)) = self.reserved.iter().find(|(n, _)| n.contains(&ip)) {
            return Some(format!("{ip} is {what} ({net})"));
        }
        if !self.allowed.is_empty() {
            if self.allowed.iter().any(|n| n.contains(&ip)) {
                // The operator named the LoadBalancer ranges: inside them a Node's
                // claim (its kubelet's word) cannot switch a LoadBalancer off.
                return None;
            }
            let list: Vec<String> = self.allowed.iter().map(IpNet::to_string).collect();
            return Some(format!(
                "{ip} is outside the load balancer ranges of --lb-cidrs ({})",
                list.join(", ")
            ));
        }
        if let Some((net, what)) = self.node_claims.iter().find(|(n, _)| n.contains(&ip)) {
            return Some(format!(
                "{ip} is {what} ({net}); a Node's report yields to --lb-cidrs: list the \
                 LoadBalancer ranges there if that Node is not this LoadBalancer"
            ));
        }
        None
    }
}

/// A documented metadata or platform endpoint: (address, what it is, where it is
/// documented). Those in 169.254.0.0/16 or fe80::/10 are refused as link-local
/// anyway; they are listed so the refusal names them.
pub(crate) const PLATFORM_ENDPOINTS: &[(&str, &str, &str)] = &[
    (
        "169.254.169.254",
        "the instance metadata endpoint (AWS, GCP, Azure, OCI, OpenStack, DigitalOcean, Hetzner, IBM Cloud VPC)",
        "docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html",
    ),
    (
        "fd00:ec2::254",
        "the AWS instance metadata endpoint over IPv6",
        "docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html",
    ),
    (
        "fd00:ec2::253",
        "the AWS Route 53 Resolver over IPv6",
        "docs.aws.amazon.com/vpc/latest/userguide/AmazonDNS-concepts.html",
    ),
    (
        "fd00:ec2::123",
        "the Amazon Time Sync Service over IPv6",
        "docs.aws.amazon.com/AWSEC2/latest/UserGuide/set-time.html",
    ),
    (
        "fd00:ec2::23",
        "the Amazon EKS Pod Identity Agent over IPv6",
        "docs.aws.amazon.com/eks/latest/userguide/pod-id-how-it-works.html",
    ),
    (
        "169.254.170.23",
        "the Amazon EKS Pod Identity Agent",
        "docs.aws.amazon.com/eks/latest/userguide/pod-id-how-it-works.html",
    ),
    (
        "169.254.170.2",
        "the Amazon ECS task metadata and credentials endpoint",
        "docs.aws.amazon.com/AmazonECS/latest/developerguide/task-iam-roles.html",
    ),
    (
        "fd20:ce::254",
        "the Google Compute Engine metadata server over IPv6",
        "cloud.google.com/compute/docs/metadata/querying-metadata",
    ),
    (
        "fd00:c1::a9fe:a9fe",
        "the Oracle Cloud instance metadata endpoint over IPv6",
        "docs.oracle.com/iaas/Content/Compute/Tasks/gettingmetadata.htm",
    ),
    (
        "100.100.100.200",
        "the Alibaba Cloud ECS instance metadata endpoint",
        "alibabacloud.com/help/ecs/user-guide/view-instance-metadata",
    ),
    (
        "168.63.129.16",
        "the Azure WireServer (platform DNS, DHCP, health probes, VM agent)",
        "learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16",
    ),
    (
        "169.254.0.23",
        "the Tencent Cloud CVM metadata endpoint",
        "tencentcloud.com/document/product/213/4934",
    ),
    (
        "169.254.20.10",
        "the node-local-dns cache address",
        "kubernetes.io/docs/tasks/administer-cluster/nodelocaldns/",
    ),
];

/// The NAT64 prefix lengths RFC 6052 section 2.2 defines, each with its own place
/// for the IPv4 address (bits 64 to 71, the `u` octet, are always skipped).
pub(crate) const NAT64_PREFIX_LENGTHS: [u8; 6] = [32, 40, 48, 56, 64, 96];

/// The IPv4 address embedded in `ip` under a NAT64 prefix of `prefix_len` bits
/// (RFC 6052 section 2.2); `None` for a length the RFC does not define.
pub(crate) fn rfc6052_ipv4(ip: Ipv6Addr, prefix_len: u8) -> Option<Ipv4Addr> {
    let o = ip.octets();
    // Octet indexes holding the IPv4 address, in order, for each prefix length.
    let at: [usize; 4] = match prefix_len {
        32 => [4, 5, 6, 7],
        40 => [5, 6, 7, 9],
        48 => [6, 7, 9, 10],
        56 => [7, 9, 10, 11],
        64 => [9, 10, 11, 12],
        96 => [12, 13, 14, 15],
        _ => return None,
    };
    Some(Ipv4Addr::new(o[at[0]], o[at[1]], o[at[2]], o[at[3]]))
}

/// Every IPv4 address an IPv6 address may stand for, where it is one of the
/// spellings a DNS64 resolver, a NAT64 gateway or a dual-stack socket turns back
/// into it: IPv4-mapped, IPv4-compatible, the NAT64 well-known prefix
/// `64:ff9b::/96` (RFC 6052), the local-use prefix `64:ff9b:1::/48` (RFC 8215) at
/// every length an operator may carve from it (48, 56, 64 and 96: each reading is
/// a candidate), 6to4 (RFC 3056), and `nat64` (the operator's own prefixes,
/// `--nat64-prefixes`).
pub(crate) fn embedded_ipv4s(ip: Ipv6Addr, nat64: &[ipnet::Ipv6Net]) -> Vec<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let last = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let mut out = Vec::new();
    if let Some(v4) = ip.to_ipv4_mapped() {
        out.push(v4);
    }
    // IPv4-compatible (deprecated, RFC 4291 2.5.5.1); not :: and ::1.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        out.push(last);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        out.push(last);
    }
    if s[..3] == [0x64, 0xff9b, 1] {
        out.extend(
            [48, 56, 64, 96]
                .into_iter()
                .filter_map(|l| rfc6052_ipv4(ip, l)),
        );
    }
    // 6to4 (RFC 3056): 2002:AABB:CCDD::/48.
    if s[0] == 0x2002 {
        out.push(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    for p in nat64.iter().filter(|p| p.contains(&ip)) {
        out.extend(rfc6052_ipv4(ip, p.prefix_len()));
    }
    out.dedup();
    out
}

fn platform_endpoint_with(
    ip: IpAddr,
    nat64: &[ipnet::Ipv6Net],
) -> Option<(&'static str, &'static str, &'static str)> {
    let mut forms = vec![ip.to_canonical()];
    if let IpAddr::V6(v6) = ip.to_canonical() {
        forms.extend(embedded_ipv4s(v6, nat64).into_iter().map(IpAddr::V4));
    }
    PLATFORM_ENDPOINTS
        .iter()
        .copied()
        .find(|(addr, _, _)| addr.parse::<IpAddr>().is_ok_and(|a| forms.contains(&a)))
}

/// The classes no LoadBalancer address can belong to, whatever the policy: each
/// checked on the address and on every IPv4 address an IPv6 spelling stands for.
pub fn builtin_refusal(ip: IpAddr) -> Option<String> {
    builtin_refusal_with(ip, &[])
}

/// As [`builtin_refusal`], also decoding the operator's NAT64 prefixes.
pub(crate) fn builtin_refusal_with(ip: IpAddr, nat64: &[ipnet::Ipv6Net]) -> Option<String> {
    if let Some((addr, what, source)) = platform_endpoint_with(ip, nat64) {
        return Some(format!("{what} ({addr}; {source})"));
    }
    let canonical = ip.to_canonical();
    if let Some(class) = class_refusal(canonical) {
        return Some(class.to_string());
    }
    if let IpAddr::V6(v6) = canonical {
        for v4 in embedded_ipv4s(v6, nat64) {
            if let Some(class) = class_refusal(IpAddr::V4(v4)) {
                return Some(format!("{class} in an IPv6 spelling ({v4})"));
            }
        }
    }
    None
}

fn class_refusal(ip: IpAddr) -> Option<&'static str> {
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
            ("169.254.169.254", "metadata"),
            ("169.254.1.1", "link-local"),
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

    /// Issue 22: every endpoint of the table, in every spelling, is refused by name.
    #[test]
    fn platform_endpoints_are_refused_in_every_spelling() {
        let p = LbAddressPolicy::default();
        for (addr, what, source) in PLATFORM_ENDPOINTS {
            let a: IpAddr = addr.parse().expect("table address");
            let mut spellings = vec![a];
            if let IpAddr::V4(v4) = a {
                let [b0, b1, b2, b3] = v4.octets();
                let low = format!("{:x}{:02x}:{:x}{:02x}", b0, b1, b2, b3);
                spellings.extend(
                    [
                        format!("::ffff:{v4}"),
                        format!("::{v4}"),
                        format!("64:ff9b::{v4}"),
                        format!("64:ff9b::{low}"),
                        format!("64:ff9b:1::{v4}"),
                        format!("2002:{low}::1"),
                    ]
                    .iter()
                    .map(|s| s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"))),
                );
            }
            for s in spellings {
                let why = p
                    .refusal(s)
                    .unwrap_or_else(|| panic!("{s} ({addr}) not refused"));
                assert!(why.contains(what) && why.contains(source), "{s}: {why}");
            }
        }
        // The five tried in the issue, by name.
        for (addr, name) in [
            ("fd00:ec2::254", "AWS instance metadata"),
            ("fd00:c1::a9fe:a9fe", "Oracle Cloud"),
            ("100.100.100.200", "Alibaba"),
            ("168.63.129.16", "Azure WireServer"),
            ("64:ff9b::a9fe:a9fe", "instance metadata endpoint"),
        ] {
            let why = p.refusal(ip(addr)).unwrap_or_default();
            assert!(why.contains(name), "{addr}: {why}");
        }
        // Classes through an IPv6 spelling.
        for (addr, class) in [
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a9fe:1", "link-local"),
            ("2002:a9fe:0101::1", "link-local"),
        ] {
            let why = p.refusal(ip(addr)).unwrap_or_default();
            assert!(
                why.contains(class) && why.contains("IPv6 spelling"),
                "{addr}: {why}"
            );
        }
        // Ordinary addresses, NAT64 of an ordinary one included, pass.
        for ok in ["203.0.113.10", "64:ff9b::cb00:710a", "2001:db8::1", "::2:1"] {
            assert_eq!(p.refusal(ip(ok)), None, "{ok}");
        }
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
            node_claims: vec![],
            nat64: vec![],
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

    /// Issue 31: a Node's claim refuses an address only outside `--lb-cidrs`.
    #[test]
    fn node_claims_yield_to_the_load_balancer_ranges() {
        let mut p = LbAddressPolicy {
            node_claims: vec![(
                "203.0.113.10/32".parse().expect("net"),
                "an address Node evil reports in status.addresses[type=ExternalIP]".into(),
            )],
            ..LbAddressPolicy::default()
        };
        let why = p.refusal(ip("203.0.113.10")).unwrap_or_default();
        assert!(
            why.contains("Node evil") && why.contains("--lb-cidrs"),
            "{why}"
        );
        p.allowed = vec!["203.0.113.0/24".parse().expect("net")];
        assert_eq!(p.refusal(ip("203.0.113.10")), None);
        // The operator's own reservations still win over --lb-cidrs.
        p.reserved = vec![(
            "203.0.113.10/32".parse().expect("net"),
            "in --reserved-cidrs".into(),
        )];
        assert!(p.refusal(ip("203.0.113.10")).is_some());
    }

    /// Issue 31: the RFC 6052 section 2.2 layouts, the local-use prefix at every
    /// length an operator may carve from it, and the operator's own prefixes.
    #[test]
    fn nat64_forms_of_every_prefix_length_are_judged_as_their_ipv4_address() {
        // 169.254.169.254 = a9.fe.a9.fe, 127.0.0.1 = 7f.00.00.01.
        for (addr, len) in [
            ("2001:db8:a9fe:a9fe::", 32),
            ("2001:db8:64a9:fea9:fe::", 40),
            ("2001:db8:64:a9fe:a9:fe00::", 48),
            ("2001:db8:64:aa9:fe:a9fe::", 56),
            ("2001:db8:64:aa:a9:fea9:fe00:0", 64),
            ("2001:db8:64:aa:0:0:a9fe:a9fe", 96),
        ] {
            let v6: Ipv6Addr = addr.parse().expect("v6");
            assert_eq!(
                rfc6052_ipv4(v6, len),
                Some(Ipv4Addr::new(169, 254, 169, 254)),
                "{addr} /{len}"
            );
        }
        let p = LbAddressPolicy::default();
        // The local-use prefix carved at /64: the metadata endpoint and loopback.
        for (addr, what) in [
            ("64:ff9b:1:0:a9:fea9:fe00:0", "instance metadata endpoint"),
            ("64:ff9b:1:7f00:1::", "loopback"),
        ] {
            let why = p.refusal(ip(addr)).unwrap_or_default();
            assert!(why.contains(what), "{addr}: {why}");
        }
        // An operator prefix is decoded only once listed.
        let operator = ip("2001:db8:64:aa:a9:fea9:fe00:0");
        assert_eq!(p.refusal(operator), None);
        let with = LbAddressPolicy {
            nat64: vec!["2001:db8:64:aa::/64".parse().expect("net")],
            ..LbAddressPolicy::default()
        };
        let why = with.refusal(operator).unwrap_or_default();
        assert!(why.contains("instance metadata endpoint"), "{why}");
        // An ordinary IPv4 address behind the operator's prefix passes.
        assert_eq!(with.refusal(ip("2001:db8:64:aa:cb:71a:0:0")), None);
        // EKS Pod Identity over IPv6 (the lower item of issue 31).
        let why = p.refusal(ip("fd00:ec2::23")).unwrap_or_default();
        assert!(why.contains("EKS Pod Identity"), "{why}");
    }
}
