//! BENCHMARKS.md: the main table (figure, spread, comparison, target, met or not),
//! then the per-target detail, the method and the machine.

use std::fmt::Write;

use super::{
    cells::{cell, ms, q_cell},
    connect::ConnectResult,
    footprint::Footprint,
    interval::{Interval, SEED, bootstrap_median, paired_ratio},
    options::Options,
    programs::{ProgramRuns, ProgramsTotal},
    stats::{Spread, ratio},
    traffic::{DIRECT, FLOOR, KERNEL_V1, KERNEL_V2, RateRuns, Transfers},
};

/// Everything one bench run measured; a case that failed leaves its field empty and
/// says why in `failures`.
#[derive(Default)]
pub struct Results {
    /// wrk rounds per target.
    pub rate: Vec<RateRuns>,
    /// Agent RSS (KiB) idle with the bench's two frontends, and the largest under wrk.
    pub rss_small: Option<(u64, u64)>,
    /// Bulk transfers per target.
    pub bulk: Vec<Transfers>,
    /// wrk rounds per target with the kernel path on.
    pub rate_kernel: Vec<RateRuns>,
    /// Bulk transfers per target with the kernel path on.
    pub bulk_kernel: Vec<Transfers>,
    /// Uploads per target (relay run).
    pub upload: Vec<Transfers>,
    /// Uploads per target with the kernel path on.
    pub upload_kernel: Vec<Transfers>,
    /// The kernel path's programs' own run time under wrk.
    pub kernel_programs: Vec<ProgramRuns>,
    /// All of the kernel path's programs together per connection, under wrk.
    pub kernel_programs_total: Vec<ProgramsTotal>,
    /// connect() ns per case.
    pub connect: Vec<ConnectResult>,
    /// File-source convergence, ms per change.
    pub converge_file: Vec<f64>,
    /// Watch-stream convergence, when that source exists.
    pub converge_watch: Option<Vec<f64>>,
    /// Per frontend-count footprint.
    pub footprint: Vec<Footprint>,
    /// Cases that failed, with the error.
    pub failures: Vec<String>,
    /// Free-form notes on placement and limits.
    pub notes: Vec<String>,
    /// The kernel path against a baseline build (`--baseline`).
    pub baseline: Option<super::baseline::Comparison>,
    /// The A/A check: the same target on both sides.
    pub aa: Option<super::aa::AaCheck>,
}

pub(super) fn met(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "**met**",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

fn rate_by<'a>(r: &'a Results, name: &str) -> Option<&'a RateRuns> {
    r.rate.iter().find(|x| x.target.name == name)
}

/// The ratios of `x` to `y` round by round, as their median with a bootstrap 95%
/// interval. The rounds run every target in a shuffled order, so round i of both ran
/// in the same round, and the ratio of each pair cancels the machine's drift between
/// rounds (on this machine the direct path alone has ranged by a quarter between
/// rounds of one run); a ratio of medians would take the two medians from different
/// rounds. When the rounds cannot be paired (a case lost a round), the ratio of the
/// medians, as one sample.
fn compare(x: &[f64], y: &[f64]) -> Option<Interval> {
    if let Some(q) = paired_ratio(x, y) {
        return Some(q);
    }
    bootstrap_median(&[ratio(Spread::of(x), Spread::of(y))?], SEED)
}

/// A ratio cell: `0.87×`, or `0.87× [0.85–0.90]` (the median of the paired rounds'
/// ratios and its bootstrap 95% interval) when it stands on rounds.
fn qs_cell(q: Option<Interval>) -> String {
    q.map_or("—".into(), |q| q.show_ratio())
}

/// A figure of a target's rate rounds, one sample per round in round order.
type Rounds = fn(&RateRuns) -> Vec<f64>;

fn proxy_cpu_rounds(r: &RateRuns) -> Vec<f64> {
    r.cpu_us_per_request.clone()
}

/// A row reported without a comparison or a target: its figure and value.
pub(super) fn reported(out: &mut String, figure: &str, value: &str) {
    let _ = writeln!(out, "| {figure} | {value} | — | — | — | reported |");
}

