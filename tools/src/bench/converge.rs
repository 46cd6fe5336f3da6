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
use hairpin_tests::{
    agent::{Agent, FrontendSpec, frontends_yaml, spec},
    fakeapi::FakeApi,
};

/// The frontends the convergence agent starts with: only the v1 LB.
pub fn base_specs() -> Vec<FrontendSpec> {
    vec![spec(LB_V1, "v1")]
}

fn toggled_specs() -> Vec<FrontendSpec> {
    let mut s = base_specs();
    s.push(spec(LB_V2, "v2"));
    s
}

/// The file source (`--frontends`, polled every `--frontends-poll`): milliseconds from
/// the file being replaced to the pod's connect to LB_V2 being redirected (odd
/// changes add the frontend, even ones remove it), one sample per change.
pub fn file_source(ctx: &Ctx<'_>, agent: &Agent) -> Result<Vec<f64>> {
    measure(ctx, |adding| {
        let specs = if adding {
            toggled_specs()
        } else {
            base_specs()
        };
        Ok(agent.replace_frontends(&frontends_yaml(&specs))?)
    })
}

/// The Kubernetes watch source: milliseconds from a Service for LB_V2 appearing in
/// (or leaving) the recorded API server's watch stream to the pod's connect being
/// redirected (or not), with an agent that watches that server.
pub fn watch_stream(ctx: &Ctx<'_>) -> Result<Vec<f64>> {
    let api = FakeApi::start_in_netns(&ctx.node.node_ns);
    let kubeconfig = ctx.node.dir.join("bench-kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut agent = Agent::start_kube(ctx.node, &kubeconfig, &["--events", "false"]);
    agent.wait_for_log("agent ready", std::time::Duration::from_secs(20));
    let service = lb_service(LB_V2);
    measure(ctx, |adding| {
        if adding {
            api.apply(service.clone());
        } else {
            api.delete(&service);
        }
        Ok(())
    })
}

/// A LoadBalancer Service as the API server returns it, PROXY v2 by our annotation.
fn lb_service(ip: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": "bench-v2", "namespace": "bench", "uid": "7d1c0e52-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"hairpin.dev/proxy-protocol": "v2"}
        },
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.50",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80, "nodePort": 31080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}
    })
}

/// Runs `ctx.opts.changes` changes through `change(adding)`, timing each from just
/// before the change to the pod's probe seeing LB_V2 redirected (or no longer).
fn measure(ctx: &Ctx<'_>, mut change: impl FnMut(bool) -> Result<()>) -> Result<Vec<f64>> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_str().context("utf-8 exe path")?;
    let target = format!("{LB_V2}:80");
    let mut samples = Vec::new();
    for i in 0..ctx.opts.changes {
        super::unless_interrupted()?;
        let adding = i % 2 == 0;
        let want = if adding { "redirected" } else { "direct" };
        let mut child = in_pod(ctx.node, None, &[exe, "probe", &target, want, "5000"])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("probe stdout")?).lines();
        let ready = lines.next().context("probe said nothing")??;
        anyhow::ensure!(ready == "ready", "probe: {ready}");
        let t0 = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        change(adding)?;
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
