//! The release's image: one OCI image index over the agent's image for each
//! architecture, written as a reproducible OCI archive.
//!
//! Each platform's image is built into local container storage under its own tag
//! (`<tag>-amd64`, `<tag>-arm64`), `podman manifest create`/`add` makes the list under
//! the release's tag, and `podman manifest push --all --format oci` writes it into an
//! OCI layout whose index.json names one entry: the image index, whose digest is the
//! release's image digest (what a registry, containerd and Kubernetes resolve to the
//! node's platform).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

use crate::{
    image::{self, Arch},
    run,
    source::Source,
    target_dir,
    toolchain::output,
};

/// The OCI media type of an image index.
pub(crate) const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// The image of a release: the index and the manifest of each platform in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Index {
    /// The index's digest: the image's digest.
    pub(crate) digest: String,
    /// (OCI architecture, manifest digest), in the index's order.
    pub(crate) platforms: Vec<(String, String)>,
}

/// The tag of one platform's image in local storage.
pub(crate) fn platform_tag(tag: &str, arch: Arch) -> String {
    format!("{tag}-{}", arch.oci())
}

/// Builds the image for each of `archs` and the index over them twice with `podman`
/// (the release's own store; the digests must agree) and writes the index as a
/// reproducible OCI archive to `archive`; returns the index.
pub(crate) fn image_archive(
    podman: &dyn Fn() -> Command,
    tag: &str,
    source: &Source,
    archs: &[Arch],
    archive: &Path,
) -> Result<Index> {
    let layout = target_dir().join("dist").join("oci-layout");
    let mut rounds = Vec::new();
    for _ in 0..2 {
        let mut images = Vec::new();
        for &arch in archs {
            let build = image::Build {
                tag: platform_tag(tag, arch),
                version: super::version().to_string(),
                revision: source.revision.clone(),
                epoch: source.epoch,
            };
            image::build_with(podman, &build, arch)?;
            images.push(build.tag);
        }
        rounds.push(write_index(podman, tag, &images, &layout)?);
    }
    ensure!(
        rounds[0] == rounds[1],
        "the image is not reproducible: two builds gave {:?} and {:?}",
        rounds[0],
        rounds[1]
    );
    deterministic_tar(&layout, archive, source.epoch)?;
    Ok(rounds.remove(0))
}

/// Makes the manifest list `list` of `images` (local tags, one per platform) with
/// `podman` and pushes it with every image into a fresh OCI layout at `layout`;
/// returns the index it wrote.
pub(crate) fn write_index(
    podman: &dyn Fn() -> Command,
    list: &str,
    images: &[String],
    layout: &Path,
) -> Result<Index> {
    // A list (or an image) of that name from an earlier run would be added to.
    let _ = podman().args(["manifest", "rm", list]).output();
    let _ = podman().args(["rmi", "--ignore", list]).output();
    output(podman().args(["manifest", "create", list]))
        .with_context(|| format!("podman could not create the manifest list {list}"))?;
    for image in images {
        output(
            podman()
                .args(["manifest", "add", list])
                .arg(format!("containers-storage:{image}")),
        )
        .with_context(|| format!("podman could not add {image} to {list}"))?;
    }
    if layout.exists() {
        fs::remove_dir_all(layout)
            .with_context(|| format!("failed to clear {}", layout.display()))?;
    }
    output(
        podman()
            .args(["manifest", "push", "--all", "--quiet", "--format", "oci"])
            .arg(list)
            .arg(format!("oci:{}:{list}", layout.display())),
    )
    .context("podman could not write the image index as an OCI layout")?;
    read_index(layout)
}

/// The image index an OCI layout's index.json names (its only entry), and the
/// platforms it lists.
pub(crate) fn read_index(layout: &Path) -> Result<Index> {
    let digest = manifest_digest(layout)?;
    let blob = blob_path(layout, &digest);
    let index: serde_json::Value = serde_json::from_slice(
        &fs::read(&blob).with_context(|| format!("failed to read {}", blob.display()))?,
    )
    .context("the image index is not JSON")?;
    ensure!(
        index["mediaType"] == INDEX_MEDIA_TYPE,
        "{digest}: media type {}, expected {INDEX_MEDIA_TYPE}",
        index["mediaType"]
    );
    let platforms = index["manifests"]
        .as_array()
        .context("the image index lists no manifests")?
        .iter()
        .map(|m| {
            Ok((
                m["platform"]["architecture"]
                    .as_str()
                    .context("an index entry without platform.architecture")?
                    .to_string(),
                m["digest"]
                    .as_str()
                    .context("an index entry without a digest")?
                    .to_string(),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Index { digest, platforms })
}

/// The file of blob `digest` in an OCI layout.
fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs")
        .join("sha256")
        .join(digest.trim_start_matches("sha256:"))
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
