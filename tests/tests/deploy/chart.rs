//! The Helm chart, rendered and linted by Helm itself: Helm v4's Go SDK as a library
//! (the PyPI wheel helm-python-sdk, pinned and installed into a virtual environment by
//! `cargo xtask setup`; `helm.py` beside this file drives it). Each variant's values
//! must render what kustomize renders for it, and pass Helm's strict lint.

use std::collections::BTreeMap;

use hairpin_tests::repo::workspace;

use serde_json::Value as Json;
use yaml_serde::Value as Yaml;

use super::{
    VARIANTS,
    render::{docs, kustomize, normalize, parse_all},
};

/// The chart's directory.
pub(super) use hairpin_tests::helm::CHART;

/// The Kubernetes version the lint checks against: the chart's `kubeVersion` floor.
const KUBE_VERSION: &str = "v1.29.0";

use hairpin_tests::helm::helm;

/// `--set-json KEY=VALUE` for each (dotted key, value): Helm merges each over
/// values.yaml (a map is merged into the default map, anything else replaces it).
fn set_json(set: &[(&str, Yaml)]) -> Vec<String> {
    set.iter()
        .flat_map(|(key, v)| {
            let json = serde_json::to_string(v).expect("a YAML value maps to JSON");
            ["--set-json".to_string(), format!("{key}={json}")]
        })
        .collect()
}

/// Whether `o` is a Helm hook (an uninstall step or the `helm test` pod): Helm runs
/// hooks at their event and keeps them out of the release.
pub(super) fn is_hook(o: &Json) -> bool {
    o["metadata"]["annotations"]["helm.sh/hook"].is_string()
}

/// Every object of the chart as `helm install RELEASE CHART -n NAMESPACE` renders it
/// with `flags` (`--set EXPR`, `--set-json EXPR`), hooks included, one JSON value per
/// object, in template path order; NOTES.txt is left out.
pub(super) fn render_all(namespace: &str, release: &str, flags: &[String]) -> Vec<Json> {
    let objs = hairpin_tests::helm::render_workspace_chart(namespace, release, flags);
    assert!(
        objs.iter().any(|o| o["kind"] == "DaemonSet"),
        "Helm rendered no DaemonSet"
    );
    objs
}

/// The release's objects (no hooks) as `helm install hairpin CHART -n hairpin-system`
/// renders them with `flags`.
pub(super) fn render_chart_with(flags: &[String]) -> Vec<Json> {
    render_all("hairpin-system", "hairpin", flags)
        .into_iter()
        .filter(|o| !is_hook(o))
        .collect()
}

/// The chart's hooks (the uninstall steps, the test pod) for `flags`.
pub(super) fn render_hooks_with(flags: &[String]) -> Vec<Json> {
    render_all("hairpin-system", "hairpin", flags)
        .into_iter()
        .filter(is_hook)
        .collect()
}

/// Helm's own error for `flags` (the schema's or a template's), as its message:
/// the render must fail.
pub(super) fn render_error(flags: &[String]) -> String {
    let r = std::panic::catch_unwind(|| render_chart_with(flags));
    r.err()
        .and_then(|p| p.downcast::<String>().ok().map(|s| *s))
        .unwrap_or_else(|| panic!("Helm rendered the chart with {flags:?}: expected a refusal"))
}

/// `helm install --dry-run=client`: the release manifest Helm would install (hooks
/// set apart by Helm itself) and the rendered NOTES.txt.
pub(super) fn dry_run_install(
    namespace: &str,
    release: &str,
    flags: &[String],
) -> (Vec<Json>, String) {
    let mut args = vec![
        "install".to_string(),
        workspace().join(CHART).display().to_string(),
        namespace.to_string(),
        "--release".to_string(),
        release.to_string(),
    ];
    args.extend_from_slice(flags);
    let answer = helm(&args);
    let manifest = answer["manifest"].as_str().expect("manifest");
    (
        docs(manifest),
        answer["notes"].as_str().unwrap_or_default().to_string(),
    )
}

/// The chart rendered by Helm with values.yaml overridden by `set` (dotted keys, as
/// `--set-json`), in namespace hairpin-system, without its hooks.
pub(super) fn render_chart(set: &[(&str, Yaml)]) -> Vec<Json> {
    render_chart_with(&set_json(set))
}

