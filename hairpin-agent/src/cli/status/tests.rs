use super::kernel::{KERNEL_FALLBACKS, KERNEL_MISSES};
use super::*;
use hairpin_ebpf::Counter;

use crate::{
    model::{KernelPathMode, LivePath, Paths},
    status::{
        AttachmentStatus, FrontendStatus, KernelIds, KernelPathState, RetryPolicy, SourceStatus,
    },
};

fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    s.agent.version = "0.1.0".into();
    s.agent.pid = 42;
    s.agent.started_at = "2026-05-19T10:00:00Z".into();
    s.attachment = Some(AttachmentStatus {
        cgroup: "/sys/fs/cgroup".into(),
        ids: KernelIds {
            programs: vec![ProgramIds {
                name: "hairpin_connect4".into(),
                program_id: 101,
                link_ids: vec![7],
                map_ids: vec![11, 12],
            }],
            frontends_map_id: Some(11),
            counters_map_id: Some(12),
        },
    });
    s.frontends.push(FrontendStatus::active_for_test(
        "203.0.113.10:80",
        "192.0.2.1:40001",
    ));
    s.sources.push(SourceStatus {
        name: "file f.yaml".into(),
        synced: true,
        last_sync: Some("2026-05-19T10:00:01Z".into()),
        last_error: None,
    });
    s.counters.kernel.insert("redirected".into(), 3);
    s
}

fn report(status: Option<Snapshot>) -> StatusReport {
    StatusReport {
        agent_reachable: status.is_some(),
        agent_error: status
            .is_none()
            .then(|| "the agent is not reachable: ...".into()),
        not_ready_reason: status.as_ref().and_then(Snapshot::not_ready_reason),
        status,
        kernel_programs: Some(vec![]),
        kernel_error: None,
        pinned: None,
    }
}

