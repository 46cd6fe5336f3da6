//! Connection rate and latency (wrk, a new TCP connection per request) and bulk
//! throughput (curl of one large file), from the pod, through each data plane.

use std::{
    process::Stdio,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use anyhow::{Context, Result, ensure};

use super::{
    Ctx,
    interval::{SEED, SplitMix64},
    procs::{CpuTime, cpu_deltas, cpu_times, cpu_us, rss_kib},
    setup::{
        HAPROXY_V1_PORT, HAPROXY_V2_PORT, LB_KERNEL_V1, LB_KERNEL_V2, LB_PLAIN, LB_V1, LB_V2,
        in_cgroup, in_pod, upload_file, url,
    },
    stats::Spread,
    wrk::{self, WrkResult},
};
use hairpin_tests::node::NODE_IP4;

/// One way from the pod to nginx.
#[derive(Clone, Debug)]
pub struct Target {
    /// Row label.
    pub name: &'static str,
    /// Host and port the client dials.
    pub ip: &'static str,
    /// Port the client dials.
    pub port: u16,
    /// True for the hairpin relay (its RSS is sampled while it carries load).
    pub hairpin: bool,
    /// True for the bench's HAProxy (its CPU time is measured like the relay's).
    pub haproxy: bool,
    /// True when the client runs in the floor's cgroup ([`super::Ctx::floor_cgroup`]:
    /// outside hairpin's, under trivial programs) instead of the pod's.
    pub floor: bool,
}

/// Row label of the floor: the direct path from a cgroup where only trivial
/// programs run (five empty sock_ops runs and one psock insert and delete per
/// connection), the least the kernel path can cost on this kernel.
pub const FLOOR: &str = "floor (direct + empty sock_ops + psock insert/delete)";

/// The floor's target: the direct LB dialled from the floor's cgroup.
pub fn floor_target() -> Target {
    Target {
        name: FLOOR,
        floor: true,
        ..targets()[0].clone()
    }
}

/// Clears what the last round left in the node's three namespaces, so every round
/// starts from the same state whichever target ran before it: the TIME_WAIT
/// sockets (`ss -K`, sock_diag's destroy) and the conntrack entries (a ctnetlink
/// flush); a target after a high-rate one would otherwise meet tens of thousands of
/// both in the hash tables its connects look up. Best effort: a kernel without
/// sock_diag destroy keeps the sockets, and a failed flush leaves conntrack's
/// TIME_WAIT entries to the 5 s timeout `tune_for_load` sets (said once on stderr).
pub fn settle(ctx: &Ctx<'_>) {
    let n = ctx.node;
    for ns in [&n.pod_ns, &n.node_ns, &n.ingress_ns] {
        let _ = hairpin_tests::sh::output_in(ns, None, &["ss", "-K", "-t", "state", "time-wait"]);
        if let Err(e) = super::conntrack::flush(ns) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| eprintln!("  conntrack flush in {ns}: {e:#}"));
        }
    }
}

/// The kernel path's rows: LBs of their own (see [`LB_KERNEL_V1`]), reached with an
/// agent run with the default `--kernel-path auto`, between the same direct and HAProxy rows so
/// drift falls on all alike.
pub fn kernel_targets() -> Vec<Target> {
    targets()
        .into_iter()
        .map(|t| match t.name {
            "hairpin relay, PROXY v1" => Target {
                name: KERNEL_V1,
                ip: LB_KERNEL_V1,
                hairpin: false,
                ..t
            },
            "hairpin relay, PROXY v2" => Target {
                name: KERNEL_V2,
                ip: LB_KERNEL_V2,
                hairpin: false,
                ..t
            },
            _ => t,
        })
        .collect()
}

/// Row label of the direct path.
pub const DIRECT: &str = "direct (plain nginx, no PROXY)";
/// Row label of the kernel path with PROXY v1.
pub const KERNEL_V1: &str = "hairpin kernel path, PROXY v1";
/// Row label of the kernel path with PROXY v2.
pub const KERNEL_V2: &str = "hairpin kernel path, PROXY v2";

