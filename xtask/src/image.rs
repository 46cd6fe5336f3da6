//! `cargo xtask image`: the runtime image, built offline into local container storage
//! as [`IMAGE`].
//!
//! The agent is linked statically (glibc with `+crt-static`: glibc 2.34+ has its DNS
//! and files resolvers built in, and its allocator keeps the relay's figures, which
//! musl's would not) and copied onto an empty base: no shell, no package manager, no
//! shared library, only `/usr/local/bin/hairpin-agent`,
//! run as uid 0 as the DaemonSet says (deploy/base/daemonset.yaml explains why). No
//! registry is needed: `FROM scratch` pulls nothing. `cargo xtask image` builds this
//! machine's architecture; the release builds every [`Arch`], the foreign one with
//! Debian's cross toolchain. deploy/Dockerfile builds the same layout for users,
//! multi-arch, from bases pinned by digest.

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

/// The image of the next version ([`next_version`]), which the upgrade scenario
/// (tests/tests/real_cluster/daemonset.rs) rolls the DaemonSet to: the same tree
/// built with another version string, as two releases differ.
pub(crate) const NEXT_IMAGE: &str = "localhost/hairpin-agent:next";

/// The variable the agent's binary reads its version from at build time
/// (hairpin-agent/src/main.rs); unset, the crate's version.
pub(crate) const BUILD_VERSION_VAR: &str = "HAIRPIN_BUILD_VERSION";

/// Options of `image`.
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// The version the agent reports (`--version`, `/status`, `hairpin_build_info`)
    /// and the image's version label; default the workspace's.
    #[arg(long, env = BUILD_VERSION_VAR, default_value = env!("CARGO_PKG_VERSION"))]
    pub(crate) agent_version: String,
    /// The image's name in local container storage.
    #[arg(long, env = "HAIRPIN_IMAGE_TAG", default_value = IMAGE)]
    pub(crate) tag: String,
}

/// The workspace's version with its minor part raised and the rest dropped
/// (`0.1.0` -> `0.2.0`): the version of [`NEXT_IMAGE`].
pub(crate) fn next_version(version: &str) -> Result<String> {
    let mut parts = version.split(['.', '-', '+']);
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("version {version:?}: expected MAJOR.MINOR.PATCH");
    };
    let minor: u64 = minor
        .parse()
        .with_context(|| format!("version {version:?}: the minor part is not a number"))?;
    Ok(format!("{major}.{}.0", minor + 1))
}

/// The runtime stage, as deploy/Dockerfile's: the binary alone, uid 0, the OCI labels
/// (the annotation keys of the OCI image spec). `{version}` is the agent's
/// version ([`Build::version`]), `{revision}` the commit, `{created}` the commit's time (RFC 3339).
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

/// One image build: its name, the agent's version, and the commit it comes from
/// (its id and time, which is every timestamp in the image, so the same commit gives
/// the same digest).
#[derive(Clone, Debug)]
pub(crate) struct Build {
    /// The name in local container storage.
    pub(crate) tag: String,
    /// The version the agent reports and the `version` label.
    pub(crate) version: String,
    /// The commit id (the `revision` label).
    pub(crate) revision: String,
    /// The commit's time, seconds since the epoch.
    pub(crate) epoch: u64,
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
        .replace("{version}", &build.version)
        .replace("{revision}", &build.revision)
        .replace("{created}", &rfc3339(build.epoch)?))
}

/// An architecture the image is built for: the agent is compiled for its Rust
/// target (natively, or with Debian's cross toolchain) and put in an image of its
/// OCI platform. The BPF object is the same for both (bpfel bytecode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Arch {
    /// linux/amd64 (x86_64).
    Amd64,
    /// linux/arm64 (aarch64: Graviton, Ampere, Hetzner's Arm nodes).
    Arm64,
}

