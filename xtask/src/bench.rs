//! `cargo xtask bench`: builds the agent in release with its BPF object embedded,
//! then runs `hairpin-bench`, which measures hairpin beside HAProxy `send-proxy` on a
//! simulated node and writes BENCHMARKS.md at the workspace root.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{build_agent, cargo, prereqs, run, target_dir, workspace_root};

/// Options of `bench`; each size overrides the preset (`--quick` or the full run).
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// Smoke run: every case, small sizes, under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Rounds per measurement (the reported spread is over these).
    #[arg(long)]
    pub runs: Option<u32>,
    /// Seconds per wrk run.
    #[arg(long)]
    pub wrk_secs: Option<u32>,
    /// wrk connections (one thread), the same for every target.
    #[arg(long)]
    pub wrk_connections: Option<u32>,
    /// MiB per bulk transfer.
    #[arg(long)]
    pub bulk_mib: Option<u64>,
    /// connect() calls per connect-overhead run.
    #[arg(long)]
    pub connects: Option<u32>,
    /// Frontends-file changes timed for convergence.
    #[arg(long)]
    pub changes: Option<u32>,
    /// Frontend counts for the footprint case, comma-separated (e.g. 1000,10000).
    #[arg(long)]
    pub sizes: Option<String>,
    /// Hostnames for the name-routing footprint case (0 skips it).
    #[arg(long)]
    pub hostnames: Option<u64>,
    /// `perf record` into this directory: the agent during the relay's first PROXY v1
    /// rate round and first bulk and upload transfers; the whole machine during the
    /// kernel-path run's first direct and kernel-path v1 rate rounds. Those rounds'
    /// figures then include perf's own cost.
    #[arg(long)]
    pub profile: Option<std::path::PathBuf>,
    /// The relay run's agent's `--relay-splice` (default `pipe`; `off`: the relay copies every byte).
    #[arg(long)]
    pub relay_splice: Option<String>,
    /// The A/A check alone (about 2 minutes): the kernel path's PROXY v1 target on
    /// both sides of a comparison, its rate and machine CPU per request as A/B ratios
    /// with their bootstrap intervals, printed (BENCHMARKS.md is left as it is).
    #[arg(long, env = "HAIRPIN_BENCH_AA", conflicts_with_all = ["quick", "baseline"])]
    pub aa: bool,
    /// Print the report only; leave BENCHMARKS.md as it is.
    #[arg(long)]
    pub no_write: bool,
    /// A git revision (e.g. `main`) whose agent is built too (release, its own BPF
    /// object, from a worktree under target/baseline) and measured against this
    /// tree's: the kernel path's rate rounds and program statistics, the two agents
    /// alternating round by round in the same run.
    #[arg(long, value_name = "REV")]
    pub baseline: Option<String>,
    /// With `--baseline`: extra flags for the baseline's agent, whitespace-separated
    /// (`--baseline HEAD --baseline-args='--mesh-capture-ports none'` measures one
    /// flag's cost with two agents of this tree).
    #[arg(
        long,
        env = "HAIRPIN_BENCH_BASELINE_ARGS",
        requires = "baseline",
        allow_hyphen_values = true
    )]
    pub baseline_args: Option<String>,
    /// With `--baseline`: run that comparison only (and the sanity checks it needs).
    #[arg(long, requires = "baseline")]
    pub baseline_only: bool,
}

