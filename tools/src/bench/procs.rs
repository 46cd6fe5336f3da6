//! Processes the bench starts, CPU placement, and what it reads about them.
//!
//! Every process is owned by a [`Proc`] that stops it on drop, so a panic in
//! the middle of a case leaves no nginx, haproxy or agent behind (the SimNode's
//! own drop then kills whatever is still in its namespaces).

use std::{
    fs,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

/// A child process, SIGTERMed (then SIGKILLed) on drop.
pub struct Proc {
    child: Option<Child>,
    /// What it is, for messages.
    pub name: &'static str,
    log: std::path::PathBuf,
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr sent to `log`.
    pub fn spawn(name: &'static str, mut cmd: Command, log: &std::path::Path) -> Result<Proc> {
        let out = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        Ok(Proc {
            child: Some(child),
            name,
            log: log.to_path_buf(),
        })
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Fails when the process has already exited (a bad config, a port in use).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(status) = c.try_wait()?
        {
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            anyhow::bail!("{} exited early: {status}\n{log}", self.name);
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGTERM first: nginx's master only takes its workers down on a signal it can catch.
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Restricts this process (and so every child it starts afterwards) to `cpu`.
pub fn pin_self(cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
        }
    }
    Ok(())
}

/// Raises RLIMIT_NOFILE for this process and its future children: nginx, HAProxy
/// and the relay hold two descriptors per connection under load, more than the
/// usual 1,024.
/// Without CAP_SYS_RESOURCE (a container) only the soft limit can rise, to the hard
/// one. Returns the soft limit in force.
pub fn raise_nofile(want: u64) -> Result<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read or write a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return Err(std::io::Error::last_os_error()).context("getrlimit(RLIMIT_NOFILE)");
        }
        let up = libc::rlimit {
            rlim_cur: want,
            rlim_max: want.max(rl.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &up) == 0 {
            return Ok(want);
        }
        let soft = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft) != 0 {
            return Err(std::io::Error::last_os_error()).context("setrlimit(RLIMIT_NOFILE)");
        }
    }
    Ok(rl.rlim_max)
}

/// VmRSS of `pid` in KiB, from /proc/PID/status.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time `pid` has used so far, user and system (which includes the softirq work
/// its own sends trigger on this CPU), in microseconds.
pub fn cpu_us(pid: i32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: utime and stime are the
    // 14th and 15th of the whole line, the 12th and 13th after the ')'.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let (utime, stime): (u64, u64) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
    Some((utime + stime) as f64 * 1e6 / clk_tck()?)
}

/// The machine, for the report: CPU count, kernel, CPU model.
pub fn machine() -> String {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let model = fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(String::new(), |k| format!(", {} GiB RAM", k / 1024 / 1024));
    // Other work on the machine skews every figure: say how busy it was.
    let load = fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "nproc {}, kernel {}, CPU {model}{mem}; 1-5-15 min load average {load}",
        num_cpus_online(),
        kernel.trim()
    )
}

/// Version line of a tool (`wrk -v`, `haproxy -v`, `nginx -v`), for the report.
pub fn tool_version(argv: &[&str]) -> String {
    Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_else(|_| "not found".into())
}

/// CPUs online (not just this process's affinity, which the bench narrows).
fn num_cpus_online() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1)
}

/// The kernel's clock ticks per second, the unit of /proc/PID/stat and /proc/stat.
fn clk_tck() -> Option<f64> {
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    (tck > 0).then_some(tck as f64)
}

/// One CPU's time in µs, from /proc/stat: accumulated since boot ([`cpu_times`]) or
/// over an interval ([`cpu_deltas`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTime {
    /// user, nice, system, irq and softirq (guest time is counted inside user).
    pub busy_us: f64,
    /// Time the hypervisor ran something else while this CPU wanted to run.
    pub steal_us: f64,
    /// Every field: busy, idle, iowait and steal.
    pub total_us: f64,
}

