//! What the connect programs cost every connect() in the attached cgroup: the same
//! loop of connects from the pod with no agent, with the agent running but the loop
//! in a cgroup outside the attached subtree, and with the loop under the programs;
//! then the programs' own run time per call from the kernel's BPF run-time statistics.

use std::process::Stdio;

use anyhow::{Context, Result};

use super::{
    Ctx,
    probes::ConnectMode,
    setup::{LB_PLAIN, LB_V1, in_cgroup},
    stats::Spread,
};
use hairpin_agent::datapath::{enable_run_time_stats, hairpin_program_run_stats};
use hairpin_tests::agent::Agent;

/// One kind of destination.
#[derive(Clone, Debug)]
pub struct ConnectCase {
    /// Row label.
    pub name: &'static str,
    /// How the loop dials.
    pub mode: ConnectMode,
    /// Where.
    pub addr: String,
    /// Whether hairpin redirects this destination when attached.
    pub proxied: bool,
}

/// The destinations measured.
pub fn cases() -> Vec<ConnectCase> {
    vec![
        ConnectCase {
            name: "not proxied: 127.0.0.1 closed port (blocking, RST)",
            mode: ConnectMode::Refused,
            addr: "127.0.0.1:1".into(),
            proxied: false,
        },
        ConnectCase {
            name: "not proxied: unproxied LB IP (nonblocking)",
            mode: ConnectMode::Nonblocking,
            addr: format!("{LB_PLAIN}:80"),
            proxied: false,
        },
        ConnectCase {
            name: "proxied: LB IP, rewritten to the relay (nonblocking)",
            mode: ConnectMode::Nonblocking,
            addr: format!("{LB_V1}:80"),
            proxied: true,
        },
    ]
}

/// ns per connect for one case, one sample per round on each side.
#[derive(Clone, Debug)]
pub struct ConnectResult {
    /// The case.
    pub case: ConnectCase,
    /// No agent: nothing attached (the kernel skips the connect hooks altogether).
    pub detached: Vec<f64>,
    /// Agent running with its programs attached, the loop in a cgroup outside the
    /// attached subtree: what every connect pays before any program is reached. One
    /// sample per pair.
    pub outside: Vec<f64>,
    /// Agent running, the loop in the pod cgroup under the programs; one per pair.
    pub attached: Vec<f64>,
    /// attached − outside for each back-to-back pair (one process, milliseconds apart).
    pub paired_added: Vec<f64>,
    /// The connect programs' own mean run time per run (ns), from the kernel's
    /// run-time statistics during a separate attached run.
    pub program_ns: Vec<f64>,
    /// Program runs per connect() in those runs (1.0 when the hook ran once per call).
    pub runs_per_connect: Vec<f64>,
}

impl ConnectResult {
    /// What the programs add per connect: the paired differences (attached minus
    /// outside, both with the agent running), median and range, ns.
    pub fn added(&self) -> Option<Spread> {
        Spread::of(&self.paired_added)
    }

    /// Median attached minus median with no agent at all, ns.
    pub fn added_vs_detached_ns(&self) -> Option<f64> {
        Some(Spread::of(&self.attached)?.median - Spread::of(&self.detached)?.median)
    }
}

