//! `cargo xtask release`: one versioned set, built offline and reproducibly from the
//! commit checked out, into `target/dist/hairpin-<version>/`:
//!
//! - `hairpin-agent-<version>.oci.tar`: the image for linux/amd64 and linux/arm64 (the
//!   static agent on an empty base, OCI labels) as one OCI image index in an OCI
//!   archive, which `podman load`, `skopeo copy --all oci-archive:` and `ctr images
//!   import` take; the index's digest is the image's digest;
//! - `hairpin-<version>.tgz`: the chart, packaged by Helm, with that digest in its
//!   values (`image.digest`), so every pod runs exactly this image (its node's
//!   platform of it);
//! - `hairpin-agent-<version>-{amd64,arm64}.cdx.json`, `hairpin-ebpf-<version>.cdx.json`:
//!   CycloneDX SBOMs of the agent for each architecture and of the programs it embeds,
//!   from Cargo.lock, by cargo-cyclonedx (pinned, installed into the cache);
//! - `release.json` (version, commit, digests) and `SHA256SUMS` over all of them.
//!
//! Two architectures from one machine: the agent for the other one is cross-built with
//! Debian's cross toolchain (statically, as the native one), the BPF object is shared
//! (bpfel bytecode), and the foreign agent's unit tests run under qemu-user first
//! ([`qemu`]). Reproducible: every timestamp is the commit's (`SOURCE_DATE_EPOCH`),
//! the builds carry no path of this machine (`--remap-path-prefix`), the archives are
//! written with sorted entries, fixed owners and mtimes, and the SBOMs leave out their
//! random serial number and creation time (CycloneDX's `cdx:reproducible`). The images
//! and the index are built twice and the digests must agree; the set is then checked
//! as a user would use it ([`verify`]).
//!
//! Offline: crates are fetched first (`cargo fetch --locked`), so it also works from
//! an empty cargo home; everything after that needs no network (`--network=none`,
//! `CARGO_NET_OFFLINE`).

mod oci;
mod qemu;
mod verify;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

use crate::{
    image::Arch, prereqs, run, source::Source, target_dir, toolchain::output, workspace_root,
};

/// cargo-cyclonedx, the CycloneDX project's SBOM generator for Cargo, pinned.
pub(crate) const CARGO_CYCLONEDX_VERSION: &str = "0.5.9";

/// The image's name in the set (and in the registry the workflow publishes to).
pub(crate) const IMAGE_REPOSITORY: &str = "ghcr.io/hairpin-dev/hairpin-agent";

/// Options of `release`.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct Options {
    /// Where the set goes; default `target/dist/hairpin-<version>`.
    #[arg(long, env = "HAIRPIN_RELEASE_OUT")]
    pub(crate) out: Option<PathBuf>,
    /// The architectures of the set (comma-separated); default every one, amd64 and
    /// arm64. A published set has both; `cargo xtask test` builds this machine's alone,
    /// the agent its image build compiled (the other one's cold cross build alone is
    /// longer than the whole suite's budget).
    #[arg(
        long = "arch",
        env = "HAIRPIN_RELEASE_ARCHS",
        value_delimiter = ',',
        value_enum
    )]
    pub(crate) archs: Vec<Arch>,
}

impl Options {
    /// The architectures asked for, in [`Arch::ALL`]'s order, each once; all of them
    /// when none was named.
    pub(crate) fn archs(&self) -> Vec<Arch> {
        Arch::ALL
            .into_iter()
            .filter(|a| self.archs.is_empty() || self.archs.contains(a))
            .collect()
    }
}

/// The version every artifact carries: the workspace's, which Chart.yaml (version and
/// appVersion) and the kustomizations' image tags must equal.
pub(crate) fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Every file name of the set for `version`.
pub(crate) struct Names {
    /// The image archive.
    pub(crate) archive: String,
    /// The chart package.
    pub(crate) chart: String,
    /// The agent's SBOM for each architecture of the set (its crates differ: some are
    /// for one CPU only), in [`Arch::ALL`]'s order.
    pub(crate) agent_sboms: Vec<String>,
    /// The BPF programs' SBOM.
    pub(crate) ebpf_sbom: String,
}

