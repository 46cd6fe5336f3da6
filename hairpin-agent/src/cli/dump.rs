//! `hairpin-agent dump`: hairpin's BPF maps, raw, read from the kernel, so it works
//! without the agent: the maps pinned in `--bpf-pin-dir` by path and read-only (this
//! works inside the pod with the DaemonSet's capabilities), or maps by id (needs
//! CAP_SYS_ADMIN). Several agents may share a machine (tests run many): `--map-id`,
//! `--pid` or the agent's `/status` pick whose maps to show.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    AgentArgs, CliError, OutputFormat, colour_stdout, print_json, print_text, table::Table,
};
use crate::datapath::kernel_objects::{self, FoundMap, kernel_name};

/// Options of `dump`.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Prints hairpin's BPF maps as the kernel holds them: the frontends map \
(LoadBalancer address -> relay slot, #ADDRESS:PORT: the index of the relay address among \
its family's, as `status` lists them under listen.addresses, and the port) and the counters \
map (summed over CPUs), so this works when the agent is down. Which maps: --map-id, else \
those held open by --pid (both by id: CAP_SYS_ADMIN), else those pinned in --bpf-pin-dir (by \
path, read-only: the DaemonSet's capabilities suffice), else the ids in the running agent's \
/status, else every hairpin map on the machine (found by their kernel names HAIRPIN_FRONTEN, \
HAIRPIN_COUNTER).",
    after_help = "Exit status: 0 maps found and read; 1 no hairpin map found, or one could not be read.\n\n\
Examples:\n  hairpin-agent dump\n  hairpin-agent dump --pid $(pidof hairpin-agent) --output json\n  \
hairpin-agent dump --map-id 42,43"
)]
pub struct DumpArgs {
    /// Map ids to dump (comma-separated), as `bpftool map list` shows them.
    #[arg(long = "map-id", env = "HAIRPIN_DUMP_MAP_IDS", value_delimiter = ',')]
    pub(crate) map_ids: Vec<u32>,

    /// Dump the hairpin maps this process (an agent) holds open.
    #[arg(long, env = "HAIRPIN_DUMP_PID")]
    pub(crate) pid: Option<u32>,

    /// The agent: its maps pinned in --bpf-pin-dir (unless --map-id or --pid is
    /// given), else the ids its admin server reports.
    #[command(flatten)]
    pub(crate) agent: AgentArgs,

    /// Output format.
    #[arg(long, short, env = "HAIRPIN_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) output: OutputFormat,
}

/// One map's contents.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct MapDump {
    /// Kernel map id.
    pub id: u32,
    /// Kernel name.
    pub name: String,
    /// `frontends` or `counters`.
    pub kind: &'static str,
    /// Frontend entries, for the frontends map.
    pub entries: Option<Vec<Entry>>,
    /// Counter values, for the counters map.
    pub counters: Option<BTreeMap<String, u64>>,
    /// Why it could not be read.
    pub error: Option<String>,
}

/// One frontends map entry.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Entry {
    /// The LoadBalancer address a connect is aimed at.
    pub frontend: String,
    /// The relay listener it is rewritten to.
    pub listener: String,
    /// What the entry does with a connect: `kernel v1`, `kernel v2` (the kernel
    /// writes the header; the listener is the fallback), `relay`,
    /// `relay (server speaks first)` or `relay (hairpin.dev/path)` (the Service asks
    /// for the relay).
    pub path: String,
}

/// The JSON document `dump --output json` prints.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DumpReport {
    /// `map_id`, `pid`, `pins`, `agent` or `all`.
    pub selected_by: &'static str,
    /// The maps.
    pub maps: Vec<MapDump>,
}

/// Prints hairpin's maps and counters; returns the exit code.
pub fn dump_maps(args: &DumpArgs) -> Result<i32, CliError> {
    if args.map_ids.is_empty()
        && args.pid.is_none()
        && let Some(pinned) = args.agent.read_pinned().filter(|p| !p.is_empty())
    {
        return print_report(args, pinned_report(&pinned));
    }
    let all = kernel_objects::hairpin_maps();
    let (selected_by, ids): (&'static str, Vec<u32>) = if !args.map_ids.is_empty() {
        ("map_id", args.map_ids.clone())
    } else if let Some(pid) = args.pid {
        ("pid", kernel_objects::map_ids_of_pid(pid)?)
    } else if let Some(a) = args.agent.admin.status().ok().and_then(|s| s.attachment) {
        (
            "agent",
            a.ids
                .frontends_map_id
                .into_iter()
                .chain(a.ids.counters_map_id)
                .collect(),
        )
    } else {
        ("all", all.iter().map(|m| m.id).collect())
    };
    // Only hairpin's maps: a pid holds others too, and a wrong --map-id must not be decoded.
    // A map freed between listing and opening (an agent exiting) is gone, not an error.
    let maps: Vec<MapDump> = all
        .iter()
        .filter(|m| ids.contains(&m.id))
        .filter_map(dump_one)
        .collect();
    print_report(args, DumpReport { selected_by, maps })
}

