use super::*;
use crate::{
    model::{LivePath, Paths, ProxyVersion},
    status::{AttachmentStatus, FrontendStatus, KernelIds, RetryPolicy, SourceStatus},
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
    s.frontends.push(FrontendStatus {
        ip: "203.0.113.10".parse().expect("ip"),
        port: 80,
        version: ProxyVersion::V1,
        source: "file f.yaml".into(),
        state: FrontendState::Active,
        listener: Some("192.0.2.1:40001".parse().expect("addr")),
        reason: None,
        retry: None,
        path: Paths(vec![LivePath::Ebpf]),
    });
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
        s.frontends.push(FrontendStatus {
            ip: "203.0.113.10".parse().expect("ip"),
            port,
            version: ProxyVersion::V1,
            source: "file f.yaml".into(),
            state: FrontendState::Failed,
            listener: None,
            reason: Some(reason.into()),
            retry: Some(retry),
            path: Paths::default(),
        });
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
