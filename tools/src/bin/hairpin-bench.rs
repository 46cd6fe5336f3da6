//! `cargo xtask bench`: measures hairpin against HAProxy `send-proxy` and a direct
//! path on a simulated node, prints the table and writes BENCHMARKS.md.
//!
//! Also the child the bench re-executes inside the pod: `connect-loop`, `connect-pairs` and `probe`.

use anyhow::{Context, Result};
use hairpin_tools::bench::{
    self,
    options::Options,
    probes,
    procs::{machine, tool_version},
    report,
};

/// SIGINT, SIGTERM and SIGHUP ask the bench to stop ([`bench::interrupt`]): the case
/// running ends at its next client run and every owner's teardown runs (the node's
/// namespaces and cgroups, the agents and their pins, nginx, HAProxy). A second one
/// exits at once; the next bench or test run sweeps what a dead bench left.
/// Blocked here, before any thread starts (threads inherit the mask; children get
/// the default mask back from `Command`), and taken by one waiting thread.
fn teardown_on_signals() -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals
        .thread_block()
        .context("block SIGINT, SIGTERM and SIGHUP")?;
    std::thread::spawn(move || {
        let mut asked = false;
        while let Ok(signal) = signals.wait() {
            if asked {
                eprintln!("{signal:?} again: exiting without the teardown");
                std::process::exit(130);
            }
            asked = true;
            eprintln!("{signal:?}: stopping after this client run and tearing the node down");
            bench::interrupt();
        }
    });
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("connect-loop") => return probes::connect_loop(&args[1..]),
        Some("connect-pairs") => return probes::connect_pairs(&args[1..]),
        Some("probe") => return probes::probe(&args[1..]),
        _ => {}
    }
    let opts = Options::parse(&args)?;
    teardown_on_signals()?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!(
            "the bench builds network namespaces and attaches BPF programs: run it as root"
        );
    }
    let started = std::time::Instant::now();
    let machine_before = machine();
    let results = bench::run(&opts)?;
    let tools = [
        tool_version(&["wrk", "-v"]),
        tool_version(&["haproxy", "-v"]),
        tool_version(&["nginx", "-v"]),
    ];
    let text = report::render(
        &results,
        &opts,
        &format!(
            "{machine_before} at the start; at the end {}",
            machine().rsplit("average ").next().unwrap_or("")
        ),
        &tools,
    );
    println!("{text}");
    eprintln!("bench took {:.0} s", started.elapsed().as_secs_f64());
    if let Some(out) = &opts.out {
        // Sections other runs measured (the real control plane's) are carried over.
        let previous = std::fs::read_to_string(out).unwrap_or_default();
        let kept = report::kept_sections(&previous);
        let text = if kept.is_empty() {
            text
        } else {
            format!("{}\n\n{kept}", text.trim_end())
        };
        std::fs::write(out, &text).with_context(|| format!("write {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if !results.failures.is_empty() {
        anyhow::bail!("{} case(s) failed; see above", results.failures.len());
    }
    Ok(())
}
