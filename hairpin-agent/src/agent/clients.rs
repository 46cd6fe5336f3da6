//! Which peers the relays serve, failing closed: `--allowed-clients`, else this
//! node's pod CIDRs from its Node object, else this node's pod networks read from
//! its own links and routes ([`crate::podnet`], followed as the CNI changes them);
//! always this node's own addresses and loopback (host processes). Nothing is read
//! cluster-wide: the agents need no Pods list or watch. Where the routes show no
//! pod network the relays serve the node itself only, and the log, `status` and
//! `doctor` say how to widen it. Never "anyone": a relay that served any peer
//! reaching it would let the world past the LoadBalancer's source ranges.

use std::time::Duration;

use tracing::{info, warn};

use super::args::RunArgs;
use crate::{
    k8s, podnet,
    relay::client_policy::{ClientPolicy, LearnedClients},
    status::{AgentState, ClientsStatus, LearnedClientsStatus},
};

/// The relays' client policy, recorded in `state`.
pub(crate) async fn policy(
    args: &RunArgs,
    kube: Option<kube::Client>,
    state: &AgentState,
) -> ClientPolicy {
    let own = own_networks(args);
    if !args.allowed_clients.is_empty() {
        let mut nets = args.allowed_clients.clone();
        nets.extend(own);
        return fixed(state, nets, "--allowed-clients".into());
    }
    let Some(client) = kube else {
        return learning(
            state,
            own,
            "no --allowed-clients, and the frontends file names no pod network".into(),
        );
    };
    let node = match args.node_name() {
        Ok(node) => node,
        Err(e) => {
            return learning(state, own, format!("no --allowed-clients, and {e:#}"));
        }
    };
    let why_learn = match node_pod_cidrs(client, &node).await {
        Ok(cidrs) if !cidrs.is_empty() => {
            let mut nets = cidrs;
            nets.extend(own);
            return fixed(state, nets, format!("Node {node} spec.podCIDRs"));
        }
        Ok(_) => format!(
            "Node {node} has no spec.podCIDRs (the CNI allocates pod addresses itself, as \
             the AWS VPC CNI, Azure CNI, Calico and Cilium's cluster-pool IPAM do)"
        ),
        Err(why) => why.to_string(),
    };
    learning(state, own, why_learn)
}

/// This node's own addresses (the relays' listeners included) and loopback.
fn own_networks(args: &RunArgs) -> Vec<ipnet::IpNet> {
    let mut nets: Vec<ipnet::IpNet> = args
        .node_ips
        .iter()
        .chain(&args.listen_addresses)
        .chain(args.names_address.iter())
        .copied()
        .map(ipnet::IpNet::from)
        .collect();
    nets.extend(super::args::default_listen_addresses().map(ipnet::IpNet::from));
    nets.extend(
        ["127.0.0.0/8", "::1/128"]
            .iter()
            .filter_map(|n| n.parse::<ipnet::IpNet>().ok()),
    );
    nets.dedup();
    nets
}

fn fixed(state: &AgentState, nets: Vec<ipnet::IpNet>, source: String) -> ClientPolicy {
    let policy = ClientPolicy::new(nets);
    info!(allowed = %policy, from = %source, "relay client policy");
    record(
        state,
        &policy,
        format!("{source}, this node's addresses and loopback"),
        None,
    );
    policy
}

/// Reads this node's pod networks from its links and routes, and follows them in
/// the background.
fn learning(state: &AgentState, own: Vec<ipnet::IpNet>, why: String) -> ClientPolicy {
    let learned = LearnedClients::default();
    let policy = ClientPolicy::new(own).learning(learned.clone());
    let source = format!(
        "{why}: this node's pod networks are read from its links and routes (per-pod veth \
         host routes, cilium_host, a pod bridge), plus this node's addresses and loopback"
    );
    info!(allowed = %policy, from = %source, "relay client policy");
    record(
        state,
        &policy,
        source,
        Some(LearnedClientsStatus::default()),
    );
    let state = state.clone();
    tokio::spawn(podnet::netlink::follow(move |read| {
        if let Ok(found) = read {
            if found.shapes.is_empty() {
                warn!(
                    "no pod network found in this node's links and routes: pods are refused; \
                     set --allowed-clients to this node's pod CIDR(s)"
                );
            }
            learned.replace(found.clone());
        }
        state.update(|s| {
            let Some(c) = s.clients.as_mut() else { return };
            let l = c.learned.get_or_insert_with(LearnedClientsStatus::default);
            match read {
                Ok(found) => {
                    l.pods = found.hosts.len();
                    l.ranges = found.ranges.len();
                    l.shapes = found.describe();
                    l.synced = true;
                    l.error = None;
                }
                Err(e) => l.error = Some(e.to_string()),
            }
        });
    }));
    policy
}

fn record(
    state: &AgentState,
    policy: &ClientPolicy,
    source: String,
    learned: Option<LearnedClientsStatus>,
) {
    state.update(|s| {
        s.clients = Some(ClientsStatus {
            allowed: policy.to_string(),
            source,
            learned,
        })
    });
}

/// Why this node's pod CIDRs cannot be had.
#[derive(Debug, thiserror::Error)]
enum PodCidrsError {
    /// The Node read failed or has no usable `spec.podCIDRs`.
    #[error(transparent)]
    Node(#[from] k8s::node::NodeError),
    /// The API server did not answer in time.
    #[error("Node {0} could not be read within 10 s")]
    Timeout(String),
}

/// This node's pod CIDRs, or why they cannot be had.
async fn node_pod_cidrs(
    client: kube::Client,
    node: &str,
) -> Result<Vec<ipnet::IpNet>, PodCidrsError> {
    // Bounded: an API server that does not answer must not hold up the datapath.
    match tokio::time::timeout(Duration::from_secs(10), k8s::node::pod_cidrs(client, node)).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(PodCidrsError::Timeout(node.to_string())),
    }
}
