//! `cargo xtask bench`: builds the agent in release with its BPF object embedded,
//! then runs `hairpin-bench`, which measures hairpin beside HAProxy `send-proxy` on a
//! simulated node and writes BENCHMARKS.md at the workspace root.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{build_agent, prereqs, run, target_dir, workspace_root};

/// Options of `bench`; each size overrides the preset (`--quick` or the full run).
#[derive(clap::Args, Debug)]
pub struct Options {
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
    /// The relay run's agent's `--relay-splice` (`off`: the relay copies every byte).
    #[arg(long)]
    pub relay_splice: Option<String>,
    /// Print the report only; leave BENCHMARKS.md as it is.
    #[arg(long)]
    pub no_write: bool,
}

/// Builds, then runs the bench binary as this process (root is checked there).
pub fn bench(opts: &Options) -> Result<()> {
    prereqs::ensure_system_packages()?;
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
    if let Some(dir) = &opts.profile {
        cmd.arg("--profile").arg(dir);
    }
    if !opts.no_write {
        cmd.arg("--out").arg(workspace_root().join("BENCHMARKS.md"));
    }
    run(&mut cmd)
}
