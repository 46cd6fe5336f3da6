//! `cargo xtask fuzz`: runs every cargo-fuzz target in `fuzz/` for a bounded time,
//! installing the pinned nightly and cargo-fuzz when missing, and fails on any crash.
//!
//! Each target starts from its committed seeds (`fuzz/seeds/<target>`) and the
//! corpus earlier runs grew (`fuzz/corpus/<target>`, not committed); libFuzzer's
//! output goes to `fuzz/logs/<target>.log`, and a crashing input to
//! `fuzz/artifacts/<target>/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{
    prereqs, run,
    toolchain::{self, NIGHTLY},
    workspace_root,
};

/// The cargo-fuzz release installed into the cache when missing.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// Seconds each target runs (libFuzzer's -max_total_time).
    #[arg(long, default_value_t = 30)]
    time: u64,
    /// Only these targets (default: every target in fuzz/Cargo.toml).
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Sanitizer to build with. The code under test is safe Rust, so `none` (the
    /// default) trades nothing for about twice the executions; debug assertions
    /// and overflow checks stay on either way.
    #[arg(long, default_value = "none", value_parser = ["none", "address"])]
    sanitizer: String,
}

impl Options {
    /// What `cargo xtask test` runs: every target for 10 s, no sanitizer.
    pub(crate) fn smoke() -> Options {
        Options {
            time: 10,
            targets: Vec::new(),
            sanitizer: "none".into(),
        }
    }
}

/// What one target's run showed.
struct Outcome {
    target: String,
    seconds: u64,
    executions: Option<u64>,
    per_second: Option<u64>,
    coverage: Option<u64>,
    features: Option<u64>,
    corpus: Option<u64>,
    crash: Option<String>,
    log: PathBuf,
}

