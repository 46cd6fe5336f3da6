//! `hairpin-agent status`: what the agent on this node is doing, in one look; what
//! the kernel says when the agent does not answer.

use serde::Serialize;

use super::{
    AgentArgs, CliError, OutputFormat, colour_stdout, print_json, print_text,
    table::{Cell, Table, Tone, paint},
};
use crate::{
    datapath::{inspect::PinnedDatapath, kernel_objects},
    model::LivePath,
    status::ProgramIds,
    status::{
        ClientsStatus, CorednsStatus, FrontendState, FrontendStatus, ListenStatus, ModeStatus,
        NamesStatus, RelayStatus, Snapshot,
    },
};

/// Options of `status`.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Shows what the hairpin agent on this node is doing: where its programs are \
attached (program and link ids), every frontend with its state, listener, live path and the \
reason when it failed, the kernel and relay counters, the last reconcile and each source's \
health.\n\nWhen the agent does not answer, says so, reads the datapath pinned in --bpf-pin-dir \
(its links, whether its heartbeat still keeps it live, its counters: by path, read-only, so \
this works inside the pod), lists the hairpin programs the kernel has loaded where it may \
(CAP_SYS_ADMIN), and exits 4.",
    after_help = "Exit status: 0 the agent answered and is ready; 3 the agent answered but is not \
ready (programs detached or a source not synced); 4 the agent is not reachable; 2 usage; \
6 the output could not be written.\n\n\
Examples:\n  hairpin-agent status\n  hairpin-agent status --output json | jq '.status.frontends'"
)]
pub struct StatusArgs {
    /// The agent: asked through its admin server; when it does not answer, its
    /// datapath pinned in --bpf-pin-dir is read (links, heartbeat, counters).
    #[command(flatten)]
    pub(crate) agent: AgentArgs,

    /// Output format.
    #[arg(long, short, env = "HAIRPIN_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) output: OutputFormat,
}

/// The JSON document `status --output json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct StatusReport {
    /// True when the agent answered.
    pub agent_reachable: bool,
    /// Why it did not.
    pub agent_error: Option<String>,
    /// Why it is not ready, when it answered.
    pub not_ready_reason: Option<String>,
    /// Its `/status`, when it answered.
    pub status: Option<Snapshot>,
    /// Hairpin programs the kernel has loaded, listed only when the agent did not answer.
    pub kernel_programs: Option<Vec<ProgramIds>>,
    /// Why they could not be listed.
    pub kernel_error: Option<String>,
    /// The datapath pinned in `--bpf-pin-dir`, read when the agent did not answer.
    pub pinned: Option<Vec<PinnedDatapath>>,
}

/// Shows what the agent on this node is doing (or what the kernel says); returns
/// the exit code.
pub fn show_status(args: &StatusArgs) -> Result<i32, CliError> {
    let report = match args.agent.admin.status() {
        Ok(snap) => StatusReport {
            agent_reachable: true,
            agent_error: None,
            not_ready_reason: snap.not_ready_reason(),
            status: Some(snap),
            kernel_programs: None,
            kernel_error: None,
            pinned: None,
        },
        Err(e) => {
            let (programs, error) = match kernel_objects::hairpin_programs() {
                Ok(p) => (Some(p), None),
                Err(e) => (None, Some(e.to_string())),
            };
            StatusReport {
                agent_reachable: false,
                agent_error: Some(e.to_string()),
                not_ready_reason: None,
                status: None,
                kernel_programs: programs,
                kernel_error: error,
                pinned: args.agent.read_pinned(),
            }
        }
    };
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text => print_text(&render(&report, colour_stdout()))?,
    }
    Ok(match (&report.status, &report.not_ready_reason) {
        (None, _) => super::Exit::Unreachable,
        (Some(_), Some(_)) => super::Exit::NotReady,
        (Some(_), None) => super::Exit::Ok,
    }
    .code())
}

/// The mode, the name relay, the listen addresses, the clients, the cluster DNS and
/// the CoreDNS writer, one line each (and their notes) when present.
fn render_paths(s: &Snapshot, colour: bool) -> String {
    let mut out = String::new();
    if let Some(m) = &s.mode {
        render_mode(&mut out, m, colour);
    }
    if let Some(n) = &s.names {
        render_names(&mut out, n, colour);
    }
    if let Some(l) = &s.listen {
        render_listen(&mut out, l);
    }
    if let Some(r) = &s.relay {
        render_relay(&mut out, r, colour);
    }
    if let Some(c) = &s.clients {
        render_clients(&mut out, c);
    }
    if !s.cluster_dns.is_empty() {
        let ips: Vec<String> = s.cluster_dns.iter().map(|i| i.to_string()).collect();
        out.push_str(&format!(
            "cluster dns {} (what `check` asks to resolve as a pod)\n",
            ips.join(", ")
        ));
    }
    if let Some(c) = &s.coredns {
        render_coredns(&mut out, c, colour);
    }
    out
}

