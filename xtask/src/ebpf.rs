//! `cargo xtask build-ebpf`: the BPF object the agent embeds.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{prereqs, run, toolchain, workspace_root};

/// Options of `build-ebpf`.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct Options {
    /// Build with debug assertions instead of release (the verifier usually rejects those).
    #[arg(long)]
    pub debug: bool,
}

/// Where the object is built; kept apart from the host target dir so the BPF
/// rustflags never invalidate host artifacts.
fn bpf_target_dir() -> PathBuf {
    workspace_root().join("target").join("bpf")
}

/// Path of the release object `build` produces.
pub(crate) fn object_path() -> PathBuf {
    bpf_target_dir()
        .join("bpfel-unknown-none")
        .join("release")
        .join("hairpin-ebpf")
}

/// The sysroot of toolchain `name` (where its rust-src lives).
fn sysroot(name: &str) -> Result<PathBuf> {
    let out = crate::toolchain::output(
        Command::new("rustup").args(["run", name, "rustc", "--print", "sysroot"]),
    )?;
    Ok(PathBuf::from(out.trim()))
}

/// Ensures the toolchain and bpf-linker, builds the object and returns its path.
pub(crate) fn build(opts: &Options) -> Result<PathBuf> {
    let tc = toolchain::bpf_toolchain()?;
    let linker_dir = prereqs::ensure_bpf_linker(&tc)?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![linker_dir];
    paths.extend(std::env::split_paths(&path));

    let mut cmd = Command::new("rustup");
    cmd.current_dir(workspace_root().join("hairpin-ebpf"))
        .args(["run", &tc.name, "cargo", "build", "--locked"])
        .args(["--package", "hairpin-ebpf", "--bin", "hairpin-ebpf"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(bpf_target_dir())
        .env(
            "PATH",
            std::env::join_paths(paths).context("PATH is not joinable")?,
        )
        // The object's BTF names source files: no path of this machine goes in (the
        // checkout, the cargo home, the toolchain with its rust-src), so the release
        // embeds the same object wherever it is built.
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            format!(
                "-C debuginfo=2 -C link-arg=--btf {} --remap-path-prefix={}=/toolchain",
                crate::toolchain::remap_flags(),
                sysroot(&tc.name)?.display()
            ),
        )
        // Outer cargo's variables would pin the wrong toolchain for the inner build.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO");
    if !opts.debug {
        cmd.arg("--release");
    }
    if tc.needs_bootstrap {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    run(&mut cmd)?;
    let object = if opts.debug {
        bpf_target_dir().join("bpfel-unknown-none/debug/hairpin-ebpf")
    } else {
        object_path()
    };
    anyhow::ensure!(
        object.exists(),
        "the BPF build succeeded but {} is missing",
        object.display()
    );
    Ok(object)
}