/// Each CPU's accumulated time so far, in /proc/stat order (`cpu0`, `cpu1`, ...).
pub fn cpu_times() -> Option<Vec<CpuTime>> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_times(&stat, clk_tck()?)
}

/// The per-CPU lines of a /proc/stat text: `cpuN user nice system idle iowait irq
/// softirq steal guest guest_nice`, in `tck` ticks per second.
fn parse_cpu_times(stat: &str, tck: f64) -> Option<Vec<CpuTime>> {
    let mut cpus = Vec::new();
    for line in stat.lines() {
        let mut f = line.split_whitespace();
        let Some(name) = f.next() else { continue };
        if name == "cpu" || !name.starts_with("cpu") {
            continue;
        }
        let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = v[..] else {
            return None;
        };
        let us = |t: u64| t as f64 * 1e6 / tck;
        cpus.push(CpuTime {
            busy_us: us(user + nice + system + irq + softirq),
            steal_us: us(steal),
            total_us: us(user + nice + system + idle + iowait + irq + softirq + steal),
        });
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// What each CPU spent between two [`cpu_times`] reads.
pub fn cpu_deltas(before: &[CpuTime], after: &[CpuTime]) -> Vec<CpuTime> {
    before
        .iter()
        .zip(after)
        .map(|(a, b)| CpuTime {
            busy_us: b.busy_us - a.busy_us,
            steal_us: b.steal_us - a.steal_us,
            total_us: b.total_us - a.total_us,
        })
        .collect()
}

/// Whether `perf stat` can count cycles and instructions here, as a note for the
/// report: the counted cost per request would use them, but a guest without a
/// virtual PMU counts neither, and the note says so with perf's own words.
pub fn perf_counters() -> String {
    let out = Command::new("perf")
        .args(["stat", "-x", ",", "-e", "cycles,instructions", "true"])
        .stdout(Stdio::null())
        .output();
    let text = match out {
        Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
        Err(e) => {
            return format!(
                "Cycles and instructions per request: not measured, `perf` did not start: {e}."
            );
        }
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines
        .iter()
        .any(|l| l.contains("<not supported>") || l.contains("<not counted>"))
        || lines.is_empty()
    {
        return format!(
            "Cycles and instructions per request: not measured. This machine has no hardware performance counters for perf (no `cpu` PMU in /sys/bus/event_source/devices: {}): `perf stat -x, -e cycles,instructions true` prints `{}`. The counted costs are the machine's CPU time per request from /proc/stat over every request of a run, the programs' own run time (kernel BPF statistics) and the instructions the verifier processed loading each program.",
            fs::read_dir("/sys/bus/event_source/devices")
                .map(|d| {
                    let mut v: Vec<String> = d
                        .filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect();
                    v.sort();
                    v.join(", ")
                })
                .unwrap_or_default(),
            lines.join(" / ")
        );
    }
    format!(
        "Cycles and instructions: `perf stat` counts them here (`{}`), but the bench does not measure them per request yet.",
        lines.join(" / ")
    )
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn per_cpu_lines_are_read_and_the_summary_line_is_not() {
        let stat = "cpu  100 0 50 1000 5 0 10 20 0 0\n\
                    cpu0 60 1 30 400 2 3 4 5 0 0\n\
                    cpu1 40 0 20 600 3 0 6 15 0 0\n\
                    intr 12345\nctxt 999\n";
        let c = parse_cpu_times(stat, 100.0).unwrap();
        assert_eq!(c.len(), 2);
        // 60+1+30+3+4 ticks of 10 ms.
        assert_eq!(c[0].busy_us, 980_000.0);
        assert_eq!(c[0].steal_us, 50_000.0);
        assert_eq!(c[0].total_us, 5_050_000.0);
        assert_eq!(c[1].busy_us, 660_000.0);
        let d = cpu_deltas(&c, &[c[1], c[0]]);
        assert_eq!(d[0].busy_us, -320_000.0);
        assert!(parse_cpu_times("cpu0 1 2\n", 100.0).is_none());
        assert!(parse_cpu_times("intr 1\n", 100.0).is_none());
    }
}
