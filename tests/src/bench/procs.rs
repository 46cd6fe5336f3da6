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

/// Raises RLIMIT_NOFILE for this process and its future children: the agent opens
/// one listener per frontend, 10,000 frontends need more than the usual 1,024.
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
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)?;
    Some((utime + stime) as f64 * 1e6 / tck as f64)
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
