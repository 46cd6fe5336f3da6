//! The set checked as a user takes it, in a podman store of its own.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

use super::{Names, oci::Index};
use crate::{image::Arch, run, target_dir, toolchain::output, workspace_root};

/// The set as a user takes it: the sums check; the archive loads into podman and
/// runs this machine's agent under the index's digest; a registry client reads the
/// same index, and each platform's image in it holds a static agent for that
/// architecture that answers `--version` (the foreign one under qemu-user); Helm
/// renders the packaged chart with that digest on every pod.
pub(crate) fn verify(
    out: &Path,
    names: &Names,
    tag: &str,
    index: &Index,
    archs: &[Arch],
    helm_python: &Path,
) -> Result<()> {
    let digest = &index.digest;
    run(Command::new("sha256sum")
        .current_dir(out)
        .args(["--check", "--quiet", "SHA256SUMS"]))
    .context("SHA256SUMS does not match the set")?;
    let work = target_dir().join("dist").join("verify");
    // A store of its own, empty, as a new user's: in the shared one the image built a
    // moment before (`cargo xtask image`'s dev tag, same content, same id) survives
    // `rmi` of this tag, `podman load` then only re-tags it, and `.Digest` is the
    // manifest podman stored when it built the image, not the archive's.
    let store = PrivateStore::new(&work.join("store"))?;
    let archive_path = out.join(&names.archive);
    let got = store.loaded_digest(&archive_path, tag)?;
    ensure!(
        got == *digest,
        "podman loaded {tag} with digest {got} from the archive, expected {digest}"
    );
    let version = output(
        // Explicit limits: a runtime that may not raise the host's (a sandboxed
        // build machine) refuses the defaults podman asks for.
        store
            .podman()
            .args(["run", "--rm", "--network=none"])
            .args([
                "--ulimit",
                "nofile=4096:4096",
                "--ulimit",
                "nproc=4096:4096",
            ])
            .args([tag, "--version"]),
    )?;
    let want_version = format!("hairpin-agent {}", super::version());
    ensure!(
        version.trim() == want_version,
        "the loaded image runs {version:?}"
    );
    drop(store);
    // A registry client reads the same index (skopeo copies it to a registry with
    // `--all --preserve-digests`: README, "Releases").
    let archive = format!("oci-archive:{}", archive_path.display());
    let raw = output(Command::new("skopeo").args(["inspect", "--raw", &archive]))?;
    let read = format!("sha256:{}", sha256_hex(raw.as_bytes())?);
    ensure!(
        read == *digest,
        "skopeo reads manifest {read}, expected {digest}"
    );
    let listed: Vec<&str> = index.platforms.iter().map(|(a, _)| a.as_str()).collect();
    let want: Vec<&str> = archs.iter().map(|a| a.oci()).collect();
    ensure!(
        listed == want,
        "the image index lists platforms {listed:?}, expected {want:?}"
    );
    for (&arch, (_, manifest)) in archs.iter().zip(&index.platforms) {
        let answer = platform_agent_version(&archive, arch, manifest, &work.join(arch.oci()))?;
        ensure!(
            answer == want_version,
            "the {} image's agent answers {answer:?}, expected {want_version:?}",
            arch.platform()
        );
    }
    let rendered = output(
        Command::new(helm_python)
            .arg(workspace_root().join("tests/tests/deploy/helm.py"))
            .args(["render"])
            .arg(out.join(&names.chart))
            .args([
                "hairpin-system",
                "--set",
                "coredns.mode=corefile",
                "--set",
                "tests.target=a.example.com",
            ]),
    )?;
    let want = format!("{tag}@{digest}");
    let images = rendered.matches("image: ").count();
    let pinned = rendered.matches(&format!("image: {want}")).count();
    if images == 0 || images != pinned {
        bail!("the packaged chart renders {pinned} of {images} images as {want}");
    }
    fs::remove_dir_all(&work).with_context(|| format!("failed to remove {}", work.display()))
}

