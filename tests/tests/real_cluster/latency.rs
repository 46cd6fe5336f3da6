//! The time from a LoadBalancer status patch (as the cloud controller writes it) to
//! the pod's first request carrying its header: the real API server's watch, the
//! agent's decision and datapath update, and kube-proxy's sync, together; p50 and
//! p99 over 100 changes (BENCHMARKS.md). And 10,000 LoadBalancer Services in the
//! real API server: the agent's RSS and time to converge (ignored by default: it
//! takes minutes; `cargo test -p hairpin-tests --test real_cluster -- --ignored`).

use std::{
    io::{BufRead, BufReader, Write},
    process::Stdio,
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::status,
    node::{KubeProxyMode, POD_IP4},
    sh::command_in,
};

use crate::{RealNode, do_service, vip};

/// Changes measured.
const CHANGES: usize = 100;

/// A prober in the pod (its namespace and cgroup): for each LB IP read from stdin it
/// connects to IP:80 until the reply names the pod in the header (connect timeout
/// 50 ms, so resolution is about that), then prints the attempts.
const PROBER: &str = r#"
import socket, sys
for line in sys.stdin:
    ip = line.strip()
    tries = 0
    while True:
        tries += 1
        try:
            s = socket.create_connection((ip, 80), timeout=0.05)
            s.settimeout(2)
            s.sendall(b"GET / HTTP/1.0\r\nHost: lb\r\n\r\n")
            reply = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
            s.close()
            if b"client=" + sys.argv[1].encode() + b":" in reply:
                break
        except OSError:
            pass
    print(tries, flush=True)
"#;

/// Seconds since midnight UTC of `t`.
fn time_of_day(t: std::time::SystemTime) -> f64 {
    let since = t
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    since.as_secs_f64() % 86_400.0
}

/// Seconds since midnight UTC of the agent log line that proxied `ip`:80 (its
/// timestamp is `YYYY-MM-DDTHH:MM:SS.ffffffZ`).
fn proxied_at(log: &str, ip: &str) -> Option<f64> {
    let needle = format!("frontend proxied frontend={ip}:80 ");
    let line = log.lines().rev().find(|l| l.contains(&needle))?;
    let clock = line.split('T').nth(1)?.split('Z').next()?;
    let mut parts = clock.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[test]
fn status_patch_to_first_header_p50_p99_over_100_changes() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Nftables) else {
        return;
    };
    rn.start_agent(&[]);
    let c = &rn.cluster;
    let mut svc = do_service("ingress-nginx", "moving", &[]);
    svc.dual_stack = false;
    c.create_lb_service(&svc);
    let mut prober = command_in(
        &rn.node.pod_ns,
        Some(&rn.node.pod_cgroup()),
        &["python3", "-c", PROBER, POD_IP4],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the prober");
    let mut to = prober.stdin.take().expect("stdin");
    let mut from = BufReader::new(prober.stdout.take().expect("stdout"));
    let mut took = Vec::with_capacity(CHANGES);
    let mut agent_took = Vec::with_capacity(CHANGES);
    for i in 0..CHANGES {
        // A new address each time: 203.0.113.100 .. 203.0.113.199.
        let ip = format!("203.0.113.{}", 100 + i);
        let started = Instant::now();
        let patched_at = time_of_day(std::time::SystemTime::now());
        c.set_lb_ingress("ingress-nginx", "moving", vip(&[&ip]));
        writeln!(to, "{ip}").expect("to the prober");
        let mut line = String::new();
        let deadline = Duration::from_secs(20);
        from.read_line(&mut line).expect("from the prober");
        let t = started.elapsed();
        assert!(
            t < deadline,
            "change {i} to {ip} took {t:?}\n{}",
            rn.agent().log()
        );
        took.push(t);
        let log = rn.agent().log();
        let at = proxied_at(&log, &ip).unwrap_or_else(|| panic!("no proxied line for {ip}"));
        agent_took.push(Duration::from_secs_f64(
            (at - patched_at).rem_euclid(86_400.0),
        ));
    }
    let _ = prober.kill();
    let _ = prober.wait();
    took.sort();
    agent_took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "status patch -> the agent's frontend proxied (its log) over {CHANGES} changes: \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(&agent_took, 0.5)),
        ms(percentile(&agent_took, 0.99)),
        ms(agent_took[CHANGES - 1]),
    );
    eprintln!(
        "status patch -> first header over {CHANGES} changes (kube-proxy nftables, Kubernetes {}): \
         p50 {:.0} ms, p99 {:.0} ms, min {:.0} ms, max {:.0} ms",
        rn.cluster.bins.k8s_version,
        ms(percentile(&took, 0.5)),
        ms(percentile(&took, 0.99)),
        ms(took[0]),
        ms(took[CHANGES - 1]),
    );
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

#[test]
#[ignore = "minutes: 10,000 Services through the real API server"]
fn ten_thousand_lb_services_agent_rss_and_time_to_converge() {
    const N: usize = 10_000;
    let Some(mut rn) = RealNode::start(KubeProxyMode::Nftables) else {
        return;
    };
    rn.start_agent(&[]);
    let idle = rss_kib(rn.agent().pid());
    let c = &rn.cluster;
    // Spread over namespaces as a cluster's are: one namespace may hold at most
    // `--max-frontends-per-namespace` (4,096 by default) frontends.
    const NAMESPACES: usize = 4;
    for n in 0..NAMESPACES {
        c.ensure_namespace(&format!("many-{n}"));
    }
    let client = c.client();
    let created = Instant::now();
    // Services with their status, 32 requests in flight.
    c.block_on(async {
        use futures::StreamExt;
        futures::stream::iter(0..N)
            .map(|i| {
                let client = client.clone();
                async move {
                    let ip = format!("198.18.{}.{}", 1 + i / 250, 1 + i % 250);
                    hairpin_tests::cluster::objects::create_service_with_status(
                        &client,
                        &format!("many-{}", i % NAMESPACES),
                        &format!("lb-{i}"),
                        &ip,
                    )
                    .await;
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    });
    let created_in = created.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    let converged = loop {
        let s = status(&rn.node);
        let n = s["frontends"].as_array().map_or(0, Vec::len);
        if n >= N {
            break created.elapsed();
        }
        assert!(Instant::now() < deadline, "{n} of {N} frontends");
        std::thread::sleep(Duration::from_millis(500));
    };
    let rss = rss_kib(rn.agent().pid());
    eprintln!(
        "{N} LB Services (real API server, Kubernetes {}): created in {:.1} s; agent converged \
         {:.1} s after the first create; RSS {:.1} MiB (idle {:.1} MiB)",
        rn.cluster.bins.k8s_version,
        created_in.as_secs_f64(),
        converged.as_secs_f64(),
        rss as f64 / 1024.0,
        idle as f64 / 1024.0
    );
}