/// KiB samples as MiB.
pub(super) fn mib(kib: &[f64]) -> Option<Spread> {
    Spread::of(&kib.iter().map(|k| k / 1024.0).collect::<Vec<_>>())
}

/// The programs' total run time per connection before the work to halve it (ns, PROXY
/// v1, on the developers' 2-core machine the bench's figures come from): the target
/// is half of it. `--baseline REV` measures an earlier build in the same run instead.
const PROGRAMS_BEFORE_NS: f64 = 4_600.0;

/// The kernel path's rows: rate and p99 against direct (the targets) and HAProxy,
/// bulk against direct, all from the kernel path's own rounds.
fn kernel_rows(r: &Results, out: &mut String) {
    if r.rate_kernel.is_empty() && r.bulk_kernel.is_empty() {
        return;
    }
    let by = |name: &str| r.rate_kernel.iter().find(|x| x.target.name == name);
    let direct = by(DIRECT);
    for (v, k, ha) in [
        ("v1", KERNEL_V1, "HAProxy send-proxy"),
        ("v2", KERNEL_V2, "HAProxy send-proxy-v2"),
    ] {
        let runs = [by(k), direct, by(ha)];
        kernel_row(
            out,
            &format!("new connections/s, **kernel path**, PROXY {v}"),
            (ha, runs),
            (RateRuns::rps_rounds, no_scale, 0),
            Some(("≥ 0.95× direct", |q| q >= 0.95)),
        );
        kernel_row(
            out,
            &format!("p99 latency, **kernel path**, PROXY {v} (ms)"),
            (ha, runs),
            (RateRuns::p99_rounds, ms, 2),
            Some(("≤ 1.10× direct", |q| q <= 1.10)),
        );
        kernel_row(
            out,
            &format!("machine CPU per request, **kernel path**, PROXY {v} (µs, all CPUs)"),
            (ha, runs),
            (RateRuns::machine_rounds, no_scale, 1),
            Some(("≤ 1.04× direct", |q| q <= 1.04)),
        );
    }
    for (way, runs) in [
        ("bulk download, **kernel path**", &r.bulk_kernel),
        ("bulk upload, **kernel path**", &r.upload_kernel),
    ] {
        if !runs.is_empty() {
            transfer_row(out, way, runs, (KERNEL_V1, "kernel"), Some(0.95));
            machine_per_mb_row(out, way, runs, KERNEL_V1);
        }
    }
}

/// The kernel path's programs' run time (kernel BPF statistics) and the verifier's
/// count of instructions it processed loading each: absolute figures, judged without
/// the A/A check.
fn program_rows(r: &Results, out: &mut String) {
    for t in &r.kernel_programs_total {
        let total = Spread::of(&t.ns_per_request);
        let _ = writeln!(
            out,
            "| the programs' total run time per connection (Σ ns per run × runs per request, kernel BPF stats), {}, ns | {} | before the work to halve it: {PROGRAMS_BEFORE_NS:.0} (the developers' machine) | {} | ≤ {:.0} | {} |",
            t.target,
            cell(total, 0),
            q_cell(total.map(|s| s.median / PROGRAMS_BEFORE_NS)),
            PROGRAMS_BEFORE_NS / 2.0,
            met(total.map(|s| s.median <= PROGRAMS_BEFORE_NS / 2.0)),
        );
    }
    for p in &r.kernel_programs {
        // Only sock_ops has a target of its own: its runs, most of them callbacks the
        // kernel makes on every connect whatever the program asks for.
        let runs = Spread::of(&p.runs_per_request);
        let (target, result) = if p.program == "hairpin_sockops" {
            ("≤ 2 runs per request", met(runs.map(|s| s.median <= 2.0)))
        } else {
            ("—", "reported")
        };
        let _ = writeln!(
            out,
            "| `{}` program's own run time (kernel BPF stats), {}, ns per run | {} | runs per request: {}; instructions the verifier processed loading it: {} | — | {target} | {result} |",
            p.program,
            p.target,
            cell(Spread::of(&p.ns_per_run), 0),
            cell(runs, 2),
            p.verified_insns.map_or("—".into(), |n| n.to_string()),
        );
    }
}

