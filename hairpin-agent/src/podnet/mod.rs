//! This node's pod networks, read from the node itself: its links, their addresses
//! and its main routing table, as the CNI left them. The relays' client policy uses
//! them where the Node has no `spec.podCIDRs` (AWS VPC CNI, Azure CNI, Calico and
//! Cilium cluster-pool IPAM allocate pod addresses themselves), so the agents need no
//! cluster-wide read of Pods: what a pod on this node is, the node's own routes say.
//!
//! Pure: [`classify`] turns links and routes into [`PodNetworks`]; the netlink edge
//! that reads and follows them is [`netlink`]. The shapes each CNI installs are
//! recorded as fixtures (`hairpin-agent/tests/fixtures/cni/*.routes`, in the text
//! form [`fixture`] reads), each with its sources.
//!
//! The rules, each a shape some CNI installs on the node for its own pods only:
//! - **A host route out of a veth** (`/32`, `/128`; no gateway; main table): the
//!   pod behind that veth. Calico (`cali*`), the AWS VPC CNI (`eni*`), Azure CNI in
//!   transparent mode (`azv*`), Cilium with endpoint routes (`lxc*`), the ptp plugin
//!   (kindnet's `veth*`). Routes to other nodes' pods always go through a gateway or
//!   a tunnel device, never a veth.
//! - **Cilium's `cilium_host`**: the route through `cilium_host` whose destination
//!   holds `cilium_host`'s own address (the router IP is taken from this node's pod
//!   range). In tunnel mode the other nodes' ranges go through `cilium_host` too, but
//!   never contain this node's router IP.
//! - **A bridge or gateway link holding the pod range** (`cni0` of flannel and the
//!   bridge plugin, kubenet's `cbr0`, kube-router's `kube-bridge`, Antrea's
//!   `antrea-gw0`): its connected route. Not `weave` (its bridge holds the whole
//!   cluster's range) nor Azure CNI's bridge mode `azure0` (the node's own subnet,
//!   which other machines share): those leave the pods unknown, so refused, and
//!   `--allowed-clients` is the way to name them.
//!
//! Nothing here widens the policy past what a rule matched: a route wider than
//! [`MAX_RANGE_V4`] / [`MAX_RANGE_V6`] is never taken as a node's pod range.

/// Not for the agent: the CNI fixtures' text form, for the suites.
#[cfg(any(test, feature = "testing"))]
mod fixture;
pub(crate) mod netlink;

#[cfg(any(test, feature = "testing"))]
pub use fixture::{Fixture, FixtureError, parse as parse_fixture};
pub use netlink::follow as follow_pod_networks;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use ipnet::IpNet;

/// The widest IPv4 route taken as one node's pod range (a /16 is 65,536 pods; no
/// CNI gives one node more).
pub(crate) const MAX_RANGE_V4: u8 = 16;
/// The widest IPv6 route taken as one node's pod range.
pub(crate) const MAX_RANGE_V6: u8 = 48;

/// The main routing table's id: the CNIs above install their pod routes there.
pub const MAIN_TABLE: u32 = 254;

/// One link of the node, as far as the rules need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLink {
    /// Its name (`cali1f2e3d4c5b6`, `cni0`, `cilium_host`).
    pub name: String,
    /// Its type as the kernel names it (`veth`, `bridge`, `netkit`), when it has one.
    pub kind: Option<String>,
    /// Its addresses with their prefix lengths.
    pub addresses: Vec<IpNet>,
}

/// One route of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoute {
    /// The destination.
    pub dst: IpNet,
    /// The output link's name, when the route has one.
    pub dev: Option<String>,
    /// The gateway, when the route has one.
    pub via: Option<IpAddr>,
    /// Whether it is a plain unicast route (not blackhole, local, broadcast...).
    pub unicast: bool,
    /// Its table.
    pub table: u32,
}

/// Which rule found a pod network, with the CNI its link names point at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shape {
    /// Host routes out of veths named `{prefix}*` (`cni` says whose).
    PodVeths {
        /// The CNI whose naming the links follow, or `veth` when unknown.
        cni: &'static str,
        /// The link name prefix.
        prefix: &'static str,
    },
    /// Cilium's range through `cilium_host`.
    CiliumHost,
    /// The connected route of a bridge or gateway link.
    Bridge {
        /// The link.
        link: String,
    },
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::PodVeths { cni, prefix } => write!(f, "{cni} ({prefix}* host routes)"),
            Shape::CiliumHost => f.write_str("cilium (pod range through cilium_host)"),
            Shape::Bridge { link } => write!(f, "bridge {link} (its connected pod range)"),
        }
    }
}