impl Names {
    /// The names for `version` and the set's `archs`.
    pub(crate) fn of(version: &str, archs: &[Arch]) -> Names {
        Names {
            archive: format!("hairpin-agent-{version}.oci.tar"),
            chart: format!("hairpin-{version}.tgz"),
            agent_sboms: archs
                .iter()
                .map(|a| format!("hairpin-agent-{version}-{}.cdx.json", a.oci()))
                .collect(),
            ebpf_sbom: format!("hairpin-ebpf-{version}.cdx.json"),
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
    let archs = opts.archs();
    let names = Names::of(v, &archs);

    // The foreign agent's own tests first: a failure there costs no image build.
    for &arch in &archs {
        if arch.is_cross()? {
            qemu::unit_tests(arch)?;
        }
    }
    let tag = format!("{IMAGE_REPOSITORY}:{v}");
    // The images are built in an empty store of the set's own, never in this
    // machine's local storage: what an earlier build left there (`cargo xtask image`'s
    // image of the same content, a list of the same name) cannot enter the set.
    let store = verify::PrivateStore::new(&target_dir().join("dist").join("store"))?;
    let index = oci::image_archive(
        &|| store.podman(),
        &tag,
        &source,
        &archs,
        &out.join(&names.archive),
    )?;
    drop(store);
    let digest = &index.digest;
    package_chart(&helm_python, digest, &source, &out)?;
    // The agent for each architecture; the programs for the BPF target, whose
    // dependencies (aya-ebpf, aya-log-ebpf) only that target has.
    for (&arch, name) in archs.iter().zip(&names.agent_sboms) {
        sbom(
            &cyclonedx,
            "hairpin-agent",
            arch.triple(),
            source.epoch,
            &out.join(name),
        )?;
    }
    sbom(
        &cyclonedx,
        "hairpin-ebpf",
        "bpfel-unknown-none",
        source.epoch,
        &out.join(&names.ebpf_sbom),
    )?;
    let platforms: serde_json::Map<String, serde_json::Value> = index
        .platforms
        .iter()
        .map(|(arch, d)| (format!("linux/{arch}"), serde_json::Value::from(d.as_str())))
        .collect();
    let sboms: serde_json::Map<String, serde_json::Value> = archs
        .iter()
        .zip(&names.agent_sboms)
        .map(|(a, n)| (a.platform(), serde_json::Value::from(n.as_str())))
        .collect();
    let manifest = serde_json::json!({
        "version": v,
        "revision": source.revision,
        "source_date_epoch": source.epoch,
        "image": {"name": tag, "digest": digest, "archive": names.archive, "platforms": platforms},
        "chart": {"name": "hairpin", "version": v, "archive": names.chart},
        "sboms": {"agent": sboms, "ebpf": names.ebpf_sbom},
    });
    fs::write(
        out.join("release.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    write_sums(&out)?;
    verify::verify(&out, &names, &tag, &index, &archs, &helm_python)?;
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

/// The CycloneDX SBOM of `package` for `target` ([`sbom_for`]) written to `to`.
fn sbom(cyclonedx: &Path, package: &str, target: &str, epoch: u64, to: &Path) -> Result<()> {
    fs::write(to, sbom_for(cyclonedx, package, target, epoch)? + "\n")
        .with_context(|| format!("failed to write {}", to.display()))
}

/// The CycloneDX SBOM of `package` for `target` from Cargo.lock, offline, made
/// reproducible ([`reproducible_bom`]): the same lock file gives the same bytes
/// wherever it is checked out. Pretty JSON.
fn sbom_for(cyclonedx: &Path, package: &str, target: &str, epoch: u64) -> Result<String> {
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
    .with_context(|| format!("cargo-cyclonedx could not describe {package} for {target}"))?;
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
    reproducible_bom(&mut bom)
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

#[cfg(test)]
mod tests;