/// Builds, then runs the bench binary as this process (root is checked there).
pub(crate) fn bench(opts: &Options) -> Result<()> {
    prereqs::ensure_system_packages()?;
    // The baseline first: its build uplifts its own binaries into the shared target
    // dir, which this tree's build then puts back.
    let baseline = match &opts.baseline {
        Some(rev) => Some((rev, build_baseline(rev)?)),
        None => None,
    };
    let agent = build_agent(true)?;
    let bin = target_dir().join("release").join("hairpin-bench");
    if !bin.exists() {
        bail!("the release build did not produce {}", bin.display());
    }
    // The exact command line, for the report: `cargo xtask bench ...`.
    let command = format!(
        "cargo xtask {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let mut cmd = Command::new(bin);
    cmd.env("HAIRPIN_AGENT_BIN", &agent)
        .current_dir(workspace_root())
        .args(["--command", &command]);
    if opts.quick {
        cmd.arg("--quick");
    }
    if opts.aa {
        cmd.arg("--aa");
    }
    let numeric = [
        ("--runs", opts.runs.map(u64::from)),
        ("--wrk-secs", opts.wrk_secs.map(u64::from)),
        ("--wrk-connections", opts.wrk_connections.map(u64::from)),
        ("--bulk-mib", opts.bulk_mib),
        ("--connects", opts.connects.map(u64::from)),
        ("--changes", opts.changes.map(u64::from)),
        ("--hostnames", opts.hostnames),
    ];
    for (flag, v) in numeric {
        if let Some(v) = v {
            cmd.args([flag, &v.to_string()]);
        }
    }
    if let Some(s) = &opts.sizes {
        cmd.args(["--sizes", s]);
    }
    if let Some(mode) = &opts.relay_splice {
        cmd.args(["--relay-splice", mode]);
    }
    if let Some((rev, bin)) = &baseline {
        cmd.args(["--baseline-rev", rev.as_str()])
            .arg("--baseline-agent")
            .arg(bin);
        if opts.baseline_only {
            cmd.args(["--baseline-only", "yes"]);
        }
        if let Some(extra) = &opts.baseline_args {
            cmd.args(["--baseline-args", extra]);
        }
    }
    if let Some(dir) = &opts.profile {
        cmd.arg("--profile").arg(dir);
    }
    if !opts.no_write && !opts.aa {
        cmd.arg("--out").arg(workspace_root().join("BENCHMARKS.md"));
    }
    run(&mut cmd)
}

/// The agent of git revision `rev`, built in release with its own BPF object, and
/// kept as target/baseline/hairpin-agent-<commit> (built once per commit). The
/// source is one detached worktree, target/baseline/src, moved to each commit; its
/// BPF object is built by its own `cargo xtask build-ebpf` (into its own target/bpf),
/// and everything else in target/baseline/target, kept between runs and first
/// seeded with a copy of this tree's release dependencies: a target dir shared with
/// this tree's builds would have the two builds overwrite each other's artifacts
/// (a workspace crate's artifacts are named the same in both trees).
fn build_baseline(rev: &str) -> Result<PathBuf> {
    let root = workspace_root();
    let git = |args: &[&str]| -> Result<String> {
        let out = crate::toolchain::output(Command::new("git").current_dir(&root).args(args))?;
        Ok(out.trim().to_string())
    };
    let commit = git(&["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .with_context(|| format!("--baseline {rev}: not a commit of this repository"))?;
    let dir = target_dir().join("baseline");
    let bin = dir.join(format!("hairpin-agent-{commit}"));
    if bin.exists() {
        eprintln!(
            "baseline {rev} ({commit}): {} (built before)",
            bin.display()
        );
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let src = dir.join("src");
    let src_str = src.to_str().context("the target dir's path is not UTF-8")?;
    if src.join(".git").exists() {
        run(Command::new("git")
            .current_dir(&src)
            .args(["checkout", "--quiet", "--force", "--detach", &commit]))?;
    } else {
        git(&["worktree", "prune"])?;
        git(&["worktree", "add", "--force", "--detach", src_str, &commit])?;
    }
    let targets = dir.join("target");
    if !targets.exists() && target_dir().join("release").exists() {
        eprintln!(
            "baseline {rev}: seeding {} with this tree's release dependencies",
            targets.display()
        );
        std::fs::create_dir_all(&targets)?;
        run(Command::new("cp")
            .arg("-a")
            .arg(target_dir().join("release"))
            .arg(&targets))?;
        // Cargo checks a workspace crate's fingerprint against its sources by their
        // path inside the package, so the copies of this tree's own crates would pass
        // for fresh in the baseline's worktree: only the dependencies may stay.
        run(cargo()
            .current_dir(&src)
            .args(["clean", "--release"])
            .args(["--package", "hairpin-agent", "--package", "hairpin-ebpf"])
            .args(["--package", "hairpin-tests", "--package", "hairpin-tools"])
            .env("CARGO_TARGET_DIR", &targets))?;
    }
    eprintln!("baseline {rev} ({commit}): building its BPF object and agent");
    run(cargo()
        .current_dir(&src)
        .args(["xtask", "build-ebpf"])
        .env("CARGO_TARGET_DIR", &targets))?;
    let object = src.join("target/bpf/bpfel-unknown-none/release/hairpin-ebpf");
    run(cargo()
        .current_dir(&src)
        // The same packages as this tree's build: the same features for every
        // dependency, so the seeded ones are reused.
        .args(["build", "--locked", "--release", "--bins"])
        .args(["--package", "hairpin-agent", "--package", "hairpin-tests"])
        .args(["--package", "hairpin-tools"])
        .env("CARGO_TARGET_DIR", &targets)
        .env("HAIRPIN_EBPF_OBJECT", &object))?;
    std::fs::copy(targets.join("release/hairpin-agent"), &bin)
        .with_context(|| format!("copy the baseline agent to {}", bin.display()))?;
    Ok(bin)
}