/// Fails unless fuzz/Cargo.lock needs no change: the fuzz workspace depends on the
/// agent by path, so a dependency added to the agent must be committed there too.
/// Cheap (no build), so `cargo xtask test` runs it up front beside cargo-deny
/// rather than learning it after the suites.
pub(crate) fn check_lock() -> Result<()> {
    toolchain::ensure_nightly(&[])?;
    run(Command::new("cargo")
        .current_dir(workspace_root().join("fuzz"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .stdout(Stdio::null())
        .env("RUSTUP_TOOLCHAIN", NIGHTLY)
        .env_remove("CARGO")
        .env_remove("RUSTC"))
    .context(
        "fuzz/Cargo.lock is out of date: run `cargo update --workspace` in fuzz/ and commit it",
    )
}

/// Runs the targets and prints one line per target; fails if any crashed.
pub(crate) fn fuzz(opts: &Options) -> Result<()> {
    toolchain::ensure_nightly(&[])?;
    let cargo_fuzz = ensure_cargo_fuzz()?;
    let root = workspace_root();
    let fuzz_dir = root.join("fuzz");
    let all = list_targets(&cargo_fuzz, &root)?;
    let targets: Vec<String> = if opts.targets.is_empty() {
        all
    } else {
        for t in &opts.targets {
            if !all.contains(t) {
                bail!("no fuzz target {t:?}: expected one of {}", all.join(", "));
            }
        }
        opts.targets.clone()
    };
    eprintln!(
        "xtask: building {} fuzz targets ({NIGHTLY}, sanitizer {})",
        targets.len(),
        opts.sanitizer
    );
    // cargo-fuzz's build has no --locked: check first that fuzz/Cargo.lock needs no
    // change, so the build below resolves exactly what is committed.
    check_lock()?;
    run(fuzz_cmd(&cargo_fuzz, &root).args(["build", "--sanitizer", &opts.sanitizer]))?;

    let logs = fuzz_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("failed to create {}", logs.display()))?;
    let bin_dir = binary_dir(&root)?;
    let mut outcomes = Vec::new();
    for target in &targets {
        eprintln!("xtask: fuzzing {target} for {} s", opts.time);
        outcomes.push(run_target(&root, &bin_dir, target, opts, &logs)?);
    }

    println!(
        "{:<18} {:>6} {:>12} {:>8} {:>6} {:>7} {:>7}  result",
        "target", "secs", "executions", "exec/s", "cov", "ft", "corpus"
    );
    let show = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    for o in &outcomes {
        println!(
            "{:<18} {:>6} {:>12} {:>8} {:>6} {:>7} {:>7}  {}",
            o.target,
            o.seconds,
            show(o.executions),
            show(o.per_second),
            show(o.coverage),
            show(o.features),
            show(o.corpus),
            o.crash.as_deref().unwrap_or("ok"),
        );
    }
    let crashed: Vec<&Outcome> = outcomes.iter().filter(|o| o.crash.is_some()).collect();
    if !crashed.is_empty() {
        for o in &crashed {
            eprintln!(
                "xtask: {} failed: {} (log: {}); reproduce with `cargo +{NIGHTLY} fuzz run --sanitizer {} {} <artifact>`",
                o.target,
                o.crash.as_deref().unwrap_or_default(),
                o.log.display(),
                opts.sanitizer,
                o.target,
            );
        }
        bail!(
            "{} of {} fuzz targets failed",
            crashed.len(),
            outcomes.len()
        );
    }
    Ok(())
}

fn run_target(
    root: &Path,
    bin_dir: &Path,
    target: &str,
    opts: &Options,
    logs: &Path,
) -> Result<Outcome> {
    let corpus = root.join("fuzz/corpus").join(target);
    let artifacts = root.join("fuzz/artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    }
    let seeds = root.join("fuzz/seeds").join(target);
    let log_path = logs.join(format!("{target}.log"));
    let log = fs::File::create(&log_path)
        .with_context(|| format!("failed to create {}", log_path.display()))?;
    // The binary `cargo fuzz build` made, run directly: `cargo fuzz run` would
    // rebuild hairpin-agent first (its build script watches an optional file).
    let mut cmd = Command::new(bin_dir.join(target));
    cmd.arg(&corpus);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    let mut prefix = artifacts.into_os_string();
    prefix.push("/");
    cmd.arg(format!("-max_total_time={}", opts.time))
        // An input that takes seconds is a bug here (every parser is linear).
        .arg("-timeout=10")
        .arg("-print_final_stats=1")
        .arg({
            let mut arg = std::ffi::OsString::from("-artifact_prefix=");
            arg.push(&prefix);
            arg
        })
        .current_dir(root)
        .stdout(Stdio::null())
        .stderr(log);
    let started = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    let seconds = started.elapsed().as_secs();
    let text = fs::read(&log_path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .with_context(|| format!("failed to read {}", log_path.display()))?;
    let mut outcome = parse_log(target, &text);
    outcome.seconds = seconds;
    outcome.log = log_path;
    if !status.success() && outcome.crash.is_none() {
        outcome.crash = Some(format!("exited with {status}"));
    }
    Ok(outcome)
}

/// Where `cargo fuzz build` puts the target binaries: `<target dir>/<host>/release`.
fn binary_dir(root: &Path) -> Result<PathBuf> {
    let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("fuzz/target"),
    };
    let version = Command::new("rustc")
        .arg(format!("+{NIGHTLY}"))
        .arg("-vV")
        .output()
        .with_context(|| format!("failed to run rustc +{NIGHTLY} -vV"))?;
    let host = String::from_utf8_lossy(&version.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .with_context(|| format!("rustc +{NIGHTLY} -vV printed no host triple"))?;
    Ok(target_dir.join(host).join("release"))
}

/// Reads libFuzzer's final stats and its last status line
/// (`#N DONE cov: C ft: F corp: K/...`), and a crash's artifact path.
fn parse_log(target: &str, text: &str) -> Outcome {
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
    };
    let status_line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains(" cov: "));
    let field = |name: &str| {
        status_line.and_then(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == name)?;
            words.next()?.split('/').next()?.parse().ok()
        })
    };
    let crash = text
        .lines()
        .find(|l| l.contains("Test unit written to"))
        .map(|l| {
            let why = text
                .lines()
                .find(|l| l.contains("==ERROR: libFuzzer") || l.contains("panicked at"))
                .unwrap_or("crash");
            format!("{} -> {}", why.trim(), l.rsplit(' ').next().unwrap_or(l))
        });
    Outcome {
        target: target.to_string(),
        seconds: 0,
        executions: stat("number_of_executed_units"),
        per_second: stat("average_exec_per_sec"),
        coverage: field("cov:"),
        features: field("ft:"),
        corpus: field("corp:"),
        crash,
        log: PathBuf::new(),
    }
}

fn fuzz_cmd(cargo_fuzz: &Path, root: &Path) -> Command {
    let mut cmd = Command::new(cargo_fuzz);
    // `cargo-fuzz fuzz ...` is how cargo itself invokes the subcommand.
    // Through rustup's cargo proxy on the pinned nightly: the stable cargo that runs xtask
    // exports CARGO (and may export RUSTC), which cargo-fuzz would otherwise follow.
    cmd.arg("fuzz")
        .current_dir(root)
        .env("RUSTUP_TOOLCHAIN", NIGHTLY)
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTC_BOOTSTRAP");
    cmd
}

fn list_targets(cargo_fuzz: &Path, root: &Path) -> Result<Vec<String>> {
    let out = fuzz_cmd(cargo_fuzz, root)
        .arg("list")
        .output()
        .context("failed to run cargo fuzz list")?;
    if !out.status.success() {
        bail!(
            "cargo fuzz list failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// Returns the cargo-fuzz binary in the cache, installing it there once.
fn ensure_cargo_fuzz() -> Result<PathBuf> {
    prereqs::ensure_cargo_tool("cargo-fuzz", CARGO_FUZZ_VERSION, "a minute or two", |_| {
        true
    })
}
