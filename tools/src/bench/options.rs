//! The bench's sizes: every one configurable, with a `--quick` smoke preset.

use anyhow::{Context, Result, bail};

/// How much each case measures.
#[derive(Clone, Debug)]
pub struct Options {
    /// Repetitions of each measurement (the spread is over these).
    pub runs: usize,
    /// Seconds per wrk run.
    pub wrk_secs: u32,
    /// wrk connections (one thread; the same for every target).
    pub wrk_connections: u32,
    /// Bytes per bulk transfer, in MiB.
    pub bulk_mib: u64,
    /// connect() calls per connect-overhead run.
    pub connects: u32,
    /// Frontends-file changes timed for convergence.
    pub changes: usize,
    /// Frontend counts for the footprint case.
    pub sizes: Vec<usize>,
    /// Hostnames for the name-routing footprint case (with the largest size's
    /// frontends); 0 skips it.
    pub hostnames: usize,
    /// Where the report goes; `None` prints only.
    pub out: Option<std::path::PathBuf>,
    /// The command line that produced the run, written into the report.
    pub command: String,
    /// `perf record` into this directory: the agent during the relay's first PROXY v1
    /// rate round and first bulk and upload transfers; the whole machine during the
    /// kernel-path run's first direct and kernel-path v1 rate rounds. Those rounds'
    /// figures then include perf's own cost.
    pub profile: Option<std::path::PathBuf>,
    /// The relay run's agent's `--relay-splice` (`None`: its default, `pipe`): `off`
    /// measures the copy, `auto` or `kernel` the kernel's splice.
    pub relay_splice: Option<String>,
    /// The baseline's agent binary and the revision it was built from (`--baseline`):
    /// the kernel path is measured with both agents, alternating round by round.
    pub baseline: Option<(std::path::PathBuf, String)>,
    /// Only the baseline comparison (`--baseline-only`): no other case runs.
    pub baseline_only: bool,
    /// Seconds of unrecorded wrk per target before the first round.
    pub warmup_secs: u32,
    /// Rounds of bulk and upload transfers (each moves `bulk_mib`).
    pub bulk_runs: usize,
    /// wrk runs per target with the BPF run-time statistics on.
    pub stats_runs: usize,
    /// Extra flags for the baseline's agent (`--baseline-args`, whitespace-separated):
    /// with this tree's own agent as the baseline, an A/B of one flag, e.g.
    /// `--mesh-capture-ports none` for what the mesh probes cost.
    pub baseline_args: Vec<String>,
    /// The A/A check only (`--aa`): the same target on both sides, `runs` rounds.
    pub aa_only: bool,
}

impl Options {
    /// The full run: about 10 minutes on 2 cores. 12 rounds of 2 s wrk runs: the
    /// paired ratios' interval narrows as 1/√rounds, and pairing cancels the slow
    /// drift that longer runs would only average, so rounds pay more than seconds.
    /// The A/A runs under the neighbours' load said 13 to 21 rounds for ±3% at 2 s;
    /// the A/A table of each run prints what its own spread needs.
    pub fn full() -> Options {
        Options {
            runs: 12,
            wrk_secs: 2,
            wrk_connections: 32,
            bulk_mib: 1024,
            connects: 20_000,
            changes: 20,
            sizes: vec![1_000, 10_000, 100_000],
            hostnames: 10_000,
            out: None,
            command: "cargo xtask bench".into(),
            profile: None,
            relay_splice: None,
            baseline: None,
            baseline_only: false,
            warmup_secs: 2,
            bulk_runs: 5,
            stats_runs: 3,
            aa_only: false,
            baseline_args: Vec::new(),
        }
    }

    /// `--aa`: the A/A check alone, about 2 minutes: 24 rounds of the same target
    /// twice, 2 s each.
    pub fn aa() -> Options {
        Options {
            runs: 24,
            command: "cargo xtask bench --aa".into(),
            aa_only: true,
            ..Options::full()
        }
    }

