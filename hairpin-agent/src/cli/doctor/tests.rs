use super::*;
use crate::status::NamesStatus;

#[test]
fn an_empty_names_domains_list_warns_with_the_fix_and_a_listed_one_is_ok() {
    let empty = names_scope_check(&NamesStatus::default());
    assert_eq!(empty.status, Status::Warn);
    assert_eq!(
        empty.detail,
        "none: --names-domains is empty, no names are published"
    );
    assert!(
        empty
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("HAIRPIN_NAMES_DOMAINS"))
    );
    let listed = names_scope_check(&NamesStatus {
        domains: vec!["example.com".into()],
        skips: vec![
            "Ingress a/b: spec.rules[0].host: host localhost refused (rule localhost)".into(),
        ],
        ..NamesStatus::default()
    });
    assert_eq!(listed.status, Status::Ok);
    assert_eq!(
        listed.detail,
        "names under example.com are published; 1 hostname(s) left out, each with its rule \
         in `hairpin-agent status`"
    );
}

fn kernel_path_agent(
    state: crate::status::KernelPathState,
    reason: Option<(KernelPathReason, &str)>,
    counters: &[(&str, u64)],
) -> Snapshot {
    let mut s = Snapshot {
        kernel_path: Some(crate::status::KernelPathStatus {
            configured: crate::model::KernelPathMode::On,
            state,
            reason: reason.map(|(_, why)| why.into()),
            reason_kind: reason.map(|(kind, _)| kind),
            sockets_map_id: Some(33),
            sockets_capacity: Some(65_536),
            sockets_map_pin: None,
            sockets_map_pin_error: None,
            mptcp_detection: None,
        }),
        ..Default::default()
    };
    for (n, v) in counters {
        s.counters.kernel.insert((*n).into(), *v);
    }
    s
}

/// Issue 13: the kernel path check is skipped when off or without an agent, ok
/// when on and nothing was missed, with the headers written and the fallbacks.
#[test]
fn the_kernel_path_is_skipped_when_off_and_ok_when_nothing_was_missed() {
    assert_eq!(kernel_path_check(None, &[]).status, Status::Skip);
    assert_eq!(
        kernel_path_check(Some(&Snapshot::default()), &[]).status,
        Status::Skip
    );
    let mut off = kernel_path_agent(KernelPathState::Off, None, &[]);
    if let Some(k) = off.kernel_path.as_mut() {
        k.configured = crate::model::KernelPathMode::Off;
    }
    let c = kernel_path_check(Some(&off), &[]);
    assert_eq!(c.status, Status::Skip);
    assert_eq!(
        c.detail,
        "off (--kernel-path off): every frontend takes the relay path"
    );
    let on = kernel_path_agent(
        KernelPathState::On,
        None,
        &[
            ("kernel_headers_written", 120),
            ("kernel_fallback_mptcp", 2),
            ("kernel_sockets_entered", 125),
            ("kernel_sockets_left", 122),
        ],
    );
    let c = kernel_path_check(Some(&on), &[]);
    assert_eq!(c.status, Status::Ok, "{c:?}");
    assert_eq!(
        c.detail,
        "on: 120 headers written by the kernel, none missed; 2 connects sent to the relay \
         instead (no socket storage 0, sockets map near full 0, MPTCP subflow 2, TCP Fast \
         Open 0, mesh proxy 0); sockets map 3 of 65536 in use"
    );
    assert!(c.fix.is_none());
}

/// An unpinned datapath is a warning with what it costs and the mount to add.
#[test]
fn an_unpinned_datapath_warns_with_what_it_costs_and_the_mount_to_add() {
    let mut s = kernel_path_agent(KernelPathState::On, None, &[("kernel_headers_written", 4)]);
    if let Some(kp) = s.kernel_path.as_mut() {
        kp.sockets_map_pin_error = Some("/sys/fs/bpf is not on a bpf filesystem".into());
    }
    let c = kernel_path_check(Some(&s), &[]);
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.detail.ends_with(
            "; the datapath is not pinned (/sys/fs/bpf is not on a bpf filesystem): it goes \
             with the agent, so every restart, upgrade or crash leaves traffic without \
             hairpin until the next agent attaches, and sockets established but not yet \
             written go without their header"
        ),
        "{}",
        c.detail
    );
    assert_eq!(c.fix.as_deref(), Some(PIN_FIX));
}

