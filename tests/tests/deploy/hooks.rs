//! `helm uninstall`, ordered: the chart's pre-delete hooks, as Helm classifies them
//! (a client-side `helm install --dry-run` keeps them out of the release) and runs
//! them (by weight, then kind, then name; Helm waits for each Job to complete and
//! deletes `hook-succeeded` hooks only once all have succeeded), stop the agents and
//! the writer before Helm deletes any RBAC, and are the objects of the kustomize
//! uninstall.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use super::{
    VARIANTS,
    chart::{comparable, dry_run_install, render_hooks_with, set_flags},
    render::kustomize,
};

/// Helm's `releaseutil.InstallOrder` (pkg/release/util/kind_sorter.go), by which it
/// orders hooks of the same weight: the kinds the hooks use, in that order.
const HELM_INSTALL_ORDER: [&str; 7] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "DaemonSet",
    "Job",
];

/// `(weight, kind, name)` of each pre-delete hook, in the order Helm creates them
/// (`hookByWeight` in pkg/action/hooks.go).
fn helm_order(hooks: &[Json]) -> Vec<(i64, String, String)> {
    let mut order: Vec<(i64, usize, String, String)> = hooks
        .iter()
        .filter(|h| {
            h["metadata"]["annotations"]["helm.sh/hook"]
                .as_str()
                .is_some_and(|e| e.split(',').any(|e| e.trim() == "pre-delete"))
        })
        .map(|h| {
            let kind = h["kind"].as_str().expect("kind").to_string();
            let weight = h["metadata"]["annotations"]["helm.sh/hook-weight"]
                .as_str()
                .unwrap_or("0")
                .parse()
                .expect("an integer hook weight");
            let rank = HELM_INSTALL_ORDER
                .iter()
                .position(|k| *k == kind)
                .unwrap_or_else(|| panic!("{kind}: not in Helm's install order as listed here"));
            (
                weight,
                rank,
                kind,
                h["metadata"]["name"].as_str().expect("name").to_string(),
            )
        })
        .collect();
    order.sort();
    order.into_iter().map(|(w, _, k, n)| (w, k, n)).collect()
}

#[test]
fn helm_uninstall_stops_the_agents_before_it_deletes_their_rbac() {
    for v in VARIANTS {
        let flags = set_flags(v.chart);
        let (release, _) = dry_run_install("hairpin-system", "hairpin", &flags);
        let hooks = render_hooks_with(&flags);
        // Helm itself sets the hooks apart: none is part of the release, whose
        // objects `helm uninstall` deletes after the pre-delete hooks succeeded.
        let hook_names: Vec<String> = hooks
            .iter()
            .map(|h| format!("{}/{}", h["kind"], h["metadata"]["name"]))
            .collect();
        for o in &release {
            let n = format!("{}/{}", o["kind"], o["metadata"]["name"]);
            assert!(
                !hook_names.contains(&n),
                "{}: {n} is a hook and a release object",
                v.dir
            );
        }
        for h in &hooks {
            let policy = h["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                .as_str()
                .unwrap_or_default();
            assert!(
                policy.contains("before-hook-creation"),
                "{}: {} {}: a retried uninstall must replace it",
                v.dir,
                h["kind"],
                h["metadata"]["name"]
            );
        }
        let order = helm_order(&hooks);
        let kinds: Vec<&str> = order.iter().map(|(_, k, _)| k.as_str()).collect();
        let job_at = kinds
            .iter()
            .position(|k| *k == "Job")
            .expect("an uninstall Job");
        assert_eq!(
            job_at,
            kinds.len() - 1,
            "{}: the Job runs last: {order:?}",
            v.dir
        );
        assert_eq!(
            kinds.iter().filter(|k| **k == "Job").count(),
            1,
            "{}",
            v.dir
        );
        let ds_at = kinds
            .iter()
            .position(|k| *k == "DaemonSet")
            .expect("the node cleanup");
        assert!(
            kinds[..ds_at]
                .iter()
                .all(|k| ["ServiceAccount", "Role", "RoleBinding"].contains(k)),
            "{}: accounts and their grants first: {order:?}",
            v.dir
        );
        // Weights set the phases apart (kind order alone would put the DaemonSet
        // before the Job too, but a later hook of another kind must not slip in).
        let weight = |kind: &str| order.iter().find(|(_, k, _)| k == kind).map(|(w, _, _)| *w);
        assert!(weight("RoleBinding") < weight("DaemonSet") && weight("DaemonSet") < weight("Job"));
        // hook-succeeded: Helm deletes them once all succeeded (reverse order), so
        // the accounts outlive the Job. A failed Job or node cleanup is kept for its
        // logs; the accounts and grants go on failure too (hook-failed), so a failed
        // uninstall leaves no RBAC behind.
        for h in &hooks {
            let policy = h["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                .as_str()
                .unwrap_or_default();
            if h["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete" {
                let rbac = [
                    "ServiceAccount",
                    "Role",
                    "RoleBinding",
                    "ClusterRole",
                    "ClusterRoleBinding",
                ]
                .contains(&h["kind"].as_str().unwrap_or_default());
                assert!(
                    policy.contains("hook-succeeded") && policy.contains("hook-failed") == rbac,
                    "{}: {} {}: {policy}",
                    v.dir,
                    h["kind"],
                    h["metadata"]["name"]
                );
            }
        }
    }
}

/// The kustomize uninstall less what only a Helm-less uninstall needs (deleting the
/// namespace and giving it the objects outside it: the ClusterRole, and the patch
/// rule of the kube-system Role): Helm deletes the release itself.
fn without_namespace_deletion(objs: Vec<Json>) -> Vec<Json> {
    objs.into_iter()
        .filter(|o| {
            !(o["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ClusterRole"))
                && o["metadata"]["name"] == "hairpin-uninstall")
        })
        .map(|mut o| {
            if let Some(rules) = o["rules"].as_array_mut() {
                rules.retain(|r| r["verbs"] != serde_json::json!(["patch"]));
            }
            if let Some(cs) = o["spec"]["template"]["spec"]["containers"].as_array_mut() {
                for c in cs {
                    if let Some(env) = c["env"].as_array_mut() {
                        env.retain(|e| {
                            !matches!(
                                e["name"].as_str(),
                                Some(
                                    "HAIRPIN_UNINSTALL_DELETE_NAMESPACE"
                                        | "HAIRPIN_UNINSTALL_WITH_NAMESPACE"
                                )
                            )
                        });
                    }
                }
            }
            o
        })
        .collect()
}

#[test]
fn the_chart_hooks_are_the_kustomize_uninstall() {
    for v in VARIANTS {
        let flags = set_flags(v.chart);
        let hooks: Vec<Json> = render_hooks_with(&flags)
            .into_iter()
            .filter(|h| h["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete")
            .collect();
        let Some(kustomized) = kustomize(v.uninstall) else {
            return;
        };
        let (a, b): (BTreeMap<String, Json>, BTreeMap<String, Json>) = (
            comparable(hooks),
            comparable(without_namespace_deletion(kustomized)),
        );
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "chart hooks with {flags:?} and {} render different objects",
            v.uninstall
        );
        for (key, obj) in &a {
            assert_eq!(
                serde_json::to_string_pretty(obj).expect("json"),
                serde_json::to_string_pretty(&b[key]).expect("json"),
                "{key}: the chart's hook with {flags:?} differs from {}",
                v.uninstall
            );
        }
    }
}

#[test]
fn uninstall_disabled_renders_no_hook() {
    let hooks = render_hooks_with(&["--set".into(), "uninstall.enabled=false".into()]);
    assert!(hooks.is_empty(), "{hooks:?}");
}
