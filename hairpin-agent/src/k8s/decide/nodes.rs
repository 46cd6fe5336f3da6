//! What every Node of the cluster says about itself that hairpin must never take
//! over: its addresses and pod networks (never a LoadBalancer's address) and its
//! names (never published). Both binaries refuse them, from one list of Nodes (a
//! kubelet can read every Node too; the list is cut down to these fields as it
//! arrives).

use std::collections::BTreeSet;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::lb_address::LbAddressPolicy;
use crate::names::scope::{NameScope, ScopeRule};

/// The addresses, pod networks and names of every Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterNodes {
    /// (network, what it is): `192.0.2.7/32` "an address of Node n1".
    pub networks: Vec<(IpNet, String)>,
    /// Node names and the DNS names in their `status.addresses`.
    pub names: BTreeSet<String>,
}

impl ClusterNodes {
    /// Reads `nodes`: `status.addresses` (InternalIP, ExternalIP as addresses;
    /// Hostname, InternalDNS, ExternalDNS as names), `spec.podCIDRs`, the name.
    /// Entries that do not parse are passed over.
    pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> ClusterNodes {
        let mut out = ClusterNodes::default();
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
                match a.type_.as_str() {
                    "InternalIP" | "ExternalIP" => {
                        if let Ok(ip) = a.address.parse::<std::net::IpAddr>() {
                            out.networks
                                .push((IpNet::from(ip), format!("an address of Node {name}")));
                        }
                    }
                    "Hostname" | "InternalDNS" | "ExternalDNS" => {
                        out.names.insert(a.address.clone());
                    }
                    _ => {}
                }
            }
            let spec = node.spec.as_ref();
            let cidrs = spec
                .and_then(|s| s.pod_cidrs.clone())
                .filter(|l| !l.is_empty())
                .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
                .unwrap_or_default();
            for c in cidrs {
                if let Ok(net) = c.parse::<IpNet>() {
                    out.networks
                        .push((net.trunc(), format!("the pod network of Node {name}")));
                }
            }
        }
        out
    }

    /// `policy` also refusing every Node's addresses and pod networks.
    pub fn refuse_addresses(&self, policy: &LbAddressPolicy) -> LbAddressPolicy {
        let mut p = policy.clone();
        p.reserved.extend(self.networks.iter().cloned());
        p
    }

    /// `scope` also refusing every Node's names.
    pub fn refuse_names(&self, scope: &NameScope) -> NameScope {
        self.names.iter().fold(scope.clone(), |s, n| {
            s.refuse_own(n, ScopeRule::NodeName, "the name of a Node of this cluster")
        })
    }
}

/// `node` cut down to what [`ClusterNodes::from_nodes`] reads: a Node's images,
/// conditions and labels are most of its size.
pub fn slim(node: &mut Node) {
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
            ("203.0.113.70", "an address of Node ip-10-0-1-7"),
            ("10.0.1.7", "an address of Node ip-10-0-1-7"),
            ("192.0.2.12", "an address of Node worker-2.example.com"),
            (
                "10.244.2.9",
                "the pod network of Node worker-2.example.com (10.244.2.0/24)",
            ),
            ("fd00:10:244:2::9", "the pod network of Node worker-2"),
        ] {
            let why = policy.refusal(ip.parse().expect("ip")).unwrap_or_default();
            assert!(why.contains(what), "{ip}: {why}");
        }
        assert_eq!(policy.refusal("203.0.113.10".parse().expect("ip")), None);

        let scope = cluster
            .refuse_names(&NameScope::new(&["example.com"], "cluster.local").expect("scope"));
        for name in ["worker-2.example.com", "w2.example.com", "*.example.com"] {
            let r = scope
                .check(&Hostname::parse(name).expect("name"))
                .expect_err(name);
            assert_eq!(r.rule, ScopeRule::NodeName, "{name}: {}", r.message);
        }
        assert!(
            scope
                .check(&Hostname::parse("shop.example.com").expect("name"))
                .is_ok()
        );

        let mut big = nodes[1].clone();
        slim(&mut big);
        assert_eq!(
            ClusterNodes::from_nodes([&big]),
            ClusterNodes::from_nodes([&nodes[1]])
        );
        assert!(big.status.as_ref().is_some_and(|s| s.images.is_none()));
    }
}
