//! Which peers the relays serve: `--allowed-clients`, else this node's pod CIDRs
//! from its Node object; plus this node's own addresses and loopback (host
//! processes). Open, and said loudly (log, `status`, `doctor`), when neither gives
//! a network: a wrong guess would refuse this node's own pods.

use std::time::Duration;

use tracing::{info, warn};

use super::args::RunArgs;
use crate::{
    k8s,
    relay::clients::ClientPolicy,
    status::{AgentState, ClientsStatus},
};

/// The relays' client policy, recorded in `state`.
pub async fn policy(
    args: &RunArgs,
    kube: Option<kube::Client>,
    state: &AgentState,
) -> ClientPolicy {
    let (mut nets, source) = if !args.allowed_clients.is_empty() {
        (
            args.allowed_clients.clone(),
            "--allowed-clients".to_string(),
        )
    } else {
        match node_pod_cidrs(args, kube).await {
            Ok((node, cidrs)) if !cidrs.is_empty() => (cidrs, format!("Node {node} spec.podCIDRs")),
            Ok((node, _)) => {
                let why = format!(
                    "Node {node} has no spec.podCIDRs (the CNI allocates pod addresses itself, as \
                     Calico and Cilium's cluster-pool IPAM do): set --allowed-clients to the pod CIDR"
                );
                return open(state, why);
            }
            Err(why) => return open(state, why),
        }
    };
    let own = args
        .node_ips
        .iter()
        .chain(&args.listen_addresses)
        .chain(args.names_address.iter());
    nets.extend(own.copied().map(ipnet::IpNet::from));
    nets.extend(
        ["127.0.0.0/8", "::1/128"]
            .iter()
            .filter_map(|n| n.parse::<ipnet::IpNet>().ok()),
    );
    let policy = ClientPolicy::new(nets);
    info!(allowed = %policy, from = %source, "relay client policy");
    state.update(|s| {
        s.clients = Some(ClientsStatus {
            allowed: policy.to_string(),
            source: format!("{source}, this node's addresses and loopback"),
        })
    });
    policy
}

/// This node's name and pod CIDRs, or why they cannot be had.
async fn node_pod_cidrs(
    args: &RunArgs,
    kube: Option<kube::Client>,
) -> Result<(String, Vec<ipnet::IpNet>), String> {
    let Some(client) = kube else {
        return Err("no --allowed-clients, and the frontends file gives no pod CIDRs".into());
    };
    let node = args.node_name().map_err(|e| format!("{e:#}"))?;
    // Bounded: an API server that does not answer must not hold up the datapath.
    match tokio::time::timeout(Duration::from_secs(10), k8s::node::pod_cidrs(client, &node)).await {
        Ok(Ok(cidrs)) => Ok((node, cidrs)),
        Ok(Err(e)) => Err(format!("no --allowed-clients, and {e}")),
        Err(_) => Err(format!(
            "no --allowed-clients, and Node {node} could not be read within 10 s"
        )),
    }
}

fn open(state: &AgentState, why: String) -> ClientPolicy {
    warn!(reason = %why, "relays serve any peer that reaches their listeners");
    state.update(|s| {
        s.clients = Some(ClientsStatus {
            allowed: "any".into(),
            source: why,
        })
    });
    ClientPolicy::default()
}
