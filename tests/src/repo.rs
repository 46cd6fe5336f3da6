//! Where the suites find the repository's own files: the workspace root (deploy/,
//! docs/, the Dockerfile) and the recordings the agent crate owns.

use std::path::{Path, PathBuf};

/// The agent's fixtures, relative to the workspace root: recorded Kubernetes objects
/// (Services, DaemonSets, Ingresses, cluster DNS), CNI route tables and Corefiles.
/// The agent crate owns them (its deciders' tests read them beside its code); the
/// suites read the same recordings, and only through [`agent_fixture`].
pub const AGENT_FIXTURES: &str = "hairpin-agent/tests/fixtures";

/// The workspace root (this crate is its `tests/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// The agent's fixture `rel` (`services/digitalocean.yaml`, `cni/calico.routes`).
pub fn agent_fixture(rel: &str) -> PathBuf {
    workspace().join(AGENT_FIXTURES).join(rel)
}

/// Writes `dir`/kustomization.yaml: `deploy/` with `components` (workspace paths),
/// named by relative paths, the only kind kustomize takes to other kustomizations.
pub fn write_kustomization(dir: &Path, components: &[&str]) {
    let up = "../".repeat(dir.components().count() - 1);
    let rel = |p: &str| format!("{up}{}", workspace().join(p).display()).replace("//", "/");
    let mut k = format!("resources:\n  - {}\ncomponents:\n", rel("deploy"));
    for c in components {
        k.push_str(&format!("  - {}\n", rel(c)));
    }
    std::fs::write(dir.join("kustomization.yaml"), k).expect("write kustomization");
}
