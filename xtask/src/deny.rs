//! `cargo xtask deny`: the supply-chain gate, cargo-deny against `deny.toml`.
//!
//! `bans`, `licenses` and `sources` read only Cargo.lock and the registry cache, so
//! they run offline and always gate. `advisories` needs the RustSec advisory
//! database, a git repository cargo-deny fetches: when it can be fetched the check
//! gates too; when it cannot (no route to it, as on the project's build machines),
//! the run says plainly that advisories were not checked, and passes.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{prereqs, run, workspace_root};

/// The cargo-deny release installed into the cache (rust-version 1.88).
const CARGO_DENY_VERSION: &str = "0.20.2";

/// How long fetching the advisory database may take before it counts as unreachable.
const ADVISORY_FETCH_TIMEOUT: Duration = Duration::from_secs(90);

/// Returns cargo-deny, installing the pinned release into the cache first when missing
/// (`cargo install --locked`, a few minutes once).
pub fn ensure_cargo_deny() -> Result<PathBuf> {
    prereqs::ensure_cargo_tool("cargo-deny", CARGO_DENY_VERSION, "a few minutes", |o| {
        String::from_utf8_lossy(&o.stdout).contains(CARGO_DENY_VERSION)
    })
}

/// cargo-deny on every workspace member with deny.toml, Cargo.lock unchanged.
fn deny(bin: &Path) -> Command {
    let root = workspace_root();
    let mut cmd = Command::new(bin);
    cmd.current_dir(&root)
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--config")
        .arg(root.join("deny.toml"))
        .args(["--workspace", "--locked"]);
    cmd
}

/// Runs the gate: bans, licenses and sources offline (failing on any finding), then
/// advisories when the database can be fetched, saying so either way.
pub fn check() -> Result<()> {
    let bin = ensure_cargo_deny()?;
    eprintln!("xtask: cargo-deny: bans, licenses, sources (deny.toml)");
    run(deny(&bin).args(["--offline", "check", "bans", "licenses", "sources"]))
        .context("cargo-deny refused the dependency graph (deny.toml): see its report above")?;
    match fetch_advisory_db(&bin)? {
        Fetched::Yes => {
            eprintln!("xtask: cargo-deny: advisories (the RustSec database, just fetched)");
            run(deny(&bin).args(["--offline", "check", "advisories"]))
                .context("cargo-deny found advisories against Cargo.lock: see its report above")
        }
        Fetched::No(why) => {
            eprintln!(
                "xtask: cargo-deny: ADVISORIES NOT CHECKED: the RustSec advisory database could not be \
                 fetched ({why}); bans, licenses and sources passed"
            );
            Ok(())
        }
    }
}

/// Whether the advisory database was fetched.
enum Fetched {
    Yes,
    No(String),
}

/// `cargo-deny fetch db`, given [`ADVISORY_FETCH_TIMEOUT`]: a network that drops
/// packets would otherwise hang the run.
fn fetch_advisory_db(bin: &Path) -> Result<Fetched> {
    let mut child = deny(bin)
        .args(["fetch", "db"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start cargo-deny fetch")?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("waiting for cargo-deny fetch")? {
            if status.success() {
                return Ok(Fetched::Yes);
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message");
            return Ok(Fetched::No(format!(
                "cargo-deny fetch: {status}: {}",
                last.trim()
            )));
        }
        if start.elapsed() > ADVISORY_FETCH_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Fetched::No(format!(
                "no answer within {} s",
                ADVISORY_FETCH_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
