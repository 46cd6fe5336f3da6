//! `cargo xtask bench`: what users pay for hairpin, measured on a [`SimNode`] beside
//! hairpin-proxy's data plane (HAProxy `send-proxy`) and a direct path, in one run.
//!
//! Loopback and the bench's own namespaces only. Cases run in this order: connect()
//! overhead (programs detached and attached), connection rate and bulk throughput
//! (one agent, HAProxy and nginx running throughout), convergence, footprint.

pub mod aa;
pub mod baseline;
pub mod cells;
pub mod connect;
pub mod conntrack;
pub mod converge;
pub mod floor;
pub mod footprint;
pub mod interval;
pub mod options;
pub mod probes;
pub mod procs;
pub mod programs;
pub mod report;
pub mod setup;
pub mod stats;
pub mod traffic;
pub mod wrk;

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::Result;

use hairpin_tests::{
    agent::{Agent, FrontendSpec},
    node::SimNode,
};
use options::Options;
use report::Results;
use setup::{LB_KERNEL_V1, LB_KERNEL_V2, LB_V1, LB_V2};
use traffic::Direction;

/// Set by [`interrupt`] (the bench's SIGINT, SIGTERM or SIGHUP): the running case
/// stops at its next client run and the bench returns, so the agents, HAProxy,
/// nginx, the floor's programs and the node are torn down by their owners.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Asks the bench to stop at its next client run and tear its node down.
pub fn interrupt() {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// An error once [`interrupt`] was called: every client run and every case
/// boundary asks, so an interrupted bench unwinds within one run.
pub fn unless_interrupted() -> Result<()> {
    anyhow::ensure!(
        !INTERRUPTED.load(Ordering::Relaxed),
        "interrupted: tearing the node down"
    );
    Ok(())
}

/// What every case needs.
pub struct Ctx<'a> {
    /// The simulated node.
    pub node: &'a SimNode,
    /// Sizes.
    pub opts: &'a Options,
    /// CPU the clients (wrk, curl, connect loops) are pinned to; servers get the others.
    pub client_cpu: Option<usize>,
    /// The floor's cgroup ([`floor::Floor`]), where the floor target's client runs;
    /// `None` when its program could not be attached.
    pub floor_cgroup: Option<&'a std::path::Path>,
}

/// The agent's extra flags: a fast file poll for the convergence case.
const AGENT_ARGS: &[&str] = &["--frontends-poll", "100ms"];

/// One frontend on port 80 for each PROXY version: `v1` and `v2` are their LBs.
fn one_per_version(v1: &'static str, v2: &'static str) -> Vec<FrontendSpec> {
    [(v1, "v1"), (v2, "v2")]
        .into_iter()
        .map(|(ip, version)| FrontendSpec {
            ip,
            ports: vec![80],
            version,
        })
        .collect()
}

/// The frontends the traffic cases use: one LB per PROXY version.
pub fn traffic_specs() -> Vec<FrontendSpec> {
    one_per_version(LB_V1, LB_V2)
}

/// The kernel-path run's frontends: the kernel path's own LBs, one per version.
pub fn kernel_specs() -> Vec<FrontendSpec> {
    one_per_version(LB_KERNEL_V1, LB_KERNEL_V2)
}

fn start_agent(node: &SimNode, specs: &[FrontendSpec]) -> Agent {
    Agent::start_logging(node, specs, "info", AGENT_ARGS)
}

/// The relay run's agent: the traffic frontends, with `--relay-splice` as asked.
fn relay_agent(node: &SimNode, opts: &Options) -> Agent {
    let mut args: Vec<&str> = AGENT_ARGS.to_vec();
    if let Some(mode) = &opts.relay_splice {
        args.extend(["--relay-splice", mode.as_str()]);
    }
    Agent::start_logging(node, &traffic_specs(), "info", &args)
}