/// Copies `arch`'s image out of the archive as a registry client resolves it on such
/// a node (skopeo, `--override-arch`), checks its manifest is `manifest`, unpacks the
/// agent from its layer, checks it is a static binary for `arch` and returns what its
/// `--version` prints: run directly on this machine's architecture, under qemu-user
/// (Debian's `qemu-aarch64`) on the other.
fn platform_agent_version(archive: &str, arch: Arch, manifest: &str, dir: &Path) -> Result<String> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    // skopeo's dir: transport makes the last directory only.
    fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let copied = dir.join("image");
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--override-os", "linux"])
        .args(["--override-arch", arch.oci(), archive])
        .arg(format!("dir:{}", copied.display())))
    .with_context(|| format!("skopeo could not copy the {} image", arch.platform()))?;
    let bytes = fs::read(copied.join("manifest.json"))?;
    let got = format!("sha256:{}", sha256_hex(&bytes)?);
    ensure!(
        got == manifest,
        "skopeo resolved {} to manifest {got}, the index lists {manifest}",
        arch.platform()
    );
    let parsed: serde_json::Value = serde_json::from_slice(&bytes)?;
    let layers = parsed["layers"]
        .as_array()
        .context("the manifest lists no layers")?;
    ensure!(
        layers.len() == 1,
        "the {} image has {} layers, expected the agent's one",
        arch.platform(),
        layers.len()
    );
    let layer = layers[0]["digest"]
        .as_str()
        .context("a layer without a digest")?
        .trim_start_matches("sha256:");
    let root = dir.join("rootfs");
    fs::create_dir_all(&root)?;
    // tar recognises the layer's compression (gzip after `manifest push`) itself.
    run(Command::new("tar")
        .arg("--extract")
        .arg("--file")
        .arg(copied.join(layer))
        .arg("--directory")
        .arg(&root))
    .with_context(|| format!("tar could not unpack the {} layer", arch.platform()))?;
    let bin = root.join("usr/local/bin/hairpin-agent");
    let file = output(Command::new("file").arg("-b").arg(&bin))?;
    ensure!(
        file.contains(arch.file_says()) && file.contains("static"),
        "the {} image's agent is {}",
        arch.platform(),
        file.trim()
    );
    let mut cmd = if arch.is_cross()? {
        let mut qemu = Command::new(arch.qemu());
        qemu.arg("-L").arg(arch.sysroot()).arg(&bin);
        qemu
    } else {
        Command::new(&bin)
    };
    Ok(output(cmd.arg("--version"))?.trim().to_string())
}

/// The sha256 of `bytes` in hex (`sha256sum`).
pub(crate) fn sha256_hex(bytes: &[u8]) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("failed to run sha256sum")?;
    child
        .stdin
        .take()
        .context("sha256sum's stdin")?
        .write_all(bytes)?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// A podman image store of its own under a directory (`--root`, `--runroot`), empty
/// when made and removed when dropped: what a fresh machine's podman sees.
pub(crate) struct PrivateStore {
    dir: PathBuf,
}

impl PrivateStore {
    /// An empty store at `dir` (whatever was there is removed first).
    pub(crate) fn new(dir: &Path) -> Result<PrivateStore> {
        let store = PrivateStore {
            dir: dir.to_path_buf(),
        };
        store.clear()?;
        fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
        Ok(store)
    }

    /// `podman` on this store alone.
    pub(crate) fn podman(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("run"));
        cmd
    }

    /// Loads the OCI archive and returns the digest podman gives `tag`.
    pub(crate) fn loaded_digest(&self, archive: &Path, tag: &str) -> Result<String> {
        output(
            self.podman()
                .args(["load", "--quiet", "--input"])
                .arg(archive),
        )
        .with_context(|| format!("podman could not load {}", archive.display()))?;
        Ok(output(
            self.podman()
                .args(["image", "inspect", "--format", "{{.Digest}}", tag]),
        )?
        .trim()
        .to_string())
    }

    /// Removes the store's images (their overlay mounts) and then its directory.
    fn clear(&self) -> Result<()> {
        if !self.dir.exists() {
            return Ok(());
        }
        let _ = self.podman().args(["rmi", "--all", "--force"]).output();
        fs::remove_dir_all(&self.dir)
            .with_context(|| format!("failed to remove {}", self.dir.display()))
    }
}

impl Drop for PrivateStore {
    fn drop(&mut self) {
        if let Err(e) = self.clear() {
            eprintln!("xtask: {e:#}");
        }
    }
}