/// `mode`: the configured mode, the live paths and why.
fn render_mode(out: &mut String, m: &ModeStatus, colour: bool) {
    let live = if m.live.is_empty() {
        paint("none", Tone::Bad, colour)
    } else {
        paint(
            &m.live
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            Tone::Good,
            colour,
        )
    };
    out.push_str(&format!(
        "mode        {} (live: {live}): {}\n",
        m.configured, m.reason
    ));
}

/// `names`: the name relay's listeners and hosts file, the writer's pace, the
/// listeners that failed, and what is published or left out.
fn render_names(out: &mut String, n: &NamesStatus, colour: bool) {
    let listeners: Vec<String> = n
        .listeners
        .iter()
        .map(|l| match n.redirects.iter().find(|r| r.listener == *l) {
            Some(r) => format!("{} (redirected to {l})", r.dialled),
            None => l.to_string(),
        })
        .collect();
    out.push_str(&format!(
        "names       relay on {} ({} routes), hosts file {}{}\n",
        if listeners.is_empty() {
            "nothing yet".to_string()
        } else {
            listeners.join(", ")
        },
        n.routes,
        n.hosts_file
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "not managed".into()),
        n.link_note
            .as_ref()
            .map(|l| format!("; {l}"))
            .unwrap_or_default(),
    ));
    if let Some(e) = &n.hosts_error {
        out.push_str(&format!(
            "            {}\n",
            paint(&format!("error: {e}"), Tone::Bad, colour)
        ));
    }
    if let Some(w) = &n.hosts_writer {
        out.push_str(&format!(
            "            hosts file written {} times (last {}), at most once per {}; \
             {} changes coalesced{}\n",
            w.writes,
            w.last_write.as_deref().unwrap_or("never"),
            humantime::format_duration(std::time::Duration::from_millis(w.min_interval_ms)),
            w.coalesced,
            if w.pending { ", one waiting" } else { "" },
        ));
    }
    for f in &n.failed_listeners {
        out.push_str(&format!(
            "            {} {}: {} (retrying)\n",
            paint("cannot listen on", Tone::Bad, colour),
            f.address,
            f.error
        ));
    }
    render_published(out, n, colour);
}

/// Under `names`: the domains names are published under, the names the caps
/// withhold, and each name left out (or, with no domain, one line for them all).
fn render_published(out: &mut String, n: &NamesStatus, colour: bool) {
    if n.domains.is_empty() {
        // Every name is left out for the same reason: say it once.
        out.push_str(&format!(
            "            {} ({} hostnames left out)\n",
            paint(
                "no names published: --names-domains is empty",
                Tone::Warn,
                colour
            ),
            n.skips.len()
        ));
        return;
    }
    out.push_str(&format!(
        "            published under {}\n",
        n.domains.join(", ")
    ));
    if let Some(l) = n.limits.as_ref().filter(|l| l.withheld > 0) {
        let by: Vec<String> = l
            .withheld_by_namespace
            .iter()
            .map(|(ns, k)| format!("{ns} {k}"))
            .collect();
        let capped = format!(
            "{} names withheld by the caps (--max-names-per-namespace {}, --max-names {})",
            l.withheld, l.max_names_per_namespace, l.max_names
        );
        out.push_str(&format!(
            "            {}: {}\n",
            paint(&capped, Tone::Warn, colour),
            by.join(", ")
        ));
    }
    for skip in &n.skips {
        out.push_str(&format!("            left out: {skip}\n"));
    }
}

/// `listen`: the relays' listen addresses and the link they are on.
fn render_listen(out: &mut String, l: &ListenStatus) {
    let addresses: Vec<String> = l.addresses.iter().map(ToString::to_string).collect();
    let on = match &l.link {
        Some(link) => format!("on {link}"),
        None => "as given (--listen-link none)".to_string(),
    };
    out.push_str(&format!("listen      {} {on}\n", addresses.join(", ")));
}

