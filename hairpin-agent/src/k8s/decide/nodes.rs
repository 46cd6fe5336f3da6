//! What every Node of the cluster says about itself that hairpin must never take
//! over: its addresses and pod networks (never a LoadBalancer's address) and its
//! name (never published). Both binaries refuse them, from one list of Nodes (a
//! kubelet can read every Node too; the list is cut down to these fields as it
//! arrives).
//!
//! A Node's status is written by its own kubelet, so one compromised node could
//! claim anything there: a tenant's LoadBalancer address, `0.0.0.0/0` as its pod
//! network, a tenant's host name. What a Node says is therefore believed only as
//! far as it cannot be used against others:
//! - names come from `metadata.name` alone (the name the node's credential was
//!   issued for), never from the DNS names of `status.addresses`;
//! - a pod network wider than a node's share (the most common prefix length among
//!   every Node's pod networks, and never wider than /16 or /48) is passed over,
//!   with an Event on the Node saying so;
//! - an address claim never outranks `--lb-cidrs`: inside the operator's
//!   LoadBalancer ranges the operator is believed, not the Node
//!   ([`LbAddressPolicy::refusal`]); outside them a claim refuses the address, and
//!   the refusal names the Node in the Service's Warning Event.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::lb_address::LbAddressPolicy;
use crate::names::scope::{NameScope, ScopeRule};

/// No node's pod network is wider than this (IPv4): a Node claiming a wider one is
/// passed over whatever the others claim (`--node-cidr-mask-size` defaults to /24;
/// a whole cluster range is commonly /16).
pub(crate) const WIDEST_POD_NETWORK_V4: u8 = 16;
/// As [`WIDEST_POD_NETWORK_V4`] for IPv6 (the default node share is /64).
pub(crate) const WIDEST_POD_NETWORK_V6: u8 = 48;

/// One address or pod network a Node reports as its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeClaim {
    /// The Node's `metadata.name`.
    pub node: String,
    /// The network claimed (a /32 or /128 for an address).
    pub net: IpNet,
    /// Where in the Node it was read: `status.addresses[type=ExternalIP]`,
    /// `spec.podCIDRs[1]`.
    pub field: String,
    /// Whether it is a pod network (`spec.podCIDRs`) rather than an address.
    pub pod_network: bool,
}

/// A claim passed over, and why: an Event on the Node says so.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IgnoredClaim {
    /// The Node's `metadata.name`.
    pub node: String,
    /// The field and value, `spec.podCIDRs[0]=0.0.0.0/0`.
    pub claim: String,
    /// Why it is passed over, as a sentence.
    pub reason: String,
}

/// The addresses, pod networks and names of every Node, as far as they are believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterNodes {
    /// Addresses and pod networks refused as LoadBalancer addresses.
    pub claims: Vec<NodeClaim>,
    /// Node names (`metadata.name`).
    pub names: BTreeSet<String>,
    /// Claims passed over, sorted.
    pub ignored: Vec<IgnoredClaim>,
}

impl ClusterNodes {
    /// Reads `nodes`: `status.addresses` (InternalIP, ExternalIP), `spec.podCIDRs`
    /// (or the older `spec.podCIDR`), `metadata.name`. Entries that do not parse are
    /// passed over; pod networks wider than a node's share too, into `ignored`.
    pub(crate) fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> ClusterNodes {
        let mut out = ClusterNodes::default();
        let mut pod_networks = Vec::new();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            if !name.is_empty() {
                out.names.insert(name.clone());
            }
            for a in node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
            {
                if matches!(a.type_.as_str(), "InternalIP" | "ExternalIP")
                    && let Ok(ip) = a.address.parse::<std::net::IpAddr>()
                {
                    out.claims.push(NodeClaim {
                        node: name.clone(),
                        net: IpNet::from(ip.to_canonical()),
                        field: format!("status.addresses[type={}]", a.type_),
                        pod_network: false,
                    });
                }
            }
            for (field, c) in crate::k8s::node::listed_pod_cidrs(node) {
                if let Ok(net) = c.parse::<IpNet>() {
                    pod_networks.push(NodeClaim {
                        node: name.clone(),
                        net: net.trunc(),
                        field,
                        pod_network: true,
                    });
                }
            }
        }
        let (kept, ignored) = within_share(pod_networks);
        out.claims.extend(kept);
        out.ignored = ignored;
        out
    }

    /// `policy` also refusing every Node's believed addresses and pod networks
    /// (outside `--lb-cidrs`: see [`LbAddressPolicy::refusal`]).
    pub(crate) fn refuse_addresses(&self, policy: &LbAddressPolicy) -> LbAddressPolicy {
        let mut p = policy.clone();
        p.node_claims.extend(self.claims.iter().map(|c| {
            let what = if c.pod_network {
                "in the pod network"
            } else {
                "an address"
            };
            (
                c.net,
                format!("{what} Node {} reports in {}", c.node, c.field),
            )
        }));
        p
    }

    /// `scope` also refusing every Node's name.
    pub(crate) fn refuse_names(&self, scope: &NameScope) -> NameScope {
        self.names.iter().fold(scope.clone(), |s, n| {
            s.refuse_own(n, ScopeRule::NodeName, "the name of a Node of this cluster")
        })
    }
}