impl Arch {
    /// Every architecture of a release, in the order of the image index.
    pub(crate) const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// This machine's architecture.
    pub(crate) fn host() -> Result<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Arch::Amd64),
            "aarch64" => Ok(Arch::Arm64),
            other => bail!("no image for architecture {other} (x86_64, aarch64)"),
        }
    }

    /// The OCI name (`GOARCH`): `amd64`, `arm64`.
    pub(crate) fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The OCI platform, as `podman build --platform` takes it.
    pub(crate) fn platform(self) -> String {
        format!("linux/{}", self.oci())
    }

    /// The Rust target, named explicitly so that the static flag applies to the agent
    /// and not to build scripts and proc-macros.
    pub(crate) fn triple(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The GNU triplet of Debian's cross toolchain for it (`<triplet>-gcc`,
    /// `/usr/<triplet>`).
    pub(crate) fn gnu(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// What `file -b` says of an ELF binary for it.
    pub(crate) fn file_says(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86-64",
            Arch::Arm64 => "ARM aarch64",
        }
    }

    /// Debian's qemu-user emulator for its binaries (package qemu-user).
    pub(crate) fn qemu(self) -> String {
        format!("qemu-{}", self.gnu().trim_end_matches("-linux-gnu"))
    }

    /// The cross toolchain's sysroot, qemu-user's `-L` (its dynamic loader and
    /// libraries, for the test binaries' helpers that are not static).
    pub(crate) fn sysroot(self) -> PathBuf {
        PathBuf::from("/usr").join(self.gnu())
    }

    /// Whether building for it here needs the cross toolchain.
    pub(crate) fn is_cross(self) -> Result<bool> {
        Ok(self != Arch::host()?)
    }

    /// `strip` for its binaries: the host's binutils know only the host's format.
    fn strip(self) -> Result<String> {
        Ok(if self.is_cross()? {
            format!("{}-strip", self.gnu())
        } else {
            "strip".to_string()
        })
    }

    /// The cross toolchain's packages and the rustup target, when missing (nothing
    /// for this machine's own architecture).
    pub(crate) fn ensure_toolchain(self) -> Result<()> {
        if !self.is_cross()? {
            return Ok(());
        }
        let packages = match self {
            Arch::Arm64 => prereqs::CROSS_ARM64_PACKAGES,
            Arch::Amd64 => {
                bail!("no cross toolchain for amd64 on this machine (build it on x86_64)")
            }
        };
        prereqs::ensure_cross_target(self.triple(), packages)
    }

    /// The environment of a cargo build or test of the agent for it: static
    /// (`+crt-static`, set per target so build scripts and proc-macros stay
    /// dynamic), without this machine's paths, and for a cross build the cross
    /// linker and C compiler (ring).
    pub(crate) fn cargo_env(self) -> Result<Vec<(String, String)>> {
        let var = self.triple().to_uppercase().replace('-', "_");
        let mut env = vec![(
            format!("CARGO_TARGET_{var}_RUSTFLAGS"),
            format!("-C target-feature=+crt-static {}", toolchain::remap_flags()),
        )];
        if self.is_cross()? {
            let gcc = format!("{}-gcc", self.gnu());
            env.push((format!("CARGO_TARGET_{var}_LINKER"), gcc.clone()));
            env.push((format!("CC_{}", self.triple().replace('-', "_")), gcc));
        }
        Ok(env)
    }
}

/// The agent, linked statically for `arch` with its BPF object embedded (release),
/// reporting `version`; returns the binary. A full release build of its own per
/// architecture (about as long as `cargo build --release`): the static flag changes
/// every artifact. Another `version` recompiles the binary's crate alone (its
/// main.rs reads it), so the release and the next image share the rest.
pub(crate) fn build_static_agent(arch: Arch, version: &str) -> Result<PathBuf> {
    prereqs::ensure_image_packages()?;
    arch.ensure_toolchain()?;
    let target = arch.triple();
    let object = ebpf::build(&ebpf::Options::default())?;
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
        .env(BUILD_VERSION_VAR, version)
        .envs(arch.cargo_env()?))?;
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
    if !file.contains(arch.file_says()) {
        bail!(
            "{} is not for {}: {}",
            bin.display(),
            arch.oci(),
            file.trim()
        );
    }
    Ok(bin)
}

