//! Finding and, where missing, installing what the build and the tests need.
//!
//! Each step checks before it acts, so a second run costs a few process spawns.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{run, toolchain::BpfToolchain};

/// Debian packages the datapath tests, the demo and the benchmarks use, with the
/// binary that proves each is installed.
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "/usr/sbin/ip"),
    ("iptables", "/usr/sbin/iptables"),
    ("nftables", "/usr/sbin/nft"),
    ("nginx-light", "/usr/sbin/nginx"),
    ("haproxy", "/usr/sbin/haproxy"),
    ("bpftool", "/usr/sbin/bpftool"),
    ("curl", "/usr/bin/curl"),
    ("util-linux", "/usr/bin/nsenter"),
    ("wrk", "/usr/bin/wrk"),
    // `kubectl kustomize` renders deploy/ in the tests; this machine kind ships it.
    ("kubectl", "/usr/bin/kubectl"),
    // The real-client matrix (tests/tests/real_clients.rs): clients in the languages
    // and socket styles workloads use.
    ("wget", "/usr/bin/wget"),
    ("openssl", "/usr/bin/openssl"),
    ("nodejs", "/usr/bin/node"),
    ("openjdk-17-jdk-headless", "/usr/bin/java"),
    // A server that reads PROXY v1 only, for the data-plane matrix
    // (tests/tests/dataplanes.rs).
    ("gunicorn", "/usr/bin/gunicorn"),
    // The public DNS of the ACME self-check suite (tests/tests/acme.rs); the binary
    // alone, no service.
    ("dnsmasq-base", "/usr/sbin/dnsmasq"),
    // promtool checks and unit-tests the monitoring component's alerting rules.
    ("prometheus", "/usr/bin/promtool"),
    // The RustSec snapshot in supply-chain/ is a .tar.xz (cargo xtask deny).
    ("xz-utils", "/usr/bin/xz"),
    // The kubelet's container runtime on the simulated node (tests/src/cluster/
    // kubelet.rs): containerd with its CRI plugin and runc shim, the CNI plugins, and
    // what the local images are made of: the pause binary (C, linked statically) and
    // busybox for the test pods.
    ("containerd", "/usr/bin/containerd"),
    ("runc", "/usr/sbin/runc"),
    ("containernetworking-plugins", "/usr/lib/cni/ptp"),
    ("gcc", "/usr/bin/gcc"),
    ("libc6-dev", "/usr/include/stdio.h"),
    ("busybox-static", "/bin/busybox"),
];

/// Installs the Debian packages that are missing (`apt-get`, as root).
pub(crate) fn ensure_system_packages() -> Result<()> {
    ensure_packages(PACKAGES)
}

/// Installs those of `packages` (name, a file proving it is installed) that are
/// missing; as another user, fails naming them.
pub(crate) fn ensure_packages(packages: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, bin)| !Path::new(bin).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !crate::root::is_root() {
        bail!(
            "missing packages {}: run `sudo apt-get install -y {}` or run this command as root",
            missing.join(", "),
            missing.join(" ")
        );
    }
    apt_install(&missing)
}

/// Debian packages `cargo xtask image` and the image test use: podman with buildah
/// underneath and runc (crun fails on hybrid cgroup hosts), `file` to check that the
/// agent is static, and `strip` to drop its debug info from the image.
const IMAGE_PACKAGES: &[(&str, &str)] = &[
    ("podman", "/usr/bin/podman"),
    ("buildah", "/usr/bin/buildah"),
    ("runc", "/usr/sbin/runc"),
    ("file", "/usr/bin/file"),
    ("binutils", "/usr/bin/strip"),
];

/// What `cargo xtask release` adds: skopeo reads the archive back as a registry
/// client would (the README's mirroring recipe uses it).
const RELEASE_PACKAGES: &[(&str, &str)] = &[("skopeo", "/usr/bin/skopeo")];

/// Installs the release's packages (and the image's) when missing.
pub(crate) fn ensure_release_packages() -> Result<()> {
    ensure_packages(IMAGE_PACKAGES)?;
    ensure_packages(RELEASE_PACKAGES)
}

