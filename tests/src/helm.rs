//! Helm v4 as a library (the PyPI wheel helm-python-sdk, pinned and installed into a
//! virtual environment by `cargo xtask setup`), driven through
//! `tests/tests/deploy/helm.py`: the chart rendered, installed as a client-side dry
//! run, linted and packaged by Helm itself, never by a re-implementation.

use std::{path::PathBuf, process::Command};

use serde::Deserialize;
use serde_json::Value as Json;
use yaml_serde::Value as Yaml;

use crate::repo::workspace;

/// The chart's directory in the workspace.
pub const CHART: &str = "deploy/chart/hairpin";

/// Where `cargo xtask setup` keeps its tools (xtask/src/cache.rs names the place):
/// `$XDG_CACHE_HOME/hairpin`, else `~/.cache/hairpin`, else `/var/cache/hairpin`.
/// Only the fallback of a plain `cargo test`: `cargo xtask test` passes each tool's
/// path itself (`HAIRPIN_HELM_PYTHON`, ...).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("hairpin")
}

/// The Python interpreter of the virtual environment holding helm-python-sdk:
/// `HAIRPIN_HELM_PYTHON` (set by `cargo xtask test`), else the one `cargo xtask
/// setup` made under the cache. Missing, the caller fails saying how to install it:
/// the chart is never checked by anything but Helm.
pub fn helm_python() -> PathBuf {
    if let Some(p) = std::env::var_os("HAIRPIN_HELM_PYTHON") {
        return PathBuf::from(p);
    }
    let cache = cache_dir();
    let found = std::fs::read_dir(&cache).ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path().join("bin/python"))
            .filter(|p| {
                p.parent()
                    .and_then(|b| b.parent())
                    .and_then(|v| v.file_name())
                    .is_some_and(|n| n.to_string_lossy().starts_with("helm-python-sdk-"))
            })
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "Helm (helm-python-sdk) is not installed under {}: run `cargo xtask setup`, \
             or set HAIRPIN_HELM_PYTHON to a Python that imports helm_python",
            cache.display()
        )
    })
}

/// Runs `helm.py ARGS` and returns its JSON answer, failing with Helm's own error.
pub fn helm(args: &[String]) -> Json {
    let python = helm_python();
    let out = Command::new(&python)
        .arg(workspace().join("tests/tests/deploy/helm.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("failed to run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("helm.py prints JSON")
}

/// Splits a multi-document YAML stream into JSON values, dropping empty documents.
pub fn docs(text: &str) -> Vec<Json> {
    yaml_serde::Deserializer::from_str(text)
        .map(|d| Yaml::deserialize(d).unwrap_or_else(|e| panic!("invalid YAML: {e}")))
        .filter(|v| !v.is_null())
        .map(|v| serde_json::to_value(v).expect("YAML maps to JSON"))
        .collect()
}

/// Every object of the chart at `chart` as `helm install RELEASE CHART -n NAMESPACE`
/// renders it with `flags` (`--set EXPR`, `--set-json EXPR`), hooks included, in
/// template path order; NOTES.txt is left out.
pub fn render(
    chart: &std::path::Path,
    namespace: &str,
    release: &str,
    flags: &[String],
) -> Vec<Json> {
    let mut args = vec![
        "render".to_string(),
        chart.display().to_string(),
        namespace.to_string(),
        "--release".to_string(),
        release.to_string(),
    ];
    args.extend_from_slice(flags);
    let answer = helm(&args);
    let manifests = answer["manifests"].as_object().expect("manifests");
    let files: std::collections::BTreeMap<&String, &str> = manifests
        .iter()
        .filter(|(path, _)| path.ends_with(".yaml"))
        .map(|(path, text)| (path, text.as_str().expect("manifest text")))
        .collect();
    files.values().flat_map(|text| docs(text)).collect()
}

/// The workspace's chart rendered as [`render`] does.
pub fn render_workspace_chart(namespace: &str, release: &str, flags: &[String]) -> Vec<Json> {
    render(&workspace().join(CHART), namespace, release, flags)
}

/// The workspace's chart copied to `to` as a release packages it: `version` as its
/// version and its appVersion (so the image tag the DaemonSet runs).
pub fn chart_as_version(to: &std::path::Path, version: &str) {
    let from = workspace().join(CHART);
    let out = Command::new("cp")
        .arg("-a")
        .arg(&from)
        .arg(to)
        .output()
        .expect("cp");
    assert!(out.status.success(), "cp: {out:?}");
    let file = to.join("Chart.yaml");
    let chart = std::fs::read_to_string(&file).expect("Chart.yaml");
    let chart: Vec<String> = chart
        .lines()
        .map(|l| {
            if l.starts_with("version: ") {
                format!("version: {version}")
            } else if l.starts_with("appVersion: ") {
                format!("appVersion: \"{version}\"")
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&file, chart.join("\n") + "\n").expect("write Chart.yaml");
}