/// Builds `opts.tag` with the agent reporting `opts.agent_version` into local
/// container storage with podman (buildah underneath), offline, from the commit
/// checked out, for this machine's architecture.
pub(crate) fn build(opts: &Options) -> Result<()> {
    let source = Source::read()?;
    build_with(
        &|| Command::new("podman"),
        &Build {
            tag: opts.tag.clone(),
            version: opts.agent_version.clone(),
            revision: source.revision,
            epoch: source.epoch,
        },
        Arch::host()?,
    )
}

/// [`IMAGE`], the workspace's version.
pub(crate) fn build_dev() -> Result<()> {
    build(&Options {
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        tag: IMAGE.to_string(),
    })
}

/// [`NEXT_IMAGE`]: the agent reporting [`next_version`].
pub(crate) fn build_next() -> Result<()> {
    build(&Options {
        agent_version: next_version(env!("CARGO_PKG_VERSION"))?,
        tag: NEXT_IMAGE.to_string(),
    })
}

/// Builds `build.tag` for `arch` with `podman` (local storage, or a store of the
/// release's own) offline and reproducibly: every timestamp in the image (its
/// creation, each file's mtime in the layer) is the commit's, and no build-host
/// label is added. `FROM scratch` with no `RUN` needs no emulation for a foreign
/// platform: podman only records it in the image's config.
pub(crate) fn build_with(podman: &dyn Fn() -> Command, build: &Build, arch: Arch) -> Result<()> {
    let bin = build_static_agent(arch, &build.version)?;
    let context = target_dir().join("image").join(arch.oci());
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
    run(Command::new(arch.strip()?)
        .arg("--strip-debug")
        .arg(context.join("hairpin-agent")))?;
    fs::write(context.join("Containerfile"), containerfile(build)?)
        .context("failed to write the Containerfile")?;
    let tag = &build.tag;
    // The image the tag names now: left without a name by this build, it is removed
    // after it, so that rebuilding `:dev` does not pile up unnamed images.
    let replaced = image_id(podman, tag);
    run(podman()
        .args(["build", "--pull=never", "--network=none", "--layers=false"])
        .args(["--identity-label=false", "--timestamp"])
        .arg(build.epoch.to_string())
        .args(["--platform", &arch.platform()])
        .args(["--runtime", "runc", "--tag", tag, "--file"])
        .arg(context.join("Containerfile"))
        .arg(&context))
    .context("podman could not build the image")?;
    let size = output(podman().args(["image", "inspect", "--format", "{{.Size}}", tag]))?;
    eprintln!(
        "xtask: built {tag} for {} ({} bytes), the agent reporting {}",
        arch.platform(),
        size.trim(),
        build.version
    );
    if let Some(old) = replaced.filter(|old| image_id(podman, tag).as_ref() != Some(old)) {
        // Only when nothing names it any more: podman refuses to remove an image
        // another tag or a container still uses, and that refusal is fine.
        let names = output(podman().args(["image", "inspect", "--format", "{{.RepoTags}}", &old]))
            .unwrap_or_default();
        if names.trim() == "[]" {
            let _ = podman().args(["rmi", &old]).output();
        }
    }
    Ok(())
}

/// The ID of the image `tag` names in podman's storage, if any.
fn image_id(podman: &dyn Fn() -> Command, tag: &str) -> Option<String> {
    output(podman().args(["image", "inspect", "--format", "{{.Id}}", tag]))
        .ok()
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::{CONTAINERFILE, next_version};

    #[test]
    fn the_next_version_raises_the_minor_part() {
        assert_eq!(next_version("0.1.0").expect("next"), "0.2.0");
        assert_eq!(next_version("1.9.3-rc.1").expect("next"), "1.10.0");
        assert!(next_version("1").is_err());
        assert!(next_version("1.x.0").is_err());
    }

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