/// Runs this bench binary's hidden subcommand `sub` with `args` from `cgroup` in the
/// pod's namespace, on the client CPU; its stdout.
fn run_child(ctx: &Ctx<'_>, cgroup: &std::path::Path, sub: &str, args: &[&str]) -> Result<String> {
    super::unless_interrupted()?;
    let exe = std::env::current_exe()?;
    let mut argv = vec![exe.to_str().context("utf-8 exe path")?, sub];
    argv.extend_from_slice(args);
    let out = in_cgroup(ctx.node, cgroup, ctx.client_cpu, &argv)
        .stderr(Stdio::piped())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{sub} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn measure(ctx: &Ctx<'_>, case: &ConnectCase, cgroup: &std::path::Path) -> Result<f64> {
    let n = ctx.opts.connects.to_string();
    let text = run_child(
        ctx,
        cgroup,
        "connect-loop",
        &[case.mode.arg(), &case.addr, &n],
    )?;
    text.trim()
        .parse()
        .with_context(|| format!("connect-loop printed {text:?}"))
}

/// Back-to-back pairs per round in which the same child process times `connects / 4`
/// calls from the outside cgroup and from the pod cgroup.
pub const PAIRS: u32 = 10;

/// One round of [`PAIRS`] (outside, attached) samples, ns per connect.
fn measure_pairs(ctx: &Ctx<'_>, case: &ConnectCase) -> Result<Vec<(f64, f64)>> {
    let n = (ctx.opts.connects / 4).max(1).to_string();
    let outside = ctx.node.outside_cgroup();
    let pod = ctx.node.pod_cgroup();
    let text = run_child(
        ctx,
        &pod,
        "connect-pairs",
        &[
            case.mode.arg(),
            &case.addr,
            &n,
            &PAIRS.to_string(),
            outside.to_str().context("utf-8 cgroup path")?,
            pod.to_str().context("utf-8 cgroup path")?,
        ],
    )?;
    let pairs: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(' ')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    anyhow::ensure!(
        pairs.len() == PAIRS as usize,
        "connect-pairs printed {text:?}"
    );
    Ok(pairs)
}

/// One attached run with BPF run-time statistics on: mean ns per program run and
/// program runs per connect(), summed over hairpin's programs (only connect4 runs
/// for these IPv4 loops).
fn measure_program(ctx: &Ctx<'_>, case: &ConnectCase) -> Result<(f64, f64)> {
    let stats_on = enable_run_time_stats()
        .context("BPF_ENABLE_STATS (run-time statistics need CAP_SYS_ADMIN)")?;
    let before = hairpin_program_run_stats();
    measure(ctx, case, &ctx.node.pod_cgroup())?;
    let after = hairpin_program_run_stats();
    drop(stats_on);
    let (mut ns, mut runs) = (0u64, 0u64);
    for (id, a) in &after {
        if let Some((_, b)) = before.iter().find(|(bid, _)| bid == id) {
            ns += a.run_time_ns.saturating_sub(b.run_time_ns);
            runs += a.run_count.saturating_sub(b.run_count);
        }
    }
    anyhow::ensure!(
        runs > 0,
        "{}: the connect programs did not run during an attached loop",
        case.name
    );
    Ok((
        ns as f64 / runs as f64,
        runs as f64 / f64::from(ctx.opts.connects),
    ))
}

/// Alternates rounds so drift affects every side alike: no agent, then one agent
/// for the outside, attached and statistics runs. `start_agent` attaches the
/// programs; dropping the agent detaches them.
pub fn overhead(ctx: &Ctx<'_>, start_agent: &dyn Fn() -> Agent) -> Result<Vec<ConnectResult>> {
    let mut results: Vec<ConnectResult> = cases()
        .into_iter()
        .map(|case| ConnectResult {
            case,
            detached: Vec::new(),
            outside: Vec::new(),
            attached: Vec::new(),
            paired_added: Vec::new(),
            program_ns: Vec::new(),
            runs_per_connect: Vec::new(),
        })
        .collect();
    let pod = ctx.node.pod_cgroup();
    for round in 0..ctx.opts.stats_runs.max(3) {
        for r in &mut results {
            r.detached.push(measure(ctx, &r.case, &pod)?);
        }
        let agent = start_agent();
        for r in &mut results {
            for (o, a) in measure_pairs(ctx, &r.case)? {
                r.outside.push(o);
                r.attached.push(a);
                r.paired_added.push(a - o);
            }
            let (ns, per) = measure_program(ctx, &r.case)?;
            r.program_ns.push(ns);
            r.runs_per_connect.push(per);
        }
        drop(agent);
        for r in &results {
            let last = |v: &[f64]| v.last().copied().unwrap_or(0.0);
            eprintln!(
                "  connect round {round}: {:<52} detached {:>7.0} outside {:>7.0} attached {:>7.0} ns (last pair), paired added median {:>+6.0} ns; program {:>5.0} ns/run, {:.2} runs/connect",
                r.case.name,
                last(&r.detached),
                last(&r.outside),
                last(&r.attached),
                Spread::of(&r.paired_added).map_or(0.0, |s| s.median),
                last(&r.program_ns),
                last(&r.runs_per_connect),
            );
        }
    }
    Ok(results)
}
