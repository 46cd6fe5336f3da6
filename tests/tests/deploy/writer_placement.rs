//! Issue 22: the CoreDNS writer (whose token may rewrite every pod's DNS) runs on
//! control-plane nodes where the cluster has them, tolerating their taint, and
//! falls back to any Linux node where it has none (a preference, not a rule), in
//! every variant with a writer.

use k8s_openapi::api::apps::v1::Deployment;

use super::{
    VARIANTS,
    render::{find, kustomize, typed},
};

#[test]
fn the_writer_prefers_control_plane_nodes_and_tolerates_their_taint() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let Some(obj) = find(&objs, "Deployment", "hairpin-coredns") else {
            continue;
        };
        let d: Deployment = typed(obj);
        let pod = d
            .spec
            .and_then(|s| s.template.spec)
            .unwrap_or_else(|| panic!("{}: writer pod spec", v.dir));
        let node = pod
            .affinity
            .and_then(|a| a.node_affinity)
            .unwrap_or_else(|| panic!("{}: writer node affinity", v.dir));
        assert!(
            node.required_during_scheduling_ignored_during_execution
                .is_none(),
            "{}: a preference, so clusters without control-plane nodes still run it",
            v.dir
        );
        let preferred = node
            .preferred_during_scheduling_ignored_during_execution
            .unwrap_or_default();
        assert!(
            preferred.iter().any(|p| p
                .preference
                .match_expressions
                .iter()
                .flatten()
                .any(
                    |e| e.key == "node-role.kubernetes.io/control-plane" && e.operator == "Exists"
                )),
            "{}: {preferred:?}",
            v.dir
        );
        assert!(
            pod.tolerations.iter().flatten().any(|t| t.key.as_deref()
                == Some("node-role.kubernetes.io/control-plane")
                && t.effect.as_deref() == Some("NoSchedule")),
            "{}: tolerates the control-plane taint",
            v.dir
        );
    }
}
