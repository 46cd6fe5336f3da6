//! This node's pod CIDRs (`Node.spec.podCIDRs`), the default for `--allowed-clients`:
//! the relays serve this node's pods and its own processes, nobody else.
//!
//! The Node is read once at startup (`get`, one object): pod CIDRs are immutable once
//! set. Where the node IPAM does not fill them (Calico's and Cilium's cluster-pool
//! IPAM allocate pod addresses themselves), the caller says so and asks for
//! `--allowed-clients` instead of guessing.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

/// Why the pod CIDRs could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeError {
    /// The API call failed (403 without the `nodes get` grant, 404 for a wrong name).
    #[error("Node {node}: cannot read it: {source}")]
    Get {
        /// The node name asked for.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A pod CIDR is not a CIDR.
    #[error("Node {node}: {field}: expected a CIDR such as 10.244.1.0/24, got {value:?}")]
    Invalid {
        /// The node name.
        node: String,
        /// `spec.podCIDRs[i]` or `spec.podCIDR`.
        field: String,
        /// What was there.
        value: String,
    },
}

/// Reads `node`'s pod CIDRs; empty when the Node has none.
pub(crate) async fn pod_cidrs(client: Client, node: &str) -> Result<Vec<IpNet>, NodeError> {
    let n = Api::<Node>::all(client)
        .get(node)
        .await
        .map_err(|source| NodeError::Get {
            node: node.to_string(),
            source,
        })?;
    from_node(&n, node)
}

/// The pod CIDRs `n` lists, as written, each with the field it is in:
/// `spec.podCIDRs[i]`, else the older single `spec.podCIDR`.
pub(crate) fn listed_pod_cidrs(n: &Node) -> Vec<(String, &String)> {
    let spec = n.spec.as_ref();
    match spec.and_then(|s| s.pod_cidrs.as_ref()) {
        Some(list) if !list.is_empty() => list
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("spec.podCIDRs[{i}]"), c))
            .collect(),
        _ => spec
            .and_then(|s| s.pod_cidr.as_ref())
            .map(|c| vec![("spec.podCIDR".to_string(), c)])
            .unwrap_or_default(),
    }
}

/// The pod CIDRs of `n` (`spec.podCIDRs`, else the older single `spec.podCIDR`).
pub(crate) fn from_node(n: &Node, node: &str) -> Result<Vec<IpNet>, NodeError> {
    listed_pod_cidrs(n)
        .into_iter()
        .map(|(field, value)| {
            value
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| NodeError::Invalid {
                    node: node.to_string(),
                    field,
                    value: value.clone(),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(yaml: &str) -> Node {
        yaml_serde::from_str(yaml).expect("node yaml")
    }

    #[test]
    fn dual_stack_pod_cidrs_are_read_in_order() {
        let n = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: worker-1}\n\
             spec: {podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24, 'fd00:10:244:1::/64']}\n",
        );
        let got = from_node(&n, "worker-1").expect("cidrs");
        assert_eq!(
            got.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.244.1.0/24", "fd00:10:244:1::/64"]
        );
    }

    #[test]
    fn the_single_pod_cidr_field_is_used_when_the_list_is_absent() {
        let n = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: old}\nspec: {podCIDR: 10.42.0.0/24}\n",
        );
        assert_eq!(
            from_node(&n, "old").expect("cidr")[0].to_string(),
            "10.42.0.0/24"
        );
    }

    #[test]
    fn a_node_without_pod_cidrs_gives_none() {
        // Calico / Cilium cluster-pool IPAM: the controller-manager allocates nothing.
        let n = node("apiVersion: v1\nkind: Node\nmetadata: {name: calico}\nspec: {}\n");
        assert!(from_node(&n, "calico").expect("empty").is_empty());
    }

    #[test]
    fn a_bad_cidr_names_the_node_field_and_value() {
        let n = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: w}\nspec: {podCIDRs: [10.244.1.0/24, bogus]}\n",
        );
        let e = from_node(&n, "w").expect_err("bogus").to_string();
        assert_eq!(
            e,
            "Node w: spec.podCIDRs[1]: expected a CIDR such as 10.244.1.0/24, got \"bogus\""
        );
    }
}