/// The data planes compared, in the order they run within each round.
pub fn targets() -> Vec<Target> {
    let t = |name, ip, port, hairpin| Target {
        name,
        ip,
        port,
        hairpin,
        haproxy: false,
        floor: false,
    };
    let haproxy = |name, port| Target {
        haproxy: true,
        ..t(name, NODE_IP4, port, false)
    };
    vec![
        t(DIRECT, LB_PLAIN, 80, false),
        t("hairpin relay, PROXY v1", LB_V1, 80, true),
        haproxy("HAProxy send-proxy", HAPROXY_V1_PORT),
        t("hairpin relay, PROXY v2", LB_V2, 80, true),
        haproxy("HAProxy send-proxy-v2", HAPROXY_V2_PORT),
    ]
}

/// Every wrk run of one target.
#[derive(Clone, Debug)]
pub struct RateRuns {
    /// The target.
    pub target: Target,
    /// One result per round.
    pub runs: Vec<WrkResult>,
    /// CPU time the proxy process (the agent for the relay rows, HAProxy for its
    /// rows) used per request, in µs, per round; empty for rows without one.
    pub cpu_us_per_request: Vec<f64>,
    /// Every CPU's time over each round, whoever spent it (client, kernel work,
    /// programs, softirq, kworkers, nginx, the proxy): what a request costs the
    /// machine, apart from the time the hypervisor stole.
    pub machine: Vec<MachineRun>,
}

/// The machine's CPUs over one wrk run, and the requests it completed.
#[derive(Clone, Debug)]
pub struct MachineRun {
    /// Per CPU, /proc/stat order.
    pub cpus: Vec<CpuTime>,
    /// Requests wrk completed.
    pub requests: u64,
}

impl MachineRun {
    fn per_request(&self, busy: f64) -> Option<f64> {
        (self.requests > 0).then(|| busy / self.requests as f64)
    }
}

impl RateRuns {
    /// Requests per second, one sample per round in round order (as are the other
    /// `*_rounds`: the report pairs rounds of two targets by their index).
    pub fn rps_rounds(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.requests_per_sec).collect()
    }
    /// Median latency (µs), per round.
    pub fn p50_rounds(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.p50_us).collect()
    }
    /// p99 latency (µs), per round.
    pub fn p99_rounds(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.p99_us).collect()
    }
    /// Busy time of every CPU per request (µs), per round; NaN for a round without
    /// requests (which [`Spread`] leaves out), so the indices stay the rounds'.
    pub fn machine_rounds(&self) -> Vec<f64> {
        (self.machine.iter())
            .map(|m| {
                m.per_request(m.cpus.iter().map(|c| c.busy_us).sum())
                    .unwrap_or(f64::NAN)
            })
            .collect()
    }
    /// Requests per second over the rounds.
    pub fn rps(&self) -> Option<Spread> {
        Spread::of(&self.rps_rounds())
    }
    /// Median latency (µs) over the rounds.
    pub fn p50(&self) -> Option<Spread> {
        Spread::of(&self.p50_rounds())
    }
    /// p99 latency (µs) over the rounds.
    pub fn p99(&self) -> Option<Spread> {
        Spread::of(&self.p99_rounds())
    }
    /// The proxy process's CPU time per request (µs) over the rounds.
    pub fn cpu_per_request(&self) -> Option<Spread> {
        Spread::of(&self.cpu_us_per_request)
    }
    /// Busy time of every CPU per request (µs) over the rounds.
    pub fn machine_per_request(&self) -> Option<Spread> {
        Spread::of(&self.machine_rounds())
    }
    /// Busy time of CPU `cpu` per request (µs) over the rounds.
    pub fn cpu_per_request_on(&self, cpu: usize) -> Option<Spread> {
        let v: Vec<f64> = (self.machine.iter())
            .filter_map(|m| m.per_request(m.cpus.get(cpu)?.busy_us))
            .collect();
        Spread::of(&v)
    }
    /// How busy CPU `cpu` was (%, of the time it was not stolen) over the rounds.
    pub fn busy_percent_on(&self, cpu: usize) -> Option<Spread> {
        let v: Vec<f64> = (self.machine.iter())
            .filter_map(|m| m.cpus.get(cpu))
            .filter(|c| c.total_us > c.steal_us)
            .map(|c| 100.0 * c.busy_us / (c.total_us - c.steal_us))
            .collect();
        Spread::of(&v)
    }
    /// The share (%) of every CPU's time the hypervisor stole, over the rounds.
    pub fn steal_percent(&self) -> Option<Spread> {
        let v: Vec<f64> = (self.machine.iter())
            .filter_map(|m| {
                let (s, t) = m
                    .cpus
                    .iter()
                    .fold((0.0, 0.0), |(s, t), c| (s + c.steal_us, t + c.total_us));
                (t > 0.0).then(|| 100.0 * s / t)
            })
            .collect();
        Spread::of(&v)
    }
    /// Failed requests over all rounds.
    pub fn errors(&self) -> u64 {
        self.runs.iter().map(|r| r.errors).sum()
    }
}

