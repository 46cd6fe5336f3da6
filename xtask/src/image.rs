//! `cargo xtask image`: the runtime image, built offline into local container storage
//! as [`IMAGE`].
//!
//! The agent is linked statically (glibc with `+crt-static`: glibc 2.34+ has its DNS
//! and files resolvers built in, and its allocator keeps the relay's figures, which
//! musl's would not) and copied onto an empty base: no shell, no package manager, no
//! shared library, only `/usr/local/bin/hairpin-agent`,
//! run as uid 0 as the DaemonSet says (deploy/base/daemonset.yaml explains why). No
//! registry is needed: `FROM scratch` pulls nothing. deploy/Dockerfile builds the same
//! layout for users, multi-arch, from bases pinned by digest.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    cargo, ebpf, prereqs, run,
    source::Source,
    target_dir,
    toolchain::{self, output},
};

/// The image's name in local container storage.
pub(crate) const IMAGE: &str = "localhost/hairpin-agent:dev";

/// The runtime stage, as deploy/Dockerfile's: the binary alone, uid 0, the OCI labels
/// (the annotation keys of the OCI image spec). `{version}` is the agent's crate
/// version, `{revision}` the commit, `{created}` the commit's time (RFC 3339).
const CONTAINERFILE: &str = r#"FROM scratch
COPY hairpin-agent /usr/local/bin/hairpin-agent
LABEL org.opencontainers.image.title="hairpin-agent" \
      org.opencontainers.image.description="Makes in-cluster traffic to the cluster's own PROXY-protocol LoadBalancers work (per-node eBPF agent)" \
      org.opencontainers.image.licenses="Apache-2.0 AND (MIT OR GPL-2.0-only)" \
      org.opencontainers.image.vendor="hairpin" \
      org.opencontainers.image.url="https://github.com/hairpin-dev/hairpin" \
      org.opencontainers.image.source="https://github.com/hairpin-dev/hairpin" \
      org.opencontainers.image.documentation="https://github.com/hairpin-dev/hairpin#readme" \
      org.opencontainers.image.version="{version}" \
      org.opencontainers.image.revision="{revision}" \
      org.opencontainers.image.created="{created}"
USER 0:0
ENTRYPOINT ["/usr/local/bin/hairpin-agent"]
CMD ["run"]
"#;

/// One image build: its name, and the commit it comes from (its id and time, which
/// is every timestamp in the image, so the same commit gives the same digest).
#[derive(Clone, Debug)]
pub(crate) struct Build {
    /// The name in local container storage.
    pub tag: String,
    /// The commit id (the `revision` label).
    pub revision: String,
    /// The commit's time, seconds since the epoch.
    pub epoch: u64,
}

/// `epoch` as RFC 3339 in UTC (`date -u`), for the `created` label.
fn rfc3339(epoch: u64) -> Result<String> {
    Ok(output(
        Command::new("date")
            .args(["-u", "-d"])
            .arg(format!("@{epoch}"))
            .arg("+%Y-%m-%dT%H:%M:%SZ"),
    )?
    .trim()
    .to_string())
}

/// The Containerfile for `build`.
fn containerfile(build: &Build) -> Result<String> {
    Ok(CONTAINERFILE
        .replace("{version}", env!("CARGO_PKG_VERSION"))
        .replace("{revision}", &build.revision)
        .replace("{created}", &rfc3339(build.epoch)?))
}

/// The target of this machine's architecture, named explicitly so that the static
/// flag applies to the agent and not to build scripts and proc-macros.
pub(crate) fn host_target() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("x86_64-unknown-linux-gnu"),
        "aarch64" => Ok("aarch64-unknown-linux-gnu"),
        other => bail!("no image for architecture {other} (x86_64, aarch64)"),
    }
}