#[test]
fn a_live_agent_renders_programs_frontends_counters_and_sources() {
    let text = render(&report(Some(snapshot())), false);
    assert!(
        text.starts_with(
            "agent       hairpin-agent 0.1.0 (pid 42, started 2026-05-19T10:00:00Z): ready\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("programs    attached at /sys/fs/cgroup\n"),
        "{text}"
    );
    assert!(
        text.contains("            hairpin_connect4  101      7\n"),
        "{text}"
    );
    assert!(
        text.contains("maps        frontends id 11, counters id 12\n"),
        "{text}"
    );
    assert!(
        text.contains("  203.0.113.10:80  active  ebpf  192.0.2.1:40001  v1     file f.yaml\n"),
        "{text}"
    );
    assert!(
        text.contains("counters    redirected 3, skipped by mark 0;"),
        "{text}"
    );
    assert!(
        text.contains("  file f.yaml  yes     2026-05-19T10:00:01Z\n"),
        "{text}"
    );
    assert!(!text.contains("decisions"), "{text}");
}

/// Issue 14: names withheld by the caps are counted by namespace, with the caps,
/// and the hosts file writer says how often it wrote and what it coalesced.
#[test]
fn names_withheld_by_the_caps_and_the_hosts_writers_pace_are_shown() {
    let mut s = snapshot();
    s.names = Some(crate::status::NamesStatus {
        domains: vec!["example.com".into()],
        hosts_file: Some("/host/etc/hosts".into()),
        skips: vec![
            "Ingress tenant-a/a3: spec.rules[0].host: host a3.example.com withheld \
                     (rule max-names-per-namespace): ..."
                .into(),
        ],
        limits: Some(crate::status::NameLimitsStatus {
            max_names_per_namespace: 3,
            max_names: 2000,
            withheld: 7,
            withheld_by_namespace: [("tenant-a".to_owned(), 7)].into(),
        }),
        hosts_writer: Some(crate::status::HostsWriterStatus {
            min_interval_ms: 2000,
            writes: 4,
            coalesced: 98,
            last_write: Some("2026-05-19T10:00:02Z".into()),
            pending: true,
        }),
        ..Default::default()
    });
    let text = render(&report(Some(s)), false);
    assert!(
        text.contains(
            "            7 names withheld by the caps (--max-names-per-namespace 3, \
             --max-names 2000): tenant-a 7\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "            hosts file written 4 times (last 2026-05-19T10:00:02Z), at most once \
             per 2s; 98 changes coalesced, one waiting\n"
        ),
        "{text}"
    );
    assert!(text.contains("left out: Ingress tenant-a/a3"), "{text}");
}

#[test]
fn an_unreachable_agent_renders_what_the_kernel_has() {
    let mut r = report(None);
    let text = render(&r, false);
    assert!(text.contains("no hairpin programs loaded"), "{text}");
    r.kernel_programs = Some(vec![ProgramIds {
        name: "hairpin_connect".into(),
        program_id: 9,
        link_ids: vec![],
        map_ids: vec![1],
    }]);
    let text = render(&r, false);
    assert!(
        text.contains("hairpin_connect  9        not attached  1"),
        "{text}"
    );
}

#[test]
fn a_failed_frontend_says_why_and_when_it_is_tried_again() {
    let mut s = snapshot();
    for (port, reason, retry) in [
        (81, "the frontend map is full", RetryPolicy::OnChange),
        (82, "address in use", RetryPolicy::Backoff),
    ] {
        s.frontends.push(FrontendStatus::failed_for_test(
            &format!("203.0.113.10:{port}"),
            reason,
            Some(retry),
        ));
    }
    let text = render(&report(Some(s)), false);
    assert!(
        text.contains("the frontend map is full (waits for a change)\n"),
        "{text}"
    );
    assert!(
        text.contains("address in use (retrying with backoff)\n"),
        "{text}"
    );
}

/// A `/status` of an agent with the kernel path on (`--kernel-path auto`, the
/// default), as it serves it (trimmed to what the kernel path lines read): two
/// frontends, one whose server speaks first.
const KERNEL_PATH_STATUS: &str = r#"{
  "agent": {"version": "0.1.0", "pid": 42, "started_at": "2026-05-19T10:00:00Z", "bypass_mark": 104},
  "attachment": null,
  "frontends": [
    {"ip": "203.0.113.10", "port": 80, "version": "v1", "source": "file f.yaml", "state": "active",
     "listener": "192.0.2.1:40001", "reason": "kernel: the client speaks first", "path": "kernel"},
    {"ip": "203.0.113.10", "port": 25, "version": "v2", "source": "file f.yaml", "state": "active",
     "listener": "192.0.2.1:40002",
     "reason": "relay: the server speaks first (the kernel writes the header only ahead of the client's first bytes)",
     "path": "ebpf"}
  ],
  "counters": {
    "kernel": {"redirected": 4, "skipped_bypass_mark": 4, "kernel_marked": 12,
               "kernel_headers_written": 9, "kernel_fallback_relay": 0, "kernel_fallback_full": 1,
               "kernel_fallback_mptcp": 2, "kernel_fallback_fastopen": 3, "kernel_missed_insert": 0, "kernel_missed_data_first": 0,
               "kernel_missed_push": 0, "kernel_missed_write": 0, "kernel_sockets_entered": 10,
               "kernel_sockets_left": 9},
    "relay": {"connections": 4, "active_connections": 0, "bytes_upstream": 1, "bytes_downstream": 2,
              "upstream_errors": {}}
  },
  "sources": [{"name": "file f.yaml", "synced": true, "last_sync": null, "last_error": null}],
  "last_reconcile": null,
  "decisions": [],
  "kernel_path": {"configured": "auto", "state": "on", "sockets_map_id": 33, "sockets_capacity": 64}
}"#;

fn kernel_path_snapshot() -> Snapshot {
    serde_json::from_str(KERNEL_PATH_STATUS).expect("a /status document")
}

