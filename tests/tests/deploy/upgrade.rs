//! The operator's install and upgrade, as README.md and docs/upgrade.md write them, run
//! by real Helm against a real API server (etcd and kube-apiserver, as the
//! real_cluster suite starts them; no kubelet: what is checked is what Helm writes).
//!
//! A packaged chart pins its image by digest in its values; an upgrade that keeps the
//! old chart's defaults (`--reuse-values`) keeps the old digest, and every node would
//! restart into the old binary. The documented command must move every pod to the new
//! chart's image and keep the values the operator gave at install.

use std::{fs, path::Path};

use hairpin_tests::{
    cluster::Cluster,
    helm::{docs, helm},
    node::SimNode,
    repo::workspace,
};
use serde_json::Value as Json;

const OLD_DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const NEW_DIGEST: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

/// The workspace's chart as a release packages it: `version` as its version and
/// appVersion, `digest` as `image.digest` (xtask/src/release.rs edits the same line).
fn packaged_chart(to: &Path, version: &str, digest: &str) {
    hairpin_tests::helm::chart_as_version(to, version);
    let values = fs::read_to_string(to.join("values.yaml")).expect("values.yaml");
    let needle = "\n  digest: \"\"\n";
    assert_eq!(values.matches(needle).count(), 1, "one empty image.digest");
    fs::write(
        to.join("values.yaml"),
        values.replacen(needle, &format!("\n  digest: \"{digest}\"\n"), 1),
    )
    .expect("write values.yaml");
}

/// The first shell command in `doc` that starts with `prefix`, continuation lines
/// joined and `#` comments dropped, split into words.
fn command_in(doc: &str, prefix: &str) -> Vec<String> {
    let text = fs::read_to_string(workspace().join(doc)).expect("read the doc");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(prefix));
    let mut words = Vec::new();
    for line in lines.by_ref() {
        let line = line.split(" #").next().unwrap_or_default().trim_end();
        let (body, more) = match line.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (line, false),
        };
        words.extend(
            body.split_whitespace()
                .map(|w| w.trim_matches('\'').to_string()),
        );
        if !more {
            break;
        }
    }
    assert!(!words.is_empty(), "{doc} has no `{prefix}` command");
    words
}

/// `helm install|upgrade RELEASE CHART ARGS` as helm.py's cluster command with the
/// local chart `chart` for CHART: `--version` (the chart is given) dropped, `-n` the
/// namespace, the value modes and `--set` passed on; any other flag fails the test.
fn as_helm_py(words: &[String], kubeconfig: &Path, chart: &Path) -> Vec<String> {
    let (verb, release) = (&words[1], &words[2]);
    let mut namespace = None;
    let mut rest = Vec::new();
    let mut it = words[4..].iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "--version" => {
                it.next();
            }
            "-n" | "--namespace" => namespace = it.next().cloned(),
            "--set" => {
                rest.push(w.clone());
                rest.push(it.next().expect("--set EXPR").clone());
            }
            "--reuse-values" | "--reset-values" | "--reset-then-reuse-values" => {
                rest.push(w.clone());
            }
            other => panic!("the test does not know `{other}` in {words:?}"),
        }
    }
    let mut args = vec![
        format!("cluster-{verb}"),
        kubeconfig.display().to_string(),
        chart.display().to_string(),
        namespace.expect("the command names its namespace"),
        "--release".to_string(),
        release.clone(),
    ];
    args.extend(rest);
    args
}

/// Every container image in the release's manifest.
fn images(manifest: &Json) -> Vec<String> {
    let mut out = Vec::new();
    for doc in docs(manifest.as_str().expect("manifest")) {
        let spec = &doc["spec"]["template"]["spec"];
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                out.push(c["image"].as_str().expect("image").to_string());
            }
        }
    }
    out
}

/// README's install and docs/upgrade.md's upgrade, run by Helm against the API
/// server: the upgrade moves the DaemonSet and the writer to the new chart's image and
/// keeps the install's values; the old doc's `--reuse-values` (run too, on a second
/// release) keeps the old image, which is what this test exists to catch.
#[test]
fn the_documented_upgrade_moves_every_pod_to_the_new_charts_image() {
    if !hairpin_tests::privileges::datapath_tests_can_run(module_path!()) {
        return;
    }
    let node = SimNode::for_real_kube_proxy();
    let Some(cluster) = Cluster::start(&node) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    packaged_chart(&old, "0.1.0", OLD_DIGEST);
    packaged_chart(&new, "0.2.0", NEW_DIGEST);
    let kubeconfig = cluster.admin_kubeconfig();
    // README: the namespace first (kubectl create namespace), then helm install.
    cluster.ensure_namespace("hairpin-system");
    let install = command_in("README.md", "helm install hairpin oci://ghcr.io/");
    let upgrade = command_in("docs/upgrade.md", "helm upgrade hairpin ");
    let image = |digest: &str, version: &str| {
        format!("ghcr.io/hairpin-dev/hairpin-agent:{version}@{digest}")
    };

    let installed = helm(&as_helm_py(&install, &kubeconfig, &old));
    let before = images(&installed["manifest"]);
    assert!(before.len() >= 2, "the agent and the writer: {before:?}");
    assert!(
        before.iter().all(|i| *i == image(OLD_DIGEST, "0.1.0")),
        "{before:?}"
    );

    let upgraded = helm(&as_helm_py(&upgrade, &kubeconfig, &new));
    assert_eq!(upgraded["revision"], 2, "a second revision");
    let after = images(&upgraded["manifest"]);
    assert_eq!(after.len(), before.len(), "{after:?}");
    assert!(
        after.iter().all(|i| *i == image(NEW_DIGEST, "0.2.0")),
        "docs/upgrade.md's {upgrade:?} leaves the pods on {after:?}"
    );
    // The install's values stay: the writer (coredns.mode=corefile) and the domain.
    let manifest = upgraded["manifest"].as_str().expect("manifest");
    assert!(manifest.contains("hairpin-coredns"), "the writer is gone");
    assert!(manifest.contains("example.com"), "names.domains is gone");

    // What the API server holds is what Helm says it wrote.
    let ds: k8s_openapi::api::apps::v1::DaemonSet = cluster.block_on(async {
        kube::Api::namespaced(cluster.client(), "hairpin-system")
            .get("hairpin")
            .await
            .expect("the DaemonSet")
    });
    let served = ds
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers[0].image.clone().unwrap_or_default());
    assert_eq!(served, Some(image(NEW_DIGEST, "0.2.0")));

    // The old doc's command on a release of its own: the old image stays.
    let mut reuse = as_helm_py(&install, &kubeconfig, &old);
    reuse[5] = "reuse".to_string();
    helm(&reuse);
    let mut old_doc = as_helm_py(&upgrade, &kubeconfig, &new);
    old_doc[5] = "reuse".to_string();
    old_doc.retain(|a| !matches!(a.as_str(), "--reset-then-reuse-values" | "--reset-values"));
    old_doc.push("--reuse-values".to_string());
    let kept = images(&helm(&old_doc)["manifest"]);
    assert!(
        kept.iter().all(|i| *i == image(OLD_DIGEST, "0.2.0")),
        "--reuse-values keeps the old chart's digest (Helm changed?): {kept:?}"
    );
}
