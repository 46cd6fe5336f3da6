//! What the running agent knows about itself, for the admin server's `/status` and
//! `/readyz` and for the node CLI that reads them.
//!
//! The run loop writes a [`Snapshot`] through [`AgentState`] after each change; the
//! admin server only reads it. The same types deserialize on the CLI side, so the
//! field names below are the stable JSON contract of `/status`.

pub(crate) mod admin;
pub(crate) mod capabilities;
pub(crate) mod metrics;
pub(crate) mod metrics_address;
pub(crate) mod tcp_server;
mod version;
pub(crate) use version::build_version;
pub use version::set_build_version;

pub use metrics::{ConnError, Direction, Metrics};

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::model::{NodePath, Paths, ProxyVersion};

mod datapath;
pub(crate) use datapath::{
    ChildCgroupsStatus, ForeignProgram, HookOrderStatus, KernelPathReason, KernelPathState,
    KernelPathStatus, LifecycleStatus, LinkOrderStatus, MptcpDetection,
};
mod relay;
pub(crate) use relay::{RelayStatus, UnservedFamily, UnservedStep};
mod paths;
pub(crate) use paths::{
    CorednsStatus, EbpfFailure, FailedListener, HostsWriterStatus, ModeStatus, NameLimitsStatus,
    NameRedirect, NamesStatus,
};

/// Shared, cheaply cloneable handle on the agent's [`Snapshot`].
#[derive(Clone, Debug, Default)]
pub struct AgentState {
    inner: Arc<RwLock<Snapshot>>,
    /// When the run loop last went round or ticked; `None` before it started.
    heartbeat: Arc<Mutex<Option<Instant>>>,
}

/// How often the run loop beats while it waits for a change.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// A run loop silent this long is stuck (an apply that never returns, a
/// deadlock): `/healthz` fails so the kubelet restarts the agent. Twelve missed
/// beats, and three times the longest drain the manifests allow.
pub(crate) const RUN_LOOP_STALL: Duration = Duration::from_secs(60);

/// Everything `/status` reports. Counters are filled in per request by the admin server.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Snapshot {
    /// The agent process.
    pub agent: AgentInfo,
    /// Where the programs are attached; `None` before attach and after detach.
    pub attachment: Option<AttachmentStatus>,
    /// Every frontend asked for, live or failed.
    pub frontends: Vec<FrontendStatus>,
    /// Kernel and relay counters.
    pub counters: Counters,
    /// Each source of desired frontends (the file, Kubernetes watches).
    pub sources: Vec<SourceStatus>,
    /// The last time desired state was applied.
    pub last_reconcile: Option<ReconcileStatus>,
    /// Per-object decisions (Kubernetes Services), free-form for their producer.
    pub decisions: Vec<Decision>,
    /// Which paths are live on this node and why; `None` until the agent decided.
    #[serde(default)]
    pub mode: Option<ModeStatus>,
    /// The name relay, when it runs.
    #[serde(default)]
    pub names: Option<NamesStatus>,
    /// How long the run loop has been silent, when over the liveness limit (filled
    /// per request by the admin server; `/healthz` fails meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_loop_stalled_secs: Option<u64>,
    /// The cluster DNS Service's IPs (kube-dns), from the Kubernetes source; what
    /// `check` asks to resolve as a pod does when no --dns-server is given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<IpAddr>,
    /// The CoreDNS writer, when `--coredns` is not `off`.
    #[serde(default)]
    pub coredns: Option<CorednsStatus>,
    /// Which peers the relays serve, and where that came from.
    #[serde(default)]
    pub clients: Option<ClientsStatus>,
    /// Where the relays listen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<ListenStatus>,
    /// The relay of frontends' listeners and the families it does not serve, when a
    /// datapath runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayStatus>,
    /// The kernel path (in-kernel headers), when the programs were loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<KernelPathStatus>,
    /// What outlives the agent: pins, the dead-man switch, what was adopted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleStatus>,
    /// Where the connect programs run among the other connect programs at the
    /// cgroup (a socket load balancer in front hides the LB address from them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_order: Option<LinkOrderStatus>,
    /// How relayed bytes move once spliced (`--relay-splice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_splice: Option<RelaySpliceStatus>,
    /// Why the agent waits to own the node's datapath (another agent holds the pin
    /// directory's lock), while it does: the admin server answers from the start,
    /// and readiness gives this as its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath_wait: Option<String>,
}

