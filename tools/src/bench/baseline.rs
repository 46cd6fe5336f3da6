//! `--baseline <rev>`: the kernel path with this tree's agent against the agent of
//! another revision, in one sitting. Round by round the two agents take turns (the
//! order alternating), each running one rate round (direct and the kernel path's two
//! targets) and one statistics run of its programs, so drift and the neighbours'
//! load fall on both alike.

use std::fmt::Write;

use anyhow::{Context, Result, ensure};
use hairpin_tests::{
    agent::{agent_bin, set_agent_bin},
    node::SimNode,
    sh::command_in,
};

use super::{
    Ctx,
    cells::cell,
    interval::{SEED, bootstrap_median, paired_ratio},
    programs::{self, ProgramRuns, ProgramsTotal},
    stats::{Spread, ratio},
    traffic::{self, DIRECT, KERNEL_V1, KERNEL_V2, RateRuns},
};

/// What one agent measured over every round.
#[derive(Default)]
pub struct Side {
    /// Rate rounds per target (direct, kernel path v1 and v2).
    pub rate: Vec<RateRuns>,
    /// Each program's run time per kernel-path target.
    pub programs: Vec<ProgramRuns>,
    /// All programs together per connection, per kernel-path target.
    pub totals: Vec<ProgramsTotal>,
}

/// This tree's agent against the baseline's.
#[derive(Default)]
pub struct Comparison {
    /// The revision the baseline was built from, as given.
    pub rev: String,
    /// This tree's agent.
    pub new: Side,
    /// The baseline's agent.
    pub base: Side,
}

/// Appends one round's results to the rounds before it, target by target.
fn merge_rate(all: &mut Vec<RateRuns>, round: Vec<RateRuns>) {
    for r in round {
        match all.iter_mut().find(|x| x.target.name == r.target.name) {
            Some(x) => {
                x.runs.extend(r.runs);
                x.cpu_us_per_request.extend(r.cpu_us_per_request);
                x.machine.extend(r.machine);
            }
            None => all.push(r),
        }
    }
}

fn merge_programs(side: &mut Side, (runs, totals): (Vec<ProgramRuns>, Vec<ProgramsTotal>)) {
    for p in runs {
        match side
            .programs
            .iter_mut()
            .find(|x| x.target == p.target && x.program == p.program)
        {
            Some(x) => {
                x.ns_per_run.extend(p.ns_per_run);
                x.runs_per_request.extend(p.runs_per_request);
            }
            None => side.programs.push(p),
        }
    }
    for t in totals {
        match side.totals.iter_mut().find(|x| x.target == t.target) {
            Some(x) => x.ns_per_request.extend(t.ns_per_request),
            None => side.totals.push(t),
        }
    }
}

