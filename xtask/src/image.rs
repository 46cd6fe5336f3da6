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

use crate::{cargo, ebpf, prereqs, run, target_dir, toolchain::output};

/// The image's name in local container storage.
pub const IMAGE: &str = "localhost/hairpin-agent:dev";

/// The runtime stage, as deploy/Dockerfile's: the binary alone, uid 0, the OCI labels.
/// `{version}` is the agent's crate version.
const CONTAINERFILE: &str = r#"FROM scratch
COPY hairpin-agent /usr/local/bin/hairpin-agent
LABEL org.opencontainers.image.title="hairpin-agent" \
      org.opencontainers.image.description="Makes in-cluster traffic to the cluster's own PROXY-protocol LoadBalancers work (per-node eBPF agent)" \
      org.opencontainers.image.licenses="Apache-2.0 AND (MIT OR GPL-2.0-only)" \
      org.opencontainers.image.version="{version}"
USER 0:0
ENTRYPOINT ["/usr/local/bin/hairpin-agent"]
CMD ["run"]
"#;

/// The target of this machine's architecture, named explicitly so that the static
/// flag applies to the agent and not to build scripts and proc-macros.
fn host_target() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("x86_64-unknown-linux-gnu"),
        "aarch64" => Ok("aarch64-unknown-linux-gnu"),
        other => bail!("no image for architecture {other} (x86_64, aarch64)"),
    }
}

/// The agent, linked statically for this machine's architecture with its BPF object
/// embedded (release); returns the binary. A full release build of its own (about
/// as long as `cargo build --release`): the static flag changes every artifact.
pub fn build_static_agent() -> Result<PathBuf> {
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
        .env(flags_var, "-C target-feature=+crt-static"))?;
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
/// offline; returns the image's name.
pub fn build() -> Result<&'static str> {
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
    let version = env!("CARGO_PKG_VERSION");
    fs::write(
        context.join("Containerfile"),
        CONTAINERFILE.replace("{version}", version),
    )
    .context("failed to write the Containerfile")?;
    run(Command::new("podman")
        .args(["build", "--pull=never", "--network=none", "--layers=false"])
        .args(["--runtime", "runc", "--tag", IMAGE, "--file"])
        .arg(context.join("Containerfile"))
        .arg(&context))
    .context("podman could not build the image")?;
    let size =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", IMAGE]))?;
    eprintln!(
        "xtask: built {IMAGE} ({} bytes): `podman run --rm {IMAGE} --version`",
        size.trim()
    );
    Ok(IMAGE)
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