/// A connection without its header is a warning naming the counter, what it
/// means, and what to do.
#[test]
fn kernel_path_misses_warn_with_each_counter_and_its_fix() {
    let s = kernel_path_agent(
        KernelPathState::On,
        None,
        &[
            ("kernel_headers_written", 10),
            ("kernel_missed_data_first", 2),
            ("kernel_missed_insert", 1),
        ],
    );
    let c = kernel_path_check(Some(&s), &[]);
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.detail.starts_with(
            "on, but 3 connections went without their PROXY header since the agent \
             started: kernel_missed_data_first 2 (data sent before the handshake \
             completed: TCP Fast Open (MSG_FASTOPEN, where the agent has no \
             CAP_PERFMON), or a send() queued while connecting); \
             kernel_missed_insert 1 (the socket could not enter the sockets map"
        ),
        "{}",
        c.detail
    );
    // The escape hatch for a workload that hits a known miss, too.
    let fix = c.assert_fix_names(&[
        "turn Fast Open off",
        "raise --kernel-path-sockets",
        "`hairpin.dev/path: relay`",
    ]);
    assert!(!fix.contains("kernel_missed_push"), "{fix}");
}

/// Unavailable: the reason, what this kernel lacks, and the fix for that cause;
/// a warning with `auto` (the relay takes over as planned), a failure with `on`.
#[test]
fn an_unavailable_kernel_path_warns_with_the_reason_and_the_fix() {
    let mut s = kernel_path_agent(
        KernelPathState::Unavailable,
        Some((
            KernelPathReason::NoProgramType,
            "this kernel has no sk_msg programs",
        )),
        &[],
    );
    let c = kernel_path_check(Some(&s), &["sk_msg programs".into()]);
    assert_eq!(c.status, Status::Fail);
    assert_eq!(
        c.detail,
        "required (--kernel-path on) but unavailable: this kernel has no sk_msg programs; \
         every frontend takes the relay path (headers are still written); this kernel \
         lacks sk_msg programs"
    );
    if let Some(k) = s.kernel_path.as_mut() {
        k.configured = crate::model::KernelPathMode::Auto;
    }
    let auto = kernel_path_check(Some(&s), &["sk_msg programs".into()]);
    assert_eq!(auto.status, Status::Warn);
    assert_eq!(
        auto.detail,
        "unavailable on this node (--kernel-path auto): this kernel has no sk_msg \
         programs; every frontend takes the relay path (headers are still written); this \
         kernel lacks sk_msg programs"
    );
    assert_eq!(auto.fix, c.fix);
    c.assert_fix_names(&["sk_msg"]);
    let s = kernel_path_agent(
        KernelPathState::Unavailable,
        Some((
            KernelPathReason::Refused,
            "hairpin_sockops did not load: Permission denied (os error 13)",
        )),
        &[],
    );
    let c = kernel_path_check(Some(&s), &[]);
    assert_eq!(c.status, Status::Fail);
    let refused = c.fix.clone();
    assert!(
        refused
            .as_deref()
            .is_some_and(|f| f.contains("5.19") && f.contains("a bug to report")),
        "{c:?}"
    );
    // The fix follows the reason's kind, never its words.
    let s = kernel_path_agent(
        KernelPathState::Unavailable,
        Some((
            KernelPathReason::Refused,
            "this kernel has no words that matter",
        )),
        &[],
    );
    assert_eq!(kernel_path_check(Some(&s), &[]).fix, refused);
    let s = kernel_path_agent(
        KernelPathState::Unavailable,
        Some((KernelPathReason::LinkFailed, "sk_msg did not load")),
        &[],
    );
    assert!(
        kernel_path_check(Some(&s), &[])
            .fix
            .is_some_and(|f| f.starts_with("see the agent's log")),
    );
}

/// Issue 14: a hosts file the agent cannot write (here: replaced on the host) and
/// wildcard rewrites held back for an old CoreDNS are not "ok" in doctor.
#[test]
fn a_hosts_file_error_fails_and_held_back_rewrites_warn() {
    let replaced = name_relay_check(&NamesStatus {
        hosts_error: Some("hosts file /host/etc/hosts: ... nlink 0 ...".into()),
        ..NamesStatus::default()
    });
    assert_eq!(replaced.status, Status::Fail);
    assert!(replaced.detail.contains("nlink 0"), "{}", replaced.detail);
    let snapshot = Snapshot {
        coredns: Some(crate::status::CorednsStatus {
            held_back: Some("1 wildcard name(s) not rewritten in CoreDNS".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let check = coredns_check(&snapshot);
    assert_eq!(check.status, Status::Warn);
    assert!(check.detail.starts_with("1 wildcard"), "{}", check.detail);
}
