use super::*;
use crate::model::Mode;

fn attached() -> AttachmentStatus {
    AttachmentStatus {
        cgroup: "/sys/fs/cgroup".into(),
        ids: KernelIds::default(),
    }
}

#[test]
fn ready_needs_attachment_and_every_source_synced() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    assert_eq!(
        state.snapshot().not_ready_reason().as_deref(),
        Some("programs are not attached")
    );
    state.set_attachment(Some(attached()));
    assert_eq!(
        state.snapshot().not_ready_reason().as_deref(),
        Some("no source of frontends has reported yet")
    );
    state.source_error("kubernetes services", "forbidden");
    state.source_synced("file /etc/hairpin/frontends.yaml");
    assert_eq!(
        state.snapshot().not_ready_reason().as_deref(),
        Some("sources not synced: kubernetes services")
    );
    state.source_synced("kubernetes services");
    assert_eq!(state.snapshot().not_ready_reason(), None);
    state.set_attachment(None);
    assert!(state.snapshot().not_ready_reason().is_some());
}

#[test]
fn an_agent_waiting_for_the_datapath_says_why_it_is_not_ready() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    state.source_synced("file f.yaml");
    state.update(|s| {
        s.datapath_wait =
            Some("waiting for the pin directory: another process holds its lock".into())
    });
    assert_eq!(
        state.snapshot().not_ready_reason().as_deref(),
        Some(
            "programs are not attached: waiting for the pin directory: another process holds \
             its lock"
        )
    );
    state.update(|s| s.datapath_wait = None);
    state.set_attachment(Some(attached()));
    assert_eq!(state.snapshot().not_ready_reason(), None);
}

#[test]
fn a_synced_source_stays_synced_through_errors_and_a_good_delivery_clears_them() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    state.source_synced("file f");
    state.source_error("file f", "line 3: expected a mapping");
    let s = state.snapshot();
    assert_eq!(s.sources.len(), 1);
    assert!(s.sources[0].synced);
    assert_eq!(
        s.sources[0].last_error.as_deref(),
        Some("line 3: expected a mapping")
    );
    state.source_synced("file f");
    assert_eq!(state.snapshot().sources[0].last_error, None);
}

#[test]
fn the_snapshot_round_trips_through_json_with_stable_names() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    state.set_attachment(Some(attached()));
    state.update(|s| {
        s.decisions.push(Decision {
            object: "Service ingress-nginx/controller".into(),
            state: DecisionState::Skipped,
            reason: "IPModeProxy".into(),
            message: "the LB says ipMode: Proxy".into(),
        });
        s.frontends.push(FrontendStatus::failed_for_test(
            "203.0.113.10:80",
            "no IPv4 listen address",
            None,
        ));
    });
    let snap = state.snapshot();
    let json = serde_json::to_value(&snap).expect("json");
    assert_eq!(
        json["agent"]["bypass_mark"],
        hairpin_ebpf::DEFAULT_BYPASS_MARK
    );
    assert_eq!(json["attachment"]["cgroup"], "/sys/fs/cgroup");
    assert!(
        json["attachment"]["programs"].is_array(),
        "ids are flattened"
    );
    assert_eq!(json["frontends"][0]["state"], "failed");
    assert_eq!(json["frontends"][0]["version"], "v1");
    assert_eq!(json["decisions"][0]["reason"], "IPModeProxy");
    let back: Snapshot = serde_json::from_value(json).expect("decode");
    assert_eq!(back, snap);
}

#[test]
fn without_ebpf_live_readiness_does_not_wait_for_programs() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    state.update(|s| {
        s.mode = Some(ModeStatus {
            configured: Mode::Fallback,
            live: vec![NodePath::Hosts],
            reason: "--mode fallback".into(),
            ebpf_failure: None,
        })
    });
    state.source_synced("file f");
    assert_eq!(state.snapshot().not_ready_reason(), None);
    state.update(|s| {
        if let Some(m) = s.mode.as_mut() {
            m.live = vec![NodePath::Programs];
        }
    });
    assert_eq!(
        state.snapshot().not_ready_reason().as_deref(),
        Some("programs are not attached")
    );
}

#[test]
fn the_run_loop_counts_as_stalled_only_after_it_started_and_fell_silent() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    let limit = Duration::from_secs(60);
    let later = |secs| Instant::now() + Duration::from_secs(secs);
    assert_eq!(
        state.run_loop_stalled(later(3600), limit),
        None,
        "not started yet"
    );
    state.beat();
    assert_eq!(state.run_loop_stalled(later(59), limit), None);
    let silent = state.run_loop_stalled(later(61), limit).expect("stalled");
    assert!(
        silent > limit && silent < Duration::from_secs(62),
        "{silent:?}"
    );
    // A clone (the admin server's) sees the run loop's beats.
    let admin = state.clone();
    state.beat();
    assert_eq!(admin.run_loop_stalled(later(30), limit), None);
}

#[test]
fn a_stalled_run_loop_is_the_first_reason_not_to_be_ready() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    state.set_attachment(Some(attached()));
    state.source_synced("file /etc/hairpin/frontends.yaml");
    let mut snap = state.snapshot();
    assert_eq!(snap.not_ready_reason(), None);
    snap.run_loop_stalled_secs = Some(75);
    assert_eq!(
        snap.not_ready_reason().as_deref(),
        Some("run loop stalled: silent for 75 s (liveness restarts the agent)")
    );
    // Part of the /status JSON only while it is so.
    let json = serde_json::to_value(&snap).expect("json");
    assert_eq!(json["run_loop_stalled_secs"], 75);
    snap.run_loop_stalled_secs = None;
    let json = serde_json::to_value(&snap).expect("json");
    assert!(json.get("run_loop_stalled_secs").is_none());
}

/// A name listener that could not bind (its port held by another process) keeps
/// the agent not ready: with the CoreDNS mode, the hairpin Service's endpoint on
/// this node follows readiness, so the node's pods are not sent to that port.
#[test]
fn a_name_listener_that_is_not_bound_keeps_the_agent_not_ready() {
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    state.set_attachment(Some(attached()));
    state.source_synced("file f.yaml");
    state.update(|s| s.names = Some(NamesStatus::default()));
    assert_eq!(state.snapshot().not_ready_reason(), None);
    state.update(|s| {
        if let Some(n) = s.names.as_mut() {
            n.failed_listeners = vec![FailedListener {
                address: "192.0.2.1:880".parse().expect("addr"),
                error: "Address in use".into(),
            }];
        }
    });
    let why = state.snapshot().not_ready_reason().expect("not ready");
    assert!(
        why.contains("name listeners not bound") && why.contains("192.0.2.1:880"),
        "{why}"
    );
}