/// How relayed bytes move once a way is spliced.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RelaySpliceStatus {
    /// `--relay-splice`: `auto`, `kernel`, `pipe` or `off`.
    pub configured: String,
    /// What splices: `kernel` (the stream verdict), `pipe` (splice(2)) or `copy`
    /// (nothing: every byte through the agent).
    pub splicer: String,
    /// Why the kernel's splice is not used, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `--relay-splice-after`: bytes a way copies before it is spliced.
    pub after_bytes: u64,
}

/// The relays' client policy as `status` and `doctor` show it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct ClientsStatus {
    /// The allowed networks, comma-separated, or `any`.
    pub allowed: String,
    /// Where they came from (`--allowed-clients`, the Node's pod CIDRs, this node's
    /// routes) or why only the node itself is served.
    pub source: String,
    /// This node's pod networks read from its routes, when the policy learns them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<LearnedClientsStatus>,
}

/// Where the relays listen.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct ListenStatus {
    /// The listen addresses (one per family).
    pub addresses: Vec<IpAddr>,
    /// The link they were put on (`--listen-link`), when one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// What was done to put them there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The pod networks the client policy read from this node's links and routes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct LearnedClientsStatus {
    /// Pod addresses (host routes out of pods' veths).
    pub pods: usize,
    /// Pod ranges (Cilium's through cilium_host, a pod bridge's).
    pub ranges: usize,
    /// The CNI shapes that matched, each with its count, or that none did.
    pub shapes: String,
    /// Whether the routes have been read once (until then, pods are refused).
    pub synced: bool,
    /// The last read's error, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The agent process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct AgentInfo {
    /// Crate version.
    pub version: String,
    /// Process id, to pair with `dump --pid`.
    pub pid: u32,
    /// RFC 3339 start time.
    pub started_at: String,
    /// SO_MARK of relay upstream sockets, which the programs skip.
    pub bypass_mark: u32,
}

/// Where and how the programs are attached.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct AttachmentStatus {
    /// The cgroup v2 directory.
    pub cgroup: PathBuf,
    /// Kernel ids of the programs, links and maps.
    #[serde(flatten)]
    pub ids: KernelIds,
}

/// One program with its links.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramIds {
    /// ELF name (`hairpin_connect4`), or the kernel's truncated one when found by listing.
    pub name: String,
    /// Kernel program id.
    pub program_id: u32,
    /// bpf_link ids attaching it.
    pub link_ids: Vec<u32>,
    /// Map ids it uses.
    pub map_ids: Vec<u32>,
}

/// Kernel ids of one datapath: its programs and its two maps.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelIds {
    /// connect4 and connect6.
    pub programs: Vec<ProgramIds>,
    /// Id of the frontends map.
    pub frontends_map_id: Option<u32>,
    /// Id of the counters map.
    pub counters_map_id: Option<u32>,
}

/// Whether a frontend is proxied now.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FrontendState {
    /// A listener and a redirect are live.
    Active,
    /// It could not be made live; traffic takes the pre-hairpin path.
    Failed,
    /// No redirect (eBPF is not live), but names routed to it reach the name relay.
    Fallback,
}

/// One frontend asked for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct FrontendStatus {
    /// The LoadBalancer IP.
    pub ip: IpAddr,
    /// The TCP port.
    pub port: u16,
    /// The PROXY version written.
    pub version: ProxyVersion,
    /// What asked for it.
    pub source: String,
    /// Active or failed.
    pub state: FrontendState,
    /// The relay listener when active.
    pub listener: Option<SocketAddr>,
    /// Why it failed.
    pub reason: Option<String>,
    /// When a failed frontend is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// How in-cluster clients reach a relay: `ebpf`, `hosts`, `coredns` joined by
    /// commas (`ebpf,hosts`), or `none` when nothing leads them to one.
    pub path: Paths,
}

/// When a failed frontend is tried again.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RetryPolicy {
    /// Soon, with backoff (1 s doubling to 30 s): the cause may pass by itself.
    Backoff,
    /// At the next change of the desired frontends: retrying alone cannot fix it.
    OnChange,
}

impl RetryPolicy {
    /// How `status` says it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            RetryPolicy::Backoff => "retrying with backoff",
            RetryPolicy::OnChange => "waits for a change",
        }
    }
}

/// Counters, summed over CPUs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Counters {
    /// The programs' counters by name (`redirected`, `skipped_bypass_mark`).
    pub kernel: BTreeMap<String, u64>,
    /// The relay's.
    pub relay: RelayCounters,
}

