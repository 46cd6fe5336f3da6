//! What the connect programs cost every connect() in the attached cgroup: the same
//! loop of connects from the pod with the programs detached (no agent) and attached.

use std::process::Stdio;

use anyhow::{Context, Result};

use super::{
    Ctx,
    probes::ConnectMode,
    setup::{LB_PLAIN, LB_V1, in_pod},
    stats::Spread,
};
use crate::agent::Agent;

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

/// ns per connect for one case, detached and attached, one sample per round.
#[derive(Clone, Debug)]
pub struct ConnectResult {
    /// The case.
    pub case: ConnectCase,
    /// Programs detached.
    pub detached: Vec<f64>,
    /// Programs attached (agent running with the bench's frontends).
    pub attached: Vec<f64>,
}

impl ConnectResult {
    /// Median attached minus median detached, ns.
    pub fn added_ns(&self) -> Option<f64> {
        Some(Spread::of(&self.attached)?.median - Spread::of(&self.detached)?.median)
    }
}

fn measure(ctx: &Ctx, case: &ConnectCase) -> Result<f64> {
    let exe = std::env::current_exe()?;
    let n = ctx.opts.connects.to_string();
    let out = in_pod(
        ctx.node,
        ctx.client_cpu,
        &[
            exe.to_str().context("utf-8 exe path")?,
            "connect-loop",
            case.mode.arg(),
            &case.addr,
            &n,
        ],
    )
    .stderr(Stdio::piped())
    .output()?;
    anyhow::ensure!(
        out.status.success(),
        "connect-loop {}: {}",
        case.addr,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .with_context(|| format!("connect-loop printed {text:?}"))
}

/// Alternates detached and attached rounds so drift affects both sides alike.
/// `start_agent` attaches the programs; dropping the agent detaches them.
pub fn overhead(ctx: &Ctx, start_agent: &dyn Fn() -> Agent) -> Result<Vec<ConnectResult>> {
    let mut results: Vec<ConnectResult> = cases()
        .into_iter()
        .map(|case| ConnectResult {
            case,
            detached: Vec::new(),
            attached: Vec::new(),
        })
        .collect();
    for round in 0..ctx.opts.runs.max(3) {
        for r in &mut results {
            r.detached.push(measure(ctx, &r.case)?);
        }
        let agent = start_agent();
        for r in &mut results {
            r.attached.push(measure(ctx, &r.case)?);
        }
        drop(agent);
        for r in &results {
            eprintln!(
                "  connect round {round}: {:<52} detached {:>7.0} ns attached {:>7.0} ns",
                r.case.name,
                r.detached.last().copied().unwrap_or(0.0),
                r.attached.last().copied().unwrap_or(0.0)
            );
        }
    }
    Ok(results)
}