/// The maps of every pinned layout, read-only by path (the kernel ids are not
/// known without CAP_SYS_ADMIN: 0).
fn pinned_report(pinned: &[crate::datapath::inspect::PinnedDatapath]) -> DumpReport {
    let mut maps = Vec::new();
    for p in pinned {
        let name = |m: &str| format!("{}/maps/{m}", p.dir.display());
        let error_of = |m: &str| p.errors.iter().find(|e| e.contains(m)).cloned();
        let fe_error = error_of(hairpin_ebpf::MAP_FRONTENDS);
        maps.push(MapDump {
            id: 0,
            name: name(hairpin_ebpf::MAP_FRONTENDS),
            kind: "frontends",
            entries: fe_error.is_none().then(|| {
                p.frontends
                    .iter()
                    .map(|e| Entry {
                        frontend: e.frontend.to_string(),
                        listener: e.listener.to_string(),
                        path: e.path.clone(),
                    })
                    .collect()
            }),
            counters: None,
            error: fe_error,
        });
        let ctr_error = error_of(hairpin_ebpf::MAP_COUNTERS);
        maps.push(MapDump {
            id: 0,
            name: name(hairpin_ebpf::MAP_COUNTERS),
            kind: "counters",
            entries: None,
            counters: ctr_error.is_none().then(|| p.counters.clone()),
            error: ctr_error,
        });
    }
    DumpReport {
        selected_by: "pins",
        maps,
    }
}

/// Prints `report`; the exit code: 0 when maps were found and all read.
fn print_report(args: &DumpArgs, report: DumpReport) -> Result<i32, CliError> {
    let ok = !report.maps.is_empty() && report.maps.iter().all(|m| m.error.is_none());
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text => print_text(&render(&report, colour_stdout()))?,
    }
    Ok(if ok { 0 } else { 1 })
}

fn dump_one(m: &FoundMap) -> Option<MapDump> {
    let mut d = MapDump {
        id: m.id,
        name: m.name.clone(),
        kind: "counters",
        entries: None,
        counters: None,
        error: None,
    };
    if m.name == kernel_name(hairpin_ebpf::MAP_FRONTENDS) {
        d.kind = "frontends";
        match crate::datapath::read_frontend_paths(m.id) {
            Ok(e) => {
                d.entries = Some(
                    e.into_iter()
                        .map(|(f, l, path)| Entry {
                            frontend: f.to_string(),
                            listener: l.to_string(),
                            path: path.to_string(),
                        })
                        .collect(),
                )
            }
            Err(e) if e.is_gone() => return None,
            Err(e) => d.error = Some(e.to_string()),
        }
    } else {
        match kernel_objects::read_counters(m.id) {
            Ok(c) => d.counters = Some(c.into_iter().map(|(n, v)| (n.to_string(), v)).collect()),
            Err(e) if e.is_gone() => return None,
            Err(e) => d.error = Some(e.to_string()),
        }
    }
    Some(d)
}

/// The human rendering.
pub(crate) fn render(r: &DumpReport, colour: bool) -> String {
    if r.maps.is_empty() {
        return format!("no hairpin maps found (selected by {})\n", r.selected_by);
    }
    let mut out = String::new();
    for m in &r.maps {
        if m.id == 0 {
            out.push_str(&format!("map {} ({})\n", m.name, m.kind));
        } else {
            out.push_str(&format!("map {} {} ({})\n", m.id, m.name, m.kind));
        }
        if let Some(e) = &m.error {
            out.push_str(&format!("  error: {e}\n"));
        }
        if let Some(entries) = &m.entries {
            let mut t = Table::new(&["FRONTEND", "LISTENER", "PATH"]);
            for e in entries {
                t.row(vec![
                    e.frontend.as_str().into(),
                    e.listener.as_str().into(),
                    e.path.as_str().into(),
                ]);
            }
            out.push_str(&t.render(2, colour));
        }
        if let Some(counters) = &m.counters {
            let mut t = Table::new(&["COUNTER", "VALUE"]);
            for (k, v) in counters {
                t.row(vec![k.as_str().into(), v.to_string().into()]);
            }
            out.push_str(&t.render(2, colour));
        }
    }
    out
}