/// One bulk download, then one upload, per target: each case's results, empty when
/// it failed (and recorded as failed). `run` names the run (`""`, `" (kernel path)"`).
fn transfers(
    ctx: &Ctx<'_>,
    r: &mut Results,
    pids: (i32, i32),
    targets: &[traffic::Target],
    run: &str,
) -> (Vec<traffic::Transfers>, Vec<traffic::Transfers>) {
    let mut one = |way: Direction, case: &str| {
        eprintln!("{case}{run} ({} MiB per transfer)", ctx.opts.bulk_mib);
        let res = traffic::bulk(ctx, pids, targets, way);
        record(r, &format!("{case}{run}"), res).unwrap_or_default()
    };
    (
        one(Direction::Download, "bulk"),
        one(Direction::Upload, "upload"),
    )
}

fn record<T>(r: &mut Results, case: &str, res: Result<T>) -> Option<T> {
    match res {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("{case} failed: {e:#}");
            r.failures.push(format!("{case}: {e:#}"));
            None
        }
    }
}

/// An agent with the kernel path on (`--kernel-path auto`, the default
/// configuration; the test harness's agents otherwise run the relay) serving the
/// kernel path's own LBs; an error when the path did not come on.
fn kernel_agent(node: &SimNode, extra: &[String]) -> Result<Agent> {
    let mut args: Vec<&str> = AGENT_ARGS.to_vec();
    args.extend(["--kernel-path", "auto"]);
    args.extend(extra.iter().map(String::as_str));
    let agent = Agent::start_logging(node, &kernel_specs(), "info", &args);
    if !agent.log().contains("state=on") {
        anyhow::bail!(
            "the kernel path is not on: {}",
            agent
                .log()
                .lines()
                .find(|l| l.contains("kernel path configured"))
                .unwrap_or("no kernel path line in the agent log")
        );
    }
    Ok(agent)
}

/// The kernel path against the baseline build (`--baseline`), recorded in `r`.
fn compare_with_baseline(ctx: &Ctx<'_>, r: &mut Results, haproxy_pid: i32) {
    eprintln!(
        "kernel path against the baseline ({} rounds per agent, wrk {} s per run)",
        ctx.opts.runs, ctx.opts.wrk_secs
    );
    let res = baseline::compare(ctx, haproxy_pid);
    r.baseline = record(r, "kernel path against the baseline", res);
}