    /// The smoke run: every case once or twice, small, under a minute.
    pub fn quick() -> Options {
        Options {
            runs: 2,
            wrk_secs: 1,
            wrk_connections: 16,
            bulk_mib: 128,
            connects: 5_000,
            changes: 6,
            sizes: vec![1_000],
            hostnames: 1_000,
            out: None,
            command: "cargo xtask bench --quick".into(),
            profile: None,
            relay_splice: None,
            baseline: None,
            baseline_only: false,
            warmup_secs: 1,
            bulk_runs: 2,
            stats_runs: 1,
            aa_only: false,
            baseline_args: Vec::new(),
        }
    }

    /// Parses `args` (without the program name). `--quick` picks the smoke preset;
    /// the other flags override single sizes on top of the preset.
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut o = if args.iter().any(|a| a == "--quick") {
            Options::quick()
        } else if args.iter().any(|a| a == "--aa") {
            Options::aa()
        } else {
            Options::full()
        };
        let mut it = args.iter();
        let (mut base_bin, mut base_rev) = (None, None);
        while let Some(flag) = it.next() {
            if flag == "--quick" || flag == "--aa" {
                continue;
            }
            let value = it.next().with_context(|| format!("{flag} needs a value"))?;
            let num = || -> Result<u64> {
                value
                    .parse::<u64>()
                    .with_context(|| format!("{flag}: expected a number, got {value:?}"))
            };
            match flag.as_str() {
                "--runs" => o.runs = num()?.max(1) as usize,
                "--wrk-secs" => o.wrk_secs = num()?.max(1) as u32,
                "--warmup-secs" => o.warmup_secs = num()? as u32,
                "--bulk-runs" => o.bulk_runs = num()?.max(1) as usize,
                "--stats-runs" => o.stats_runs = num()?.max(1) as usize,
                "--wrk-connections" => o.wrk_connections = num()?.max(1) as u32,
                "--bulk-mib" => o.bulk_mib = num()?.max(1),
                "--connects" => o.connects = num()?.max(1) as u32,
                "--changes" => o.changes = num()? as usize,
                "--sizes" => {
                    o.sizes = value
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| s.trim().parse::<usize>())
                        .collect::<Result<_, _>>()
                        .with_context(|| {
                            format!("--sizes: expected e.g. 1000,10000, got {value:?}")
                        })?
                }
                "--hostnames" => o.hostnames = num()? as usize,
                "--out" => o.out = Some(value.into()),
                "--profile" => o.profile = Some(value.into()),
                "--relay-splice" => o.relay_splice = Some(value.clone()),
                "--command" => o.command = value.clone(),
                "--baseline-agent" => base_bin = Some(std::path::PathBuf::from(value)),
                "--baseline-rev" => base_rev = Some(value.clone()),
                "--baseline-args" => {
                    o.baseline_args = value.split_whitespace().map(String::from).collect()
                }
                "--baseline-only" => o.baseline_only = value != "no",
                _ => bail!("unknown option {flag}"),
            }
        }
        o.baseline = match (base_bin, base_rev) {
            (Some(bin), rev) => Some((bin, rev.unwrap_or_else(|| "baseline".into()))),
            (None, None) => None,
            (None, Some(rev)) => bail!("--baseline-rev {rev} needs --baseline-agent"),
        };
        if o.baseline_only && o.baseline.is_none() {
            bail!("--baseline-only needs --baseline-agent");
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn quick_preset_with_overrides() {
        let o = Options::parse(&args("--runs 4 --quick --sizes 10,20")).unwrap();
        assert_eq!(o.runs, 4);
        assert_eq!(o.wrk_secs, Options::quick().wrk_secs);
        assert_eq!(o.sizes, vec![10, 20]);
        assert!(Options::parse(&args("--runs")).is_err());
        assert!(Options::parse(&args("--bogus 1")).is_err());
        assert_eq!(Options::parse(&[]).unwrap().bulk_mib, 1024);
        let o = Options::parse(&args("--baseline-agent /b/agent --baseline-rev main")).unwrap();
        assert_eq!(o.baseline, Some(("/b/agent".into(), "main".into())));
        assert!(!o.baseline_only);
        assert!(Options::parse(&args("--baseline-rev main")).is_err());
        assert!(Options::parse(&args("--baseline-only yes")).is_err());
        let o = Options::parse(&args("--aa --runs 5")).unwrap();
        assert!(o.aa_only);
        assert_eq!(o.runs, 5);
    }
}
