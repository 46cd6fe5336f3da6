//! The pinned nightly: the BPF object and the fuzz targets build with it.
//!
//! Its name lives in one file, `rust-toolchain-bpf` at the repository root, which
//! this module reads at compile time and `deploy/Dockerfile` installs from.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::run;

/// The nightly the BPF object (`-Z build-std=core` for `bpfel-unknown-none`) and the
/// fuzz targets (`-Z sanitizer`, sancov) build with, as rustup names it: the one line
/// of `rust-toolchain-bpf`.
///
/// `nightly-2026-05-20` is rustc 1.97.0-nightly (e50aa6fba 2026-05-19) on LLVM 22, the
/// LLVM major of the stable 1.95 that builds the host crates. The exact aya pins in
/// the root Cargo.toml and bpf-linker's `llvm-<major>` feature move with it; when the
/// file changes, update this paragraph.
pub(crate) const NIGHTLY: &str = include_str!("../../rust-toolchain-bpf").trim_ascii();

/// The toolchain that builds the BPF crate.
#[derive(Debug, Clone)]
pub(crate) struct BpfToolchain {
    /// The rustup name: [`NIGHTLY`], or `stable` when the pin cannot be installed.
    pub name: String,
    /// Stable needs `RUSTC_BOOTSTRAP=1` for `-Z build-std`.
    pub needs_bootstrap: bool,
    /// The toolchain's sysroot.
    pub sysroot: PathBuf,
}

/// The pinned nightly with `rust-src` (to build `core` for the BPF target); where it
/// cannot be installed (no network to the rustup dist server), stable with
/// `RUSTC_BOOTSTRAP=1`, said loudly: same LLVM major today, but not the pinned compiler.
pub(crate) fn bpf_toolchain() -> Result<BpfToolchain> {
    let (name, needs_bootstrap) = match ensure_nightly(&["rust-src"]) {
        Ok(()) => (NIGHTLY, false),
        Err(e) => {
            eprintln!(
                "xtask: warning: {e:#}\nxtask: warning: building the BPF object with stable and \
                 RUSTC_BOOTSTRAP=1 instead of the pinned {NIGHTLY}"
            );
            ensure_components("stable", &["rust-src"])?;
            ("stable", true)
        }
    };
    let sysroot = output(
        Command::new("rustc")
            .arg(format!("+{name}"))
            .args(["--print", "sysroot"]),
    )?;
    Ok(BpfToolchain {
        name: name.to_string(),
        needs_bootstrap,
        sysroot: PathBuf::from(sysroot.trim()),
    })
}

/// Makes sure rustup has [`NIGHTLY`] with `components`, installing what is missing
/// (minimal profile). Fails naming the pin when rustup cannot.
pub(crate) fn ensure_nightly(components: &[&str]) -> Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"])).context(
        "rustup is needed for the pinned nightly toolchain: install it from your distribution or rustup.rs",
    )?;
    // rustup lists a dated toolchain with its host triple: `nightly-2026-05-20-x86_64-...`.
    let installed = list.lines().any(|l| {
        let name = l.split_whitespace().next().unwrap_or_default();
        name == NIGHTLY || name.starts_with(&format!("{NIGHTLY}-"))
    });
    if !installed {
        eprintln!("xtask: installing the pinned toolchain {NIGHTLY} (rust-toolchain-bpf)");
        let mut cmd = Command::new("rustup");
        cmd.args(["toolchain", "install", NIGHTLY, "--profile", "minimal"]);
        for c in components {
            cmd.args(["--component", c]);
        }
        return run(&mut cmd).with_context(|| {
            format!(
                "could not install the pinned toolchain {NIGHTLY} (rust-toolchain-bpf): \
                 run `rustup toolchain install {NIGHTLY} --profile minimal`"
            )
        });
    }
    ensure_components(NIGHTLY, components)
}

/// Adds the `components` `toolchain` lacks.
fn ensure_components(toolchain: &str, components: &[&str]) -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        toolchain,
    ]))?;
    for c in components {
        if installed.lines().any(|l| l.starts_with(c)) {
            continue;
        }
        eprintln!("xtask: adding {c} to the {toolchain} toolchain");
        run(Command::new("rustup").args(["component", "add", c, "--toolchain", toolchain]))
            .with_context(|| {
                format!("could not add {c}: run `rustup component add {c} --toolchain {toolchain}`")
            })?;
    }
    Ok(())
}

/// Runs `cmd` and returns its standard output, failing with its standard error.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `--remap-path-prefix` flags that take this machine's paths (the checkout, the
/// cargo home) out of what a build writes into its output, so that the same commit
/// builds the same bytes wherever it is checked out.
pub(crate) fn remap_flags() -> String {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let mut flags = format!(
        "--remap-path-prefix={}=/hairpin",
        crate::workspace_root().display()
    );
    if let Some(home) = home {
        flags.push_str(&format!(" --remap-path-prefix={}=/cargo", home.display()));
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::NIGHTLY;

    #[test]
    fn the_pin_is_a_dated_nightly() {
        let date = NIGHTLY.strip_prefix("nightly-").unwrap_or_else(|| {
            panic!("rust-toolchain-bpf: expected nightly-YYYY-MM-DD, got {NIGHTLY:?}")
        });
        let parts: Vec<&str> = date.split('-').collect();
        assert!(
            parts.len() == 3
                && [4, 2, 2]
                    .iter()
                    .zip(&parts)
                    .all(|(n, p)| p.len() == *n && p.bytes().all(|b| b.is_ascii_digit())),
            "rust-toolchain-bpf: expected nightly-YYYY-MM-DD, got {NIGHTLY:?}"
        );
    }

    #[test]
    fn the_dockerfile_installs_the_pin_from_the_same_file() {
        let dockerfile = std::fs::read_to_string(crate::workspace_root().join("deploy/Dockerfile"))
            .expect("read deploy/Dockerfile");
        assert!(
            dockerfile.contains("COPY rust-toolchain-bpf")
                && dockerfile.contains("rustup toolchain install \"$(cat rust-toolchain-bpf)\""),
            "deploy/Dockerfile must install the toolchain named in rust-toolchain-bpf"
        );
        assert!(
            !dockerfile.contains("toolchain install nightly "),
            "deploy/Dockerfile must not install an unpinned nightly"
        );
    }
}
