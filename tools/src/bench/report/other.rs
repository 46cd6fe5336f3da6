//! The main table's rows that compare no two data planes: connect() overhead,
//! convergence and footprint.

use std::fmt::Write;

use super::{Results, met, mib, reported};
use crate::bench::{
    cells::cell,
    footprint::Footprint,
    stats::{Spread, percentile},
};

/// connect() overhead, convergence and footprint.
pub(super) fn other_rows(r: &Results, out: &mut String) {
    for c in &r.connect {
        let added = c.added();
        let target = if c.case.proxied {
            "— (different path)"
        } else {
            "< 1000 ns added"
        };
        let ok = if c.case.proxied {
            None
        } else {
            added.map(|a| a.median < 1000.0)
        };
        let _ = writeln!(
            out,
            "| connect() ns, {} | attached {} | agent running, loop outside the attached cgroup: {}; no agent: {} ({} vs no agent) | added {} ns (paired, n={}) | {target} | {} |",
            c.case.name,
            cell(Spread::of(&c.attached), 0),
            cell(Spread::of(&c.outside), 0),
            cell(Spread::of(&c.detached), 0),
            c.added_vs_detached_ns()
                .map_or("—".into(), |a| format!("{a:+.0}")),
            added.map_or("—".into(), |a| format!(
                "{:+.0} ({:+.0} to {:+.0})",
                a.median, a.min, a.max
            )),
            c.paired_added.len(),
            if c.case.proxied { "reported" } else { met(ok) }
        );
    }
    for c in &r.connect {
        let _ = writeln!(
            out,
            "| connect4 program's own run time (kernel BPF stats), {}, ns per run | {} | runs per connect(): {} | — | — | reported |",
            c.case.name,
            cell(Spread::of(&c.program_ns), 0),
            cell(Spread::of(&c.runs_per_connect), 2),
        );
    }
    let conv = &r.converge_file;
    if !conv.is_empty() {
        reported(
            out,
            "convergence, **file source** (`--frontends-poll 100ms`), ms",
            &format!(
                "p50 {:.0}, p99 {:.0} (min {:.0}, max {:.0}, n={})",
                percentile(conv, 50.0),
                percentile(conv, 99.0),
                percentile(conv, 0.0),
                percentile(conv, 100.0),
                conv.len()
            ),
        );
    }
    match &r.converge_watch {
        Some(w) if !w.is_empty() => {
            let _ = writeln!(
                out,
                "| convergence, Kubernetes watch stream (recorded API server), ms | p50 {:.0}, p99 {:.0} (n={}) | hairpin-proxy: 15 s poll + CoreDNS reload | — | p99 < 1000 | {} |",
                percentile(w, 50.0),
                percentile(w, 99.0),
                w.len(),
                if percentile(w, 99.0) < 1000.0 { "**met**" } else { "**missed**" }
            );
        }
        _ => out.push_str("| convergence, Kubernetes watch stream | not measured (see the errors above) | — | — | — | not measured |\n"),
    }
    if let Some((idle, load)) = r.rss_small {
        reported(
            out,
            "agent RSS, 2 frontends (MiB)",
            &format!(
                "idle {:.1}, under wrk {:.1}",
                idle as f64 / 1024.0,
                load as f64 / 1024.0
            ),
        );
    }
    for f in &r.footprint {
        if f.hostnames > 0 {
            names_rows(f, out);
            continue;
        }
        let (idle, load) = (mib(&f.idle_kib), mib(&f.load_kib));
        let limit = (f.size == 1_000).then_some(25.0);
        let ok = limit.and_then(|l| Some(idle?.max.max(load?.max) < l));
        let _ = writeln!(
            out,
            "| agent RSS, {} frontends (MiB) | idle {}, under wrk {} | — | — | {} | {} |",
            f.size,
            cell(idle, 1),
            cell(load, 1),
            limit.map_or("—".into(), |l| format!("< {l:.0} MiB")),
            if limit.is_some() { met(ok) } else { "reported" }
        );
        reported(
            out,
            &format!("apply {} frontends (ms)", f.size),
            &format!(
                "start→ready {}; file change→reconciled {} (agent-timed {})",
                cell(Spread::of(&f.ready_ms), 0),
                cell(Spread::of(&f.apply_wall_ms), 0),
                cell(Spread::of(&f.apply_agent_ms), 0),
            ),
        );
    }
}

/// The rows of the hostnames footprint case (no start→ready: it starts small).
fn names_rows(f: &Footprint, out: &mut String) {
    let kib = Spread::of(&f.hosts_bytes.iter().map(|b| b / 1024.0).collect::<Vec<_>>());
    reported(
        out,
        &format!(
            "agent RSS, {} frontends + {} hostnames (MiB)",
            f.size, f.hostnames
        ),
        &format!(
            "idle {}, under wrk {}",
            cell(mib(&f.idle_kib), 1),
            cell(mib(&f.load_kib), 1)
        ),
    );
    reported(
        out,
        &format!(
            "apply {} frontends + {} hostnames incl. /etc/hosts block (ms)",
            f.size, f.hostnames
        ),
        &format!(
            "file change→reconciled {} (agent-timed {}); hosts file {} KiB",
            cell(Spread::of(&f.apply_wall_ms), 0),
            cell(Spread::of(&f.apply_agent_ms), 0),
            cell(kib, 0),
        ),
    );
}
