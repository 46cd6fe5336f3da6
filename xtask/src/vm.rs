//! The kernel matrix: the datapath suites, built on this machine, run as root inside
//! small VMs booting Debian's kernels (6.1, 6.12) with this machine's root shared
//! read-only, the way Cilium's CI runs its datapath tests in little VMs.
//!
//! The VM runs the same test binaries against its own kernel: what a kernel's
//! verifier refuses, or a feature it lacks, fails there. Emulation (TCG) makes a
//! network check about 15 times slower than on the host, so the VMs run a bounded
//! subset ([`SUITES`]) under hard timeouts.

mod initramfs;
mod kernel;
mod qemu;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub(crate) use kernel::{Series, ensure as ensure_kernel};

/// Debian packages the VMs need: qemu (its x86 system emulator), busybox's static
/// build for the initramfs, cpio to pack it, kmod's depmod and modprobe.
pub(crate) const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("busybox-static", initramfs::BUSYBOX),
    ("cpio", "/usr/bin/cpio"),
    ("kmod", "/usr/sbin/depmod"),
];

/// A suite the VMs run: the test target and the filter arguments its binary gets
/// (`--skip`, names).
pub(crate) struct Suite {
    /// The `[[test]]` target of hairpin-tests.
    pub(crate) target: &'static str,
    /// Arguments to the test binary.
    pub(crate) args: &'static [&'static str],
}

/// What the VMs run, chosen for coverage per emulated second (a check costs about
/// 15 times its native time under TCG): the programs load and attach and the kernel
/// path writes v1 and v2 headers, v4 and v6, pods and node processes, root and the
/// DaemonSet's capabilities (kernel_path's headers), and a mesh's capture listener
/// is seen after a cached "none" (sock_ops' listen callback); the datapath outlives the agent
/// (a socket opened before a kill -9 gets its header from the pinned datapath); the
/// relay path and the kernel path through kube-proxy's DNAT, v4 and v6, v1 and v2
/// (datapath); the relay's slots serve their own frontend only (relay_slots'
/// quarantine); beside a socket load balancer (socket_lb). Filters are libtest's:
/// a test runs when its name contains any of them.
pub(crate) const SUITES: &[Suite] = &[
    Suite {
        target: "kernel_path",
        args: &[
            "headers::",
            "drain::a_socket_not_yet_written_when_the_agent_is_killed",
            "status::status_and_metrics_show_the_kernel_path",
            "fallbacks::a_capture_listener_after_a_cached_none",
        ],
    },
    Suite {
        target: "datapath",
        args: &[
            "with_hairpin_pod_and_node_requests_carry_the_true_client",
            "ipv6_and_proxy_v2_frontends_work_from_pod_and_node",
        ],
    },
    Suite {
        target: "relay_slots",
        args: &["a_frontend_back_within_its_quarantine"],
    },
    Suite {
        target: "socket_lb",
        args: &[],
    },
];

/// Tests a kernel is known not to pass, each with why: skipped there by name and
/// said on the console, so the matrix stays a gate for everything else. Each is a
/// gap of hairpin's on that kernel, listed in README's kernel table.
/// None today: on 6.1, which cannot order cgroup links, the connect programs go at
/// the child cgroups beside a socket LB (docs/architecture.md, "Beside a socket
/// load balancer") and socket_lb passes whole.
pub(crate) const KNOWN_GAPS: &[(Series, &str, &str)] = &[];

/// Memory per VM: the agent, nginx and haproxy in a few namespaces.
const MEMORY_MIB: u32 = 2048;

/// The hard limit per VM (boot, every suite, power-off). Measured warm while three
/// other builds shared the two cores: see README's kernel table.
const VM_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A suite's limit inside the VM (coreutils `timeout`, then SIGKILL 10 s later).
const SUITE_TIMEOUT_SECS: u64 = 6 * 60;

/// A test binary built on the host, by target name.
pub(crate) struct Built {
    /// The suite it runs.
    pub(crate) target: String,
    /// Its path (the same inside the VM: the host's root is the VM's).
    pub(crate) exe: PathBuf,
}

/// Builds the VM suites' test binaries (`cargo test --no-run`) and returns them.
pub(crate) fn build_suites(object: &Path) -> Result<Vec<Built>> {
    let mut cmd = crate::cargo();
    cmd.args([
        "test",
        "--locked",
        "--no-run",
        "--package",
        "hairpin-tests",
        "--message-format=json-render-diagnostics",
    ]);
    for s in SUITES {
        cmd.args(["--test", s.target]);
    }
    cmd.env("HAIRPIN_EBPF_OBJECT", object);
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("failed to run cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the VM suites failed: {}", out.status);
    }
    let mut built = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str())
        else {
            continue;
        };
        if SUITES.iter().any(|s| s.target == name) {
            built.push(Built {
                target: name.to_string(),
                exe: PathBuf::from(exe),
            });
        }
    }
    for s in SUITES {
        if !built.iter().any(|b| b.target == s.target) {
            bail!("cargo built no test binary for {}", s.target);
        }
    }
    // In the order of SUITES (cargo reports them as they finish).
    built.sort_by_key(|b| SUITES.iter().position(|s| s.target == b.target));
    Ok(built)
}

