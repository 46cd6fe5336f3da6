//! Scaffolding for the reliability suite: the `hairpin-load` upstream and clients
//! (see `src/bin/hairpin-load/`) on a [`SimNode`], and what the suite reads about
//! the agent process (resident memory, open descriptors).

use std::{
    fs,
    io::{BufRead, BufReader, Lines},
    path::PathBuf,
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    node::{INGRESS_IP4, INGRESS_IP6, LbRule, SimNode, default_lbs},
    sh::{command_in, output_in},
};

/// The LB the load and fault cases dial (kube-proxy DNATs it to the upstream).
pub const LOAD_LB4: &str = "203.0.113.20";
/// Its IPv6 twin.
pub const LOAD_LB6: &str = "2001:db8:ffff::20";
/// The `hairpin-load serve` port in the ingress namespace.
pub const UPSTREAM_PORT: u16 = 9000;

/// The default LBs plus LOAD_LB4:80 and LOAD_LB6:80 to the upstream.
pub fn load_lbs() -> Vec<LbRule> {
    let mut lbs = default_lbs();
    for lb_ip in [LOAD_LB4, LOAD_LB6] {
        lbs.push(LbRule {
            lb_ip,
            lb_port: 80,
            backend_port: UPSTREAM_PORT,
            name: "load/upstream:http",
        });
    }
    lbs
}

/// Path of the `hairpin-load` binary beside the test binary (cargo builds a
/// package's binaries before its integration tests), or HAIRPIN_LOAD_BIN.
pub fn load_bin() -> PathBuf {
    crate::agent::workspace_bin(
        "HAIRPIN_LOAD_BIN",
        "hairpin-load",
        "cargo builds it with the tests",
    )
}

/// A helper process, SIGKILLed on drop; its stdout is read line by line.
pub struct Helper {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// What it is, for messages.
    pub what: String,
}

impl Helper {
    fn spawn(mut cmd: Command, what: String) -> Helper {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        let out = child.stdout.take().expect("piped stdout");
        Helper {
            child,
            lines: BufReader::new(out).lines(),
            what,
        }
    }

    /// Starts `hairpin-load ARGS` in network namespace `netns`, outside the node's cgroup.
    pub fn in_netns(netns: &str, args: &[&str]) -> Helper {
        let bin = load_bin();
        let mut argv = vec![bin.to_str().expect("utf-8 path")];
        argv.extend_from_slice(args);
        let cmd = command_in(netns, None, &argv);
        Helper::spawn(cmd, format!("hairpin-load {}", args.join(" ")))
    }

    /// The next line it prints; panics when it exits first.
    pub fn line(&mut self) -> String {
        match self.lines.next() {
            Some(Ok(l)) => l,
            other => {
                let status = self.child.wait().ok();
                panic!(
                    "{} ended ({status:?}) instead of printing: {other:?}",
                    self.what
                )
            }
        }
    }

    /// Writes a line to its stdin.
    pub fn tell(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}").expect("write to helper");
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to exit successfully, at most `within`.
    pub fn wait_success(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait helper") {
                assert!(status.success(), "{} failed: {status}", self.what);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} still running after {within:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts the upstream in the ingress namespace on both of its addresses and waits
/// until it listens.
pub fn start_upstream(node: &SimNode) -> Helper {
    let v4 = format!("{INGRESS_IP4}:{UPSTREAM_PORT}");
    let v6 = format!("[{INGRESS_IP6}]:{UPSTREAM_PORT}");
    let mut h = Helper::in_netns(&node.ingress_ns, &["serve", &v4, &v6]);
    assert_eq!(h.line(), "listening");
    h
}

/// Starts `hairpin-load ARGS` as a pod process (pod namespace and cgroup).
pub fn pod_client(node: &SimNode, args: &[&str]) -> Helper {
    let bin = load_bin();
    let mut argv = vec![bin.to_str().expect("utf-8 path")];
    argv.extend_from_slice(args);
    let cmd = command_in(&node.pod_ns, Some(&node.pod_cgroup()), &argv);
    Helper::spawn(cmd, format!("hairpin-load {}", args.join(" ")))
}

/// `host:port` for a socket address string, bracketing IPv6.
pub fn addr(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// What the suite reads about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// Entries in /proc/PID/fd.
    pub fds: usize,
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, {} fds",
            self.rss_kib as f64 / 1024.0,
            self.fds
        )
    }
}

/// The footprint of `pid` now.
pub fn footprint(pid: i32) -> Footprint {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .count();
    Footprint { rss_kib, fds }
}

/// Polls `pid`'s descriptor count until it is `want`, at most `within`; returns the
/// last footprint and how long it took.
pub fn wait_for_fds(pid: i32, want: usize, within: Duration) -> (Footprint, Duration) {
    let started = Instant::now();
    loop {
        let f = footprint(pid);
        if f.fds == want || started.elapsed() >= within {
            return (f, started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// TCP connections in `netns` whose local port is `port`, in any state but LISTEN
/// and TIME-WAIT: connections still held by a process.
pub fn held_connections(netns: &str, port: u16) -> usize {
    let filter = format!("( sport = :{port} )");
    let out = output_in(
        netns,
        None,
        &[
            "ss",
            "-Htn",
            "state",
            "connected",
            "exclude",
            "time-wait",
            &filter,
        ],
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// The soft and hard RLIMIT_NOFILE of `pid`, from /proc/PID/limits.
pub fn nofile_limits(pid: i32) -> (u64, u64) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).expect("read /proc/PID/limits");
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .expect("Max open files in /proc/PID/limits");
    let mut v = line
        .split_whitespace()
        .map(|v| v.parse().expect("a number"));
    (v.next().expect("soft"), v.next().expect("hard"))
}

/// Polls `pid` until its RSS is at most `kib`, at most `within`; returns the last
/// footprint and how long it took.
pub fn wait_for_rss(pid: i32, kib: u64, within: Duration) -> (Footprint, Duration) {
    let started = Instant::now();
    loop {
        let f = footprint(pid);
        if f.rss_kib <= kib || started.elapsed() >= within {
            return (f, started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Raises this process's soft RLIMIT_NOFILE to at least `want`, or to the hard limit
/// when that is lower (raising the hard limit needs CAP_SYS_RESOURCE, which a
/// container's root may lack); children started afterwards inherit it. Returns the
/// soft limit now in force.
pub fn raise_nofile(want: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft >= want {
        return soft;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, want, hard.max(want)).is_ok() {
        return want;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
        .unwrap_or_else(|e| panic!("setrlimit(RLIMIT_NOFILE, {hard}): {e}"));
    hard
}

/// CLOCK_MONOTONIC in nanoseconds, as `hairpin-load` prints it: the agent's own
/// reading (the clock its heartbeat and the programs use).
pub use hairpin_agent::datapath::monotonic_ns;

/// Samples a process's footprint every 100 ms on a thread, keeping the largest.
pub struct PeakSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Footprint>>,
}

impl PeakSampler {
    /// Starts sampling `pid`.
    pub fn start(pid: i32) -> PeakSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = footprint(pid);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let now = footprint(pid);
                peak.rss_kib = peak.rss_kib.max(now.rss_kib);
                peak.fds = peak.fds.max(now.fds);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        PeakSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the largest RSS and descriptor count seen (each at its own time).
    pub fn peak(mut self) -> Footprint {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .expect("sampler running")
            .join()
            .expect("sampler thread")
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