/// The method notes every run carries: what the figures count and how ratios
/// are taken.
fn general_notes(r: &mut Results, opts: &Options, nofile: u64) {
    r.notes.push("Proxy CPU per request: the user and system time the proxy process (the agent for the relay rows, HAProxy for its own) used during each wrk run, from /proc/PID/stat, divided by the requests wrk completed. System time includes the softirq work the process's own sends run inline (the peer's half of the TCP exchange on this node), which both proxies pay alike. It is the cost behind the rate: with each proxy sharing CPU 1 with nginx, the rate follows it, and it varies less between runs than the rate does.".into());
    r.notes.push("Machine CPU per request: every CPU's busy time (user, nice, system, irq and softirq from /proc/stat; not idle, iowait or the time the hypervisor stole) over each wrk run, divided by the requests wrk completed. It counts everything a request costs, whoever runs it: the client, the kernel's TCP work and softirqs, the BPF programs, the kworkers and RCU callbacks that free what a connection left, nginx and the proxy. Per CPU it shows which side pays and which CPU is the bottleneck (busy %, of the time not stolen); stolen % says how much of the run the hypervisor took, the main source of this machine's run-to-run spread.".into());
    r.notes.push(format!("Ratios: each round runs every target of its run once, in an order shuffled round by round by a seeded generator (so no target always follows the same one, and none always runs first), after `ss -K` has killed the TIME_WAIT sockets the previous round left in the node's three namespaces. A ratio is taken round by round, hairpin's round over the compared target's in the same round, and the table gives the median of those paired ratios with a percentile bootstrap 95% interval in brackets ({resamples} resamples from a SplitMix64 generator with a fixed seed, so the same rounds always give the same interval). The machine drifts between rounds (the direct path alone has ranged by a quarter within one run here); a ratio of the two medians would set figures from different rounds against each other. A case that lost a round is compared by its medians, without an interval.", resamples = interval::RESAMPLES));
    r.notes.push(format!("A/A check: the kernel path's PROXY v1 target on both sides of a comparison (\"side A\" and \"side B\", the same LB through the same agent), measured exactly as any two targets are ({} rounds, shuffled order), with the kernel-path run's agent. Its ratios say what the bench adds to any ratio by itself. When the A/B ratio of the connection rate or of the machine CPU per request is outside {:.2}–{:.2}, the ratio rows' targets are not judged (the result cell says so with the A/A figures). Its table also gives the rounds an interval of ±3% would take at the spread it saw (the interval of a median narrows as 1/√rounds). `cargo xtask bench --aa` runs the check alone and prints it.", opts.runs, aa::LIMITS.0, aa::LIMITS.1));
    r.notes.push("Floor: the direct target dialled from a cgroup of its own outside hairpin's (a child of the node's outside cgroup) where the bench attaches a 13-instruction sock_ops program it assembles itself and loads with bpf(2): on ACTIVE_ESTABLISHED it inserts the socket into a one-slot sockmap (a psock created; the next connection's insert or the socket's close deletes it); on the other callbacks it returns. The kernel runs a cgroup sock_ops program five times per active connect whatever it asks for, and writing TCP payload from BPF on this kernel needs a psock, so this is the least the kernel path can cost here: its rows give the floor against direct and the kernel path against the floor, round by round.".into());
    r.notes.push(procs::perf_counters());
    r.notes.push(format!("RLIMIT_NOFILE set to {nofile} (setrlimit in the bench before it spawns anything, inherited by the agent, nginx and HAProxy): each proxy holds two descriptors per connection."));
}

/// `--aa`: the A/A check alone, with the kernel-path run's agent.
fn aa_only(ctx: &Ctx<'_>, r: &mut Results, haproxy_pid: i32) -> Result<()> {
    let agent = kernel_agent(ctx.node, &[])?;
    traffic::sanity(ctx, &aa::targets())?;
    eprintln!(
        "A/A: {} rounds of wrk {} s per side",
        ctx.opts.runs, ctx.opts.wrk_secs
    );
    r.aa = record(r, "A/A", aa::run(ctx, agent.pid(), haproxy_pid));
    r.notes.extend(method_notes(ctx.opts));
    Ok(())
}

/// The relay run's rows again with the kernel writing the header on the client's
/// socket, the floor beside them, the A/A check and the programs' statistics.
fn kernel_run(ctx: &Ctx<'_>, r: &mut Results, haproxy_pid: i32) {
    // The same rows with the kernel writing the header on the client's socket: the
    // default configuration (`auto`; the test harness's agents otherwise run the
    // relay), adopting the datapath the relay run's agent left pinned.
    let mut kernel = traffic::kernel_targets();
    if ctx.floor_cgroup.is_some() {
        kernel.push(traffic::floor_target());
    }
    let agent = record(r, "kernel path", kernel_agent(ctx.node, &[]));
    if let Some(agent) = &agent
        && record(r, "sanity (kernel path)", traffic::sanity(ctx, &kernel)).is_some()
    {
        eprintln!(
            "kernel path: connection rate (wrk, {} s per run)",
            ctx.opts.wrk_secs
        );
        let res = traffic::connection_rate(ctx, agent.pid(), haproxy_pid, &kernel);
        if let Some((rate, _)) = record(r, "connection rate (kernel path)", res) {
            r.rate_kernel = rate;
        }
        eprintln!(
            "A/A: {} rounds of wrk {} s per side",
            ctx.opts.runs, ctx.opts.wrk_secs
        );
        r.aa = record(r, "A/A", aa::run(ctx, agent.pid(), haproxy_pid));
        (r.bulk_kernel, r.upload_kernel) = transfers(
            ctx,
            r,
            (agent.pid(), haproxy_pid),
            &kernel,
            " (kernel path)",
        );
        eprintln!("kernel path: the programs' own run time (BPF statistics, wrk)");
        let only: Vec<_> = kernel
            .iter()
            .filter(|t| t.name == traffic::KERNEL_V1 || t.name == traffic::KERNEL_V2)
            .cloned()
            .collect();
        let res = programs::measure(ctx, agent.pid(), &only);
        (r.kernel_programs, r.kernel_programs_total) =
            record(r, "program run time (kernel path)", res).unwrap_or_default();
    }
    drop(agent);
}

