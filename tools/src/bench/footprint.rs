//! The agent's footprint with many proxied frontends: RSS idle and under load, time
//! from start to `agent ready`, and time to apply the whole set after a file change.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    Ctx,
    converge::base_specs,
    procs::rss_kib,
    traffic::{targets, wrk_once},
};
use hairpin_tests::agent::{Agent, FrontendSpec, frontends_yaml};

/// Addresses for synthetic frontends: the upper half of 203.0.113.0/24, which has no
/// kube-proxy rule and never receives traffic (nothing connects to these).
fn synthetic_ips() -> &'static [&'static str] {
    static IPS: OnceLock<Vec<&'static str>> = OnceLock::new();
    IPS.get_or_init(|| {
        // FrontendSpec holds &'static str; 128 short strings leaked once per process.
        (128..=255)
            .map(|i| &*Box::leak(format!("203.0.113.{i}").into_boxed_str()))
            .collect()
    })
}

/// `n` frontends: the real v1 LB first (so load can flow), then synthetic ones.
pub fn specs(n: usize) -> Vec<FrontendSpec> {
    let mut out = base_specs();
    let ips = synthetic_ips();
    let mut per_ip: Vec<Vec<u16>> = vec![Vec::new(); ips.len()];
    for i in 0..n.saturating_sub(1) {
        per_ip[i % ips.len()].push(10_000 + (i / ips.len()) as u16);
    }
    for (ip, ports) in ips.iter().zip(per_ip) {
        if !ports.is_empty() {
            out.push(FrontendSpec {
                ip,
                ports,
                version: "v1",
            });
        }
    }
    out
}

/// The frontends file for `specs` with `hostnames` names spread over the synthetic
/// LBs (`h<i>.bench.example.com`, never the real LB, which carries traffic).
pub fn yaml_with_hosts(specs: &[FrontendSpec], hostnames: usize) -> String {
    let synthetic = specs.len().saturating_sub(1).max(1);
    let mut hosts: Vec<Vec<String>> = vec![Vec::new(); specs.len()];
    for i in 0..hostnames {
        hosts[1 + i % synthetic].push(format!("h{i}.bench.example.com"));
    }
    hairpin_tests::agent::frontends_yaml_with_hosts(specs, &hosts)
}

/// The agent flags of the hostnames case: the name relay and a hosts file of its own,
/// with the names caps (200 per namespace, 2,000 in all by default; the frontends
/// file counts as one namespace) raised to the case's count: it measures what the
/// agent costs at that many names, which an operator allows by raising the caps.
pub fn names_args(hosts: &std::path::Path, hostnames: usize) -> Vec<String> {
    vec![
        "--mode".into(),
        "both".into(),
        "--hosts-file".into(),
        hosts.to_string_lossy().into_owned(),
        "--names-domains".into(),
        "bench.example.com".into(),
        "--max-names-per-namespace".into(),
        hostnames.to_string(),
        "--max-names".into(),
        hostnames.to_string(),
    ]
}

/// One size's samples, one per round.
#[derive(Clone, Debug, Default)]
pub struct Footprint {
    /// Frontends proxied.
    pub size: usize,
    /// Hostnames routed by the name relay and written to the hosts block.
    pub hostnames: usize,
    /// Size of the hosts file after the update, bytes.
    pub hosts_bytes: Vec<f64>,
    /// Spawn to `agent ready`, ms (20 ms polling granularity).
    pub ready_ms: Vec<f64>,
    /// VmRSS a moment after ready, KiB.
    pub idle_kib: Vec<f64>,
    /// Largest VmRSS while wrk ran through the relay, KiB.
    pub load_kib: Vec<f64>,
    /// File replaced (1 -> size frontends) to `reconcile finished` seen, ms, wall clock
    /// including up to one `--frontends-poll` period.
    pub apply_wall_ms: Vec<f64>,
    /// The agent's own `elapsed_ms` for that reconcile.
    pub apply_agent_ms: Vec<f64>,
}

/// Measures each size `ctx.opts.stats_runs` times. `start` spawns an agent with the given
/// frontends (RLIMIT_NOFILE already raised by the caller).
pub fn measure(ctx: &Ctx<'_>, start: &dyn Fn(&[FrontendSpec]) -> Agent) -> Result<Vec<Footprint>> {
    let relay = targets()
        .into_iter()
        .find(|t| t.hairpin)
        .context("a hairpin target")?;
    let mut all = Vec::new();
    for &size in &ctx.opts.sizes {
        let mut f = Footprint {
            size,
            ..Footprint::default()
        };
        let full = specs(size);
        for round in 0..ctx.opts.stats_runs {
            super::unless_interrupted()?;
            let t = Instant::now();
            let agent = start(&full);
            f.ready_ms.push(t.elapsed().as_secs_f64() * 1e3);
            std::thread::sleep(Duration::from_millis(300));
            f.idle_kib.push(rss_kib(agent.pid()).unwrap_or(0) as f64);
            let secs = ctx.opts.wrk_secs.min(2);
            let (res, load) = wrk_once(ctx, &relay, secs, Some(agent.pid()))?;
            anyhow::ensure!(
                res.errors == 0,
                "relay failed {} requests at {size} frontends",
                res.errors
            );
            f.load_kib.push(load as f64);
            drop(agent);

            let mut agent = start(&base_specs());
            let needle = format!("reconcile finished frontends={size} ");
            let (wall, ms) = timed_apply(&mut agent, &frontends_yaml(&full), &needle, 60)?;
            f.apply_wall_ms.push(wall);
            f.apply_agent_ms.push(ms);
            eprintln!(
                "  footprint {size} round {round}: ready {:.0} ms, idle {:.1} MiB, load {:.1} MiB, apply {ms:.0} ms",
                f.ready_ms.last().copied().unwrap_or(0.0),
                f.idle_kib.last().copied().unwrap_or(0.0) / 1024.0,
                load as f64 / 1024.0,
            );
        }
        all.push(f);
    }
    Ok(all)
}