/// Helm's strict lint of the chart with `flags`: no warning, no error.
fn lint(flags: &[String]) {
    let mut args = vec![
        "lint".to_string(),
        workspace().join(CHART).display().to_string(),
        KUBE_VERSION.to_string(),
    ];
    args.extend_from_slice(flags);
    let report = helm(&args);
    assert_eq!(report["total_charts_linted"], 1, "{report}");
    let errors = report["errors"].as_array().expect("errors");
    // Severity 1 is informational (`icon is recommended`); 2 warning, 3 error.
    let serious: Vec<&Json> = report["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["severity"].as_u64().is_none_or(|s| s >= 2))
        .collect();
    assert!(
        errors.is_empty() && serious.is_empty(),
        "helm lint {flags:?}: {errors:?} {serious:?}"
    );
}

/// The `--set` flags values.yaml documents for a variant.
pub(super) fn set_flags(chart: &[(&str, &str)]) -> Vec<String> {
    chart
        .iter()
        .flat_map(|(k, v)| ["--set".to_string(), format!("{k}={v}")])
        .collect()
}

/// Objects keyed by kind/namespace/name, without the labels only one side sets
/// (kustomize's part-of; Helm's managed-by and helm.sh/chart), Helm's hook
/// annotations and the Namespace (made before the install). Container env is sorted
/// by name:
/// kustomize's strategic merge moves patched entries to the front, and the order of
/// plain `value`s carries no meaning (no entry refers to another with `$(NAME)`,
/// which `no_env_refers_to_another` checks).
pub(super) fn comparable(objs: Vec<Json>) -> BTreeMap<String, Json> {
    objs.into_iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|mut o| {
            if let Some(l) = o["metadata"]["labels"].as_object_mut() {
                for only_one_side in [
                    "app.kubernetes.io/part-of",
                    "app.kubernetes.io/managed-by",
                    "helm.sh/chart",
                ] {
                    l.remove(only_one_side);
                }
            }
            if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
                a.retain(|k, _| !k.starts_with("helm.sh/hook"));
            }
            for list in ["containers", "initContainers"] {
                let Some(cs) = o["spec"]["template"]["spec"][list].as_array_mut() else {
                    continue;
                };
                for c in cs {
                    if let Some(env) = c["env"].as_array_mut() {
                        env.sort_by_key(|e| e["name"].as_str().unwrap_or_default().to_string());
                    }
                }
            }
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or("-"),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, normalize(o))
        })
        .collect()
}

#[test]
fn chart_renders_what_kustomize_renders() {
    for v in VARIANTS {
        // As values.yaml documents them: `helm install ... --set KEY=VALUE`.
        let set = set_flags(v.chart);
        let chart = render_chart_with(&set);
        parse_all(&chart, "chart");
        let Some(kustomized) = kustomize(v.dir) else {
            return;
        };
        let (a, b) = (comparable(chart), comparable(kustomized));
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "chart with {set:?} and {} render different objects",
            v.dir
        );
        for (key, obj) in &a {
            assert_eq!(
                serde_json::to_string_pretty(obj).expect("json"),
                serde_json::to_string_pretty(&b[key]).expect("json"),
                "{key}: the chart with {set:?} differs from {}",
                v.dir
            );
        }
    }
}

#[test]
fn helm_lints_the_chart_with_every_variants_values() {
    for v in VARIANTS {
        lint(&set_flags(v.chart));
    }
    for extra in [
        "kernelPath.mode=on,kernelPath.perfmon=true",
        "seccompProfile.type=Localhost,seccompProfile.localhostProfile=hairpin/bpf.json",
        "seccompProfile.type=Unconfined",
    ] {
        lint(&["--set".to_string(), extra.to_string()]);
    }
}

#[test]
fn helm_errors_fail_the_render() {
    // The harness reports Helm's own failure instead of rendering something: a
    // string where values.yaml has a map is refused by the schema, naming the key.
    let msg = render_error(&["--set-json".to_string(), r#"coredns="x""#.to_string()]);
    assert!(
        msg.contains("HelmValuesError") && msg.contains("/coredns") && msg.contains("want object"),
        "{msg}"
    );
}

#[test]
fn no_env_refers_to_another() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        for e in super::render::agent(&objs).env.iter().flatten() {
            assert!(
                !e.value.as_deref().unwrap_or_default().contains("$("),
                "{}: {} refers to another variable: env order matters then",
                v.dir,
                e.name
            );
        }
    }
}