/// Issue 13: the kernel path's state, its sockets map fill against the capacity,
/// headers written, fallbacks to the relay by reason; each frontend says who writes
/// its header and why.
#[test]
fn the_kernel_path_shows_its_fill_headers_fallbacks_and_each_frontends_writer() {
    let text = render(&report(Some(kernel_path_snapshot())), false);
    assert!(
        text.contains(
            "kernel path on (--kernel-path auto): the kernel writes the header of \
             client-speaks-first frontends on the client's own socket\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "            sockets map id 33: 1 of 64 in use (new connects go to the relay from 60)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "            headers written 9 of 12 sockets marked; to the relay instead: no socket \
             storage 0, sockets map near full 1, MPTCP subflow 2, TCP Fast Open 3, mesh proxy 0\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("            missed none: no connection went without its header\n"),
        "{text}"
    );
    assert!(
        text.contains("FRONTEND         STATE   PATH    HEADER  LISTENER"),
        "{text}"
    );
    assert!(
        text.contains(
            "  203.0.113.10:80  active  kernel  kernel  192.0.2.1:40001  v1     file f.yaml  \
             kernel: the client speaks first\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "  203.0.113.10:25  active  ebpf    relay   192.0.2.1:40002  v2     file f.yaml  \
             relay: the server speaks first"
        ),
        "{text}"
    );
}

/// A miss is a connection that went without its header: named with what it means,
/// and painted as a warning on a terminal; so is a sockets map at its limit.
#[test]
fn kernel_path_misses_are_named_and_painted_as_warnings() {
    let mut s = kernel_path_snapshot();
    s.counters
        .kernel
        .insert("kernel_missed_data_first".into(), 3);
    s.counters.kernel.insert("kernel_missed_push".into(), 1);
    s.counters
        .kernel
        .insert("kernel_sockets_entered".into(), 70);
    let text = render(&report(Some(s.clone())), false);
    assert!(
        text.contains(
            "            missed 4: connections that went without their header: \
             kernel_missed_data_first 3 (data sent before the handshake completed: TCP Fast \
             Open (MSG_FASTOPEN, where the agent has no CAP_PERFMON), or a send() queued while \
             connecting); kernel_missed_push 1 (no memory to make room for the header)\n"
        ),
        "{text}"
    );
    let coloured = render(&report(Some(s)), true);
    assert!(
        coloured.contains("\x1b[33mmissed 4: connections that went without their header"),
        "{coloured}"
    );
    assert!(coloured.contains("\x1b[33m61 of 64 in use"), "{coloured}");
    let clean = render(&report(Some(kernel_path_snapshot())), true);
    assert!(
        clean.contains("            missed none: no connection went without its header\n"),
        "{clean}"
    );
}

/// Asked for but unavailable: the reason, and every frontend is relayed; off: one
/// line and the frontends table as without the kernel path.
#[test]
fn an_unavailable_kernel_path_says_why_and_an_off_one_stays_quiet() {
    let mut s = kernel_path_snapshot();
    s.counters.kernel.retain(|k, _| !k.starts_with("kernel_"));
    s.kernel_path = Some(crate::status::KernelPathStatus {
        configured: KernelPathMode::Auto,
        state: KernelPathState::Unavailable,
        reason: Some("this kernel has no sk_msg programs".into()),
        reason_kind: Some(crate::status::KernelPathReason::NoProgramType),
        sockets_map_id: None,
        sockets_capacity: None,
        sockets_map_pin: None,
        sockets_map_pin_error: None,
        mptcp_detection: None,
    });
    for f in &mut s.frontends {
        f.path = Paths(vec![LivePath::Relay]);
        f.reason = Some("relay: the kernel path is unavailable on this node".into());
    }
    let text = render(&report(Some(s.clone())), false);
    assert!(
        text.contains(
            "kernel path unavailable: this kernel has no sk_msg programs (--kernel-path auto): \
             every frontend takes the relay\n"
        ),
        "{text}"
    );
    assert!(!text.contains("sockets map"), "{text}");
    assert!(
        text.contains("  203.0.113.10:80  active  ebpf  relay   192.0.2.1:40001"),
        "{text}"
    );
    let coloured = render(&report(Some(s.clone())), true);
    assert!(
        coloured.contains("\x1b[33munavailable: this kernel has no sk_msg programs"),
        "{coloured}"
    );
    // Required (`on`): said so, and painted as a failure rather than a caveat.
    if let Some(kp) = s.kernel_path.as_mut() {
        kp.configured = KernelPathMode::On;
    }
    let text = render(&report(Some(s.clone())), false);
    assert!(
        text.contains(
            "kernel path unavailable: this kernel has no sk_msg programs (--kernel-path on, \
             required): every frontend takes the relay\n"
        ),
        "{text}"
    );
    let coloured = render(&report(Some(s.clone())), true);
    assert!(
        coloured.contains("\x1b[31munavailable: this kernel has no sk_msg programs"),
        "{coloured}"
    );

    s.kernel_path = Some(crate::status::KernelPathStatus {
        configured: KernelPathMode::Off,
        state: KernelPathState::Off,
        reason: None,
        reason_kind: None,
        sockets_map_id: None,
        sockets_capacity: None,
        sockets_map_pin: None,
        sockets_map_pin_error: None,
        mptcp_detection: None,
    });
    let text = render(&report(Some(s)), false);
    assert!(
        text.contains("kernel path off (--kernel-path off): every frontend takes the relay\n"),
        "{text}"
    );
    assert!(!text.contains("HEADER"), "{text}");
    assert!(!text.contains("missed"), "{text}");
}

/// Every counter of a connection without its header, and every fallback, is said.
#[test]
fn every_kernel_miss_and_fallback_counter_has_its_words() {
    for c in Counter::ALL {
        let named = |list: &[(Counter, &str)]| list.iter().any(|(k, _)| *k == c);
        assert_eq!(c.is_kernel_miss(), named(&KERNEL_MISSES), "{}", c.name());
        assert_eq!(
            c.name().starts_with("kernel_fallback_"),
            named(&KERNEL_FALLBACKS),
            "{}",
            c.name()
        );
    }
}

/// Where the sockets map is pinned, or why it is not, follows its fill line.
#[test]
fn the_kernel_path_says_where_its_sockets_map_is_pinned_or_why_not() {
    // The kernel-path status with `field` added to its kernel_path object, rendered.
    let with = |field: &str| {
        let status = KERNEL_PATH_STATUS.replace(
            "\"sockets_capacity\": 64}",
            &format!("\"sockets_capacity\": 64, {field}}}"),
        );
        render(
            &report(Some(serde_json::from_str(&status).expect("status"))),
            false,
        )
    };
    let text = with("\"sockets_map_pin\": \"/sys/fs/bpf/hairpin/v1/maps/HAIRPIN_SOCKETS\"");
    assert!(
        text.contains(
            "(new connects go to the relay from 60)\n            pinned at \
             /sys/fs/bpf/hairpin/v1/maps/HAIRPIN_SOCKETS: the datapath outlives the agent\n"
        ),
        "{text}"
    );
    let text = with("\"sockets_map_pin_error\": \"/sys/fs/bpf is not on a bpf filesystem\"");
    assert!(
        text.contains(
            "            not pinned (/sys/fs/bpf is not on a bpf filesystem): the datapath \
             goes with the agent, and sockets established but not yet written when it dies go \
             without their header\n"
        ),
        "{text}"
    );
    let text = with("\"mptcp_detection\": \"notsent_lowat\"");
    assert!(
        text.contains(
            "            MPTCP subflows told apart by TCP_NOTSENT_LOWAT (no CAP_PERFMON, Linux 6.7+)\n"
        ),
        "{text}"
    );
    let plain = render(&report(Some(kernel_path_snapshot())), false);
    assert!(!plain.contains("pinned"), "{plain}");
}

#[test]
fn an_unserved_relay_family_is_named_with_its_error_and_fix() {
    let mut s = snapshot();
    s.relay = Some(crate::status::RelayStatus {
        listeners: vec!["169.254.104.1:1023".parse().expect("addr")],
        unserved: vec![crate::status::UnservedFamily {
            family: "IPv6".into(),
            address: Some("fd68:6169:7270:696e::1".parse().expect("ip")),
            what: crate::status::UnservedStep::Bind,
            error: "Address in use (os error 98)".into(),
            fix: "free one".into(),
        }],
    });
    let text = render(&report(Some(s)), false);
    assert!(
        text.contains("relay       listening on 169.254.104.1:1023\n")
            && text.contains(
                "IPv6 not served: the relay's IPv6 listener is not served on \
                 fd68:6169:7270:696e::1 (bind: Address in use (os error 98))"
            )
            && text.contains("fix: free one"),
        "{text}"
    );
}
