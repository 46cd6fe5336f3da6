//! Debian's kernels for the VM matrix: the package fetched with apt, its vmlinuz and
//! modules extracted once into the cache (`<cache>/kernels/<series>/`), `depmod` run
//! over them so that `modprobe -d` resolves dependencies there.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{prereqs, run};

/// A kernel series the matrix boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Series {
    /// Debian 12 (bookworm): Linux 6.1, the generic flavour (9p is a module there;
    /// the cloud flavour has none).
    V6_1,
    /// Debian 12's backports: Linux 6.12.
    V6_12,
}

impl Series {
    /// Every series, in the order the matrix runs them.
    pub(crate) const ALL: [Series; 2] = [Series::V6_1, Series::V6_12];

    /// The name on the command line and in the cache: `6.1`, `6.12`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Series::V6_1 => "6.1",
            Series::V6_12 => "6.12",
        }
    }

    /// Whether `package` (an `apt-cache search` name) is this series' unsigned
    /// generic kernel image: `linux-image-6.1.0-57-amd64-unsigned`,
    /// `linux-image-6.12.117+deb12-amd64-unsigned`.
    fn matches(self, package: &str) -> bool {
        let Some(rest) = package
            .strip_prefix("linux-image-")
            .and_then(|r| r.strip_suffix("-amd64-unsigned"))
        else {
            return false;
        };
        match self {
            // 6.1.0-57
            Series::V6_1 => rest
                .strip_prefix("6.1.0-")
                .is_some_and(|abi| !abi.is_empty() && abi.bytes().all(|b| b.is_ascii_digit())),
            // 6.12.117+deb12
            Series::V6_12 => rest
                .strip_prefix("6.12.")
                .and_then(|r| r.strip_suffix("+deb12"))
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        }
    }

    /// The `apt-cache search` regular expression naming this series' packages.
    fn search_pattern(self) -> &'static str {
        match self {
            Series::V6_1 => r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
            Series::V6_12 => r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$",
        }
    }
}

impl std::str::FromStr for Series {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Series::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .with_context(|| format!("unknown kernel series {s:?}: expected 6.1 or 6.12"))
    }
}

/// An extracted kernel: its image and its module tree (`root/lib/modules/<release>`).
#[derive(Clone, Debug)]
pub(crate) struct KernelTree {
    /// The series it belongs to.
    pub(crate) series: Series,
    /// `uname -r` of the kernel: `6.1.0-57-amd64`.
    pub(crate) release: String,
    /// The extracted package's root (`modprobe -d` takes it).
    pub(crate) root: PathBuf,
    /// `root/boot/vmlinuz-<release>`.
    pub(crate) vmlinuz: PathBuf,
}

/// The apt sources file adding bookworm-backports (Linux 6.12).
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/hairpin-bookworm-backports.sources";

const BACKPORTS: &str = "Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

/// The cache directory of `series`.
fn series_dir(series: Series) -> PathBuf {
    prereqs::cache_dir().join("kernels").join(series.name())
}

/// The kernel of `series`, from the cache, else downloaded with apt and extracted
/// there (about 180 MB for both series, once).
pub(crate) fn ensure(series: Series) -> Result<KernelTree> {
    let dir = series_dir(series);
    if let Some(tree) = cached(series, &dir) {
        return Ok(tree);
    }
    let package = newest_package(series)?;
    eprintln!(
        "xtask: fetching {package} for the Linux {} VM (once)",
        series.name()
    );
    let download = dir.join("download");
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)
        .with_context(|| format!("failed to create {}", download.display()))?;
    run(Command::new("apt-get")
        .args(["download", "-q"])
        .arg(&package)
        .current_dir(&download))
    .with_context(|| format!("could not download {package} with apt"))?;
    let deb = fs::read_dir(&download)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", download.display()))?;
    let partial = dir.join("root.partial");
    let _ = fs::remove_dir_all(&partial);
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    let release = release_in(&partial)?;
    // The package ships no modules.dep (its postinst runs depmod): make one so that
    // `modprobe -d` finds each module's dependencies.
    run(Command::new("depmod").arg("-b").arg(&partial).arg(&release))?;
    let root = dir.join("root");
    let _ = fs::remove_dir_all(&root);
    fs::rename(&partial, &root)?;
    fs::write(dir.join("release"), &release)?;
    fs::remove_dir_all(&download)?;
    cached(series, &dir)
        .with_context(|| format!("{} was extracted but is incomplete", dir.display()))
}

