//! The A/A check: the same target on both sides of a comparison, measured exactly
//! as the bench measures two different ones (the same rounds, the order within each
//! round shuffled, paired per-round ratios, a bootstrap interval). Whatever the
//! ratio is off 1.00 is what the bench itself adds to every ratio it reports; the
//! full run refuses to call a ratio's target met or missed when it is outside
//! 0.97–1.03.

use std::fmt::Write;

use anyhow::Result;

use super::{
    Ctx,
    cells::cell,
    interval::{Interval, TARGET_HALF_WIDTH, paired_ratio},
    traffic::{self, KERNEL_V1, RateRuns, Target},
};

/// Side A's row label.
pub const SIDE_A: &str = "hairpin kernel path, PROXY v1 (side A)";
/// Side B's row label.
pub const SIDE_B: &str = "hairpin kernel path, PROXY v1 (side B)";

/// How far from 1.00 an A/A ratio may be before the bench's own noise could decide a
/// target: ±3%.
pub const LIMITS: (f64, f64) = (0.97, 1.03);

/// Both sides' rounds.
#[derive(Clone, Debug)]
pub struct AaCheck {
    /// Side A.
    pub a: RateRuns,
    /// Side B.
    pub b: RateRuns,
}

impl AaCheck {
    /// Side A's connection rate over side B's, round by round.
    pub fn rate(&self) -> Option<Interval> {
        paired_ratio(&self.a.rps_rounds(), &self.b.rps_rounds())
    }

    /// Side A's machine CPU per request over side B's, round by round.
    pub fn cpu(&self) -> Option<Interval> {
        paired_ratio(&self.a.machine_rounds(), &self.b.machine_rounds())
    }

    /// Whether both ratios' medians are within [`LIMITS`]: the bench may judge.
    pub fn passes(&self) -> bool {
        let ok = |q: Option<Interval>| q.is_some_and(|q| (LIMITS.0..=LIMITS.1).contains(&q.median));
        ok(self.rate()) && ok(self.cpu())
    }

    /// The line the report puts where a verdict would be when the check failed.
    pub fn verdict(&self) -> String {
        let show = |q: Option<Interval>| q.map_or("—".into(), |q| q.show_ratio());
        format!("A/A rate {}, CPU {}", show(self.rate()), show(self.cpu()))
    }
}

/// The A/A targets: the kernel path's PROXY v1 target twice.
pub fn targets() -> Vec<Target> {
    let v1 = traffic::kernel_targets()
        .into_iter()
        .find(|t| t.name == KERNEL_V1)
        .expect("the kernel path's v1 target");
    vec![
        Target {
            name: SIDE_A,
            ..v1.clone()
        },
        Target { name: SIDE_B, ..v1 },
    ]
}

/// `ctx.opts.runs` rounds of the two sides with the kernel-path agent `agent_pid`
/// running.
pub fn run(ctx: &Ctx<'_>, agent_pid: i32, haproxy_pid: i32) -> Result<AaCheck> {
    let (mut runs, _) = traffic::connection_rate(ctx, agent_pid, haproxy_pid, &targets())?;
    let b = runs.pop().expect("two targets");
    let a = runs.pop().expect("two targets");
    Ok(AaCheck { a, b })
}

/// The section: each figure on both sides, their ratio with its interval, the
/// rounds an interval of ±3% would take at this spread, and the verdict.
pub fn render(c: &AaCheck, out: &mut String) {
    let _ = write!(
        out,
        "\n### A/A check: the same target on both sides\n\n| Figure | side A | side B | A/B, median of paired rounds [95% bootstrap] | rounds for ±3% | within {:.2}–{:.2} |\n|---|---|---|---|---|---|\n",
        LIMITS.0, LIMITS.1
    );
    for (figure, (a, b), q, digits) in [
        (
            "new connections/s, kernel path, PROXY v1",
            (c.a.rps(), c.b.rps()),
            c.rate(),
            0,
        ),
        (
            "machine CPU per request, kernel path, PROXY v1 (µs, all CPUs)",
            (c.a.machine_per_request(), c.b.machine_per_request()),
            c.cpu(),
            1,
        ),
    ] {
        let _ = writeln!(
            out,
            "| {figure} | {} | {} | {} | {} | {} |",
            cell(a, digits),
            cell(b, digits),
            q.map_or("—".into(), |q| q.show_ratio()),
            q.map_or("—".into(), |q| q
                .rounds_for(TARGET_HALF_WIDTH)
                .to_string()),
            match q {
                Some(q) if (LIMITS.0..=LIMITS.1).contains(&q.median) => "yes",
                Some(_) => "**no**",
                None => "not measured",
            },
        );
    }
}
