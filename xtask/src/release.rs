//! `cargo xtask release`: one versioned set, built offline and reproducibly from the
//! commit checked out, into `target/dist/hairpin-<version>/`:
//!
//! - `hairpin-agent-<version>.oci.tar`: the image (the static agent on an empty base,
//!   OCI labels) as an OCI archive, which `podman load`, `skopeo copy oci-archive:`
//!   and `ctr images import` take; its manifest digest is the image's digest;
//! - `hairpin-<version>.tgz`: the chart, packaged by Helm, with that digest in its
//!   values (`image.digest`), so every pod runs exactly this image;
//! - `hairpin-agent-<version>.cdx.json`, `hairpin-ebpf-<version>.cdx.json`: CycloneDX
//!   SBOMs of the agent and of the programs it embeds, from Cargo.lock, by
//!   cargo-cyclonedx (pinned, installed into the cache);
//! - `release.json` (version, commit, digests) and `SHA256SUMS` over all of them.
//!
//! Reproducible: every timestamp is the commit's (`SOURCE_DATE_EPOCH`), the builds
//! carry no path of this machine (`--remap-path-prefix`), the archives are written
//! with sorted entries, fixed owners and mtimes, and the SBOMs leave out their random
//! serial number and creation time (CycloneDX's `cdx:reproducible`). The image is
//! built twice and the digests must agree; the set is then checked as a user would
//! use it: the archive loaded with podman runs the agent, and Helm renders the
//! packaged chart with the archive's digest.
//!
//! Offline: crates are fetched first (`cargo fetch --locked`), so it also works from
//! an empty cargo home; everything after that needs no network (`--network=none`,
//! `CARGO_NET_OFFLINE`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{image, prereqs, run, source::Source, target_dir, toolchain::output, workspace_root};

/// cargo-cyclonedx, the CycloneDX project's SBOM generator for Cargo, pinned.
pub(crate) const CARGO_CYCLONEDX_VERSION: &str = "0.5.9";

/// The image's name in the set (and in the registry the workflow publishes to).
pub(crate) const IMAGE_REPOSITORY: &str = "ghcr.io/hairpin-dev/hairpin-agent";

/// Options of `release`.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct Options {
    /// Where the set goes; default `target/dist/hairpin-<version>`.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The version every artifact carries: the workspace's, which Chart.yaml (version and
/// appVersion) and the kustomizations' image tags must equal.
pub(crate) fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Every file name of the set for `version`.
pub(crate) struct Names {
    /// The image archive.
    pub archive: String,
    /// The chart package.
    pub chart: String,
    /// The SBOMs.
    pub sboms: [String; 2],
}

impl Names {
    /// The names for `version`.
    pub(crate) fn of(version: &str) -> Names {
        Names {
            archive: format!("hairpin-agent-{version}.oci.tar"),
            chart: format!("hairpin-{version}.tgz"),
            sboms: [
                format!("hairpin-agent-{version}.cdx.json"),
                format!("hairpin-ebpf-{version}.cdx.json"),
            ],
        }
    }
}

