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

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("connect-loop") => return probes::connect_loop(&args[1..]),
        Some("connect-pairs") => return probes::connect_pairs(&args[1..]),
        Some("probe") => return probes::probe(&args[1..]),
        _ => {}
    }
    let opts = Options::parse(&args)?;
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