/// How a figure is scaled for display.
type Scale = fn(Option<Spread>) -> Option<Spread>;

fn no_scale(s: Option<Spread>) -> Option<Spread> {
    s
}

/// A figure taken from a target's rounds, scaled for display, and its digits.
type Figure = (Rounds, Scale, usize);

/// A row's target: its text, and the test of the ratio against direct.
type Goal = (&'static str, fn(f64) -> bool);

/// One kernel-path row: the kernel path's figure against direct (the ratio, judged
/// against `target` when there is one: its text and its test) and HAProxy `ha`, from
/// `[kernel path, direct, HAProxy]` runs.
fn kernel_row(
    out: &mut String,
    figure: &str,
    (ha, runs): (&str, [Option<&RateRuns>; 3]),
    (of, scale, digits): Figure,
    target: Option<Goal>,
) {
    let [k, d, a] = runs.map(|x| x.map(of).unwrap_or_default());
    let q = compare(&k, &d);
    let shown = |x: &[f64]| cell(scale(Spread::of(x)), digits);
    let _ = writeln!(
        out,
        "| {figure} | {} | direct: {}; {ha}: {} ({}) | {} | {} | {} |",
        shown(&k),
        shown(&d),
        shown(&a),
        compare(&k, &a).map_or("—".into(), |q| format!(
            "kernel/HAProxy {}",
            q.show_ratio()
        )),
        qs_cell(q),
        target.map_or("—", |t| t.0),
        target.map_or("reported", |(_, ok)| met(q.map(|q| ok(q.median)))),
    );
}

/// One transfer row (MB/s): `hairpin` (row label, and its name in the HAProxy
/// ratio) against direct and HAProxy from the same `runs`; judged against
/// `target` × direct when there is one, else reported.
fn transfer_row(
    out: &mut String,
    figure: &str,
    runs: &[Transfers],
    (hairpin, who): (&str, &str),
    target: Option<f64>,
) {
    let of: fn(&Transfers) -> &Vec<f64> = |x| &x.mbps;
    let [h, d, a] = [hairpin, DIRECT, "HAProxy send-proxy"].map(|n| samples(runs, n, of));
    let q = compare(h, d);
    let _ = writeln!(
        out,
        "| {figure} (MB/s) | {} | direct: {}; HAProxy: {} ({}) | {} | {} | {} |",
        cell(Spread::of(h), 0),
        cell(Spread::of(d), 0),
        cell(Spread::of(a), 0),
        compare(h, a).map_or("—".into(), |q| format!(
            "{who}/HAProxy {}",
            q.show_ratio()
        )),
        qs_cell(q),
        target.map_or("—".into(), |t| format!("≥ {t:.2}× direct")),
        target.map_or("reported", |t| met(q.map(|q| q.median >= t))),
    );
}

/// One of the figures of the transfers of the target named `name`, per round.
fn samples<'a>(runs: &'a [Transfers], name: &str, of: fn(&Transfers) -> &Vec<f64>) -> &'a [f64] {
    runs.iter()
        .find(|x| x.target.name == name)
        .map_or(&[], |x| of(x))
}

/// The machine's CPU per MB moved (all CPUs, kernel work and kworkers included) by
/// `hairpin` against direct and HAProxy, from the same `runs`.
fn machine_per_mb_row(out: &mut String, way: &str, runs: &[Transfers], hairpin: &str) {
    let of: fn(&Transfers) -> &Vec<f64> = |x| &x.machine_us_per_mb;
    let [h, d, a] = [hairpin, DIRECT, "HAProxy send-proxy"].map(|n| samples(runs, n, of));
    let _ = writeln!(
        out,
        "| machine CPU per MB, {way} (µs, all CPUs) | {} | direct: {}; HAProxy: {} | {} | — | reported |",
        cell(Spread::of(h), 0),
        cell(Spread::of(d), 0),
        cell(Spread::of(a), 0),
        qs_cell(compare(h, d)),
    );
}