/// Replaces `agent`'s frontends file with `yaml` and waits for the log line
/// containing `needle`: (wall ms from the write, the agent's own `elapsed_ms`).
fn timed_apply(agent: &mut Agent, yaml: &str, needle: &str, within_s: u64) -> Result<(f64, f64)> {
    let t = Instant::now();
    agent.replace_frontends(yaml)?;
    agent.wait_for_log(needle, Duration::from_secs(within_s));
    let wall = t.elapsed().as_secs_f64() * 1e3;
    let log = agent.log();
    let line = log.lines().find(|l| l.contains(needle)).unwrap_or("");
    let ms = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("no elapsed_ms in {line:?}"))?;
    Ok((wall, ms))
}

/// The name-routing footprint: an agent with the name relay and a hosts file is
/// given `size` frontends carrying `hostnames` names in one file change; the apply
/// time covers the map, the listeners, the route table and the hosts block. Then RSS
/// idle and under wrk, as for the frontends alone. `start` spawns an agent with the
/// given frontends and extra flags.
pub fn measure_names(
    ctx: &Ctx<'_>,
    size: usize,
    hostnames: usize,
    start: &dyn Fn(&[FrontendSpec], &[String]) -> Agent,
) -> Result<Footprint> {
    let relay = targets()
        .into_iter()
        .find(|t| t.hairpin)
        .context("a hairpin target")?;
    let mut f = Footprint {
        size,
        hostnames,
        ..Footprint::default()
    };
    let full = specs(size);
    let yaml = yaml_with_hosts(&full, hostnames);
    let hosts = ctx.node.dir.join("bench-hosts");
    for round in 0..ctx.opts.stats_runs {
        std::fs::write(&hosts, b"127.0.0.1\tlocalhost\n")?;
        let mut agent = start(&base_specs(), &names_args(&hosts, hostnames));
        let needle = format!("reconcile finished frontends={size} failed=0 routes={hostnames} ");
        let (wall, ms) = timed_apply(&mut agent, &yaml, &needle, 120)?;
        f.apply_wall_ms.push(wall);
        f.apply_agent_ms.push(ms);
        let written = std::fs::read_to_string(&hosts)?;
        let entries = written
            .lines()
            .filter(|l| l.contains(".bench.example.com"))
            .count();
        anyhow::ensure!(
            entries == hostnames,
            "the hosts block has {entries} names, expected {hostnames}"
        );
        f.hosts_bytes.push(written.len() as f64);
        std::thread::sleep(Duration::from_millis(300));
        f.idle_kib.push(rss_kib(agent.pid()).unwrap_or(0) as f64);
        let (res, load) = wrk_once(ctx, &relay, ctx.opts.wrk_secs.min(2), Some(agent.pid()))?;
        anyhow::ensure!(
            res.errors == 0,
            "relay failed {} requests with {hostnames} hostnames",
            res.errors
        );
        f.load_kib.push(load as f64);
        eprintln!(
            "  footprint {size} + {hostnames} hostnames round {round}: apply {ms:.0} ms, hosts {} KiB, idle {:.1} MiB, load {:.1} MiB",
            written.len() / 1024,
            f.idle_kib.last().copied().unwrap_or(0.0) / 1024.0,
            load as f64 / 1024.0,
        );
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_unique_and_exactly_n() {
        for n in [1, 2, 129, 1_000, 10_000] {
            let s = specs(n);
            let mut seen = std::collections::BTreeSet::new();
            for f in &s {
                for p in &f.ports {
                    assert!(seen.insert((f.ip, *p)), "duplicate {}:{p}", f.ip);
                }
            }
            assert_eq!(seen.len(), n);
        }
    }

    #[test]
    fn hostnames_go_to_synthetic_lbs_only_and_each_once() {
        let s = specs(1_000);
        let yaml = yaml_with_hosts(&s, 500);
        let first = yaml.split("\n- ").next().expect("first entry");
        assert!(
            !first.contains("hosts:"),
            "the real LB carries no names: {first}"
        );
        for i in [0, 1, 250, 499] {
            assert_eq!(
                yaml.matches(&format!("h{i}.bench.example.com,")).count()
                    + yaml.matches(&format!("h{i}.bench.example.com]")).count(),
                1
            );
        }
        assert!(!yaml.contains("h500.bench"));
    }
}