/// `relay`: the relay of frontends' listeners, and each family it does not serve,
/// why and what to do.
fn render_relay(out: &mut String, r: &RelayStatus, colour: bool) {
    let listeners: Vec<String> = r.listeners.iter().map(ToString::to_string).collect();
    out.push_str(&format!(
        "relay       {}\n",
        if listeners.is_empty() {
            paint("no listener", Tone::Bad, colour)
        } else {
            format!("listening on {}", listeners.join(", "))
        }
    ));
    for u in &r.unserved {
        out.push_str(&format!(
            "            {}: {}\n            fix: {}\n",
            paint(&format!("{} not served", u.family), Tone::Bad, colour),
            u.describe(),
            u.fix
        ));
    }
}

/// `clients`: who the relays serve, and what was learned from this node's routes.
fn render_clients(out: &mut String, c: &ClientsStatus) {
    out.push_str(&format!("clients     {} ({})\n", c.allowed, c.source));
    if let Some(l) = &c.learned {
        let synced = if l.synced { "" } else { ", not read yet" };
        out.push_str(&format!(
            "            learned {} pods, {} ranges from this node's routes{synced}: {}\n",
            l.pods, l.ranges, l.shapes
        ));
        if let Some(e) = &l.error {
            out.push_str(&format!("            learning failing: {e}\n"));
        }
    }
}

/// `coredns`: the writer's mode, ConfigMap and target, whether it holds the Lease,
/// and its error and warnings.
fn render_coredns(out: &mut String, c: &CorednsStatus, colour: bool) {
    out.push_str(&format!(
        "coredns     {} {} -> {} ({}, {} rewrites, last write {})\n",
        c.mode,
        c.configmap,
        c.target,
        if c.leader {
            "Lease holder: writes"
        } else {
            "not the Lease holder"
        },
        c.rewrites,
        c.last_write.as_deref().unwrap_or("never"),
    ));
    for (what, text) in [
        ("error", &c.last_error),
        ("warning", &c.node_local_dns),
        ("warning", &c.held_back),
    ] {
        if let Some(t) = text {
            out.push_str(&format!(
                "            {}\n",
                paint(&format!("{what}: {t}"), Tone::Bad, colour)
            ));
        }
    }
}

/// The human rendering of `report`.
pub(crate) fn render(report: &StatusReport, colour: bool) -> String {
    match &report.status {
        Some(s) => render_snapshot(s, report.not_ready_reason.as_deref(), colour),
        None => render_unreachable(report, colour),
    }
}

fn render_snapshot(s: &Snapshot, not_ready: Option<&str>, colour: bool) -> String {
    let mut out = String::new();
    let ready = match not_ready {
        None => paint("ready", Tone::Good, colour),
        Some(r) => paint(&format!("not ready: {r}"), Tone::Bad, colour),
    };
    out.push_str(&format!(
        "agent       hairpin-agent {} (pid {}, started {}): {ready}\n",
        s.agent.version, s.agent.pid, s.agent.started_at
    ));
    out.push_str(&render_paths(s, colour));
    render_programs(&mut out, s, colour);
    render_frontends(&mut out, s, colour);
    render_counters(&mut out, s);
    if let Some(kp) = &s.kernel_path {
        out.push_str(&render_kernel_path(kp, &s.counters.kernel, colour));
    }
    match &s.last_reconcile {
        Some(l) => out.push_str(&format!(
            "reconciled  {} in {:.1} ms\n",
            l.at, l.duration_ms
        )),
        None => out.push_str("reconciled  never\n"),
    }
    render_sources(&mut out, s, colour);
    render_decisions(&mut out, s, colour);
    out
}

/// `programs` and `maps`: where the programs are attached, their ids and the maps' ids.
fn render_programs(out: &mut String, s: &Snapshot, colour: bool) {
    match &s.attachment {
        Some(a) => {
            out.push_str(&format!("programs    attached at {}\n", a.cgroup.display()));
            let mut t = Table::new(&["PROGRAM", "PROG ID", "LINK IDS"]);
            for p in &a.ids.programs {
                t.row(vec![
                    p.name.as_str().into(),
                    p.program_id.to_string().into(),
                    join(&p.link_ids).into(),
                ]);
            }
            out.push_str(&t.render(12, colour));
            out.push_str(&format!(
                "maps        frontends id {}, counters id {}\n",
                opt(a.ids.frontends_map_id),
                opt(a.ids.counters_map_id)
            ));
            if let Some(order) = &s.link_order {
                order::render(out, order, colour);
            }
        }
        None => out.push_str(&format!(
            "programs    {}\n",
            paint(
                "not attached: connects are not redirected",
                Tone::Bad,
                colour
            )
        )),
    }
}