/// The relay's own CPU per MB moved (the agent's user and system time) against
/// HAProxy's, from the same `runs`.
fn proxy_per_mb_row(out: &mut String, way: &str, runs: &[Transfers]) {
    let of: fn(&Transfers) -> &Vec<f64> = |x| &x.proxy_us_per_mb;
    let [h, a] = ["hairpin relay, PROXY v1", "HAProxy send-proxy"].map(|n| samples(runs, n, of));
    let _ = writeln!(
        out,
        "| relay CPU per MB, {way} (µs, the agent's process) | {} | HAProxy: {} | {} | — | reported |",
        cell(Spread::of(h), 0),
        cell(Spread::of(a), 0),
        qs_cell(compare(h, a)),
    );
}

fn main_table(r: &Results, out: &mut String) {
    out.push_str("| Figure | hairpin | compared with | ratio [95% interval] | target | result |\n|---|---|---|---|---|---|\n");
    // The default path first, then the relay: their verdicts stand on ratios, so
    // only when the A/A check says the bench's own noise is within ±3%.
    let mut ratios = String::new();
    kernel_rows(r, &mut ratios);
    floor_rows(r, &mut ratios);
    relay_rows(r, &mut ratios);
    out.push_str(&gate(&ratios, r.aa.as_ref()));
    program_rows(r, out);
    other::other_rows(r, out);
}

/// `rows` with every met or missed verdict replaced by why it is not given, unless
/// the A/A check ran and passed.
fn gate(rows: &str, aa: Option<&super::aa::AaCheck>) -> String {
    let why = match aa {
        Some(aa) if aa.passes() => return rows.to_string(),
        Some(aa) => format!(
            "not judged: {} outside {:.2}–{:.2}",
            aa.verdict(),
            super::aa::LIMITS.0,
            super::aa::LIMITS.1
        ),
        None => "not judged: no A/A check".to_string(),
    };
    rows.replace("| **met** |", &format!("| {why} |"))
        .replace("| **missed** |", &format!("| {why} |"))
}

/// How far the kernel path is from the floor: its rate and machine CPU per request
/// over the floor target's, round by round, and the floor against direct.
fn floor_rows(r: &Results, out: &mut String) {
    let by = |name: &str| r.rate_kernel.iter().find(|x| x.target.name == name);
    let Some(floor) = by(FLOOR) else {
        return;
    };
    for (figure, of, digits) in [
        ("new connections/s", RateRuns::rps_rounds as Rounds, 0),
        (
            "machine CPU per request (µs, all CPUs)",
            RateRuns::machine_rounds,
            1,
        ),
    ] {
        let f = of(floor);
        let d = by(DIRECT).map(of).unwrap_or_default();
        let _ = writeln!(
            out,
            "| {figure}, **floor** (direct + five empty sock_ops runs + one psock insert and delete, trivial programs) | {} | direct: {} | floor/direct {} | — | reported |",
            cell(Spread::of(&f), digits),
            cell(Spread::of(&d), digits),
            qs_cell(compare(&f, &d)),
        );
        for (v, k) in [("v1", KERNEL_V1), ("v2", KERNEL_V2)] {
            let x = by(k).map(of).unwrap_or_default();
            let _ = writeln!(
                out,
                "| {figure}, **kernel path against the floor**, PROXY {v} | {} | floor: {} | {} | — | reported |",
                cell(Spread::of(&x), digits),
                cell(Spread::of(&f), digits),
                qs_cell(compare(&x, &f)),
            );
        }
    }
}