/// The relay's counters, as `/metrics` also exports them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RelayCounters {
    /// Connections accepted.
    pub connections: u64,
    /// Connections open now.
    pub active_connections: i64,
    /// Bytes client -> LB.
    pub bytes_upstream: u64,
    /// Bytes LB -> client.
    pub bytes_downstream: u64,
    /// Upstream failures by kind (`refused`, `timeout`, `reset`, `other`).
    pub upstream_errors: BTreeMap<String, u64>,
    /// Relayed connections ended by the client's side, by kind (only kinds seen).
    #[serde(default)]
    pub client_errors: BTreeMap<String, u64>,
    /// Connections reset at accept because a cap was reached, by cap (only caps hit).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shed: BTreeMap<String, u64>,
    /// Ways of relayed connections (client to LB, LB to client) that were spliced,
    /// by what spliced them (`kernel`, `pipe`; only those seen).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spliced_ways: BTreeMap<String, u64>,
    /// Bytes of kernel-spliced ways that the relay carried itself (past the
    /// kernel's credit: a reader slower than its writer).
    #[serde(default)]
    pub spliced_left_bytes: u64,
    /// Times the kernel stopped taking a spliced way's bytes until its reader
    /// caught up.
    #[serde(default)]
    pub spliced_pauses: u64,
}

/// Health of one source of desired frontends.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct SourceStatus {
    /// `file /path`, `kubernetes services`, ...
    pub name: String,
    /// True once it delivered a complete first set.
    pub synced: bool,
    /// RFC 3339 time of the last good delivery.
    pub last_sync: Option<String>,
    /// The last error, cleared by the next good delivery.
    pub last_error: Option<String>,
}

/// The last apply of desired state.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct ReconcileStatus {
    /// RFC 3339 time it finished.
    pub at: String,
    /// How long it took, in milliseconds.
    pub duration_ms: f64,
}

/// What was decided for an object, in one word.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DecisionState {
    /// At least one of its frontends is proxied.
    Proxied,
    /// Nothing of it is proxied, for the reason given.
    Skipped,
    /// An annotation of ours is invalid; skipped until it is fixed.
    Invalid,
}

impl DecisionState {
    /// The word `/status` uses.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DecisionState::Proxied => "proxied",
            DecisionState::Skipped => "skipped",
            DecisionState::Invalid => "invalid",
        }
    }
}

/// One decision about a Kubernetes object, as its producer words it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Decision {
    /// `Service ns/name` and the like.
    pub object: String,
    /// What was decided.
    pub state: DecisionState,
    /// Short machine-readable reason (`IPModeProxy`, `NoProxyProtocol`, ...).
    pub reason: String,
    /// Human sentence.
    pub message: String,
}

/// RFC 3339 at second precision, the format of every time in [`Snapshot`].
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl AgentState {
    /// A state for this process, nothing attached or synced yet.
    pub fn new(bypass_mark: u32) -> AgentState {
        let state = AgentState::default();
        state.update(|s| {
            s.agent = AgentInfo {
                version: build_version().to_string(),
                pid: std::process::id(),
                started_at: rfc3339(SystemTime::now()),
                bypass_mark,
            }
        });
        state
    }

    /// The CoreDNS writer's part of the snapshot: what the suites that run the
    /// writer in process read, so the rest of the snapshot stays the crate's own.
    pub fn coredns(&self) -> Option<CorednsStatus> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .coredns
            .clone()
    }

    /// A copy of the snapshot.
    pub(crate) fn snapshot(&self) -> Snapshot {
        // A writer that panicked left a whole snapshot behind: still worth serving.
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Changes the snapshot under the lock.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        f(&mut self.inner.write().unwrap_or_else(PoisonError::into_inner));
    }

    /// The run loop is alive now.
    pub(crate) fn beat(&self) {
        *self
            .heartbeat
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// How long the run loop has been silent at `now`, when that is over `limit`;
    /// `None` while it beats, and before it first started (start-up has its own
    /// probe).
    pub(crate) fn run_loop_stalled(&self, now: Instant, limit: Duration) -> Option<Duration> {
        let last = (*self
            .heartbeat
            .lock()
            .unwrap_or_else(PoisonError::into_inner))?;
        let silent = now.saturating_duration_since(last);
        (silent > limit).then_some(silent)
    }

    /// Records where the programs are attached (`None`: detached).
    pub(crate) fn set_attachment(&self, attachment: Option<AttachmentStatus>) {
        self.update(|s| s.attachment = attachment);
    }

    /// Records every frontend asked for and how it stands, after an apply that
    /// took `took`.
    pub(crate) fn record_frontends(&self, mut frontends: Vec<FrontendStatus>, took: Duration) {
        frontends.sort_by_key(|f| (f.ip, f.port));
        self.update(|s| {
            s.frontends = frontends;
            s.last_reconcile = Some(ReconcileStatus {
                at: rfc3339(SystemTime::now()),
                duration_ms: took.as_secs_f64() * 1000.0,
            });
        });
    }

    /// Records a good delivery from source `name`: it is synced from now on.
    pub(crate) fn source_synced(&self, name: &str) {
        self.with_source(name, |src| {
            src.synced = true;
            src.last_sync = Some(rfc3339(SystemTime::now()));
            src.last_error = None;
        });
    }

    /// Registers source `name` as not yet synced, so readiness waits for it.
    pub(crate) fn register_source(&self, name: &str) {
        self.with_source(name, |_| {});
    }

    /// Clears the last error of source `name` (its watch recovered).
    pub(crate) fn source_recovered(&self, name: &str) {
        self.with_source(name, |src| src.last_error = None);
    }

    /// Records an error from source `name`; a synced source stays synced (fail static).
    pub(crate) fn source_error(&self, name: &str, error: &str) {
        self.with_source(name, |src| src.last_error = Some(error.to_string()));
    }

    fn with_source(&self, name: &str, f: impl FnOnce(&mut SourceStatus)) {
        self.update(|s| {
            let idx = match s.sources.iter().position(|x| x.name == name) {
                Some(i) => i,
                None => {
                    s.sources.push(SourceStatus {
                        name: name.to_string(),
                        synced: false,
                        last_sync: None,
                        last_error: None,
                    });
                    s.sources.len() - 1
                }
            };
            f(&mut s.sources[idx]);
        });
    }
}

