//! `doctor`'s checks of what runs beside hairpin: the other connect programs at the
//! cgroup and their order against hairpin's (a socket load balancer in front hides
//! the LB address), the connects meshed pods sent to the relay, and the
//! LoadBalancers left alone with the reason for each.
//!
//! The order is read from the kernel here (this process's own query, with the names
//! it may read: run as root on the node, every name), falling back to what the agent
//! reported; the rest comes from the agent's `/status`.

use std::path::Path;

use hairpin_ebpf::Counter;

use super::{Check, Status};
use crate::{
    datapath::{Role, order},
    status::{DecisionState, HookOrderStatus, LinkOrderStatus, Snapshot},
};

/// Names a hook's programs in run order: `a (id 1), b (id 2)`.
fn names(list: &[crate::status::ForeignProgram]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The connect hooks as the kernel lists them now at `cgroup`, for hairpin's
/// programs in `reported`; a hook that cannot be listed keeps what the agent said.
fn observed(reported: &LinkOrderStatus, cgroup: &Path) -> Vec<HookOrderStatus> {
    reported
        .hooks
        .iter()
        .map(|h| {
            let role = if h.hook == Role::Connect6.name() {
                Role::Connect6
            } else {
                Role::Connect4
            };
            order::observe(cgroup, role, h.program_id).unwrap_or_else(|_| h.clone())
        })
        .collect()
}

/// Whether hairpin's connect programs run before every other connect program at
/// the cgroup: fails, naming the programs in front and the remedy, when they do not.
pub(crate) fn link_order_check(agent: Option<&Snapshot>) -> Check {
    let name = "link_order";
    let Some(s) = agent else {
        return Check::new(
            name,
            Status::Skip,
            "needs the running agent (its connect programs' ids)",
        );
    };
    let (Some(reported), Some(att)) = (&s.link_order, &s.attachment) else {
        return Check::new(
            name,
            Status::Skip,
            "the agent reports no connect programs attached",
        );
    };
    let at = att.cgroup.display();
    if let Some(c) = &reported.children {
        let front: Vec<String> = c.at_root.iter().map(ToString::to_string).collect();
        let detail = format!(
            "this kernel cannot order cgroup links and {} runs at the connect hooks of {at}: \
             hairpin's connect programs are linked at each of its child cgroups ({}), where \
             they run before the root's",
            front.join(", "),
            c.cgroups.join(", ")
        );
        if c.root_processes == 0 {
            return Check::new(name, Status::Ok, detail);
        }
        return Check::new(
            name,
            Status::Warn,
            format!(
                "{detail}; {} processes in the root cgroup itself meet the root's programs \
                 first: a socket load balancer there hides the LB address from hairpin for them",
                c.root_processes
            ),
        )
        .fix(reported.remedy());
    }
    let hooks = observed(reported, &att.cgroup);
    let blocked: Vec<String> = hooks
        .iter()
        .filter(|h| !h.in_front.is_empty())
        .map(|h| {
            let why: Vec<&str> = h
                .in_front
                .iter()
                .filter_map(|p| p.name_unknown.as_deref())
                .take(1)
                .collect();
            format!(
                "{}: {} runs before hairpin's program (id {}){}",
                h.hook,
                names(&h.in_front),
                h.program_id,
                why.first().map(|w| format!(" ({w})")).unwrap_or_default()
            )
        })
        .collect();
    if !blocked.is_empty() {
        return Check::new(
            name,
            Status::Fail,
            format!(
                "hairpin cannot run first at {at} (links {}): {}; a socket load balancer \
                 there rewrites the LB address to a backend before hairpin sees it, so those \
                 connections get no header",
                reported.ordering,
                blocked.join("; ")
            ),
        )
        .fix(reported.remedy());
    }
    let behind: Vec<String> = hooks
        .iter()
        .filter(|h| !h.behind.is_empty())
        .map(|h| format!("{}: then {}", h.hook, names(&h.behind)))
        .collect();
    let detail = if behind.is_empty() {
        format!(
            "hairpin's connect programs are the only ones at {at} (links {})",
            reported.ordering
        )
    } else {
        format!(
            "hairpin's connect programs run first at {at} (links {}); {}",
            reported.ordering,
            behind.join("; ")
        )
    };
    if reported.first {
        Check::new(name, Status::Ok, detail)
    } else {
        // Nothing in front now, but one attached later would be.
        Check::new(name, Status::Warn, detail).fix(
            "a connect program attached after hairpin's at this cgroup would run after them: \
             a socket load balancer that starts later is fine, one that re-attaches in front \
             (BPF_F_BEFORE, on a kernel that orders cgroup links) is not; `hairpin-agent \
             doctor` says which",
        )
    }
}

/// The connects meshed pods sent to the relay (a mesh proxy listens on a capture
/// port in their network namespace): one header each, from the relay.
pub(crate) fn mesh_check(agent: Option<&Snapshot>) -> Check {
    let name = "mesh";
    let Some(s) = agent else {
        return Check::new(name, Status::Skip, "needs the running agent (its counters)");
    };
    let Some(n) = s.counters.kernel.get(Counter::KernelFallbackMesh.name()) else {
        return Check::new(
            name,
            Status::Skip,
            "the agent reports no kernel path counters (the kernel path is off or not loaded)",
        );
    };
    Check::new(
        name,
        Status::Ok,
        if *n == 0 {
            "no connect came from a network namespace where a mesh proxy captures outbound \
             connections (kernel_fallback_mesh 0)"
                .to_string()
        } else {
            format!(
                "{n} connects from network namespaces where a mesh proxy captures outbound \
                 connections took the relay, which the proxy dialled: one header each \
                 (kernel_fallback_mesh)"
            )
        },
    )
}

/// The LoadBalancers left alone, each with its reason (from the agent's decisions).
pub(crate) fn skipped_check(agent: Option<&Snapshot>) -> Check {
    let name = "skipped_lbs";
    let Some(s) = agent else {
        return Check::new(
            name,
            Status::Skip,
            "needs the running agent (its Kubernetes decisions)",
        );
    };
    let skipped: Vec<String> = s
        .decisions
        .iter()
        .filter(|d| d.state != DecisionState::Proxied)
        .map(|d| format!("{}: {} ({})", d.object, d.message, d.reason))
        .collect();
    let invalid = s
        .decisions
        .iter()
        .any(|d| d.state == DecisionState::Invalid);
    match (skipped.is_empty(), invalid) {
        (true, _) => Check::new(
            name,
            Status::Ok,
            "no LoadBalancer left alone (or no Kubernetes source)",
        ),
        (false, false) => Check::new(name, Status::Ok, skipped.join("; ")),
        (false, true) => Check::new(name, Status::Warn, skipped.join("; ")).fix(
            "fix the invalid hairpin.dev annotation named above: the Service is left alone \
             until then (a Warning Event on it says the same)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{AttachmentStatus, Decision, ForeignProgram};

    fn snapshot(first: bool, in_front: Vec<ForeignProgram>) -> Snapshot {
        Snapshot {
            attachment: Some(AttachmentStatus {
                // Not a cgroup: the live query fails and the reported order stands.
                cgroup: "/nonexistent/cgroup".into(),
                ..AttachmentStatus::default()
            }),
            link_order: Some(LinkOrderStatus {
                ordering: "appended: this kernel does not order cgroup links".into(),
                first,
                hooks: vec![HookOrderStatus {
                    hook: "connect4".into(),
                    program_id: 8,
                    attached: true,
                    in_front,
                    behind: Vec::new(),
                }],
                error: None,
                children: None,
            }),
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_program_in_front_fails_naming_it_or_its_id_and_why_and_the_remedy() {
        let named = ForeignProgram {
            id: 12,
            name: Some("cil_sock4_conne".into()),
            name_unknown: None,
        };
        let c = link_order_check(Some(&snapshot(false, vec![named])));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        c.assert_detail_names(&[
            "connect4: cil_sock4_conne (id 12) runs before hairpin's program (id 8)",
        ]);
        c.assert_fix_names(&["6.17"]);
        let unnamed = ForeignProgram {
            id: 12,
            name: None,
            name_unknown: Some("its name needs CAP_SYS_ADMIN".into()),
        };
        let c = link_order_check(Some(&snapshot(false, vec![unnamed])));
        c.assert_detail_names(&[
            "program id 12 runs before hairpin's program (id 8) (its name needs CAP_SYS_ADMIN)",
        ]);
    }

    #[test]
    fn first_is_ok_and_appended_with_nothing_in_front_warns() {
        assert_eq!(
            link_order_check(Some(&snapshot(true, Vec::new()))).status,
            Status::Ok
        );
        assert_eq!(
            link_order_check(Some(&snapshot(false, Vec::new()))).status,
            Status::Warn
        );
        assert_eq!(link_order_check(None).status, Status::Skip);
    }

    #[test]
    fn the_mesh_fallbacks_are_counted_and_skipped_lbs_named_with_their_reason() {
        let mut s = Snapshot::default();
        assert_eq!(mesh_check(Some(&s)).status, Status::Skip);
        s.counters
            .kernel
            .insert(Counter::KernelFallbackMesh.name().into(), 3);
        let c = mesh_check(Some(&s));
        assert!(
            c.status == Status::Ok && c.detail.starts_with("3 connects"),
            "{c:?}"
        );
        s.decisions.push(Decision {
            object: "Service web/ingress".into(),
            state: DecisionState::Skipped,
            reason: "IPModeProxy".into(),
            message: "its LoadBalancer says ipMode: Proxy".into(),
        });
        let c = skipped_check(Some(&s));
        assert_eq!(c.status, Status::Ok);
        assert_eq!(
            c.detail,
            "Service web/ingress: its LoadBalancer says ipMode: Proxy (IPModeProxy)"
        );
        s.decisions[0].state = DecisionState::Invalid;
        assert_eq!(skipped_check(Some(&s)).status, Status::Warn);
    }
}
