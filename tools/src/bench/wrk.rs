//! Running wrk and reading its `--latency` report.

use anyhow::{Context, Result, bail};

/// What one wrk run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct WrkResult {
    /// `Requests/sec:`.
    pub requests_per_sec: f64,
    /// Median latency from the `Latency Distribution` block, in microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, in microseconds.
    pub p99_us: f64,
    /// Requests completed.
    pub requests: u64,
    /// Socket errors (connect + read + write + timeout) and non-2xx/3xx replies:
    /// a proxy that fails requests must not look fast.
    pub errors: u64,
}

/// Parses wrk's text output (run with `--latency`).
pub fn parse(out: &str) -> Result<WrkResult> {
    let mut rps = None;
    let (mut p50, mut p99, mut requests) = (None, None, None);
    let mut errors = 0;
    for line in out.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            rps = Some(v.trim().parse::<f64>().context("Requests/sec")?);
        } else if let Some(v) = line.strip_prefix("50%") {
            p50 = Some(duration_us(v.trim())?);
        } else if let Some(v) = line.strip_prefix("99%") {
            p99 = Some(duration_us(v.trim())?);
        } else if line.contains(" requests in ") {
            let n = line.split_whitespace().next().unwrap_or("");
            requests = Some(n.parse::<u64>().context("request count")?);
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in v.split(',') {
                let n = part.split_whitespace().nth(1).unwrap_or("0");
                errors += n.parse::<u64>().context("socket error count")?;
            }
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            errors += v.trim().parse::<u64>().context("non-2xx count")?;
        }
    }
    match (rps, p50, p99, requests) {
        (Some(requests_per_sec), Some(p50_us), Some(p99_us), Some(requests)) => Ok(WrkResult {
            requests_per_sec,
            p50_us,
            p99_us,
            requests,
            errors,
        }),
        _ => bail!(
            "wrk output lacks Requests/sec, a 50%/99% latency or the request count (was --latency given?):\n{out}"
        ),
    }
}

/// wrk prints durations as `812.00us`, `1.23ms`, `2.00s` or `1.00m`.
fn duration_us(s: &str) -> Result<f64> {
    let split = s
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("duration without a unit: {s:?}"))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .with_context(|| format!("duration value: {s:?}"))?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => bail!("unknown wrk duration unit in {s:?}"),
    };
    Ok(v * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Running 2s test @ http://203.0.113.10:80/
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.04ms  456.78us  21.56ms   91.23%
    Req/Sec    15.60k     1.20k   17.01k    70.00%
  Latency Distribution
     50%  812.00us
     75%    1.30ms
     90%    1.60ms
     99%    3.50ms
  31234 requests in 2.00s, 4.56MB read
  Socket errors: connect 0, read 3, write 0, timeout 1
  Non-2xx or 3xx responses: 2
Requests/sec:  15617.00
Transfer/sec:      2.28MB
";

    #[test]
    fn parses_a_latency_report() {
        let r = parse(SAMPLE).unwrap();
        assert_eq!(r.requests_per_sec, 15617.0);
        assert_eq!(r.p50_us, 812.0);
        assert_eq!(r.p99_us, 3500.0);
        assert_eq!(r.requests, 31234);
        assert_eq!(r.errors, 6);
    }

    #[test]
    fn clean_runs_have_no_errors_and_missing_latency_is_an_error() {
        let clean: String = SAMPLE
            .lines()
            .filter(|l| !l.contains("errors") && !l.contains("Non-2xx"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(parse(&clean).unwrap().errors, 0);
        let no_latency: String = SAMPLE
            .lines()
            .filter(|l| !l.trim_start().starts_with("99%"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(parse(&no_latency).is_err());
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(duration_us("1.50s").unwrap(), 1.5e6);
        assert_eq!(duration_us("2.00m").unwrap(), 120e6);
        assert!(duration_us("12").is_err());
        assert!(duration_us("3.0xs").is_err());
    }
}