/// The tree in `dir` when a finished extraction is there.
fn cached(series: Series, dir: &Path) -> Option<KernelTree> {
    let release = fs::read_to_string(dir.join("release")).ok()?;
    let release = release.trim().to_string();
    let root = dir.join("root");
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    let deps = root.join("lib/modules").join(&release).join("modules.dep");
    (vmlinuz.is_file() && deps.is_file()).then_some(KernelTree {
        series,
        release,
        root,
        vmlinuz,
    })
}

/// The kernel release (`lib/modules/<release>`) of an extracted package.
fn release_in(root: &Path) -> Result<String> {
    let modules = root.join("lib/modules");
    let mut names: Vec<String> = fs::read_dir(&modules)
        .with_context(|| format!("the package has no {}", modules.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    match names.len() {
        1 => Ok(names.remove(0)),
        _ => bail!(
            "expected one kernel release in {}, found {names:?}",
            modules.display()
        ),
    }
}

/// The newest package of `series` apt knows, adding bookworm-backports first for 6.12.
fn newest_package(series: Series) -> Result<String> {
    if series == Series::V6_12 {
        ensure_backports()?;
    }
    let search = |update: bool| -> Result<Vec<String>> {
        if update {
            run(Command::new("apt-get").args(["update", "-qq"]))?;
        }
        let out = Command::new("apt-cache")
            .args(["search", "--names-only", series.search_pattern()])
            .output()
            .context("failed to run apt-cache")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|p| series.matches(p))
            .map(str::to_string)
            .collect())
    };
    let mut found = search(false)?;
    if found.is_empty() {
        found = search(true)?;
    }
    found.sort_by_key(|p| version_key(p));
    found.pop().with_context(|| {
        format!(
            "apt knows no Linux {} package (searched {}): is this Debian 12 with bookworm{} in its sources?",
            series.name(),
            series.search_pattern(),
            if series == Series::V6_12 { "-backports" } else { "" }
        )
    })
}

/// The numbers in a package name, for sorting `6.1.0-9` before `6.1.0-57`.
fn version_key(package: &str) -> Vec<u64> {
    package
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// Adds bookworm-backports to apt's sources (as root) when absent, and updates apt.
fn ensure_backports() -> Result<()> {
    if fs::read_to_string(BACKPORTS_SOURCES).is_ok_and(|s| s == BACKPORTS) {
        return Ok(());
    }
    if !crate::root::is_root() {
        bail!("adding bookworm-backports to apt's sources ({BACKPORTS_SOURCES}) needs root");
    }
    eprintln!("xtask: adding bookworm-backports to apt's sources ({BACKPORTS_SOURCES})");
    fs::write(BACKPORTS_SOURCES, BACKPORTS)
        .with_context(|| format!("failed to write {BACKPORTS_SOURCES}"))?;
    run(Command::new("apt-get").args(["update", "-qq"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_matches_its_generic_unsigned_image_only() {
        assert!(Series::V6_1.matches("linux-image-6.1.0-57-amd64-unsigned"));
        assert!(!Series::V6_1.matches("linux-image-6.1.0-57-cloud-amd64-unsigned"));
        assert!(!Series::V6_1.matches("linux-image-6.12.117+deb12-amd64-unsigned"));
        assert!(Series::V6_12.matches("linux-image-6.12.117+deb12-amd64-unsigned"));
        assert!(!Series::V6_12.matches("linux-image-6.12.117+deb12-rt-amd64-unsigned"));
        assert!(!Series::V6_12.matches("linux-image-6.1.0-57-amd64-unsigned"));
    }

    #[test]
    fn the_newest_abi_sorts_last() {
        let mut v = [
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-6.1.0-9-amd64-unsigned",
        ];
        v.sort_by_key(|p| version_key(p));
        assert_eq!(v[1], "linux-image-6.1.0-57-amd64-unsigned");
    }
}
