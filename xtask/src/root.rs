//! Root for the commands that need it. `demo`, `test` and `bench` build network
//! namespaces and cgroups, attach BPF programs and install Debian packages: run as
//! another user, they re-run themselves through sudo, keeping that user's Rust
//! toolchains and caches.

use std::{ffi::OsString, os::unix::process::CommandExt, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

/// Set on the re-run process: a sudo that did not make it root fails instead of
/// asking again forever.
const ELEVATED: &str = "HAIRPIN_XTASK_ELEVATED";

/// Variables passed to the root process when set: the toolchain cargo runs with,
/// where it builds, and what the tests and logs read.
const PASSED: &[&str] = &[
    "PATH",
    "RUSTUP_HOME",
    "CARGO_HOME",
    "XDG_CACHE_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO",
    "CARGO_TARGET_DIR",
    "CARGO_INCREMENTAL",
    "CARGO_BUILD_JOBS",
    "CARGO_TERM_COLOR",
    "CI",
    "RUST_LOG",
    // `cargo xtask release`: the reproducible builds' timestamp, when given.
    "SOURCE_DATE_EPOCH",
    "RUST_BACKTRACE",
    "TERM",
];

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { geteuid() == 0 }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// Returns when this process is root. Otherwise replaces it with the same xtask
/// command run as root through sudo (which asks for a password as it is
/// configured to), or fails saying why it cannot.
pub(crate) fn ensure_root(command: &str) -> Result<()> {
    if is_root() {
        return Ok(());
    }
    if std::env::var_os(ELEVATED).is_some() {
        bail!("`cargo xtask {command}` was re-run through sudo but is still not root");
    }
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("sudo").is_file()));
    if !on_path {
        bail!(
            "`cargo xtask {command}` needs root (network namespaces, BPF programs, apt packages) \
             and sudo is not installed: run it from a root shell"
        );
    }
    let exe = std::env::current_exe().context("cannot find the running xtask binary")?;
    eprintln!("xtask: `{command}` needs root (namespaces, BPF, apt): re-running it through sudo");
    // `sudo env NAME=VALUE ... xtask ARGS` rather than `sudo --preserve-env=...`:
    // sudoers' `secure_path` (Debian's default) replaces PATH even when it is asked
    // to keep it, and PATH is how rustup's cargo and the toolchains are found.
    let mut cmd = Command::new("sudo");
    cmd.arg("--").arg("env");
    for (name, value) in passed_env() {
        let mut pair = OsString::from(name);
        pair.push("=");
        pair.push(value);
        cmd.arg(pair);
    }
    cmd.arg(format!("{ELEVATED}=1"))
        .arg(exe)
        .args(std::env::args_os().skip(1));
    // Only returns when sudo could not be started.
    Err(cmd.exec()).context("failed to run sudo")
}

/// The variables of [`PASSED`] that are set, every `HAIRPIN_*` one (the tests read
/// some), and rustup's, cargo's and the cache's homes resolved from this user's
/// HOME when unset: root's own HOME would point rustup at a toolchain directory
/// that does not exist and rebuild bpf-linker into another cache.
fn passed_env() -> Vec<(String, OsString)> {
    let mut out: Vec<(String, OsString)> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            let keep = PASSED.contains(&k.as_str()) || k.starts_with("HAIRPIN_");
            keep.then_some((k, v))
        })
        .collect();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for (name, below_home) in [
        ("RUSTUP_HOME", ".rustup"),
        ("CARGO_HOME", ".cargo"),
        ("XDG_CACHE_HOME", ".cache"),
    ] {
        if out.iter().any(|(k, _)| k == name) {
            continue;
        }
        // The cache is created when first used; the toolchain homes only count if they exist.
        if let Some(dir) = home.as_ref().map(|h| h.join(below_home))
            && (dir.is_dir() || name == "XDG_CACHE_HOME")
        {
            out.push((name.to_string(), dir.into_os_string()));
        }
    }
    out.retain(|(k, _)| k != ELEVATED);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolchain_homes_are_always_passed() {
        let env = passed_env();
        let has = |name: &str| env.iter().any(|(k, _)| k == name);
        assert!(has("PATH"), "PATH is passed: {env:?}");
        if std::env::var_os("HOME").is_some() {
            assert!(has("XDG_CACHE_HOME"), "the cache is passed: {env:?}");
        }
        assert!(!has(ELEVATED), "the marker is set once, by ensure_root");
    }
}