/// Runs every case and returns what they measured.
pub fn run(opts: &Options) -> Result<Results> {
    let mut r = Results::default();
    let nofile = procs::raise_nofile(65_536)?;
    general_notes(&mut r, opts, nofile);
    let client_cpu = if procs::cpus() >= 2 {
        procs::pin_self(1)?;
        r.notes.push("CPU placement: the bench pins itself to CPU 1 before starting nginx (1 worker), HAProxy (`nbthread 1`) and the agent (its tokio runtime then sizes itself to 1 worker), so each proxy shares CPU 1 with nginx alike; clients (wrk -t1, curl, connect loops) run under `taskset -c 0`.".into());
        Some(0)
    } else {
        r.notes
            .push("one CPU: no pinning; clients and servers share it".into());
        None
    };
    let node = SimNode::with_lbs(&setup::bench_lbs());
    node.tune_for_load();
    let _nginx = setup::start_bench_nginx(&node, opts.bulk_mib * 1024 * 1024)?;
    let haproxy = setup::start_haproxy_send_proxy(&node)?;
    let floor = record(
        &mut r,
        "floor (trivial programs)",
        floor::Floor::attach(&node.outside_cgroup().join("floor")),
    );
    let ctx = Ctx {
        node: &node,
        opts,
        client_cpu,
        floor_cgroup: floor.as_ref().map(floor::Floor::cgroup),
    };

    if opts.aa_only {
        aa_only(&ctx, &mut r, haproxy.pid())?;
        return Ok(r);
    }

    if opts.baseline_only {
        compare_with_baseline(&ctx, &mut r, haproxy.pid());
        r.notes.extend(method_notes(opts));
        return Ok(r);
    }

    unless_interrupted()?;
    eprintln!("connect() overhead ({} connects per run)", opts.connects);
    let res = connect::overhead(&ctx, &|| start_agent(&node, &traffic_specs()));
    r.connect = record(&mut r, "connect overhead", res).unwrap_or_default();

    let agent = relay_agent(&node, opts);
    std::thread::sleep(Duration::from_millis(300));
    let idle = procs::rss_kib(agent.pid()).unwrap_or(0);
    let relay = traffic::targets();
    if record(&mut r, "sanity", traffic::sanity(&ctx, &relay)).is_some() {
        eprintln!("connection rate (wrk, {} s per run)", opts.wrk_secs);
        let res = traffic::connection_rate(&ctx, agent.pid(), haproxy.pid(), &relay);
        if let Some((rate, load)) = record(&mut r, "connection rate", res) {
            r.rate = rate;
            r.rss_small = Some((idle, load));
        }
        (r.bulk, r.upload) = transfers(&ctx, &mut r, (agent.pid(), haproxy.pid()), &relay, "");
    }
    drop(agent);
    unless_interrupted()?;

    kernel_run(&ctx, &mut r, haproxy.pid());
    unless_interrupted()?;
    if opts.baseline.is_some() {
        compare_with_baseline(&ctx, &mut r, haproxy.pid());
    }

    unless_interrupted()?;
    eprintln!("convergence ({} changes)", opts.changes);
    let agent = start_agent(&node, &converge::base_specs());
    let res = converge::file_source(&ctx, &agent);
    r.converge_file = record(&mut r, "convergence", res).unwrap_or_default();
    drop(agent);
    eprintln!(
        "convergence through the Kubernetes watch stream ({} changes)",
        opts.changes
    );
    let res = converge::watch_stream(&ctx);
    r.converge_watch = record(&mut r, "convergence (watch)", res);

    unless_interrupted()?;
    eprintln!("footprint ({:?} frontends)", opts.sizes);
    let res = footprint::measure(&ctx, &|specs| start_agent(&node, specs));
    r.footprint = record(&mut r, "footprint", res).unwrap_or_default();
    if let (Some(&size), true) = (opts.sizes.iter().max(), opts.hostnames > 0) {
        eprintln!("footprint ({size} frontends, {} hostnames)", opts.hostnames);
        let res = footprint::measure_names(&ctx, size, opts.hostnames, &|specs, extra| {
            let mut args: Vec<&str> = AGENT_ARGS.to_vec();
            args.extend(extra.iter().map(String::as_str));
            Agent::start_logging(&node, specs, "info", &args)
        });
        if let Some(f) = record(&mut r, "footprint (hostnames)", res) {
            r.footprint.push(f);
        }
    }
    unless_interrupted()?;
    r.notes.extend(method_notes(opts));
    Ok(r)
}

