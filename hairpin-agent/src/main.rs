//! The hairpin-agent binary.

use std::io::IsTerminal;

use clap::{Parser, Subcommand, ValueEnum};
use hairpin_agent::cli::Exit;
use tracing_subscriber::EnvFilter;

/// The version this binary reports (`--version`, `/status`, `hairpin_build_info`):
/// the crate's, unless it was built with `HAIRPIN_BUILD_VERSION` set (`cargo xtask
/// image --agent-version`: a release candidate, or the second version the upgrade
/// scenario rolls to). Read here, in the binary's crate, so that another value
/// recompiles this file and not the library.
const VERSION: &str = match option_env!("HAIRPIN_BUILD_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

// A version string goes into image labels, Helm's appVersion and a Prometheus
// label: refuse the build rather than ship one that breaks them.
const _: () = assert!(
    is_version(VERSION),
    "HAIRPIN_BUILD_VERSION: expected 1 to 64 of 0-9, A-Z, a-z, '.', '-', '+'"
);

/// Whether `v` is 1 to 64 characters of what SemVer versions are made of.
const fn is_version(v: &str) -> bool {
    let b = v.as_bytes();
    if b.is_empty() || b.len() > 64 {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if !(b[i].is_ascii_alphanumeric() || matches!(b[i], b'.' | b'-' | b'+')) {
            return false;
        }
        i += 1;
    }
    true
}

#[derive(Parser)]
#[command(
    name = "hairpin-agent",
    version = VERSION,
    about = "Makes in-cluster traffic to the cluster's own PROXY-protocol LoadBalancers work"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `hairpin_agent=debug`.
    #[arg(long, env = "HAIRPIN_LOG", default_value = "info", global = true)]
    log: String,

    /// Log format.
    #[arg(long, env = "HAIRPIN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: attach the programs, proxy the frontends, until SIGTERM.
    Run(Box<hairpin_agent::agent::RunArgs>),
    /// Write CoreDNS rewrites for the routed hostnames: the writer Deployment, apart from the DaemonSet.
    CorednsWriter(Box<hairpin_agent::agent::CorednsWriterArgs>),
    /// Show what the agent on this node is doing (or what the kernel says when it is down).
    Status(hairpin_agent::cli::StatusArgs),
    /// Say whether in-cluster requests to a host or IP work, and why not.
    Check(hairpin_agent::cli::CheckArgs),
    /// Check that this node can run hairpin: kernel, BPF, cgroup v2, capabilities, kube-proxy.
    Doctor(hairpin_agent::cli::DoctorArgs),
    /// Ask this node's agent /healthz (or /readyz) over its admin socket: the DaemonSet's exec probes.
    Health(hairpin_agent::cli::HealthArgs),
    /// Print hairpin's BPF maps and counters, raw.
    Dump(hairpin_agent::cli::DumpArgs),
    /// Remove everything hairpin wrote: the hosts block, the names address, CoreDNS lines, the Lease.
    Cleanup(Box<hairpin_agent::cli::CleanupArgs>),
    /// Remove hairpin from the cluster in an order that leaves it as it was (the uninstall Job).
    Uninstall(Box<hairpin_agent::cli::UninstallArgs>),
}

/// One glibc malloc arena for the whole process, set before any thread starts.
///
/// glibc gives threads up to eight arenas per core, and memory freed in one arena
/// serves only the threads using it. The runtime's workers take turns accepting, so
/// the buffers a flood of held connections left free in one arena went unused when
/// the next flood was accepted on another: the same 2,500 held connections cost 31 to
/// 42 KiB each from one run to the next (tests/tests/reliability/flood.rs), and on a
/// node with many cores the gap grows with the arenas. With one arena they cost the
/// same every run. The hot paths' small allocations stay per thread (glibc's tcache).
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a malloc parameter; called first in main, before
    // any other thread exists. A refusal (0) leaves glibc's default, which works.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() {
    one_malloc_arena();
    // A usage error is clap's status 2 (Exit::Usage); every other status is the
    // subcommand's verdict, and a failure of the command itself is Exit::Failed, so
    // that no status means two things (README, "Debugging a node").
    hairpin_agent::status::set_build_version(VERSION);
    let cli = Cli::parse();
    // The long-running commands take their settings from the environment (the
    // DaemonSet's and the writer's env): a misspelt variable is refused, not dropped.
    let started = match &cli.command {
        Command::Run(_) => Some("run"),
        Command::CorednsWriter(_) => Some("coredns-writer"),
        _ => None,
    };
    if let Some(subcommand) = started
        && let Err(e) = hairpin_agent::agent::check_env(
            std::env::vars_os(),
            &env_names(&<Cli as clap::CommandFactory>::command()),
            subcommand,
        )
    {
        eprintln!("Error: {e}");
        std::process::exit(Exit::Usage.code());
    }
    if let Err(e) = run(cli) {
        eprintln!("Error: {e:#}");
        // A `check` target that does not parse is a usage error like clap's own.
        let usage = matches!(
            e.downcast_ref::<hairpin_agent::cli::CliError>(),
            Some(hairpin_agent::cli::CliError::Target(_))
        );
        std::process::exit(if usage { Exit::Usage } else { Exit::Failed }.code());
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&cli.log)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: container logs are files.
        .with_ansi(std::io::stderr().is_terminal());
    // init() also installs tracing-log's LogTracer (the `tracing-log` feature): `log`
    // records reach this subscriber and its filter, among them the programs'
    // diagnostic events, which aya-log reads from their ring buffer (target
    // `hairpin_ebpf::programs`).
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    match cli.command {
        Command::Run(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            Ok(rt.block_on(hairpin_agent::agent::run(*args))?)
        }
        Command::CorednsWriter(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            Ok(rt.block_on(hairpin_agent::agent::run_coredns_writer(*args))?)
        }
        // The node subcommands exit with their verdict: scripts branch on it.
        Command::Status(args) => exit(hairpin_agent::cli::show_status(&args)?),
        Command::Check(args) => exit(hairpin_agent::cli::check_target(&args)?),
        Command::Doctor(args) => exit(hairpin_agent::cli::diagnose(&args)?),
        Command::Health(args) => exit(hairpin_agent::cli::probe(&args)),
        Command::Dump(args) => exit(hairpin_agent::cli::dump_maps(&args)?),
        Command::Cleanup(args) => exit(hairpin_agent::cli::clean_up(&args)?),
        Command::Uninstall(args) => exit(hairpin_agent::cli::uninstall(&args)?),
    }
}

/// Every `env` name of `cmd`'s flags and its subcommands'.
fn env_names(cmd: &clap::Command) -> Vec<String> {
    let mut names: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    for sub in cmd.get_subcommands() {
        names.extend(env_names(sub));
    }
    names.sort();
    names.dedup();
    names
}

fn exit(code: i32) -> anyhow::Result<()> {
    if code == Exit::Ok.code() {
        return Ok(());
    }
    std::process::exit(code)
}