/// What one kernel's run gave.
pub(crate) struct Outcome {
    /// The series.
    pub(crate) series: Series,
    /// `uname -r`.
    pub(crate) release: String,
    /// Per suite: name, exit status, tests passed, failed, ignored.
    pub(crate) suites: Vec<SuiteResult>,
    /// Time to the init's first line.
    pub(crate) to_userspace: Option<Duration>,
    /// The whole VM, boot to power-off.
    pub(crate) total: Duration,
    /// Where the console went.
    pub(crate) log: PathBuf,
}

/// One suite's result inside a VM.
#[derive(Debug, Default)]
pub(crate) struct SuiteResult {
    /// The test target.
    pub(crate) target: String,
    /// The binary's exit status (124: the suite's timeout).
    pub(crate) status: Option<i32>,
    /// Counts from the harness's `test result:` line.
    pub(crate) passed: u32,
    /// Failed tests.
    pub(crate) failed: u32,
    /// Ignored tests.
    pub(crate) ignored: u32,
    /// Seconds the suite took inside the VM.
    pub(crate) seconds: Option<u64>,
}

/// Runs `suites` as root in a VM booting `series`; `env` is passed to every test
/// binary, `args` appended to each one's own.
pub(crate) fn run(
    series: Series,
    suites: &[Built],
    env: &[(String, String)],
    args: &[String],
) -> Result<Outcome> {
    let kernel = kernel::ensure(series)?;
    let dir = qemu::work_dir(&crate::target_dir(), &kernel)?;
    let script = script(series, suites, env, args)?;
    let initrd = initramfs::build(&kernel, &script, &dir)?;
    let log = dir.join("console.log");
    eprintln!(
        "xtask: booting Linux {} ({}) under qemu (TCG) for {} suites; console in {}",
        series.name(),
        kernel.release,
        suites.len(),
        log.display()
    );
    let boot = qemu::boot(&kernel, &initrd, MEMORY_MIB, VM_TIMEOUT, &log)?;
    let suites = parse_results(&boot.console);
    let outcome = Outcome {
        series,
        release: kernel.release.clone(),
        suites,
        to_userspace: boot.to_userspace,
        total: boot.total,
        log,
    };
    eprintln!("{}", summary(&outcome));
    if boot.status != 0 {
        let failed: Vec<&str> = outcome
            .suites
            .iter()
            .filter(|s| s.status != Some(0))
            .map(|s| s.target.as_str())
            .collect();
        bail!(
            "the suites failed inside the Linux {} VM ({}): {} (status {}); console log {}",
            series.name(),
            kernel.release,
            if failed.is_empty() {
                "before any suite ran".to_string()
            } else {
                failed.join(", ")
            },
            boot.status,
            outcome.log.display()
        );
    }
    Ok(outcome)
}

/// The shell script the VM runs inside the host's root: each suite under its
/// timeout, bracketed by marker lines the host parses.
fn script(
    series: Series,
    suites: &[Built],
    env: &[(String, String)],
    args: &[String],
) -> Result<String> {
    let tests_dir = crate::workspace_root().join("tests");
    let mut s = String::new();
    writeln!(s, "cd '{}' || exit 126", tests_dir.display())?;
    // Waits for an agent or a server to settle stretch by this (tests/src/wait.rs):
    // emulation is about 15 times slower than the host, and two suites' agents start
    // side by side.
    writeln!(s, "export CI=true RUST_BACKTRACE=1 HAIRPIN_TEST_SLOWDOWN=4")?;
    for (k, v) in env {
        writeln!(s, "export {k}='{}'", v.replace('\'', r"'\''"))?;
    }
    writeln!(s, "fail=0")?;
    for b in suites {
        let own = SUITES
            .iter()
            .find(|x| x.target == b.target)
            .map_or(&[][..], |x| x.args);
        // Arguments after `--` replace the suite's own filters.
        let chosen: Vec<String> = if args.is_empty() {
            own.iter().map(|a| (*a).to_string()).collect()
        } else {
            args.to_vec()
        };
        let quoted: Vec<String> = chosen
            .into_iter()
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect();
        let mut quoted = quoted;
        for (_, test, why) in KNOWN_GAPS.iter().filter(|(k, _, _)| *k == series) {
            let line = format!(
                "hairpin-vm: skipping {test} on Linux {}: {why}",
                series.name()
            );
            writeln!(s, "echo '{}'", line.replace('\'', r"'\''"))?;
            quoted.push("--skip".to_string());
            quoted.push(format!("'{test}'"));
        }
        writeln!(s, "echo 'HAIRPIN-VM-SUITE-BEGIN {}'", b.target)?;
        writeln!(s, "t0=$(date +%s)")?;
        writeln!(
            s,
            "timeout -k 10 {SUITE_TIMEOUT_SECS} '{}' {} 2>&1",
            b.exe.display(),
            quoted.join(" ")
        )?;
        writeln!(s, "rc=$?")?;
        writeln!(
            s,
            "echo \"HAIRPIN-VM-SUITE-END {} rc=$rc secs=$(( $(date +%s) - t0 ))\"",
            b.target
        )?;
        writeln!(s, "[ $rc -eq 0 ] || fail=1")?;
    }
    writeln!(s, "exit $fail")?;
    Ok(s)
}