fn method_notes(o: &Options) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some((_, rev)) = &o.baseline {
        notes.push(format!("Against `{rev}` (`--baseline {rev}`): `cargo xtask bench` also builds that revision's agent (release, with the BPF object its own `cargo xtask build-ebpf` builds, from a worktree under target/baseline, in the same target dir so only the workspace's crates compile; kept per commit). Then {} rounds: in each, this tree's agent and the baseline's take turns (this tree first in odd rounds, the baseline first in even ones), each started with `--kernel-path auto` on the kernel path's LBs and running one rate round (1 s warm-up per target, then direct and the kernel path v1 and v2, as in the rate rows) and one wrk run per target with the BPF run-time statistics on (as in the program rows; the direct target's are the programs' miss path, where sock_ops runs only for the callbacks the kernel makes on every connect). Before each side starts, this tree's `hairpin-agent cleanup --scope node --bpf-pin-dir` removes the datapath the previous agent left pinned (its links detach), so each side runs its own programs alone whatever pin layout either build uses. Ratios are the median of the per-round ratios (this tree's over the baseline's in the same round) with their bootstrap 95% interval.", o.runs));
    }
    notes.extend([
        "Topology: `hairpin_tests::node::SimNode` (pod, node and ingress network namespaces, veths, kube-proxy-style iptables DNAT). nginx with `listen 80 proxy_protocol` (and a plain :8081) in the ingress namespace behind every path; agent built in release with the BPF object embedded, running at `--log info`.".into(),
        format!("Connection rate: `wrk -t1 -c{} -d{}s --latency -H 'Connection: close'` from the pod namespace inside the pod cgroup, a new TCP connection per request; targets interleaved round by round (order shuffled per round) after a {}-s unrecorded wrk run per target. hairpin: the client dials the LB IP and the connect4 program redirects it to the relay. HAProxy: `mode tcp`, `server lb <LB IP>:80 send-proxy[-v2]`, bound on the node IP in the node namespace outside the attached cgroup (hairpin-proxy's data plane; the client dials it directly). Direct: an unproxied LB IP DNATed to nginx's plain port. The programs stay attached for all targets, so every client connect pays the same lookup.", o.wrk_connections, o.wrk_secs, o.warmup_secs),
        format!("Kernel path: the rate, bulk and upload cases again with an agent run with the default `--kernel-path auto` (connect4 marks the socket and leaves the destination, sock_ops and sk_msg write the header on the client's own socket), the hairpin rows replaced by the kernel path's and the direct and HAProxy rows measured again in the same rounds, so each ratio compares runs of one sitting. Then, apart from the timed rounds, {} wrk runs per kernel-path target with the kernel's BPF run-time statistics on (BPF_ENABLE_STATS): for each of the agent's programs that ran (found through the agent's own descriptors), ns per run and runs per request (one new connection each), and all of them together per connection (their run time summed, over the requests wrk completed), and the instructions the verifier processed loading each program (`verified_insns` of the kernel's program info: its work over every path it walked, which no neighbour's load moves).", o.stats_runs),
        format!("Bulk: `curl -o /dev/null` of a sparse {} MiB file (nginx `sendfile on`) from the pod; upload: `curl -T` of a sparse file of the same size to nginx's `/upload`, which answers at once and reads the body away (the transfer ends when nginx has read all of it). MB/s = 10^6 bytes/s from curl's own size and time. CPU per MB: over each transfer, the proxy process's user and system time (the agent for the relay rows, HAProxy for its own) and every CPU's busy time (as for the rate rows: the client, nginx, the kernel's TCP work, softirqs and kworkers, where the kernel splice sends), per 10^6 bytes. The relay run's agent runs with `--relay-splice {}` (`pipe`, the default: each way spliced through a pooled pipe with `splice(2)`, so the bytes never enter the agent; `off`: every byte copied through the agent; `auto`: each way spliced once it has carried 64 KiB, by the kernel's stream verdict where it loads). HAProxy has no `splice-*` option, as in hairpin-proxy.", o.bulk_mib, o.relay_splice.as_deref().unwrap_or("pipe")),
        "HAProxy's `server` lines dial LBs of their own (203.0.113.20 and .22, DNATed to nginx ports 83 and 84), and so do the kernel-path rows (203.0.113.30 and .32, ports 85 and 86): flows that leave the pod masqueraded to the node IP (the direct and kernel-path rows) and those from the node IP itself (HAProxy's and the relay's upstream connects) must not meet at the same nginx port, where a TIME_WAIT left by one fails the other's SYN on PAWS (different timestamp offsets) and costs a 1 s retransmit.".into(),
        format!("connect(): {full} socket()+connect()+close() per run in one process in the pod cgroup, mean ns per call. Each round runs the loop with no agent (no connect program attached anywhere, so the kernel skips the hook), then starts the agent (2 frontends) and runs one child process that moves itself back and forth {pairs} times between a cgroup outside the attached subtree (same namespace, same running agent, no program on the path) and the pod cgroup under the programs, timing {per} connects on each side of every pair (order alternating); 'added' is the median (and range) of the per-pair differences attached minus outside, so drift and the agent's presence on the 2-core machine fall on both sides alike. The outside and attached cells are per pair; the no-agent cell is one {full}-connect run per round. A third run per round turns on the kernel's BPF run-time statistics (BPF_ENABLE_STATS) and reads hairpin's programs' run_time_ns and run_cnt before and after: the program's own ns per run, and runs per connect() (1.00 = the hook ran once per call). 'proxied' compares different paths (relay listener vs DNAT to the ingress), so it is reported, not judged.", full = o.connects, per = (o.connects / 4).max(1), pairs = connect::PAIRS),
        format!("Convergence: the agent polls the frontends file every 100 ms; {} atomic replacements alternately add and remove a frontend; a probe in the pod connects every 1 ms and stamps the first connect whose peer shows the redirect (or its absence). p99 of {} samples is close to the max.", o.changes, o.changes),
        "Footprint: VmRSS from /proc/PID/status 300 ms after `agent ready` (idle) and the largest seen every 100 ms during a wrk run through the relay; start→ready is wall time with 20 ms polling; file change→reconciled is wall time (includes up to one 100 ms poll) and the agent's own `reconcile finished elapsed_ms` log field (a 1-frontend agent given the full set). Hostnames: an agent with `--mode both --hosts-file` (name relay and /etc/hosts block) starts with 1 frontend and is given the largest size's frontends with N hostnames (`h<i>.bench.example.com`, spread over the synthetic LBs) in one file change; apply is that reconcile (map, listeners, route table, hosts block written in place), checked by counting the names in the written file; RSS idle 300 ms after, and under a wrk run through the relay.".into(),
    ]);
    notes
}