/// Installs the image's Debian packages that are missing (as root).
pub(crate) fn ensure_image_packages() -> Result<()> {
    ensure_packages(IMAGE_PACKAGES)
}

/// What the arm64 half of the release needs on an x86_64 machine: Debian's aarch64
/// cross toolchain (the linker and the C compiler for ring, and binutils' strip) with
/// the target's static glibc (`libc.a`, for `+crt-static`), and qemu-user to run the
/// arm64 agent's unit tests and its `--version` from the archive.
pub(crate) const CROSS_ARM64_PACKAGES: &[(&str, &str)] = &[
    ("gcc-aarch64-linux-gnu", "/usr/bin/aarch64-linux-gnu-gcc"),
    (
        "binutils-aarch64-linux-gnu",
        "/usr/bin/aarch64-linux-gnu-strip",
    ),
    ("libc6-dev-arm64-cross", "/usr/aarch64-linux-gnu/lib/libc.a"),
    ("qemu-user", "/usr/bin/qemu-aarch64"),
];

/// The Debian cross packages and the rustup target for building `target` on this
/// machine, when missing; nothing for this machine's own target.
pub(crate) fn ensure_cross_target(target: &str, packages: &[(&str, &str)]) -> Result<()> {
    ensure_packages(packages)?;
    let installed = crate::toolchain::output(
        Command::new("rustup")
            .current_dir(crate::workspace_root())
            .args(["target", "list", "--installed"]),
    )
    .context("rustup could not list the installed targets")?;
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    eprintln!("xtask: adding the {target} target to the toolchain");
    run(Command::new("rustup")
        .current_dir(crate::workspace_root())
        .args(["target", "add", target]))
    .with_context(|| format!("could not add {target}: run `rustup target add {target}`"))
}

