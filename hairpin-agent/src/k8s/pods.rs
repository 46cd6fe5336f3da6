//! This node's pod addresses, for the relays' client policy where the Node has no
//! `spec.podCIDRs` (EKS VPC CNI, Azure CNI, Calico and Cilium cluster-pool IPAM
//! allocate pod addresses themselves). One watch of the Pods whose `spec.nodeName`
//! is this node (a field selector: the API server filters, so each agent holds its
//! own node's pods only), reduced at once to their addresses.
//!
//! Host-network pods are left out (their address is the node's, allowed anyway);
//! so are finished pods (phase Succeeded or Failed), whose address the CNI may
//! already have given to another pod, on another node.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use tracing::{debug, warn};

/// What the watch knows, handed to the caller on every change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePods {
    /// The addresses of this node's running pods.
    pub addresses: HashSet<IpAddr>,
    /// Pods they came from.
    pub pods: usize,
    /// Whether the first list has completed.
    pub synced: bool,
    /// The watch's last error, until it recovers.
    pub error: Option<String>,
}

/// The addresses `pod` is reached by, when it is a running, non-host-network pod:
/// `status.podIPs[].ip`, else the older single `status.podIP`. Unparseable entries
/// are skipped (never widening the policy).
pub fn addresses(pod: &Pod) -> Vec<IpAddr> {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return Vec::new();
    }
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Vec::new();
    }
    let listed: Vec<&str> = match &status.pod_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(|p| p.ip.as_str()).collect(),
        _ => status.pod_ip.iter().map(String::as_str).collect(),
    };
    listed.into_iter().filter_map(|s| s.parse().ok()).collect()
}

/// The field selector naming `node`'s pods.
pub fn selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// Watches `node`'s pods forever, calling `on_change` with the whole set after
/// the first list and after every change or error. Errors are retried with the
/// watcher's backoff; the last known set is kept meanwhile.
pub async fn watch(client: Client, node: String, mut on_change: impl FnMut(&NodePods)) {
    let api = Api::<Pod>::all(client);
    let config = watcher::Config::default().fields(&selector(&node));
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut by_pod: HashMap<String, Vec<IpAddr>> = HashMap::new();
    let mut listing: HashMap<String, Vec<IpAddr>> = HashMap::new();
    let mut state = NodePods::default();
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(watcher::Event::Init) => {
                listing.clear();
                false
            }
            Ok(watcher::Event::InitApply(pod)) => {
                listing.insert(key(&pod), addresses(&pod));
                false
            }
            Ok(watcher::Event::InitDone) => {
                by_pod = std::mem::take(&mut listing);
                state.synced = true;
                state.error = None;
                debug!(node, pods = by_pod.len(), "this node's pods listed");
                true
            }
            Ok(watcher::Event::Apply(pod)) => {
                state.error = None;
                by_pod.insert(key(&pod), addresses(&pod)) != Some(addresses(&pod))
            }
            Ok(watcher::Event::Delete(pod)) => {
                state.error = None;
                by_pod.remove(&key(&pod)).is_some()
            }
            Err(e) => {
                let error = format!("watching Pods with {}: {e}", selector(&node));
                if state.error.as_deref() != Some(error.as_str()) {
                    warn!(%error, "this node's pods cannot be learned; retrying with backoff, last known set kept");
                }
                state.error = Some(error);
                true
            }
        };
        if changed {
            state.addresses = by_pod.values().flatten().copied().collect();
            state.pods = by_pod.values().filter(|a| !a.is_empty()).count();
            on_change(&state);
        }
    }
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("pod")
    }

    #[test]
    fn running_pods_give_their_addresses_and_others_none() {
        let dual = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "a"},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.3.7",
                       "podIPs": [{"ip": "10.0.3.7"}, {"ip": "fd00:3::7"}]}
        }));
        assert_eq!(
            addresses(&dual),
            vec![
                "10.0.3.7".parse::<IpAddr>().expect("ip"),
                "fd00:3::7".parse().expect("ip")
            ]
        );
        let old = pod(serde_json::json!({
            "metadata": {"name": "old"},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "podIP": "10.0.3.8"}
        }));
        assert_eq!(
            addresses(&old),
            vec!["10.0.3.8".parse::<IpAddr>().expect("ip")]
        );
        for not_counted in [
            serde_json::json!({"metadata": {"name": "h"},
                "spec": {"hostNetwork": true, "containers": []},
                "status": {"phase": "Running", "podIP": "192.0.2.1"}}),
            serde_json::json!({"metadata": {"name": "done"}, "spec": {"containers": []},
                "status": {"phase": "Succeeded", "podIP": "10.0.3.9"}}),
            serde_json::json!({"metadata": {"name": "new"}, "spec": {"containers": []},
                "status": {"phase": "Pending"}}),
            serde_json::json!({"metadata": {"name": "bad"}, "spec": {"containers": []},
                "status": {"phase": "Running", "podIP": "10.0.3.0/24"}}),
        ] {
            assert!(
                addresses(&pod(not_counted.clone())).is_empty(),
                "{not_counted}"
            );
        }
        assert_eq!(selector("n1"), "spec.nodeName=n1");
    }
}
