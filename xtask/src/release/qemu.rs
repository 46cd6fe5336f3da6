//! The cross-built agent's own unit tests, run under Debian's qemu-user: the same
//! target, flags and release profile as the binary in the image (so they also reuse
//! its compiled dependencies), cargo's runner set to `qemu-<arch> -L <sysroot>`.
//!
//! qemu-user translates the instructions and passes system calls to this machine's
//! kernel; what it cannot pass on is listed in [`SKIPPED`] by exact name with the
//! reason, and everything else runs.

use anyhow::{Context, Result, bail, ensure};

use crate::{cargo, ebpf, image::Arch, prereqs};

/// Unit tests of `hairpin-agent` that cannot run under qemu-user, with why: each is
/// skipped by its exact name (`--skip NAME --exact`), every other test runs.
pub(crate) const SKIPPED: &[(&str, &str)] = &[
    (
        "datapath::sys::tests::a_path_that_is_not_pinned_is_an_error_not_a_descriptor",
        "calls bpf(BPF_OBJ_GET); qemu-user (Debian's 7.2) implements no bpf() and answers \
         ENOSYS (os error 38)",
    ),
    (
        "relay::peer_owner::tests::a_node_peer_is_keyed_by_the_uid_owning_its_socket",
        "opens a NETLINK_SOCK_DIAG socket; qemu-user passes on netlink sockets of the \
         route, uevent and audit families only and answers EPROTONOSUPPORT (os error 93)",
    ),
    (
        "relay::listener::tests::the_nodes_own_processes_are_capped_per_uid",
        "finds the peer's uid over NETLINK_SOCK_DIAG, which qemu-user refuses \
         (EPROTONOSUPPORT, os error 93): every peer is then HostUnknown",
    ),
];

/// What one run of the unit tests counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Tests that passed.
    pub(crate) passed: u32,
    /// Tests skipped by [`SKIPPED`] (filtered out) or ignored in the source.
    pub(crate) skipped: u32,
}

/// Builds and runs `hairpin-agent`'s library unit tests for `arch` under qemu-user;
/// fails when any fails. Returns the counts.
pub(crate) fn unit_tests(arch: Arch) -> Result<Counts> {
    prereqs::ensure_image_packages()?;
    arch.ensure_toolchain()?;
    let object = ebpf::build(&ebpf::Options::default())?;
    let var = arch.triple().to_uppercase().replace('-', "_");
    let runner = format!("{} -L {}", arch.qemu(), arch.sysroot().display());
    let started = std::time::Instant::now();
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--locked",
        "--release",
        "--package",
        "hairpin-agent",
    ])
    .args(["--lib", "--target", arch.triple()])
    .env("HAIRPIN_EBPF_OBJECT", &object)
    .envs(arch.cargo_env()?)
    .env(format!("CARGO_TARGET_{var}_RUNNER"), &runner)
    .args(["--", "--exact"]);
    for (name, _) in SKIPPED {
        cmd.args(["--skip", name]);
    }
    // Cargo's progress to the terminal; libtest's report kept to count it.
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    let report = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!("{report}");
        bail!(
            "hairpin-agent's unit tests failed for {} under {runner}: {}",
            arch.platform(),
            out.status
        );
    }
    let counts = parse_counts(&report)?;
    ensure!(
        counts.skipped as usize >= SKIPPED.len(),
        "{} tests skipped, expected at least the {} listed",
        counts.skipped,
        SKIPPED.len()
    );
    eprintln!(
        "xtask: hairpin-agent's unit tests for {} under {runner}: {} passed, {} skipped ({:.0} s)",
        arch.platform(),
        counts.passed,
        counts.skipped,
        started.elapsed().as_secs_f64()
    );
    Ok(counts)
}

/// The counts of libtest's summary line (`test result: ok. 5 passed; 0 failed;
/// 1 ignored; 0 measured; 2 filtered out; ...`).
pub(crate) fn parse_counts(out: &str) -> Result<Counts> {
    let line = out
        .lines()
        .find(|l| l.starts_with("test result: "))
        .context("the test binary printed no `test result:` line")?;
    let field = |name: &str| -> Result<u32> {
        line.split(['.', ';'])
            .map(str::trim)
            .find_map(|f| f.strip_suffix(name).map(str::trim))
            .with_context(|| format!("no {name:?} in {line:?}"))?
            .parse()
            .with_context(|| format!("{name:?} in {line:?}"))
    };
    Ok(Counts {
        passed: field("passed")?,
        skipped: field("ignored")? + field("filtered out")?,
    })
}
