//! The parts of `/status` about the datapath: where the connect programs run among
//! the cgroup's others, what of the datapath outlives the agent, and the kernel path.

use serde::{Deserialize, Serialize};

use crate::model::KernelPathMode;

/// Where hairpin's connect programs run among the other connect programs at the
/// cgroup: a socket load balancer's (Cilium's, Calico's) in front of them rewrites
/// the LB address to a backend before they see it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct LinkOrderStatus {
    /// How the connect links are made: before every other program (`BPF_F_BEFORE`),
    /// or appended, and why.
    pub ordering: String,
    /// Whether they are made before every other program.
    pub first: bool,
    /// Each connect hook as the kernel lists it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookOrderStatus>,
    /// Why a hook could not be listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the kernel cannot order cgroup links and another program is at the
    /// root's connect hooks: the connect programs are at the root's children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<ChildCgroupsStatus>,
}

/// The connect programs linked at the root's child cgroups, where they run before
/// every program at the root; the root cgroup's own processes are not reached.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ChildCgroupsStatus {
    /// The root's child cgroups the connect programs are linked at, by name.
    pub cgroups: Vec<String>,
    /// The programs at the root's connect hooks that run before hairpin's for a
    /// process in the root cgroup itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub at_root: Vec<ForeignProgram>,
    /// How many processes live in the root cgroup itself: their connects meet the
    /// programs at the root first, and a socket load balancer's hides the LB
    /// address from hairpin's.
    pub root_processes: u64,
}

impl LinkOrderStatus {
    /// Whether a connect hook has another program in front of hairpin's for some
    /// process hairpin means to serve: at the cgroup it is linked at, or, linked at
    /// the children, for the root cgroup's own processes.
    pub(crate) fn behind(&self, hook: &str) -> bool {
        self.hooks
            .iter()
            .any(|h| h.hook == hook && !h.in_front.is_empty())
            || self
                .children
                .as_ref()
                .is_some_and(|c| c.root_processes > 0 && !c.at_root.is_empty())
    }

    /// The hooks where another program runs before hairpin's.
    pub(crate) fn blocked(&self) -> impl Iterator<Item = &HookOrderStatus> {
        self.hooks.iter().filter(|h| !h.in_front.is_empty())
    }

    /// What to do when another program runs before hairpin's.
    pub(crate) fn remedy(&self) -> &'static str {
        if self.first {
            "the agent puts its connect links first when it starts: restart it (the program \
             in front was attached with BPF_F_BEFORE after it started)"
        } else {
            "hairpin's connect programs must run first: a kernel that orders cgroup links \
             (Linux 6.17 and newer, and 6.12 stable releases with the backport) lets the agent put them there itself; otherwise attach the \
             socket load balancer's programs after hairpin's (its links removed and its agent \
             restarted once hairpin runs), or leave pods' service connections to its per-packet \
             load balancing (Cilium: socketLB.hostNamespaceOnly=true; Calico eBPF: \
             bpfConnectTimeLoadBalancing: Disabled)"
        }
    }
}

/// One connect hook: hairpin's program and those that run before it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct HookOrderStatus {
    /// `connect4` or `connect6`.
    pub hook: String,
    /// hairpin's program's id there.
    pub program_id: u32,
    /// Whether that program is attached there at all (`false`: every program listed
    /// is in `in_front`).
    pub attached: bool,
    /// The programs that run before it, in run order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_front: Vec<ForeignProgram>,
    /// The programs that run after it, in run order (a socket load balancer there
    /// sees the relay's address, or the LB address of a socket hairpin marked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<ForeignProgram>,
}

/// Another connect program at the cgroup.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ForeignProgram {
    /// Its kernel id.
    pub id: u32,
    /// Its kernel name (up to 15 bytes), when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Why the name could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_unknown: Option<String>,
}

impl std::fmt::Display for ForeignProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(name) if !name.is_empty() => write!(f, "{name} (id {})", self.id),
            _ => write!(f, "program id {}", self.id),
        }
    }
}

/// What of the datapath outlives the agent, and for how long.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct LifecycleStatus {
    /// Where links, programs and maps are pinned (`--bpf-pin-dir`), when they are:
    /// they outlive the agent and the next one adopts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_dir: Option<String>,
    /// Why nothing is pinned, when pinning was asked for and failed: the datapath
    /// goes with the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_error: Option<String>,
    /// The pin layout version (`v<layout>` under the pin directory).
    pub layout: u32,
    /// `--datapath-ttl`: how long after the agent's last heartbeat the connect
    /// programs still act.
    pub ttl_seconds: u64,
    /// Seconds since the heartbeat the programs see was written (filled per request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_age_seconds: Option<f64>,
    /// Per hook, what the agent did at start: `new`, `swapped` (an earlier agent's
    /// pinned link, its program swapped in place) or `replaced: why`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adopted: Vec<(String, String)>,
}

/// How the kernel path's connect programs tell an MPTCP subflow (which they send
/// to the relay: a sockhash refuses it, so the kernel could not write its header).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MptcpDetection {
    /// The kernel path is not on.
    Off,
    /// `bpf_skc_to_mptcp_sock` (CAP_PERFMON).
    MptcpSock,
    /// The subflow's TCP_NOTSENT_LOWAT (no CAP_PERFMON; Linux 6.7 or newer).
    NotsentLowat,
}

impl std::fmt::Display for MptcpDetection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MptcpDetection::Off => "off",
            MptcpDetection::MptcpSock => "bpf_skc_to_mptcp_sock (CAP_PERFMON)",
            MptcpDetection::NotsentLowat => "TCP_NOTSENT_LOWAT (no CAP_PERFMON, Linux 6.7+)",
        })
    }
}

/// Whether the kernel writes headers on clients' own sockets.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct KernelPathStatus {
    /// `--kernel-path`.
    pub configured: KernelPathMode,
    /// What runs: `on`, `off`, or `unavailable` (this kernel cannot run it; every
    /// frontend takes the relay path).
    pub state: KernelPathState,
    /// Why it is unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why it is unavailable, as a kind `doctor` picks its fix by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_kind: Option<KernelPathReason>,
    /// Kernel id of the sockets map (established sockets whose header is not out
    /// yet), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_map_id: Option<u32>,
    /// Capacity of the sockets map (`--kernel-path-sockets`), when on: past its
    /// limit (the capacity less a sixteenth) new connects go to the relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_capacity: Option<u32>,
    /// Where the sockets map is pinned (`--bpf-pin-dir`), when it is: its sockets
    /// keep their header if the agent dies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_map_pin: Option<String>,
    /// Why the sockets map is not pinned, when pinning was asked for and failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_map_pin_error: Option<String>,
    /// How MPTCP subflows are told apart at connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mptcp_detection: Option<MptcpDetection>,
}

/// Why the kernel path is unavailable ([`KernelPathStatus::reason_kind`]).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KernelPathReason {
    /// This kernel has no program type the kernel path needs (sock_ops, sk_msg).
    NoProgramType,
    /// Probing for a program type failed.
    ProbeFailed,
    /// The eBPF object lacks one of its programs (a build problem).
    NotInObject,
    /// The verifier refused a program.
    Refused,
    /// A kernel path hook could not be linked.
    LinkFailed,
}

/// [`KernelPathStatus::state`].
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum KernelPathState {
    /// Frontends whose client speaks first get in-kernel headers.
    On,
    /// Not asked for.
    Off,
    /// Asked for, but this kernel cannot run it.
    Unavailable,
}