/// Builds the set; returns its directory.
pub(crate) fn release(opts: &Options) -> Result<PathBuf> {
    let v = version();
    check_versions(v)?;
    let source = Source::read()?;
    prereqs::ensure_release_packages()?;
    let helm_python = crate::helm::ensure_helm()?;
    let cyclonedx = prereqs::ensure_cargo_tool_probed(
        "cargo-cyclonedx",
        CARGO_CYCLONEDX_VERSION,
        "about five minutes",
        &["cyclonedx", "--version"],
        |o| String::from_utf8_lossy(&o.stdout).contains(CARGO_CYCLONEDX_VERSION),
    )?;
    // Online once, offline from here on.
    run(crate::cargo().args(["fetch", "--locked", "--quiet"]))
        .context("could not fetch the crates Cargo.lock names: is crates.io reachable?")?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| target_dir().join("dist").join(format!("hairpin-{v}")));
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("failed to clear {}", out.display()))?;
    }
    fs::create_dir_all(&out).with_context(|| format!("failed to create {}", out.display()))?;
    let names = Names::of(v);

    let tag = format!("{IMAGE_REPOSITORY}:{v}");
    let digest = image_archive(&tag, &source, &out.join(&names.archive))?;
    package_chart(&helm_python, &digest, &source, &out)?;
    // The agent for the image's platform; the programs for the BPF target, whose
    // dependencies (aya-ebpf, aya-log-ebpf) only that target has.
    let targets = [
        ("hairpin-agent", image::host_target()?, &names.sboms[0]),
        ("hairpin-ebpf", "bpfel-unknown-none", &names.sboms[1]),
    ];
    for (package, target, name) in targets {
        sbom(&cyclonedx, package, target, source.epoch, &out.join(name))?;
    }
    let manifest = serde_json::json!({
        "version": v,
        "revision": source.revision,
        "source_date_epoch": source.epoch,
        "image": {"name": tag, "digest": digest, "archive": names.archive},
        "chart": {"name": "hairpin", "version": v, "archive": names.chart},
        "sboms": names.sboms,
    });
    fs::write(
        out.join("release.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    write_sums(&out)?;
    verify(&out, &names, &tag, &digest, &helm_python)?;
    eprintln!(
        "xtask: release {v} ({}) in {}:\n  image {tag}@{digest}",
        source.revision,
        out.display()
    );
    Ok(out)
}

/// Chart.yaml's version and appVersion, and every kustomization's image tag and
/// version label, equal `v`: one version for the whole set.
pub(crate) fn check_versions(v: &str) -> Result<()> {
    let root = workspace_root();
    let chart = fs::read_to_string(root.join("deploy/chart/hairpin/Chart.yaml"))?;
    for key in ["version", "appVersion"] {
        let found = chart
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .map(|s| s.trim_matches('"'));
        ensure!(
            found == Some(v),
            "deploy/chart/hairpin/Chart.yaml: {key} is {found:?}, expected {v:?} (the workspace's version)"
        );
    }
    for file in kustomizations(&root.join("deploy"))? {
        let text = fs::read_to_string(&file)?;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            let value = t
                .strip_prefix("newTag: ")
                .or_else(|| t.strip_prefix("app.kubernetes.io/version: "))
                .map(|s| s.trim_matches('"'));
            if let Some(found) = value {
                ensure!(
                    found == v,
                    "{}:{}: {found:?}, expected {v:?} (the workspace's version)",
                    file.display(),
                    i + 1
                );
            }
        }
    }
    Ok(())
}

fn kustomizations(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(kustomizations(&p)?);
        } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
            out.push(p);
        }
    }
    Ok(out)
}

/// Builds the image twice (the digests must agree), writes it as a reproducible OCI
/// archive to `archive`; returns its manifest digest.
fn image_archive(tag: &str, source: &Source, archive: &Path) -> Result<String> {
    let build = image::Build {
        tag: tag.to_string(),
        revision: source.revision.clone(),
        epoch: source.epoch,
    };
    let layout = target_dir().join("dist").join("oci-layout");
    let mut digests = Vec::new();
    for _ in 0..2 {
        image::build_with(&build)?;
        if layout.exists() {
            fs::remove_dir_all(&layout)?;
        }
        run(Command::new("podman")
            .args(["save", "--format", "oci-dir", "--output"])
            .arg(&layout)
            .arg(tag))
        .context("podman could not write the OCI layout")?;
        digests.push(manifest_digest(&layout)?);
    }
    ensure!(
        digests[0] == digests[1],
        "the image is not reproducible: two builds gave {} and {}",
        digests[0],
        digests[1]
    );
    deterministic_tar(&layout, archive, source.epoch)?;
    Ok(digests.remove(0))
}

/// The digest of the one manifest an OCI layout's index.json lists.
pub(crate) fn manifest_digest(layout: &Path) -> Result<String> {
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(layout.join("index.json"))?)
            .context("index.json is not JSON")?;
    let manifests = index["manifests"]
        .as_array()
        .context("index.json: no manifests")?;
    ensure!(
        manifests.len() == 1,
        "index.json lists {} manifests, expected one",
        manifests.len()
    );
    let digest = manifests[0]["digest"]
        .as_str()
        .context("index.json: no digest")?;
    ensure!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "index.json: digest {digest:?}"
    );
    Ok(digest.to_string())
}