/// The suites' results from the console: markers and libtest's summary lines.
fn parse_results(console: &[String]) -> Vec<SuiteResult> {
    let mut out: Vec<SuiteResult> = Vec::new();
    let mut current: Option<SuiteResult> = None;
    for line in console {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("HAIRPIN-VM-SUITE-BEGIN ") {
            current = Some(SuiteResult {
                target: name.to_string(),
                ..SuiteResult::default()
            });
        } else if let Some(rest) = line.strip_prefix("HAIRPIN-VM-SUITE-END ") {
            if let Some(mut r) = current.take() {
                for field in rest.split_whitespace() {
                    if let Some(v) = field.strip_prefix("rc=") {
                        r.status = v.parse().ok();
                    } else if let Some(v) = field.strip_prefix("secs=") {
                        r.seconds = v.parse().ok();
                    }
                }
                out.push(r);
            }
        } else if let Some(rest) = line.strip_prefix("test result: ")
            && let Some(r) = current.as_mut()
        {
            // `ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.2s`
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u32>() else { continue };
                match what {
                    "passed" => r.passed += n,
                    "failed" => r.failed += n,
                    "ignored" => r.ignored += n,
                    _ => {}
                }
            }
        }
    }
    // A suite cut off by the VM's end: its counts so far, no status.
    out.extend(current);
    out
}

/// One paragraph per kernel: release, times, each suite's counts.
pub(crate) fn summary(o: &Outcome) -> String {
    let mut s = format!(
        "xtask: Linux {} ({}): {}s in the VM, userspace after {}",
        o.series.name(),
        o.release,
        o.total.as_secs(),
        o.to_userspace
            .map_or("?".to_string(), |d| format!("{:.1}s", d.as_secs_f64()))
    );
    for r in &o.suites {
        let _ = write!(
            s,
            "\n  {:<12} {:>3} passed {:>2} failed {:>2} ignored  {}s  status {}",
            r.target,
            r.passed,
            r.failed,
            r.ignored,
            r.seconds.map_or("?".to_string(), |x| x.to_string()),
            r.status.map_or("none".to_string(), |x| x.to_string())
        );
    }
    s
}

/// Runs the VM suites on each of `series`, one VM after the other; fails after all
/// ran when any failed.
pub(crate) fn matrix(
    series: &[Series],
    object: &Path,
    env: &[(String, String)],
    args: &[String],
) -> Result<()> {
    crate::prereqs::ensure_packages(PACKAGES)?;
    let built = build_suites(object)?;
    let start = Instant::now();
    let mut errors = Vec::new();
    let mut done = Vec::new();
    for s in series {
        match run(*s, &built, env, args) {
            Ok(o) => done.push(o),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    for o in &done {
        eprintln!("{}", summary(o));
    }
    eprintln!(
        "xtask: the kernel matrix took {}s",
        start.elapsed().as_secs()
    );
    if !errors.is_empty() {
        bail!("{}", errors.join("\n\n"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernels_known_gaps_are_skipped_by_name_and_said() {
        let built = [Built {
            target: "socket_lb".into(),
            exe: PathBuf::from("/t/socket_lb-1"),
        }];
        // Each kernel skips exactly its own known gaps (none today), each by name.
        for series in [Series::V6_1, Series::V6_12] {
            let s = script(series, &built, &[], &[]).expect("script");
            let gaps: Vec<_> = KNOWN_GAPS.iter().filter(|(k, _, _)| *k == series).collect();
            for (_, test, _) in &gaps {
                assert!(s.contains(&format!("--skip '{test}'")), "{s}");
            }
            assert_eq!(s.matches("--skip").count(), gaps.len(), "{s}");
        }
    }

    #[test]
    fn results_are_read_from_the_console() {
        let console: Vec<String> = [
            "HAIRPIN-VM-SUITE-BEGIN datapath",
            "running 3 tests",
            "test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 9.1s",
            "HAIRPIN-VM-SUITE-END datapath rc=0 secs=12",
            "HAIRPIN-VM-SUITE-BEGIN relay_slots",
            "test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "HAIRPIN-VM-SUITE-END relay_slots rc=101 secs=40",
        ]
        .map(String::from)
        .to_vec();
        let r = parse_results(&console);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].passed, r[0].failed, r[0].ignored), (2, 0, 1));
        assert_eq!((r[0].status, r[0].seconds), (Some(0), Some(12)));
        assert_eq!((r[1].passed, r[1].failed, r[1].status), (4, 1, Some(101)));
    }
}