/// Splits pod networks into those within a node's share and those wider, which
/// are passed over: the share is the most common prefix length per family (the
/// longer on a tie), and never wider than [`WIDEST_POD_NETWORK_V4`] /
/// [`WIDEST_POD_NETWORK_V6`].
fn within_share(claims: Vec<NodeClaim>) -> (Vec<NodeClaim>, Vec<IgnoredClaim>) {
    let mut counts: BTreeMap<(bool, u8), usize> = BTreeMap::new();
    for c in &claims {
        *counts
            .entry((c.net.addr().is_ipv4(), c.net.prefix_len()))
            .or_default() += 1;
    }
    let share = |v4: bool| {
        let widest = if v4 {
            WIDEST_POD_NETWORK_V4
        } else {
            WIDEST_POD_NETWORK_V6
        };
        counts
            .iter()
            .filter(|((fam, len), _)| *fam == v4 && *len >= widest)
            // Most common, then the longer prefix: a tie never widens the share.
            .max_by_key(|((_, len), n)| (**n, *len))
            .map_or(widest, |((_, len), _)| *len)
    };
    let (v4_share, v6_share) = (share(true), share(false));
    let mut ignored = Vec::new();
    let kept = claims
        .into_iter()
        .filter(|c| {
            let v4 = c.net.addr().is_ipv4();
            let share = if v4 { v4_share } else { v6_share };
            if c.net.prefix_len() >= share {
                return true;
            }
            ignored.push(IgnoredClaim {
                node: c.node.clone(),
                claim: format!("{}={}", c.field, c.net),
                reason: format!(
                    "a pod network wider than a node's share (/{share}, the most common among \
                     the Nodes' pod networks): not refused as a LoadBalancer address anywhere"
                ),
            });
            false
        })
        .collect();
    ignored.sort();
    (kept, ignored)
}