/// The agent, linked statically for this machine's architecture with its BPF object
/// embedded (release); returns the binary. A full release build of its own (about
/// as long as `cargo build --release`): the static flag changes every artifact.
pub(crate) fn build_static_agent() -> Result<PathBuf> {
    prereqs::ensure_image_packages()?;
    let target = host_target()?;
    let object = ebpf::build(&ebpf::Options::default())?;
    let flags_var = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        target.to_uppercase().replace('-', "_")
    );
    run(cargo()
        .args([
            "build",
            "--locked",
            "--release",
            "--package",
            "hairpin-agent",
        ])
        .args(["--bin", "hairpin-agent", "--target", target])
        .env("HAIRPIN_EBPF_OBJECT", &object)
        .env(
            flags_var,
            format!("-C target-feature=+crt-static {}", toolchain::remap_flags()),
        ))?;
    let bin = target_dir()
        .join(target)
        .join("release")
        .join("hairpin-agent");
    if !bin.exists() {
        bail!(
            "cargo built hairpin-agent but {} does not exist",
            bin.display()
        );
    }
    let file = output(Command::new("file").arg("-b").arg(&bin))?;
    if !file.contains("statically linked") && !file.contains("static-pie linked") {
        bail!("{} is not static: {}", bin.display(), file.trim());
    }
    Ok(bin)
}

/// Builds [`IMAGE`] into local container storage with podman (buildah underneath),
/// offline, from the commit checked out; returns the image's name.
pub(crate) fn build() -> Result<&'static str> {
    let source = Source::read()?;
    build_with(&Build {
        tag: IMAGE.to_string(),
        revision: source.revision,
        epoch: source.epoch,
    })?;
    Ok(IMAGE)
}

/// Builds `build.tag` offline and reproducibly: every timestamp in the image (its
/// creation, each file's mtime in the layer) is the commit's, and no build-host
/// label is added.
pub(crate) fn build_with(build: &Build) -> Result<()> {
    let bin = build_static_agent()?;
    let context = target_dir().join("image");
    if context.exists() {
        fs::remove_dir_all(&context)
            .with_context(|| format!("failed to clear {}", context.display()))?;
    }
    fs::create_dir_all(&context)
        .with_context(|| format!("failed to create {}", context.display()))?;
    fs::copy(&bin, context.join("hairpin-agent"))
        .with_context(|| format!("failed to copy {}", bin.display()))?;
    // The release profile keeps line tables (debug = 1) for the benchmarks' profiles:
    // 148 MB of the binary's 178. The image drops them; symbols stay for backtraces.
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg(context.join("hairpin-agent")))?;
    fs::write(context.join("Containerfile"), containerfile(build)?)
        .context("failed to write the Containerfile")?;
    let tag = &build.tag;
    run(Command::new("podman")
        .args(["build", "--pull=never", "--network=none", "--layers=false"])
        .args(["--identity-label=false", "--timestamp"])
        .arg(build.epoch.to_string())
        .args(["--runtime", "runc", "--tag", tag, "--file"])
        .arg(context.join("Containerfile"))
        .arg(&context))
    .context("podman could not build the image")?;
    let size =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", tag]))?;
    eprintln!(
        "xtask: built {tag} ({} bytes): `podman run --rm {tag} --version`",
        size.trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::CONTAINERFILE;

    #[test]
    fn the_local_image_and_the_dockerfiles_runtime_stage_agree() {
        let dockerfile = std::fs::read_to_string(crate::workspace_root().join("deploy/Dockerfile"))
            .expect("read deploy/Dockerfile");
        let runtime = &dockerfile[dockerfile.find("AS runtime").expect("a runtime stage")..];
        for line in CONTAINERFILE.lines().skip(1).filter(|l| {
            l.starts_with("USER") || l.starts_with("ENTRYPOINT") || l.starts_with("CMD")
        }) {
            assert!(
                runtime.contains(line),
                "deploy/Dockerfile's runtime stage lacks {line:?}"
            );
        }
        assert!(dockerfile.contains("FROM scratch AS runtime"));
        assert!(runtime.contains("/usr/local/bin/hairpin-agent"));
    }
}