/// `frontends`: one row each, with who writes the header where the kernel path is
/// asked for.
fn render_frontends(out: &mut String, s: &Snapshot, colour: bool) {
    out.push_str("frontends\n");
    // With the kernel path asked for, each frontend says who writes its header.
    let header_column = s.kernel_path.as_ref().is_some_and(|k| k.configured.loads());
    let mut headers = vec!["FRONTEND", "STATE", "PATH"];
    if header_column {
        headers.push("HEADER");
    }
    headers.extend(["LISTENER", "PROXY", "SOURCE", "REASON"]);
    let mut t = Table::new(&headers);
    for f in &s.frontends {
        let state = match f.state {
            FrontendState::Active => Cell::toned("active", Tone::Good),
            FrontendState::Failed => Cell::toned("failed", Tone::Bad),
            FrontendState::Fallback => Cell::toned("fallback", Tone::Warn),
        };
        let mut row = vec![
            std::net::SocketAddr::new(f.ip, f.port).to_string().into(),
            state,
            f.path.to_string().into(),
        ];
        if header_column {
            row.push(header_writer(f).into());
        }
        row.extend([
            f.listener
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into())
                .into(),
            f.version.to_string().into(),
            f.source.as_str().into(),
            match (&f.reason, f.retry) {
                (Some(r), Some(retry)) => format!("{r} ({})", retry.describe()),
                (r, _) => r.clone().unwrap_or_default(),
            }
            .into(),
        ]);
        t.row(row);
    }
    out.push_str(&if t.is_empty() {
        "  (none)\n".to_string()
    } else {
        t.render(2, colour)
    });
}

/// `counters`: the programs' redirects and bypasses, the relay's connections, bytes
/// and errors.
fn render_counters(out: &mut String, s: &Snapshot) {
    let k = &s.counters.kernel;
    let r = &s.counters.relay;
    let get = |n: &str| k.get(n).copied().unwrap_or(0);
    let errors: Vec<String> = r
        .upstream_errors
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let client_errors: Vec<String> = r
        .client_errors
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    out.push_str(&format!(
        "counters    redirected {}, skipped by mark {}; connections {} ({} open), bytes up {} down {}\n\
         \x20           upstream errors: {}; client errors: {}\n",
        get("redirected"),
        get("skipped_bypass_mark"),
        r.connections,
        r.active_connections,
        r.bytes_upstream,
        r.bytes_downstream,
        if errors.is_empty() { "none".into() } else { errors.join(", ") },
        if client_errors.is_empty() { "none".into() } else { client_errors.join(", ") },
    ));
}

/// `sources`: whether each source synced, when, and its last error.
fn render_sources(out: &mut String, s: &Snapshot, colour: bool) {
    out.push_str("sources\n");
    let mut t = Table::new(&["SOURCE", "SYNCED", "LAST SYNC", "LAST ERROR"]);
    for src in &s.sources {
        t.row(vec![
            src.name.as_str().into(),
            if src.synced {
                Cell::toned("yes", Tone::Good)
            } else {
                Cell::toned("no", Tone::Bad)
            },
            src.last_sync.clone().unwrap_or_else(|| "-".into()).into(),
            src.last_error.clone().unwrap_or_default().into(),
        ]);
    }
    out.push_str(&t.render(2, colour));
}

/// `decisions`: what was decided about each object, when there is any.
fn render_decisions(out: &mut String, s: &Snapshot, colour: bool) {
    if !s.decisions.is_empty() {
        out.push_str("decisions\n");
        let mut t = Table::new(&["OBJECT", "STATE", "REASON", "MESSAGE"]);
        for d in &s.decisions {
            t.row(vec![
                d.object.as_str().into(),
                d.state.as_str().into(),
                d.reason.as_str().into(),
                d.message.as_str().into(),
            ]);
        }
        out.push_str(&t.render(2, colour));
    }
}

/// Who writes a frontend's header: `kernel` (on the client's own socket), `relay`
/// (its listener, or the name relay), or `-` when it is not live.
fn header_writer(f: &FrontendStatus) -> &'static str {
    match f.state {
        FrontendState::Failed => "-",
        _ if f.path.0.contains(&LivePath::Kernel) => "kernel",
        FrontendState::Active | FrontendState::Fallback => "relay",
    }
}

fn join(ids: &[u32]) -> String {
    let v: Vec<String> = ids.iter().map(u32::to_string).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

fn opt(id: Option<u32>) -> String {
    id.map(|i| i.to_string()).unwrap_or_else(|| "?".into())
}

mod kernel;
mod order;
mod unreachable;
pub(crate) use kernel::KernelTally;
use kernel::render_kernel_path;
use unreachable::render_unreachable;

#[cfg(test)]
mod tests;
