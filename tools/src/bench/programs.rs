//! The kernel path's programs' own run time under load: the kernel's BPF run-time
//! statistics (BPF_ENABLE_STATS) of the programs the agent holds, read before and
//! after one wrk run per target, per program.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use hairpin_agent::datapath::enable_run_time_stats;

use super::{
    Ctx,
    traffic::{Target, wrk_once},
};

/// One program's runs during the wrk runs of one target.
#[derive(Clone, Debug, Default)]
pub struct ProgramRuns {
    /// The target's row label.
    pub target: &'static str,
    /// The program's kernel name (cut to 15 bytes by the kernel).
    pub program: String,
    /// Mean ns per run, one per round.
    pub ns_per_run: Vec<f64>,
    /// Runs per request wrk completed (one new connection each), one per round.
    pub runs_per_request: Vec<f64>,
    /// Instructions the verifier processed loading it (`verified_insns`, Linux 5.16
    /// or newer): a count of its work over every path the verifier walked, which no
    /// neighbour's load moves; `None` where the kernel does not say.
    pub verified_insns: Option<u32>,
}

/// One program's counters: run time (ns), runs, and the verifier's processed
/// instructions (summed over the programs of that name).
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    ns: u64,
    runs: u64,
    verified: Option<u32>,
}

/// Every program of the agent together, per request, during the wrk runs of one
/// target: the sum over programs of ns per run × runs per request.
#[derive(Clone, Debug, Default)]
pub struct ProgramsTotal {
    /// The target's row label.
    pub target: &'static str,
    /// ns of program run time per request (one new connection each), per round.
    pub ns_per_request: Vec<f64>,
}

/// `(run_time_ns, run_count)` summed per kernel name over the programs whose
/// descriptors process `pid` holds (its `prog_id:` fdinfo lines): the agent's own,
/// not those of another agent or tool loaded under the same names.
fn snapshot(pid: i32) -> Result<BTreeMap<String, Counters>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue; // closed between listing and reading
        };
        ids.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    let mut by_name = BTreeMap::new();
    for p in aya::programs::loaded_programs().filter_map(Result::ok) {
        if !ids.contains(&p.id()) {
            continue;
        }
        let name = p.name_as_str().unwrap_or("?").to_string();
        let e: &mut Counters = by_name.entry(name).or_default();
        e.ns += u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
        e.runs += p.run_count();
        // Programs of one name are one program loaded per family or per variant:
        // the largest count stands for them.
        e.verified = e.verified.max(p.verified_instruction_count());
    }
    Ok(by_name)
}

/// For each of `targets`, `runs` wrk runs with run-time statistics on; per program
/// that ran, its ns per run and runs per request, and all of them per request.
/// Statistics cost each program run two clock reads, so these runs are apart from
/// the timed rounds.
pub fn measure(
    ctx: &Ctx<'_>,
    agent_pid: i32,
    targets: &[Target],
) -> Result<(Vec<ProgramRuns>, Vec<ProgramsTotal>)> {
    let mut out: Vec<ProgramRuns> = Vec::new();
    let mut totals: Vec<ProgramsTotal> = targets
        .iter()
        .map(|t| ProgramsTotal {
            target: t.name,
            ..ProgramsTotal::default()
        })
        .collect();
    for _ in 0..ctx.opts.stats_runs {
        for t in targets {
            let stats = enable_run_time_stats()
                .context("BPF_ENABLE_STATS (run-time statistics need CAP_SYS_ADMIN)")?;
            let before = snapshot(agent_pid)?;
            let (res, _) = wrk_once(ctx, t, ctx.opts.wrk_secs, None)?;
            let after = snapshot(agent_pid)?;
            drop(stats);
            ensure!(res.requests > 0, "{}: wrk completed no request", t.name);
            let mut total_ns = 0u64;
            for (name, c) in &after {
                let (ns, n) = (&c.ns, &c.runs);
                let b = before.get(name).copied().unwrap_or_default();
                let (ns0, n0) = (b.ns, b.runs);
                let runs = n.saturating_sub(n0);
                if runs == 0 {
                    continue; // loaded, not attached, or not on this path
                }
                total_ns += ns.saturating_sub(ns0);
                let per_run = ns.saturating_sub(ns0) as f64 / runs as f64;
                let per_req = runs as f64 / res.requests as f64;
                eprintln!(
                    "  program run time: {:<32} {name:<16} {per_run:>6.0} ns/run {per_req:>5.2} runs/request",
                    t.name
                );
                let slot = match out
                    .iter_mut()
                    .position(|p| p.target == t.name && &p.program == name)
                {
                    Some(i) => &mut out[i],
                    None => {
                        out.push(ProgramRuns {
                            target: t.name,
                            program: name.clone(),
                            ..ProgramRuns::default()
                        });
                        out.last_mut().expect("just pushed")
                    }
                };
                slot.verified_insns = c.verified;
                slot.ns_per_run.push(per_run);
                slot.runs_per_request.push(per_req);
            }
            let per_request = total_ns as f64 / res.requests as f64;
            eprintln!(
                "  program run time: {:<32} all programs {per_request:>6.0} ns/request",
                t.name
            );
            if let Some(total) = totals.iter_mut().find(|x| x.target == t.name) {
                total.ns_per_request.push(per_request);
            }
        }
    }
    ensure!(
        !out.is_empty(),
        "no program of the agent ran during the statistics runs"
    );
    Ok((out, totals))
}