/// `node` cut down to what [`ClusterNodes::from_nodes`] reads: a Node's images,
/// conditions and labels are most of its size.
pub(crate) fn slim(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.metadata.labels = None;
    if let Some(spec) = node.spec.as_mut() {
        spec.taints = None;
    }
    if let Some(status) = node.status.as_mut() {
        let addresses = status.addresses.take();
        *status = Default::default();
        status.addresses = addresses;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::hostname::Hostname;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).expect("node")
    }

    #[test]
    fn every_nodes_addresses_pod_networks_and_names_are_refused() {
        let nodes = [
            node(serde_json::json!({
                "metadata": {"name": "ip-10-0-1-7.eu-west-1.compute.internal"},
                "status": {"addresses": [
                    {"type": "InternalIP", "address": "10.0.1.7"},
                    {"type": "ExternalIP", "address": "203.0.113.70"},
                    {"type": "InternalDNS", "address": "ip-10-0-1-7.eu-west-1.compute.internal"},
                ]}
            })),
            node(serde_json::json!({
                "metadata": {"name": "worker-2.example.com"},
                "spec": {"podCIDRs": ["10.244.2.0/24", "fd00:10:244:2::/64"]},
                "status": {"addresses": [
                    {"type": "InternalIP", "address": "192.0.2.12"},
                    {"type": "Hostname", "address": "w2.example.com"},
                    {"type": "InternalIP", "address": "not-an-ip"},
                ], "images": [{"names": ["big"], "sizeBytes": 1}]}
            })),
        ];
        let cluster = ClusterNodes::from_nodes(nodes.iter());
        let policy = cluster.refuse_addresses(&LbAddressPolicy::default());
        for (ip, what) in [
            (
                "203.0.113.70",
                "an address Node ip-10-0-1-7.eu-west-1.compute.internal reports in status.addresses[type=ExternalIP]",
            ),
            ("10.0.1.7", "an address Node ip-10-0-1-7"),
            ("192.0.2.12", "an address Node worker-2.example.com reports"),
            (
                "10.244.2.9",
                "in the pod network Node worker-2.example.com reports in spec.podCIDRs[0] (10.244.2.0/24)",
            ),
            ("fd00:10:244:2::9", "in the pod network Node worker-2"),
        ] {
            let why = policy.refusal(ip.parse().expect("ip")).unwrap_or_default();
            assert!(why.contains(what), "{ip}: {why}");
        }
        assert_eq!(policy.refusal("203.0.113.10".parse().expect("ip")), None);

        let scope = cluster
            .refuse_names(&NameScope::new(&["example.com"], "cluster.local").expect("scope"));
        for name in ["worker-2.example.com", "*.example.com"] {
            let r = scope
                .check(&Hostname::parse(name).expect("name"))
                .expect_err(name);
            assert_eq!(r.rule, ScopeRule::NodeName, "{name}: {}", r.message);
        }
        // Names come from metadata.name alone: the DNS names in status.addresses are
        // the kubelet's word (issue 31).
        for name in ["shop.example.com", "w2.example.com"] {
            assert!(
                scope.check(&Hostname::parse(name).expect("name")).is_ok(),
                "{name}"
            );
        }

        let mut big = nodes[1].clone();
        slim(&mut big);
        assert_eq!(
            ClusterNodes::from_nodes([&big]),
            ClusterNodes::from_nodes([&nodes[1]])
        );
        assert!(big.status.as_ref().is_some_and(|s| s.images.is_none()));
    }

    /// Issue 31: one compromised node claiming a tenant's LoadBalancer address,
    /// 0.0.0.0/0 as its pod network, or a tenant's host name cannot switch hairpin
    /// off for that LoadBalancer or name on the other nodes.
    #[test]
    fn a_lying_node_cannot_switch_a_load_balancer_or_a_name_off() {
        let honest = |n: u8| {
            node(serde_json::json!({
                "metadata": {"name": format!("w{n}")},
                "spec": {"podCIDRs": [format!("10.244.{n}.0/24"), format!("fd00:10:244:{n}::/64")]},
                "status": {"addresses": [{"type": "InternalIP", "address": format!("10.0.0.{n}")}]}
            }))
        };
        let evil = node(serde_json::json!({
            "metadata": {"name": "evil"},
            "spec": {"podCIDRs": ["0.0.0.0/0", "::/0"]},
            "status": {"addresses": [
                {"type": "ExternalIP", "address": "203.0.113.10"},
                {"type": "Hostname", "address": "shop.example.com"},
                {"type": "ExternalDNS", "address": "*.example.com"},
            ]}
        }));
        let nodes = [honest(1), honest(2), honest(3), evil];
        let cluster = ClusterNodes::from_nodes(nodes.iter());
        // The pod networks wider than a node's share are passed over, each said.
        let ignored: Vec<&str> = cluster.ignored.iter().map(|i| i.claim.as_str()).collect();
        assert_eq!(
            ignored,
            ["spec.podCIDRs[0]=0.0.0.0/0", "spec.podCIDRs[1]=::/0"]
        );
        assert!(cluster.ignored.iter().all(|i| i.node == "evil"
            && (i.reason.contains("/24") || i.reason.contains("/64"))));
        // With --lb-cidrs the tenant's LoadBalancer stays proxied; a tenant's LB in
        // another range is still judged by the honest nodes' claims.
        let lb_ranges = LbAddressPolicy {
            allowed: vec!["203.0.113.0/24".parse().expect("net")],
            ..LbAddressPolicy::default()
        };
        let policy = cluster.refuse_addresses(&lb_ranges);
        assert_eq!(policy.refusal("203.0.113.10".parse().expect("ip")), None);
        assert!(
            policy
                .refusal("198.51.100.10".parse().expect("ip"))
                .is_some()
        );
        // 0.0.0.0/0 refuses nothing, with or without --lb-cidrs.
        let open = cluster.refuse_addresses(&LbAddressPolicy::default());
        assert_eq!(open.refusal("198.51.100.10".parse().expect("ip")), None);
        assert!(open.refusal("10.244.2.7".parse().expect("ip")).is_some());
        // Without --lb-cidrs the claim refuses the address, naming the Node and the
        // remedy in the Service's Warning Event.
        let why = open
            .refusal("203.0.113.10".parse().expect("ip"))
            .unwrap_or_default();
        assert!(
            why.contains("Node evil") && why.contains("--lb-cidrs"),
            "{why}"
        );
        // The host names a Node reports are not names of Nodes.
        let scope = cluster
            .refuse_names(&NameScope::new(&["example.com"], "cluster.local").expect("scope"));
        assert!(
            scope
                .check(&Hostname::parse("shop.example.com").expect("name"))
                .is_ok()
        );
    }

    #[test]
    fn a_single_node_cannot_widen_the_share_past_the_floor() {
        let only = node(serde_json::json!({
            "metadata": {"name": "solo"},
            "spec": {"podCIDRs": ["10.0.0.0/8"]},
        }));
        let cluster = ClusterNodes::from_nodes([&only]);
        assert!(cluster.claims.is_empty());
        assert!(
            cluster.ignored[0].reason.contains("/16"),
            "{:?}",
            cluster.ignored
        );
        let ok = node(serde_json::json!({
            "metadata": {"name": "solo"},
            "spec": {"podCIDRs": ["10.42.0.0/16"]},
        }));
        assert_eq!(ClusterNodes::from_nodes([&ok]).claims.len(), 1);
    }
}