impl Snapshot {
    /// Why the agent is not ready, or `None` when programs are attached and every
    /// source has synced.
    pub(crate) fn not_ready_reason(&self) -> Option<String> {
        if let Some(secs) = self.run_loop_stalled_secs {
            return Some(format!(
                "run loop stalled: silent for {secs} s (liveness restarts the agent)"
            ));
        }
        // Programs are awaited only where eBPF is a live path (not in `fallback`, nor
        // in `auto` after it fell back); before the paths are decided, they are.
        let wants_programs = self
            .mode
            .as_ref()
            .is_none_or(|m| m.live.contains(&NodePath::Programs));
        if wants_programs && self.attachment.is_none() {
            return Some(match &self.datapath_wait {
                Some(wait) => format!("programs are not attached: {wait}"),
                None => "programs are not attached".into(),
            });
        }
        if self.sources.is_empty() {
            return Some("no source of frontends has reported yet".into());
        }
        let pending: Vec<&str> = self
            .sources
            .iter()
            .filter(|s| !s.synced)
            .map(|s| s.name.as_str())
            .collect();
        if !pending.is_empty() {
            return Some(format!("sources not synced: {}", pending.join(", ")));
        }
        // Every name listener counts: with the CoreDNS mode the hairpin Service's
        // endpoint on this node follows readiness, and a listener that could not bind
        // (its port held by someone else) must not receive the node's pods' names.
        let failed: Vec<String> = self
            .names
            .iter()
            .flat_map(|n| &n.failed_listeners)
            .map(|f| format!("{} ({})", f.address, f.error))
            .collect();
        (!failed.is_empty()).then(|| format!("name listeners not bound: {}", failed.join(", ")))
    }
}

#[cfg(test)]
impl FrontendStatus {
    /// `addr` (`IP:PORT`) from `file f.yaml` with a v1 header, active at `listener`
    /// on the relay path.
    pub(crate) fn active_for_test(addr: &str, listener: &str) -> FrontendStatus {
        FrontendStatus {
            state: FrontendState::Active,
            listener: Some(listener.parse().expect("a listener address")),
            path: Paths(vec![crate::model::LivePath::Relay]),
            ..FrontendStatus::failed_for_test(addr, "", None)
        }
    }

    /// `addr` (`IP:PORT`) from `file f.yaml` with a v1 header, failed for `reason`
    /// (none when empty) and tried again as `retry` says.
    pub(crate) fn failed_for_test(
        addr: &str,
        reason: &str,
        retry: Option<RetryPolicy>,
    ) -> FrontendStatus {
        let addr: SocketAddr = addr.parse().expect("a frontend address");
        FrontendStatus {
            ip: addr.ip(),
            port: addr.port(),
            version: ProxyVersion::V1,
            source: "file f.yaml".into(),
            state: FrontendState::Failed,
            listener: None,
            reason: (!reason.is_empty()).then(|| reason.into()),
            retry,
            path: Paths::default(),
        }
    }
}

#[cfg(test)]
mod tests;
