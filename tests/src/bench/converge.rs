//! Convergence: from a change of the frontends source to the redirect working (or
//! no longer working) for a connect from the pod.

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

use super::{
    Ctx,
    setup::{LB_V1, LB_V2, in_pod},
};
use crate::agent::{Agent, FrontendSpec, frontends_yaml};

/// The frontends the convergence agent starts with: only the v1 LB.
pub fn base_specs() -> Vec<FrontendSpec> {
    vec![FrontendSpec {
        ip: LB_V1,
        ports: vec![80],
        version: "v1",
    }]
}

fn toggled_specs() -> Vec<FrontendSpec> {
    let mut s = base_specs();
    s.push(FrontendSpec {
        ip: LB_V2,
        ports: vec![80],
        version: "v2",
    });
    s
}

/// Replaces the frontends file in one step: the agent must never read a half-written file.
pub fn write_frontends(agent: &Agent, yaml: &str) -> Result<()> {
    let tmp = agent.frontends.with_extension("tmp");
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, &agent.frontends)?;
    Ok(())
}

/// The file source (`--frontends`, polled every `--frontends-poll`): milliseconds from
/// the file being replaced to the pod's connect to LB_V2 being redirected (odd
/// changes add the frontend, even ones remove it), one sample per change.
pub fn file_source(ctx: &Ctx, agent: &Agent) -> Result<Vec<f64>> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_str().context("utf-8 exe path")?;
    let target = format!("{LB_V2}:80");
    let mut samples = Vec::new();
    for i in 0..ctx.opts.changes {
        let adding = i % 2 == 0;
        let want = if adding { "redirected" } else { "direct" };
        let mut child = in_pod(ctx.node, None, &[exe, "probe", &target, want, "5000"])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("probe stdout")?).lines();
        let ready = lines.next().context("probe said nothing")??;
        anyhow::ensure!(ready == "ready", "probe: {ready}");
        let specs = if adding {
            toggled_specs()
        } else {
            base_specs()
        };
        let t0 = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        write_frontends(agent, &frontends_yaml(&specs))?;
        let seen = lines.next().context("probe died")??;
        let _ = child.wait();
        let Ok(t1) = seen.parse::<u128>() else {
            bail!("change {i} ({want}) not seen within 5 s: {seen}");
        };
        let ms = t1.saturating_sub(t0) as f64 / 1e6;
        eprintln!("  convergence change {i}: {want} after {ms:.1} ms");
        samples.push(ms);
    }
    Ok(samples)
}

/// Hook for the Kubernetes watch source: from a Service's status or annotation
/// changing on the API server to the redirect working. Returns `None` until that
/// source exists; fill in here (same probe, a fake API server's watch event as t0).
pub fn watch_stream(_ctx: &Ctx) -> Option<Vec<f64>> {
    None
}