/// Tears down the datapath the last agent left pinned in the node's pin directory
/// (every layout's links, programs and maps: its cgroup programs detach), with this
/// tree's `hairpin-agent cleanup` limited to the pins, run in the node's namespace
/// once the agent has exited. Each side then starts from a node with no datapath,
/// whatever pin layout the other side's build uses: an older agent would otherwise
/// wait out a newer layout's heartbeat, and each side would measure the other's
/// programs as well as its own.
pub fn teardown(node: &SimNode) -> Result<()> {
    let dir = node.pin_dir();
    if !dir.exists() {
        return Ok(());
    }
    let bin = agent_bin();
    let argv = [
        bin.to_str().context("the agent's path is not UTF-8")?,
        "cleanup",
        "--scope",
        "node",
        "--bpf-pin-dir",
        dir.to_str()
            .context("the pin directory's path is not UTF-8")?,
        "--names-redirect",
        "off",
        "--listen-link",
        "none",
        "--pin-lock-wait",
        "5s",
    ];
    let out = command_in(&node.node_ns, None, &argv)
        .env_remove("HAIRPIN_HOSTS_FILE")
        .output()
        .context("run hairpin-agent cleanup")?;
    ensure!(
        out.status.success(),
        "hairpin-agent cleanup --bpf-pin-dir {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Runs `ctx.opts.runs` rounds; in each, both agents (this tree's first in even
/// rounds) do one rate round and one statistics run. `haproxy_pid` is only passed
/// through (no HAProxy row runs here).
pub fn compare(ctx: &Ctx<'_>, haproxy_pid: i32) -> Result<Comparison> {
    let Some((base_bin, rev)) = &ctx.opts.baseline else {
        anyhow::bail!("no baseline agent given");
    };
    let targets: Vec<_> = traffic::kernel_targets()
        .into_iter()
        .filter(|t| [DIRECT, KERNEL_V1, KERNEL_V2].contains(&t.name))
        .collect();
    let one = super::options::Options {
        runs: 1,
        stats_runs: 1,
        ..ctx.opts.clone()
    };
    let ctx1 = Ctx { opts: &one, ..*ctx };
    let mut c = Comparison {
        rev: if ctx.opts.baseline_args.is_empty() {
            rev.clone()
        } else {
            format!("{rev} {}", ctx.opts.baseline_args.join(" "))
        },
        ..Comparison::default()
    };
    for round in 0..ctx.opts.runs {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for is_base in order {
            // The datapath of whichever agent ran before (the other side, or the
            // bench's kernel-path run) goes first: the sides never share pins.
            teardown(ctx.node)?;
            set_agent_bin(is_base.then(|| base_bin.clone()));
            let who = if is_base { rev.as_str() } else { "this tree" };
            eprintln!("against {rev}: round {}, {who}", round + 1);
            let extra = if is_base {
                ctx.opts.baseline_args.clone()
            } else {
                Vec::new()
            };
            let started = super::kernel_agent(ctx.node, &extra);
            set_agent_bin(None);
            let agent = started?;
            traffic::sanity(ctx, &targets)?;
            let (rate, _) = traffic::connection_rate(&ctx1, agent.pid(), haproxy_pid, &targets)?;
            // Direct too: its connects are the programs' miss path (sock_ops then runs
            // only the callbacks the kernel makes for every connect, and returns).
            let progs = programs::measure(&ctx1, agent.pid(), &targets)?;
            let side = if is_base { &mut c.base } else { &mut c.new };
            merge_rate(&mut side.rate, rate);
            merge_programs(side, progs);
            drop(agent);
        }
    }
    teardown(ctx.node)?;
    Ok(c)
}

/// One row: the figure for this tree and the baseline, and their ratio: the
/// median of the per-round ratios (both sides ran in every round) with its
/// bootstrap 95% interval.
fn row(out: &mut String, figure: &str, (new, base): (Vec<f64>, Vec<f64>), digits: usize) {
    let q = paired_ratio(&new, &base)
        .or_else(|| bootstrap_median(&[ratio(Spread::of(&new), Spread::of(&base))?], SEED));
    let _ = writeln!(
        out,
        "| {figure} | {} | {} | {} |",
        cell(Spread::of(&new), digits),
        cell(Spread::of(&base), digits),
        q.map_or("—".into(), |q| q.show_ratio()),
    );
}

/// The section: rate, p99 and machine CPU per request of the kernel path (and its
/// rate against direct in each agent's own rounds), then the programs' time.
pub fn render(c: &Comparison, out: &mut String) {
    let _ = write!(
        out,
        "\n### The kernel path against `{rev}` (same run, the two agents alternating round by round)\n\n| Figure | this tree | {rev} | this tree / {rev} |\n|---|---|---|---|\n",
        rev = c.rev
    );
    let by = |s: &Side, name: &str| s.rate.iter().find(|x| x.target.name == name).cloned();
    let of = |name: &str, f: fn(&RateRuns) -> Vec<f64>| {
        (
            by(&c.new, name).map(|x| f(&x)).unwrap_or_default(),
            by(&c.base, name).map(|x| f(&x)).unwrap_or_default(),
        )
    };
    for (v, k) in [("v1", KERNEL_V1), ("v2", KERNEL_V2)] {
        row(
            out,
            &format!("new connections/s, kernel path, PROXY {v}"),
            of(k, RateRuns::rps_rounds),
            0,
        );
        let vs_direct = |s: &Side| {
            let rounds = |name| by(s, name).map(|x| x.rps_rounds()).unwrap_or_default();
            paired_ratio(&rounds(k), &rounds(DIRECT)).map_or("—".into(), |q| q.show_ratio())
        };
        let _ = writeln!(
            out,
            "| kernel path / direct, new connections/s, PROXY {v} | {} | {} | — |",
            vs_direct(&c.new),
            vs_direct(&c.base),
        );
        let (n, b) = of(k, RateRuns::p99_rounds);
        let to_ms = |v: Vec<f64>| v.iter().map(|x| x / 1e3).collect::<Vec<_>>();
        row(
            out,
            &format!("p99 latency, kernel path, PROXY {v} (ms)"),
            (to_ms(n), to_ms(b)),
            2,
        );
        row(
            out,
            &format!("machine CPU per request, kernel path, PROXY {v} (µs, all CPUs)"),
            of(k, RateRuns::machine_rounds),
            1,
        );
    }
    row(
        out,
        "new connections/s, direct",
        of(DIRECT, RateRuns::rps_rounds),
        0,
    );
    for k in [KERNEL_V1, KERNEL_V2, DIRECT] {
        let total = |s: &Side| {
            s.totals
                .iter()
                .find(|t| t.target == k)
                .map(|t| t.ns_per_request.clone())
                .unwrap_or_default()
        };
        row(
            out,
            &format!("the programs' total run time per connection, {k}, ns"),
            (total(&c.new), total(&c.base)),
            0,
        );
        let mut names: Vec<&str> = c
            .new
            .programs
            .iter()
            .chain(&c.base.programs)
            .filter(|p| p.target == k)
            .map(|p| p.program.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let prog = |s: &Side, f: fn(&ProgramRuns) -> &Vec<f64>| {
                s.programs
                    .iter()
                    .find(|p| p.target == k && p.program == name)
                    .map(|p| f(p).clone())
                    .unwrap_or_default()
            };
            let ns: fn(&ProgramRuns) -> &Vec<f64> = |p| &p.ns_per_run;
            let runs: fn(&ProgramRuns) -> &Vec<f64> = |p| &p.runs_per_request;
            row(
                out,
                &format!("`{name}`, {k}, ns per run"),
                (prog(&c.new, ns), prog(&c.base, ns)),
                0,
            );
            row(
                out,
                &format!("`{name}`, {k}, runs per connection"),
                (prog(&c.new, runs), prog(&c.base, runs)),
                2,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(target: &'static str, ns: &[f64]) -> ProgramsTotal {
        ProgramsTotal {
            target,
            ns_per_request: ns.to_vec(),
        }
    }

    #[test]
    fn rounds_merge_per_target_and_the_section_shows_both_and_their_ratio() {
        let mut c = Comparison {
            rev: "main".into(),
            ..Comparison::default()
        };
        merge_programs(&mut c.new, (Vec::new(), vec![totals(KERNEL_V1, &[1000.0])]));
        merge_programs(&mut c.new, (Vec::new(), vec![totals(KERNEL_V1, &[3000.0])]));
        merge_programs(
            &mut c.base,
            (Vec::new(), vec![totals(KERNEL_V1, &[4000.0])]),
        );
        assert_eq!(c.new.totals.len(), 1);
        assert_eq!(c.new.totals[0].ns_per_request, vec![1000.0, 3000.0]);
        let mut out = String::new();
        render(&c, &mut out);
        assert!(out.contains("against `main`"), "{out}");
        let line = out
            .lines()
            .find(|l| l.contains("total run time per connection, hairpin kernel path, PROXY v1"))
            .expect("the total row");
        assert!(
            line.contains("| 2000 (1000–3000) | 4000 | 0.50× |"),
            "{line}"
        );
    }
}