/// `dir`'s content as a tar at `to` that depends on the content alone: sorted names,
/// owner 0:0, every mtime `epoch`, no access or change times.
pub(crate) fn deterministic_tar(dir: &Path, to: &Path, epoch: u64) -> Result<()> {
    run(Command::new("tar")
        .arg("--create")
        .arg("--file")
        .arg(to)
        .arg("--directory")
        .arg(dir)
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--format=posix",
        ])
        .arg(format!("--mtime=@{epoch}"))
        .arg("--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime")
        .arg("."))
    .with_context(|| format!("tar could not write {}", to.display()))
}

/// values.yaml with `digest` as `image.digest`: the one line `  digest: ""` under
/// `image:` replaced, every comment kept.
pub(crate) fn values_with_digest(values: &str, digest: &str) -> Result<String> {
    let needle = "\n  digest: \"\"\n";
    ensure!(
        values.matches(needle).count() == 1 && values.find("\nimage:\n") < values.find(needle),
        "deploy/chart/hairpin/values.yaml: expected one `  digest: \"\"` under `image:`"
    );
    Ok(values.replacen(needle, &format!("\n  digest: \"{digest}\"\n"), 1))
}

/// Copies the chart, sets the image digest in its values and every mtime to the
/// commit's, and packages it with Helm into `out`.
fn package_chart(helm_python: &Path, digest: &str, source: &Source, out: &Path) -> Result<()> {
    let stage = target_dir().join("dist").join("chart-stage");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let chart = stage.join("hairpin");
    copy_dir(&workspace_root().join("deploy/chart/hairpin"), &chart)?;
    let values = fs::read_to_string(chart.join("values.yaml"))?;
    fs::write(
        chart.join("values.yaml"),
        values_with_digest(&values, digest)?,
    )?;
    // Helm writes each file's mtime into the package.
    run(Command::new("find")
        .arg(&stage)
        .args(["-exec", "touch", "--no-dereference", "--date"])
        .arg(format!("@{}", source.epoch))
        .args(["{}", "+"]))?;
    let answer = output(
        Command::new(helm_python)
            .arg(workspace_root().join("tests/tests/deploy/helm.py"))
            .args(["package"])
            .arg(&chart)
            .arg(out),
    )
    .context("Helm could not package the chart")?;
    ensure!(answer.contains(".tgz"), "helm.py package printed {answer}");
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            fs::copy(e.path(), &target)
                .with_context(|| format!("failed to copy {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// The CycloneDX SBOM of `package` for `target` from Cargo.lock, offline, made
/// reproducible ([`reproducible_bom`]): the same lock file gives the same bytes
/// wherever it is checked out.
fn sbom(cyclonedx: &Path, package: &str, target: &str, epoch: u64, to: &Path) -> Result<()> {
    let manifest = workspace_root().join(package).join("Cargo.toml");
    run(Command::new(cyclonedx)
        .arg("cyclonedx")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["--format", "json", "--spec-version", "1.5", "--quiet"])
        .args(["--target", target, "--override-filename", "bom"])
        .env("CARGO_NET_OFFLINE", "true")
        // cargo-cyclonedx then writes no random serial number.
        .env("SOURCE_DATE_EPOCH", epoch.to_string()))
    .with_context(|| format!("cargo-cyclonedx could not describe {package}"))?;
    let written = workspace_root().join(package).join("bom.json");
    let text = fs::read_to_string(&written)
        .with_context(|| format!("cargo-cyclonedx wrote no {}", written.display()))?;
    // It writes one beside every workspace member's Cargo.toml: none may stay in the
    // tree (the next release would see it dirty).
    for member in ["hairpin-agent", "hairpin-ebpf", "tests", "tools", "xtask"] {
        let _ = fs::remove_file(workspace_root().join(member).join("bom.json"));
    }
    let root = format!("file://{}/", workspace_root().display());
    let mut bom: serde_json::Value = serde_json::from_str(&text.replace(&root, "file:///hairpin/"))
        .context("the SBOM is not JSON")?;
    fs::write(to, reproducible_bom(&mut bom)? + "\n")?;
    Ok(())
}

/// Drops a CycloneDX BOM's time- and random-based values and says so
/// (`cdx:reproducible`); the pretty JSON.
pub(crate) fn reproducible_bom(bom: &mut serde_json::Value) -> Result<String> {
    ensure!(bom["bomFormat"] == "CycloneDX", "not a CycloneDX BOM");
    let top = bom.as_object_mut().context("a BOM is an object")?;
    top.remove("serialNumber");
    let meta = top
        .entry("metadata")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()
        .context("metadata is an object")?;
    meta.remove("timestamp");
    let props = meta
        .entry("properties")
        .or_insert_with(|| serde_json::json!([]))
        .as_array_mut()
        .context("metadata.properties is a list")?;
    props.push(serde_json::json!({"name": "cdx:reproducible", "value": "true"}));
    Ok(serde_json::to_string_pretty(bom)?)
}

/// The sha256 of `bytes` in hex (`sha256sum`).
fn sha256_hex(bytes: &[u8]) -> Result<String> {
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

/// `SHA256SUMS` over every other file of the set, as `sha256sum` writes and
/// `sha256sum --check` reads it, sorted by name.
fn write_sums(out: &Path) -> Result<()> {
    let mut files: Vec<String> = fs::read_dir(out)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|f| f != "SHA256SUMS");
    files.sort();
    let sums = output(Command::new("sha256sum").current_dir(out).args(&files))?;
    fs::write(out.join("SHA256SUMS"), sums)?;
    Ok(())
}

/// The set as a user takes it: the sums check, the archive loads into podman and
/// runs the agent under the digest it claims, and Helm renders the packaged chart
/// with that digest on every pod.
fn verify(out: &Path, names: &Names, tag: &str, digest: &str, helm_python: &Path) -> Result<()> {
    run(Command::new("sha256sum")
        .current_dir(out)
        .args(["--check", "--quiet", "SHA256SUMS"]))
    .context("SHA256SUMS does not match the set")?;
    // A store of its own, empty, as a new user's: in the shared one the image built a
    // moment before (`cargo xtask image`'s dev tag, same content, same id) survives
    // `rmi` of this tag, `podman load` then only re-tags it, and `.Digest` is the
    // manifest podman stored when it built the image, not the archive's.
    let store = PrivateStore::new(&target_dir().join("dist").join("verify-store"))?;
    let got = store.loaded_digest(&out.join(&names.archive), tag)?;
    ensure!(
        got == digest,
        "podman loaded {tag} with digest {got} from the archive, expected {digest}"
    );
    // A registry client reads the same digest (skopeo copies it to a registry with
    // `--preserve-digests`: README, "Mirroring into a private registry").
    let archive = format!("oci-archive:{}", out.join(&names.archive).display());
    let raw = output(Command::new("skopeo").args(["inspect", "--raw", &archive]))?;
    let read = format!("sha256:{}", sha256_hex(raw.as_bytes())?);
    ensure!(
        read == digest,
        "skopeo reads manifest {read}, expected {digest}"
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
    ensure!(
        version.trim() == format!("hairpin-agent {}", crate::release::version()),
        "the loaded image runs {version:?}"
    );
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
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_goes_into_the_image_block_of_values_yaml_and_nothing_else_changes() {
        let values = fs::read_to_string(workspace_root().join("deploy/chart/hairpin/values.yaml"))
            .expect("values.yaml");
        let d = format!("sha256:{}", "0f".repeat(32));
        let with = values_with_digest(&values, &d).expect("edited");
        assert_eq!(with.replace(&format!("\"{d}\""), "\"\""), values);
        assert!(
            values_with_digest(&with, &d).is_err(),
            "no second empty digest"
        );
    }

    #[test]
    fn every_version_in_the_repository_is_the_workspaces() {
        check_versions(version()).expect("one version");
        let e = check_versions("9.9.9").expect_err("a mismatch");
        assert!(e.to_string().contains("expected \"9.9.9\""), "{e}");
    }

    #[test]
    fn a_bom_loses_its_serial_and_time_and_says_it_is_reproducible() {
        let mut bom = serde_json::json!({"bomFormat": "CycloneDX", "specVersion": "1.5",
            "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79",
            "metadata": {"timestamp": "2026-01-01T00:00:00Z", "component": {"name": "x"}}});
        let text = reproducible_bom(&mut bom).expect("bom");
        assert!(
            !text.contains("serialNumber") && !text.contains("timestamp"),
            "{text}"
        );
        assert_eq!(bom["metadata"]["properties"][0]["name"], "cdx:reproducible");
        assert_eq!(bom["metadata"]["component"]["name"], "x");
        assert!(reproducible_bom(&mut serde_json::json!({"bomFormat": "SPDX"})).is_err());
    }

    #[test]
    fn the_archive_depends_on_the_content_alone() {
        let base = std::env::temp_dir().join(format!("hairpin-tar-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        for (dir, when) in [(&a, "@1000"), (&b, "@2000")] {
            fs::create_dir_all(dir.join("blobs")).expect("dir");
            fs::write(dir.join("index.json"), "{}").expect("file");
            fs::write(dir.join("blobs/x"), "x").expect("file");
            run(Command::new("touch")
                .args(["-d", when])
                .arg(dir.join("index.json")))
            .expect("touch");
        }
        deterministic_tar(&a, &base.join("a.tar"), 42).expect("tar");
        deterministic_tar(&b, &base.join("b.tar"), 42).expect("tar");
        let bytes = |p: &str| fs::read(base.join(p)).expect("read");
        assert_eq!(bytes("a.tar"), bytes("b.tar"));
        let _ = fs::remove_dir_all(&base);
    }

    /// The release's own check on a machine where the image was built a moment before
    /// under another tag (`cargo xtask test` builds the dev image): loaded into that
    /// store, the archive only re-tags the image and podman reports the digest of the
    /// manifest it stored at build time; loaded into a store of its own, the archive's.
    /// Real podman, two private stores, a 1-file image: a few seconds.
    #[test]
    fn the_archive_is_checked_in_an_empty_store_not_the_one_that_built_it() {
        if Command::new("podman").arg("--version").output().is_err() {
            assert!(std::env::var_os("CI").is_none(), "podman is missing");
            return;
        }
        let dir = std::env::temp_dir().join(format!("xtask-release-store-{}", std::process::id()));
        let context = dir.join("context");
        fs::create_dir_all(&context).expect("context");
        fs::write(context.join("f"), "hairpin\n").expect("file");
        fs::write(
            context.join("Containerfile"),
            "FROM scratch\nCOPY f /f\nLABEL org.opencontainers.image.title=t\n",
        )
        .expect("Containerfile");
        let built = PrivateStore::new(&dir.join("built")).expect("store");
        for tag in [
            "localhost/hairpin-agent:dev",
            "ghcr.io/hairpin-dev/hairpin-agent:0.0.0",
        ] {
            run(built
                .podman()
                .args(["build", "--quiet", "--pull=never", "--network=none"])
                .args([
                    "--layers=false",
                    "--identity-label=false",
                    "--timestamp",
                    "1700000000",
                ])
                .args(["--runtime", "runc", "--tag", tag])
                .arg(&context))
            .expect("podman build");
        }
        let tag = "ghcr.io/hairpin-dev/hairpin-agent:0.0.0";
        let layout = dir.join("layout");
        run(built
            .podman()
            .args(["save", "--format", "oci-dir", "--output"])
            .arg(&layout)
            .arg(tag))
        .expect("podman save");
        let want = manifest_digest(&layout).expect("digest");
        let archive = dir.join("image.oci.tar");
        deterministic_tar(&layout, &archive, 1_700_000_000).expect("tar");
        // What the check did before: rmi the tag (the dev tag keeps the image), load.
        run(built.podman().args(["rmi", "--force", tag])).expect("rmi");
        let shared = built.loaded_digest(&archive, tag).expect("load");
        assert_ne!(
            shared, want,
            "the store that built the image reports the archive's digest: the cause is gone"
        );
        let fresh = PrivateStore::new(&dir.join("fresh")).expect("store");
        assert_eq!(fresh.loaded_digest(&archive, tag).expect("load"), want);
        drop((built, fresh));
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