/// Per-pod veth name prefixes and whose they are. A veth with another name still
/// counts (the rule is the host route out of a veth); the name only labels it.
const POD_VETHS: &[(&str, &str)] = &[
    ("cali", "calico"),
    ("eni", "aws-vpc-cni"),
    ("azv", "azure-cni"),
    ("lxc", "cilium"),
    ("gke", "gke"),
];

/// Links whose connected route is this node's pod range.
const POD_BRIDGES: &[&str] = &["cni0", "cbr0", "kube-bridge", "antrea-gw0"];

/// Cilium's host-side link.
const CILIUM_HOST: &str = "cilium_host";

/// What the rules found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNetworks {
    /// Single pod addresses (host routes out of veths).
    pub hosts: BTreeSet<IpAddr>,
    /// Pod ranges (Cilium's, a bridge's).
    pub ranges: BTreeSet<IpNet>,
    /// The rules that matched, each with how many networks it gave.
    pub shapes: BTreeMap<Shape, usize>,
}

impl PodNetworks {
    /// Every network found, host routes as /32 and /128.
    #[cfg(test)]
    pub(crate) fn networks(&self) -> Vec<IpNet> {
        self.hosts
            .iter()
            .map(|a| IpNet::from(*a))
            .chain(self.ranges.iter().copied())
            .collect()
    }

    /// Whether `peer` is one of this node's pods.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.hosts.contains(&peer) || self.ranges.iter().any(|r| r.contains(&peer))
    }

    /// The matched rules as one line: `calico (cali* host routes): 12`.
    pub(crate) fn describe(&self) -> String {
        if self.shapes.is_empty() {
            return "no pod network found in this node's links and routes".into();
        }
        self.shapes
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn is_host(net: &IpNet) -> bool {
    net.prefix_len() == net.max_prefix_len()
}

fn too_wide(net: &IpNet) -> bool {
    match net {
        IpNet::V4(n) => n.prefix_len() < MAX_RANGE_V4,
        IpNet::V6(n) => n.prefix_len() < MAX_RANGE_V6,
    }
}

/// This node's pod networks from its `links` and `routes`, by the rules of the
/// module's documentation. Routes outside the main table, with a gateway where a
/// rule wants none, or not unicast are never taken.
pub(crate) fn classify(links: &[HostLink], routes: &[HostRoute]) -> PodNetworks {
    let by_name: BTreeMap<&str, &HostLink> = links.iter().map(|l| (l.name.as_str(), l)).collect();
    let mut found = PodNetworks::default();
    for route in routes {
        if !route.unicast || route.table != MAIN_TABLE {
            continue;
        }
        let Some(link) = route.dev.as_deref().and_then(|d| by_name.get(d)) else {
            continue;
        };
        let kind = link.kind.as_deref();
        if is_host(&route.dst) {
            // A host route out of a veth (or Cilium's netkit): the pod behind it.
            let pod_link = matches!(kind, Some("veth" | "netkit"));
            if route.via.is_some() || !pod_link || link.name == CILIUM_HOST {
                continue;
            }
            let (prefix, cni) = POD_VETHS
                .iter()
                .find(|(p, _)| link.name.starts_with(p))
                .copied()
                .unwrap_or(("", "veth"));
            if found.hosts.insert(route.dst.addr()) {
                *found
                    .shapes
                    .entry(Shape::PodVeths { cni, prefix })
                    .or_default() += 1;
            }
            continue;
        }
        if route.dst.prefix_len() == 0 || too_wide(&route.dst) {
            continue;
        }
        let holds_own = link.addresses.iter().any(|a| route.dst.contains(&a.addr()));
        let shape = if link.name == CILIUM_HOST {
            // Through the router IP or straight out of cilium_host; either way only
            // the range holding the router IP is this node's.
            let via_own = route
                .via
                .is_none_or(|gw| link.addresses.iter().any(|a| a.addr() == gw));
            (holds_own && via_own).then_some(Shape::CiliumHost)
        } else if POD_BRIDGES.contains(&link.name.as_str()) {
            (holds_own && route.via.is_none()).then(|| Shape::Bridge {
                link: link.name.clone(),
            })
        } else {
            None
        };
        if let Some(shape) = shape
            && found.ranges.insert(route.dst.trunc())
        {
            *found.shapes.entry(shape).or_default() += 1;
        }
    }
    found
}