/// Checks each of `targets` answers 200 from the pod before timing it: a broken
/// path would otherwise show up as a suspiciously fast row.
pub fn sanity(ctx: &Ctx<'_>, targets: &[Target]) -> Result<()> {
    for t in targets {
        let u = url(t.ip, t.port, "/");
        let out = in_pod(ctx.node, None, &["curl", "-sS", "--max-time", "5", &u]).output()?;
        let body = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && body.starts_with("ok "),
            "{}: {u} answered {:?} / {}",
            t.name,
            body,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Runs wrk for `secs` against `t` from the pod; samples `agent_pid`'s RSS meanwhile.
pub fn wrk_once(
    ctx: &Ctx<'_>,
    t: &Target,
    secs: u32,
    agent_pid: Option<i32>,
) -> Result<(WrkResult, u64)> {
    super::unless_interrupted()?;
    let u = url(t.ip, t.port, "/");
    let (threads, conns, dur) = (
        "-t1".to_string(),
        format!("-c{}", ctx.opts.wrk_connections),
        format!("-d{secs}s"),
    );
    let argv = [
        "wrk",
        &threads,
        &conns,
        &dur,
        "--latency",
        "-H",
        "Connection: close",
        &u,
    ];
    let cgroup = match (t.floor, ctx.floor_cgroup) {
        (true, Some(cg)) => cg.to_path_buf(),
        (true, None) => anyhow::bail!("{}: no floor cgroup set up", t.name),
        (false, _) => ctx.node.pod_cgroup(),
    };
    let child = in_cgroup(ctx.node, &cgroup, ctx.client_cpu, &argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start wrk")?;
    // Sample the relay's RSS beside wrk; wait_with_output drains wrk's pipes meanwhile.
    let done = AtomicBool::new(false);
    let max_rss = AtomicU64::new(0);
    let out = std::thread::scope(|s| {
        if let Some(p) = agent_pid {
            let (done, max_rss) = (&done, &max_rss);
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    max_rss.fetch_max(rss_kib(p).unwrap_or(0), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        let out = child.wait_with_output();
        done.store(true, Ordering::Relaxed);
        out
    })
    .context("wait for wrk")?;
    let max_rss = max_rss.into_inner();
    let text = String::from_utf8_lossy(&out.stdout);
    let r = wrk::parse(&text)
        .with_context(|| format!("wrk {u}: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((r, max_rss))
}

/// Rounds of wrk over `targets`, interleaved so drift hits all targets alike: each
/// round starts from [`settle`]d state and runs the targets in an order of its own,
/// shuffled by a seeded generator, so no target always follows the same one.
/// Returns the runs and the agent's largest RSS (KiB) while it carried load. The
/// relay rows also measure the agent's CPU time per request, and the HAProxy rows
/// `haproxy_pid`'s: the cost behind the rate, steadier than the rate on 2 cores.
pub fn connection_rate(
    ctx: &Ctx<'_>,
    agent_pid: i32,
    haproxy_pid: i32,
    targets: &[Target],
) -> Result<(Vec<RateRuns>, u64)> {
    let mut all: Vec<RateRuns> = targets
        .iter()
        .cloned()
        .map(|target| RateRuns {
            target,
            runs: Vec::new(),
            cpu_us_per_request: Vec::new(),
            machine: Vec::new(),
        })
        .collect();
    let kernel_run = targets.iter().any(|t| t.name == KERNEL_V1);
    // Warm-up: caches, conntrack, the relay's allocator; not recorded.
    for r in &all {
        wrk_once(ctx, &r.target, ctx.opts.warmup_secs, None)?;
    }
    let mut rss = 0;
    let mut rng = SplitMix64::new(SEED ^ all.len() as u64);
    for round in 0..ctx.opts.runs {
        settle(ctx);
        let mut order: Vec<usize> = (0..all.len()).collect();
        rng.shuffle(&mut order);
        for &i in &order {
            let r = &mut all[i];
            let pid = r.target.hairpin.then_some(agent_pid);
            // With --profile, the first PROXY v1 round through the relay runs under
            // perf (the agent's process); in the kernel-path run, the first round of
            // the kernel path v1 and of direct (the whole machine: the kernel path's
            // cost is in the client's syscalls, softirqs and kworkers, not a process).
            let perf = match &ctx.opts.profile {
                Some(dir) if round == 0 && r.target.hairpin && !r.target.name.contains("v2") => {
                    Some(start_perf(dir, Some(agent_pid), "relay-rate")?)
                }
                Some(dir) if round == 0 && kernel_run && r.target.name == KERNEL_V1 => {
                    Some(start_perf(dir, None, "kernel-rate-kernel-v1")?)
                }
                Some(dir) if round == 0 && kernel_run && r.target.name == DIRECT => {
                    Some(start_perf(dir, None, "kernel-rate-direct")?)
                }
                _ => None,
            };
            let proxy = if r.target.hairpin {
                Some(agent_pid)
            } else {
                r.target.haproxy.then_some(haproxy_pid)
            };
            let cpu_before = proxy.and_then(cpu_us);
            let machine_before = cpu_times();
            let (res, m) = wrk_once(ctx, &r.target, ctx.opts.wrk_secs, pid)?;
            let machine_after = cpu_times();
            let cpu_after = proxy.and_then(cpu_us);
            if let (Some(a), Some(b)) = (machine_before, machine_after) {
                r.machine.push(MachineRun {
                    cpus: cpu_deltas(&a, &b),
                    requests: res.requests,
                });
            }
            if let Some(p) = perf {
                stop_perf(p)?;
            }
            if let (Some(a), Some(b)) = (cpu_before, cpu_after)
                && res.requests > 0
            {
                r.cpu_us_per_request.push((b - a) / res.requests as f64);
            }
            eprintln!(
                "  rate round {round}: {:<32} {:>9.0} req/s p50 {:>7.0} us p99 {:>7.0} us errors {}",
                r.target.name, res.requests_per_sec, res.p50_us, res.p99_us, res.errors
            );
            rss = rss.max(m);
            r.runs.push(res);
        }
    }
    Ok((all, rss))
}

/// Which way a bulk transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The pod downloads nginx's sparse `/bulk` file (nginx writes with sendfile).
    Download,
    /// The pod uploads a sparse file of the same size to nginx's `/upload`, which
    /// reads and discards it.
    Upload,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Download => "bulk",
            Direction::Upload => "upload",
        }
    }
}

/// One target's transfers one way, per round: the rate and what each MB cost.
#[derive(Clone, Debug)]
pub struct Transfers {
    /// The target.
    pub target: Target,
    /// MB/s (10^6 bytes per second).
    pub mbps: Vec<f64>,
    /// The proxy process's CPU time (user + system) per MB moved, in µs: the agent
    /// for the relay rows, HAProxy for its own; empty for rows without one.
    pub proxy_us_per_mb: Vec<f64>,
    /// Every CPU's busy time per MB moved, in µs (as [`MachineRun`] counts it):
    /// what the bytes cost the machine, kernel work and kworkers included.
    pub machine_us_per_mb: Vec<f64>,
}

impl Transfers {
    fn new(target: Target) -> Transfers {
        Transfers {
            target,
            mbps: Vec::new(),
            proxy_us_per_mb: Vec::new(),
            machine_us_per_mb: Vec::new(),
        }
    }
}

/// Bulk MB/s (10^6 bytes per second) per target, over the rounds, one way, with
/// the proxy's and the machine's CPU per MB. With `--profile DIR`, the agent's first
/// hairpin transfer runs under `perf record` (and, in [`connection_rate`], its first
/// PROXY v1 wrk round).
pub fn bulk(
    ctx: &Ctx<'_>,
    (agent_pid, haproxy_pid): (i32, i32),
    targets: &[Target],
    way: Direction,
) -> Result<Vec<Transfers>> {
    let bytes = ctx.opts.bulk_mib * 1024 * 1024;
    let wanted: Vec<Target> = targets
        .iter()
        .filter(|t| !t.name.contains("v2") && !t.floor)
        .cloned()
        .collect();
    let mut out: Vec<Transfers> = wanted.into_iter().map(Transfers::new).collect();
    let upload = upload_file(ctx.node);
    let upload = upload.to_str().context("utf-8 path")?;
    let argv = |u: &str| -> Vec<String> {
        let mut v: Vec<String> = ["curl", "-sS", "--max-time", "120", "-o", "/dev/null"]
            .map(String::from)
            .to_vec();
        match way {
            Direction::Download => {
                v.extend(["-w".into(), "%{size_download} %{time_total}".into()]);
            }
            Direction::Upload => v.extend([
                "-T".into(),
                upload.into(),
                "-w".into(),
                "%{size_upload} %{time_total}".into(),
            ]),
        }
        v.push(u.into());
        v
    };
    let path = match way {
        Direction::Download => "/bulk",
        Direction::Upload => "/upload",
    };
    // Warm-up, not recorded: the first read of a sparse file fills the page cache.
    let warm = argv(&url(LB_PLAIN, 80, path));
    let warm: Vec<&str> = warm.iter().map(String::as_str).collect();
    in_pod(ctx.node, ctx.client_cpu, &warm)
        .stdout(Stdio::null())
        .status()?;
    let mut rng = SplitMix64::new(SEED ^ 0xb01c);
    for round in 0..ctx.opts.bulk_runs {
        // As the rate rounds: each round in an order of its own.
        let mut order: Vec<usize> = (0..out.len()).collect();
        rng.shuffle(&mut order);
        for &i in &order {
            let x = &mut out[i];
            let t = &x.target;
            let u = url(t.ip, t.port, path);
            let perf = match &ctx.opts.profile {
                Some(dir) if round == 0 && t.hairpin => Some(start_perf(
                    dir,
                    Some(agent_pid),
                    &format!("relay-{}", way.label()),
                )?),
                _ => None,
            };
            let a = argv(&u);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let proxy = if t.hairpin {
                Some(agent_pid)
            } else {
                t.haproxy.then_some(haproxy_pid)
            };
            let (proxy_before, machine_before) = (proxy.and_then(cpu_us), cpu_times());
            let o = in_pod(ctx.node, ctx.client_cpu, &a).output()?;
            let (proxy_after, machine_after) = (proxy.and_then(cpu_us), cpu_times());
            if let Some(p) = perf {
                stop_perf(p)?;
            }
            let text = String::from_utf8_lossy(&o.stdout);
            let mut f = text.split_whitespace();
            let size: u64 = f.next().unwrap_or("0").parse().unwrap_or(0);
            let secs: f64 = f.next().unwrap_or("0").parse().unwrap_or(0.0);
            ensure!(
                o.status.success() && size == bytes && secs > 0.0,
                "{} {u}: moved {size} of {bytes} bytes in {secs} s: {}",
                way.label(),
                String::from_utf8_lossy(&o.stderr)
            );
            let (mb, mbps) = (size as f64 / 1e6, size as f64 / secs / 1e6);
            if let (Some(a), Some(b)) = (proxy_before, proxy_after) {
                x.proxy_us_per_mb.push((b - a) / mb);
            }
            if let (Some(a), Some(b)) = (machine_before, machine_after) {
                let busy: f64 = cpu_deltas(&a, &b).iter().map(|c| c.busy_us).sum();
                x.machine_us_per_mb.push(busy / mb);
            }
            eprintln!(
                "  {} round {round}: {:<32} {mbps:>8.0} MB/s, machine {:>6.0} µs/MB",
                way.label(),
                x.target.name,
                x.machine_us_per_mb.last().copied().unwrap_or(f64::NAN),
            );
            x.mbps.push(mbps);
        }
    }
    Ok(out)
}

/// Starts `perf record` of `pid`, or of every CPU without one, into `<dir>/<case>.perf.data`.
fn start_perf(dir: &std::path::Path, pid: Option<i32>, case: &str) -> Result<std::process::Child> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join(format!("{case}.perf.data"));
    let whom = match pid {
        Some(p) => vec!["-p".to_string(), p.to_string()],
        None => vec!["-a".to_string()],
    };
    // cpu-clock: this machine's PMU has no hardware counters (perf stat shows <not supported>).
    let child = std::process::Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", "999", "-g"])
        .args(&whom)
        .arg("-o")
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start perf record")?;
    std::thread::sleep(Duration::from_millis(300));
    eprintln!(
        "  profiling {} into {}",
        if pid.is_some() {
            "the agent"
        } else {
            "every CPU"
        },
        data.display()
    );
    Ok(child)
}

fn stop_perf(mut child: std::process::Child) -> Result<()> {
    // SAFETY: SIGINT to our own child; perf writes its data file on SIGINT.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait()?;
    Ok(())
}