/// The relay's rows: rate, latency and CPU per request against HAProxy, transfers
/// against direct (and their CPU per MB), from the relay run's rounds.
fn relay_rows(r: &Results, out: &mut String) {
    for (v, hp, ha) in [
        ("v1", "hairpin relay, PROXY v1", "HAProxy send-proxy"),
        ("v2", "hairpin relay, PROXY v2", "HAProxy send-proxy-v2"),
    ] {
        let (h, a) = (rate_by(r, hp), rate_by(r, ha));
        for (figure, (of, scale, digits), target) in [
            (
                format!("new connections/s, **relay**, PROXY {v}"),
                (RateRuns::rps_rounds as Rounds, no_scale as Scale, 0),
                Some(("≥ 1.30×", (|q| q >= 1.30) as fn(f64) -> bool)),
            ),
            (
                format!("p50 latency, **relay**, PROXY {v} (ms)"),
                (RateRuns::p50_rounds, ms, 2),
                None,
            ),
            (
                format!("p99 latency, **relay**, PROXY {v} (ms)"),
                (RateRuns::p99_rounds, ms, 2),
                Some(("≤ HAProxy", |q| q <= 1.0)),
            ),
            (
                format!("proxy CPU per request, **relay**, PROXY {v} (µs)"),
                (proxy_cpu_rounds, no_scale, 1),
                None,
            ),
            (
                format!("machine CPU per request, **relay**, PROXY {v} (µs, all CPUs)"),
                (RateRuns::machine_rounds, no_scale, 1),
                Some(("< HAProxy", |q| q < 1.0)),
            ),
        ] {
            let [x, y] = [h, a].map(|t| t.map(of).unwrap_or_default());
            let q = compare(&x, &y);
            let _ = writeln!(
                out,
                "| {figure} | {} | {ha}: {} | {} | {} | {} |",
                cell(scale(Spread::of(&x)), digits),
                cell(scale(Spread::of(&y)), digits),
                qs_cell(q),
                target.map_or("—", |t| t.0),
                target.map_or("reported", |(_, ok)| met(q.map(|q| ok(q.median)))),
            );
        }
    }
    for (way, runs) in [
        ("bulk download, **relay**", &r.bulk),
        ("bulk upload, **relay**", &r.upload),
    ] {
        if !runs.is_empty() {
            transfer_row(
                out,
                way,
                runs,
                ("hairpin relay, PROXY v1", "relay"),
                Some(0.90),
            );
            proxy_per_mb_row(out, way, runs);
            machine_per_mb_row(out, way, runs, "hairpin relay, PROXY v1");
        }
    }
}

/// Renders the whole report.
pub fn render(r: &Results, o: &Options, machine: &str, tools: &[String]) -> String {
    let mut out = String::from("# hairpin benchmarks\n\n");
    let _ = writeln!(
        out,
        "Produced by `{}` (as root). Cells are median (min–max) over {} rounds ({} for bulk and upload, {} for the program statistics and footprint) unless they say otherwise; ratios are the median of the per-round ratios with its bootstrap 95% interval in brackets.\n",
        o.command, o.runs, o.bulk_runs, o.stats_runs
    );
    let _ = writeln!(out, "Machine: {machine}.  \nTools: {}.\n", tools.join("; "));
    if !o.baseline_only && !o.aa_only {
        main_table(r, &mut out);
    }
    if let Some(aa) = &r.aa {
        super::aa::render(aa, &mut out);
    }
    if let Some(c) = &r.baseline {
        super::baseline::render(c, &mut out);
    }
    detail::detail(r, &mut out);
    out.push_str("\n## Method\n\n");
    for n in &r.notes {
        let _ = writeln!(out, "- {n}");
    }
    if !r.failures.is_empty() {
        out.push_str("\n## Cases that failed\n\n");
        for f in &r.failures {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

/// The line that opens BENCHMARKS.md's sections measured by other runs than this
/// bench (the `real_cluster` suite against a real API server and kube-proxy):
/// [`kept_sections`] carries them into the next report unchanged.
pub const KEPT_MARKER: &str = "<!-- measured elsewhere: kept by cargo xtask bench -->";

/// What of the previous BENCHMARKS.md a new report keeps: everything from
/// [`KEPT_MARKER`] on, or nothing when the file has no such line.
pub fn kept_sections(previous: &str) -> &str {
    previous.find(KEPT_MARKER).map_or("", |at| &previous[at..])
}

mod detail;
mod other;

#[cfg(test)]
mod tests;