/// `apt-get install` of `packages` (as root), after an `apt-get update`; disables
/// again the system services some packages start.
pub(crate) fn apt_install(packages: &[&str]) -> Result<()> {
    eprintln!("xtask: installing {}", packages.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    // The nginx, haproxy, prometheus and containerd packages start system services;
    // the tests run their own instances in namespaces (promtool needs no server) and
    // need nothing listening on the host.
    for svc in ["nginx", "haproxy", "prometheus", "containerd"] {
        let _ = Command::new("systemctl")
            .args(["disable", "--now", svc])
            .output();
    }
    Ok(())
}

/// Adds rustfmt and clippy to the toolchain that runs the workspace's cargo when it
/// lacks them (rustup's minimal profile has neither): `cargo xtask test` runs both.
pub(crate) fn ensure_lint_tools() -> Result<()> {
    let works = |sub: &str| {
        crate::cargo()
            .args([sub, "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let missing: Vec<&str> = [("fmt", "rustfmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(sub, _)| !works(sub))
        .map(|(_, component)| component)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: adding {} to the toolchain", missing.join(" and "));
    run(Command::new("rustup")
        .current_dir(crate::workspace_root())
        .args(["component", "add"])
        .args(&missing))
    .with_context(|| {
        format!(
            "could not add {}: run `rustup component add {}`",
            missing.join(", "),
            missing.join(" ")
        )
    })
}

/// Version of bpf-linker known to work with aya 0.14 and LLVM 21-23.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Returns the directory holding a `bpf-linker` linked against the toolchain's own
/// libLLVM, building it there first when it is missing.
///
/// bpf-linker must use the LLVM major of the rustc that emits the bitcode; the
/// distribution's LLVM is older, so we point llvm-sys at the toolchain's shared
/// libLLVM through a prefix of two symlinks.
pub(crate) fn ensure_bpf_linker(tc: &BpfToolchain) -> Result<PathBuf> {
    let lib_dir = tc.sysroot.join("lib");
    let libllvm = fs::read_dir(&lib_dir)
        .with_context(|| format!("failed to read {}", lib_dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        .with_context(|| {
            format!(
                "the {} toolchain has no shared libLLVM in {}: bpf-linker cannot be linked against it",
                tc.name,
                lib_dir.display()
            )
        })?;
    // libLLVM.so.22.1-rust-1.97.0-nightly -> 22
    let major: u32 = libllvm
        .trim_start_matches("libLLVM.so.")
        .split(['.', '-'])
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("cannot read the LLVM major version from {libllvm}"))?;

    // Keyed by the toolchain too: the linker loads libLLVM through symlinks into
    // that toolchain's sysroot, and one soname (`...-rust-1.97.0-nightly`) spans
    // many nightlies.
    let toolchain_dir = tc
        .sysroot
        .file_name()
        .map_or_else(|| tc.name.clone(), |n| n.to_string_lossy().into_owned());
    let cache = cache_dir().join(format!(
        "bpf-linker-{BPF_LINKER_VERSION}-{toolchain_dir}-{libllvm}"
    ));
    let bin_dir = cache.join("bin");
    let linker = bin_dir.join("bpf-linker");
    if linker.exists()
        && Command::new(&linker)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Ok(bin_dir);
    }

    let prefix = cache.join("llvm-prefix");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("failed to create {}", prefix_lib.display()))?;
    let target = lib_dir.join(&libllvm);
    for name in ["libLLVM.so", libllvm.as_str()] {
        let link = prefix_lib.join(name);
        let _ = fs::remove_file(&link);
        symlink(&target, &link).with_context(|| {
            format!("failed to link {} -> {}", link.display(), target.display())
        })?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {libllvm} (about a minute, once)"
    );
    run(Command::new("cargo")
        .args(["install", "--locked", "--force"])
        .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{major}"))
        .arg("--root")
        .arg(&cache)
        .env("LLVM_PREFIX", &prefix)
        .env_remove("RUSTC_BOOTSTRAP"))
    .with_context(|| {
        format!(
            "could not build bpf-linker against the toolchain's LLVM {major}; \
             bpf-linker {BPF_LINKER_VERSION} may not offer feature llvm-{major}"
        )
    })?;
    Ok(bin_dir)
}

/// The cargo subcommand `name` at `version`, from `cargo install --locked` into the
/// cache (`<cache>/<name>-<version>/bin/<name>`), installed there once (`takes`
/// says how long, while it does). A binary there counts when `--version` exits 0
/// and `is_it` holds for that output.
pub(crate) fn ensure_cargo_tool(
    name: &str,
    version: &str,
    takes: &str,
    is_it: impl Fn(&std::process::Output) -> bool,
) -> Result<PathBuf> {
    ensure_cargo_tool_probed(name, version, takes, &["--version"], is_it)
}

/// [`ensure_cargo_tool`] for a tool whose version answers to `probe` (a cargo
/// subcommand binary wants its subcommand first: `cargo-x x --version`).
pub(crate) fn ensure_cargo_tool_probed(
    name: &str,
    version: &str,
    takes: &str,
    probe: &[&str],
    is_it: impl Fn(&std::process::Output) -> bool,
) -> Result<PathBuf> {
    let root = cache_dir().join(format!("{name}-{version}"));
    let bin = root.join("bin").join(name);
    let works = |bin: &Path| {
        Command::new(bin)
            .args(probe)
            .output()
            .is_ok_and(|o| o.status.success() && is_it(&o))
    };
    if works(&bin) {
        return Ok(bin);
    }
    eprintln!(
        "xtask: installing {name} {version} into {} ({takes}, once)",
        root.display()
    );
    run(Command::new("cargo")
        .args(["install", "--locked", "--force"])
        .arg(format!("{name}@{version}"))
        .arg("--root")
        .arg(&root)
        .env_remove("RUSTC_BOOTSTRAP"))
    .with_context(|| {
        format!("could not install {name} {version}: `cargo install --locked {name}@{version}`")
    })?;
    if !works(&bin) {
        bail!(
            "cargo install put no working {name} {version} at {}",
            bin.display()
        );
    }
    Ok(bin)
}

pub(crate) use crate::cache::cache_dir;
