//! Issue 22: the uninstall's node cleanup runs where the agent put its listen
//! addresses and the hairpin0 link (the host's network namespace, hostNetwork),
//! with the capability rtnetlink needs to remove them (and CAP_BPF to detach the
//! pinned links), and removes the same
//! link and addresses the agent of the install used. (`tests/tests/modes.rs` runs
//! `cleanup` against a node and checks the addresses are gone.)

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodSpec;

use super::{
    VARIANTS,
    flags::{cleanup_args, run_args},
    render::{agent, env_of, kustomize},
};

#[test]
fn the_node_cleanup_removes_the_agents_listen_link_from_the_host_network() {
    for v in VARIANTS {
        let (Some(install), Some(uninstall)) = (kustomize(v.dir), kustomize(v.uninstall)) else {
            return;
        };
        let run = run_args(&env_of(&agent(&install), v.dir), v.dir);
        let mut seen = 0;
        for obj in &uninstall {
            if obj["kind"] != "DaemonSet" {
                continue;
            }
            let source = format!("{}: DaemonSet {}", v.uninstall, obj["metadata"]["name"]);
            let pod: PodSpec = serde_json::from_value(obj["spec"]["template"]["spec"].clone())
                .unwrap_or_else(|e| panic!("{source}: pod spec: {e}"));
            assert_eq!(pod.host_network, Some(true), "{source}: host network");
            for c in pod.init_containers.iter().flatten() {
                if c.args.as_deref() != Some(&["cleanup".to_string()][..]) {
                    continue;
                }
                seen += 1;
                let caps = c
                    .security_context
                    .as_ref()
                    .and_then(|s| s.capabilities.as_ref())
                    .unwrap_or_else(|| panic!("{source}: capabilities"));
                let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
                // NET_ADMIN for rtnetlink; BPF to detach the pinned links: with
                // kernel.unprivileged_bpf_disabled (1 or 2, the distributions'
                // default) every bpf() command needs CAP_BPF.
                assert_eq!(added, BTreeSet::from(["BPF", "NET_ADMIN"]), "{source}");
                assert_eq!(
                    caps.drop.as_deref(),
                    Some(&["ALL".to_string()][..]),
                    "{source}"
                );
                let args = cleanup_args(&env_of(c, &source), &source);
                assert_eq!(
                    Some(args.listen_link.as_str()),
                    run.listen_link(),
                    "{source}: the agent's listen link"
                );
                let agents: Vec<_> = if run.listen_addresses.is_empty() {
                    hairpin_agent::agent::default_listen_addresses().collect()
                } else {
                    run.listen_addresses.clone()
                };
                let cleaned: Vec<_> = if args.listen_addresses.is_empty() {
                    hairpin_agent::agent::default_listen_addresses().collect()
                } else {
                    args.listen_addresses.clone()
                };
                assert_eq!(cleaned, agents, "{source}: the agent's listen addresses");
            }
        }
        assert_eq!(seen, 1, "{}: one node cleanup", v.uninstall);
    }
}
