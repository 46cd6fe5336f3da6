//! The per-target detail tables under the main table.

use std::fmt::Write;

use super::Results;
use crate::bench::{
    cells::{cell, ms},
    stats::Spread,
};

/// Every target's rate, CPU and transfer figures, one table per run and case.
pub(super) fn detail(r: &Results, out: &mut String) {
    for (rate, run) in [
        (&r.rate_kernel, ", kernel path run"),
        (&r.rate, ", relay run"),
    ] {
        if rate.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "\n### Connection rate, every target{run}\n\n| target | req/s | p50 ms | p99 ms | failed requests |\n|---|---|---|---|---|\n"
        );
        for x in rate {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                x.target.name,
                cell(x.rps(), 0),
                cell(ms(x.p50()), 2),
                cell(ms(x.p99()), 2),
                x.errors()
            );
        }
    }
    for (title, rate) in [
        (
            "Machine CPU per request, every target, kernel path run",
            &r.rate_kernel,
        ),
        ("Machine CPU per request, every target, relay run", &r.rate),
    ] {
        if rate.iter().all(|x| x.machine.is_empty()) {
            continue;
        }
        let _ = write!(
            out,
            "\n### {title}\n\n| target | all CPUs µs/request | CPU 0 (clients) µs/request | CPU 1 (nginx, proxies) µs/request | CPU 0 busy % | CPU 1 busy % | stolen % |\n|---|---|---|---|---|---|---|\n"
        );
        for x in rate {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                x.target.name,
                cell(x.machine_per_request(), 1),
                cell(x.cpu_per_request_on(0), 1),
                cell(x.cpu_per_request_on(1), 1),
                cell(x.busy_percent_on(0), 0),
                cell(x.busy_percent_on(1), 0),
                cell(x.steal_percent(), 1),
            );
        }
    }
    for (title, bulk) in [
        ("Bulk, every target, kernel path run", &r.bulk_kernel),
        ("Upload, every target, kernel path run", &r.upload_kernel),
        ("Bulk, every target, relay run", &r.bulk),
        ("Upload, every target, relay run", &r.upload),
    ] {
        if bulk.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "\n### {title}\n\n| target | MB/s | proxy CPU µs/MB | machine CPU µs/MB (all CPUs) |\n|---|---|---|---|\n"
        );
        for x in bulk {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                x.target.name,
                cell(Spread::of(&x.mbps), 0),
                cell(Spread::of(&x.proxy_us_per_mb), 0),
                cell(Spread::of(&x.machine_us_per_mb), 0),
            );
        }
    }
}
