//! The parts of `/status` about which path is live: the mode, the name relay and
//! the CoreDNS writer.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use serde::{Deserialize, Serialize};

use crate::model::{Mode, NodePath};

/// Which paths are live on this node, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct ModeStatus {
    /// `--mode` as given.
    pub configured: Mode,
    /// The live paths (empty when none is).
    pub live: Vec<NodePath>,
    /// Why, in one sentence (the attach error when `auto` fell back).
    pub reason: String,
    /// When `auto` fell back because the programs could not be used: why, as a kind
    /// `doctor` picks its check by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebpf_failure: Option<EbpfFailure>,
}

/// Why the programs could not be used ([`ModeStatus::ebpf_failure`]).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EbpfFailure {
    /// A seccomp filter refused bpf() although the capabilities allow it.
    Seccomp,
    /// bpf() was refused for want of capabilities.
    Capabilities,
    /// Anything else: the reason says what.
    Other,
}

/// The name relay and the hosts file it is published in.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct NamesStatus {
    /// The address it listens on.
    pub address: Option<IpAddr>,
    /// The link the address was put on (`--names-link`), if any.
    pub link: Option<String>,
    /// What `--names-link` did: `created dummy link`, `added to lo`, `already present`, or the error.
    pub link_note: Option<String>,
    /// Bound listeners.
    pub listeners: Vec<SocketAddr>,
    /// Listeners that could not be bound yet, with the error; retried with backoff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_listeners: Vec<FailedListener>,
    /// Names ports reached through the frontends map (the connect programs are
    /// attached): nothing binds the dialled address and port, so a host process can
    /// still bind `0.0.0.0` on that port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redirects: Vec<NameRedirect>,
    /// How connects to the names ports reach the listeners (`--names-redirect`):
    /// redirected by the connect programs or by the agent's nftables table, or
    /// bound as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<String>,
    /// Why the nftables redirect was given up for binding the ports as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_error: Option<String>,
    /// The managed hosts file, when the hosts path is live.
    pub hosts_file: Option<PathBuf>,
    /// Why the hosts file was not written on the last update (content refused,
    /// read-only, replaced on the host), `None` when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts_error: Option<String>,
    /// Hostnames routed.
    pub routes: usize,
    /// `--names-domains`: the domains names are published under (empty: none is).
    #[serde(default)]
    pub domains: Vec<String>,
    /// The names scope in one sentence: the domains, or
    /// `none: --names-domains is empty, no names are published`.
    #[serde(default)]
    pub scope: String,
    /// Hostnames left out, one sentence each naming the object, the field and the
    /// rule (outside the domains, always refused, not accepted by the Gateway, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skips: Vec<String>,
    /// The caps on published names and what they withheld; `None` before the
    /// first routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<NameLimitsStatus>,
    /// The hosts file writer's pace, when the hosts file is managed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts_writer: Option<HostsWriterStatus>,
}

/// A names port sent to the name relay by the connect programs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct NameRedirect {
    /// The names address and port clients dial.
    pub dialled: SocketAddr,
    /// The listener those connects are sent to.
    pub listener: SocketAddr,
}

/// `--max-names-per-namespace` and `--max-names`, and the names they withheld
/// (each also listed in `skips`, naming its object and rule).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NameLimitsStatus {
    /// `--max-names-per-namespace`.
    pub max_names_per_namespace: usize,
    /// `--max-names`.
    pub max_names: usize,
    /// Names withheld by either cap, in all.
    pub withheld: usize,
    /// Names withheld, by namespace (the frontends file counts as
    /// `(frontends file)`); only namespaces with names withheld.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub withheld_by_namespace: BTreeMap<String, usize>,
}

/// How often the hosts file is written: at most once per `--hosts-min-interval`,
/// the latest block winning.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct HostsWriterStatus {
    /// `--hosts-min-interval`, in milliseconds.
    pub min_interval_ms: u64,
    /// Writes that changed the file, since start.
    pub writes: u64,
    /// Desired blocks replaced by a newer one before they were written.
    pub coalesced: u64,
    /// RFC 3339 time of the last write that changed the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_write: Option<String>,
    /// Whether a block waits for the interval to pass.
    pub pending: bool,
}

/// A name relay listener the agent could not bind (the port taken, the address
/// missing), and keeps retrying.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct FailedListener {
    /// The address it tries to bind.
    pub address: SocketAddr,
    /// The last bind error.
    pub error: String,
}

/// The CoreDNS writer (cluster-wide; only the Lease holder writes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CorednsStatus {
    /// `corefile` or `import`.
    pub mode: String,
    /// The ConfigMap written, `namespace/name`.
    pub configmap: String,
    /// The name the rewrites point at.
    pub target: String,
    /// Whether this agent holds the Lease, and so writes.
    pub leader: bool,
    /// RFC 3339 time of the last write that changed the ConfigMap.
    pub last_write: Option<String>,
    /// Rewrites in the last text written or found current.
    pub rewrites: usize,
    /// The last error (cleared by the next good round).
    pub last_error: Option<String>,
    /// Warning when node-local-dns is installed (its answers bypass CoreDNS rewrites).
    pub node_local_dns: Option<String>,
    /// Warning when wildcard rewrites are held back: the CoreDNS version is older
    /// than 1.8.4 (no `answer auto`) or unknown; names them and says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_back: Option<String>,
    /// RFC 3339 time since which a change waits for the minimum interval between
    /// writes (`--coredns-min-write-interval`); `None` when nothing waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_since: Option<String>,
    /// Writes (update or create) of the ConfigMap by this process.
    #[serde(default)]
    pub writes: u64,
    /// Changes of the routed names folded into a write already waiting.
    #[serde(default)]
    pub coalesced: u64,
}
