//! `status` when the agent does not answer: what is pinned (read by path, so it
//! works with the DaemonSet's capabilities) and what the kernel has loaded (by id:
//! CAP_SYS_ADMIN).

use super::{Cell, StatusReport, Table, Tone, join, paint};
use crate::datapath::inspect::PinnedDatapath;

pub(super) fn render_unreachable(report: &StatusReport, colour: bool) -> String {
    let mut out = format!(
        "agent       {}\n",
        paint(
            report.agent_error.as_deref().unwrap_or("not reachable"),
            Tone::Bad,
            colour
        )
    );
    if let Some(pinned) = &report.pinned {
        render_pinned(&mut out, pinned, colour);
    }
    out.push_str(
        "kernel      what the kernel has loaded (without the agent, the cgroup is unknown):\n",
    );
    match (&report.kernel_programs, &report.kernel_error) {
        (Some(p), _) if p.is_empty() => out.push_str(
            "            no hairpin programs loaded: nothing redirects connects on this node\n",
        ),
        (Some(p), _) => {
            let mut t = Table::new(&["PROGRAM", "PROG ID", "LINK IDS", "MAP IDS"]);
            for p in p {
                let links = if p.link_ids.is_empty() {
                    Cell::toned("not attached", Tone::Warn)
                } else {
                    join(&p.link_ids).into()
                };
                t.row(vec![
                    p.name.as_str().into(),
                    p.program_id.to_string().into(),
                    links,
                    join(&p.map_ids).into(),
                ]);
            }
            out.push_str(&t.render(12, colour));
        }
        (None, e) => out.push_str(&format!(
            "            could not list programs: {}\n",
            e.as_deref().unwrap_or("unknown error")
        )),
    }
    out
}

/// The pinned datapath, one block per layout directory.
fn render_pinned(out: &mut String, pinned: &[PinnedDatapath], colour: bool) {
    if pinned.is_empty() {
        out.push_str("pinned      nothing pinned: no datapath outlives an agent on this node\n");
        return;
    }
    for p in pinned {
        let tone = if p.live { Tone::Good } else { Tone::Warn };
        let acts = if p.live {
            "the connect programs act"
        } else {
            "the connect programs leave every connect alone"
        };
        out.push_str(&format!(
            "pinned      {}: heartbeat {} ({acts})\n",
            p.dir.display(),
            paint(&p.heartbeat, tone, colour)
        ));
        let mut t = Table::new(&["HOOK", "LINK ID", "PROG ID", "TARGET"]);
        for l in &p.links {
            let target = match (l.target_alive, &l.error) {
                (_, Some(e)) => Cell::toned(e, Tone::Bad),
                (Some(true), _) => "attached".into(),
                _ => Cell::toned("target gone", Tone::Warn),
            };
            t.row(vec![
                l.hook.as_str().into(),
                super::opt(l.link_id).into(),
                super::opt(l.prog_id).into(),
                target,
            ]);
        }
        out.push_str(&t.render(12, colour));
        out.push_str(&format!(
            "            {} frontends in the map\n",
            p.frontends.len()
        ));
        for e in &p.errors {
            out.push_str(&format!("            {}\n", paint(e, Tone::Bad, colour)));
        }
    }
}
