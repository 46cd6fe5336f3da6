//! The lifecycle's typed states: what the agent observes of the node's datapath at
//! each moment it decides (starting, linking a hook, stopping, draining), and what it
//! then does. Plain data: nothing here reads or changes the kernel.

use std::{fmt, path::PathBuf, time::Duration};

use crate::datapath::counters::Fill;
use crate::datapath::liveness::HeartbeatState;
use crate::datapath::pin::Unusable;
use crate::datapath::role::Role;
use crate::status::ForeignProgram;

/// The pin directory as a starting agent finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PinDirSeen {
    /// No `--bpf-pin-dir`: the datapath is this process's own.
    Off,
    /// Locked by this agent: it owns the node's datapath now.
    Locked,
    /// Another process holds its lock: another agent owns the node's datapath.
    Busy,
    /// It cannot be used (why): not a bpf filesystem, not writable.
    Unusable(Unusable),
}

/// A datapath of another pin layout found in the pin directory (links pinned there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ForeignLayout {
    /// Its directory, `<pin dir>/v<N>`.
    pub dir: PathBuf,
    /// Its heartbeat, which every layout keeps in the same shape.
    pub heartbeat: HeartbeatState,
}

impl ForeignLayout {
    /// Its directory's name, `v<N>`.
    pub(crate) fn name(&self) -> String {
        self.dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    }
}

/// What a starting agent observes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StartSeen {
    /// The pin directory.
    pub pins: PinDirSeen,
    /// Where it is (`--bpf-pin-dir`), when there is one.
    pub dir: Option<PathBuf>,
    /// Links of this agent's own layout are pinned: an earlier agent's datapath.
    pub own_links: bool,
    /// Datapaths of other layouts (read only when the lock is this agent's).
    pub foreign: Vec<ForeignLayout>,
}

/// What a starting agent does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Waits, not ready, and says why in the log and `status`; observes again later.
    Wait(Wait),
    /// Loads and links.
    Go(Go),
}

/// Why a starting agent waits. Waiting is a state of the lifecycle, never an error:
/// the running datapath is neither broken nor silently taken over meanwhile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Another agent holds the pin directory's lock.
    ForLock {
        /// The pin directory.
        dir: PathBuf,
    },
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::ForLock { dir } => write!(
                f,
                "waiting for the pin directory: another process holds the lock of {}: another \
                 hairpin agent owns this node's datapath",
                dir.display()
            ),
        }
    }
}

/// How a starting agent goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Go {
    /// Nothing pinned: every map made and pinned, every hook linked anew.
    Fresh,
    /// An earlier agent's datapath of this layout: its maps reused as they are, its
    /// links' programs swapped in place.
    Adopt,
    /// Datapaths of another layout that expired: removed first, then the agent goes
    /// on as `then` says.
    TakeOver {
        /// The layouts removed.
        expired: Vec<ForeignLayout>,
        /// Fresh or adopt, once they are gone.
        then: Box<Go>,
    },
    /// Live datapaths of another layout whose agent has exited (this one holds the
    /// lock): expired ones removed first; then this agent goes on as `then` says,
    /// linking its consumers beside the other layout's, and once its frontends are
    /// live swaps its connect programs into the other layout's connect links in
    /// place (the hooks never run without a program, nor with two that mark); the
    /// other layout goes once the sockets it marked have their header.
    HandOver {
        /// The live layouts handed over.
        live: Vec<ForeignLayout>,
        /// Expired layouts, removed first.
        expired: Vec<ForeignLayout>,
        /// Fresh or adopt.
        then: Box<Go>,
    },
    /// Nothing pinned and nothing to pin: the datapath goes with this process
    /// (`None`: no pin directory asked for; else why it cannot be used).
    Unpinned(Option<Unusable>),
}

impl fmt::Display for Go {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Go::Fresh => f.write_str("fresh"),
            Go::Adopt => f.write_str("adopt"),
            Go::TakeOver { expired, then } => {
                let names: Vec<String> = expired.iter().map(ForeignLayout::name).collect();
                write!(
                    f,
                    "take over from layout {} (expired), then {then}",
                    names.join(", ")
                )
            }
            Go::HandOver { live, then, .. } => {
                let names: Vec<String> = live.iter().map(ForeignLayout::name).collect();
                write!(
                    f,
                    "hand over from layout {} (live, its agent gone), then {then}",
                    names.join(", ")
                )
            }
            Go::Unpinned(None) => f.write_str("unpinned"),
            Go::Unpinned(Some(why)) => write!(f, "unpinned: {why}"),
        }
    }
}

/// What is pinned at a hook's link pin, as the agent finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PinnedLink {
    /// The datapath is not pinned: there is nothing to look at.
    NotPinning,
    /// Nothing pinned there.
    Absent,
    /// This hook's link (its link type, attach type and target are right).
    Matches,
    /// A link that is not this hook's, or that cannot be updated (why).
    Stale(Stale),
    /// This hook's link, but other connect programs run before it (these) and this
    /// kernel orders cgroup links: hairpin's program is to run first.
    Behind(Vec<ForeignProgram>),
}

/// Why a pinned link is not this hook's, or can no longer serve it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stale {
    /// Its link type (`BPF_LINK_TYPE_*`) is not the hook's.
    LinkType {
        /// The link's.
        found: u32,
        /// The hook's.
        expected: u32,
    },
    /// Its attach type is not the hook's (the kernel checks neither on update).
    AttachType {
        /// The link's.
        found: u32,
        /// The hook's.
        expected: u32,
    },
    /// It is linked elsewhere: another cgroup (0: the old one is gone), or another
    /// sockets map for sk_msg.
    Target {
        /// The link's target id.
        found: u64,
        /// This cgroup's id, or the pinned sockets map's.
        expected: u64,
        /// Whether the target is the sockets map (sk_msg).
        sockets_map: bool,
    },
    /// The kernel says it can no longer be updated (`ENOLINK`): its cgroup is gone.
    Gone,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stale::LinkType { found, expected } => {
                write!(f, "link type {found} (expected {expected})")
            }
            Stale::AttachType { found, expected } => {
                write!(f, "attach type {found} (expected {expected})")
            }
            Stale::Target {
                found,
                expected,
                sockets_map,
            } => write!(
                f,
                "target id {found} (expected {expected}: {})",
                if *sockets_map {
                    "the pinned sockets map"
                } else {
                    "this cgroup, the old one is gone or another"
                }
            ),
            Stale::Gone => f.write_str("update: the link's target is gone (ENOLINK)"),
        }
    }
}

/// Why a wanted hook's pinned link is replaced by a new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Replace {
    /// It is not this hook's, or cannot be updated.
    Stale(Stale),
    /// Other connect programs run in front of it: the new link goes before them.
    Behind(Vec<ForeignProgram>),
}

impl fmt::Display for Replace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replace::Stale(why) => why.fmt(f),
            Replace::Behind(front) => {
                let names: Vec<String> = front.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "{} runs in front of it: re-created in front",
                    names.join(", ")
                )
            }
        }
    }
}

/// One hook, as the agent finds it while linking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HookSeen {
    /// The hook.
    pub role: Role,
    /// Whether this agent runs a program there.
    pub wanted: bool,
    /// What is pinned at its link pin.
    pub pinned: PinnedLink,
    /// What the layout being handed over pinned at this hook (`Absent` when none
    /// is, or there is no hand-over).
    pub theirs: PinnedLink,
    /// Whether this agent's frontends are live (its first apply is done).
    pub frontends_live: bool,
}

/// What the agent does at one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    /// A new link (pinned when the datapath is).
    NewLink,
    /// The pinned link's program swapped for this agent's in place
    /// (`BPF_LINK_UPDATE`, compare-and-swap): the hook never runs without one.
    SwapInPlace,
    /// A new link first, then the stale one detached (why).
    Replace(Replace),
    /// An earlier agent's link this agent does not use: detached and unpinned.
    DetachUnused,
    /// Nothing there and nothing wanted.
    Leave,
    /// A connect hook of a hand-over before this agent's frontends are live: the
    /// other layout's program keeps serving there, this agent's is not linked yet.
    Defer,
    /// A connect hook of a hand-over once this agent's frontends are live: its
    /// program swapped into the other layout's link in place, which is pinned as
    /// this layout's from then on.
    TakeOverLink,
}

/// A hook's link could not be made: what of the datapath goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkFailed {
    /// A kernel path hook: the kernel path is unavailable, what of it was linked
    /// goes again, and every frontend takes the relay path.
    RelayPathOnly,
    /// A connect hook: the datapath did not attach.
    Stop,
}

/// What a stopping agent observes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StopSeen {
    /// Whether the datapath is pinned (it would outlive the process).
    pub pinned: bool,
    /// Whether the API server says the agents are being uninstalled.
    pub uninstall: bool,
}

/// What a stopping agent does with the datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Left for the next agent (a rollout, a restart, a node going down): links and
    /// maps stay pinned and the programs keep running; the TTL is the backstop.
    Keep,
    /// Removed: the connect programs detach, the kernel path's sockets drain, then
    /// every link and pin goes.
    Remove(Removal),
}

/// Why the datapath is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// Nothing is pinned: it goes with the process anyway.
    Unpinned,
    /// The agents are being uninstalled: with it go the addresses the agent put on
    /// links.
    Uninstall,
}

impl Stop {
    /// Whether the datapath goes.
    pub(crate) fn removes(&self) -> bool {
        matches!(self, Stop::Remove(_))
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stop::Keep => "kept for the next agent",
            Stop::Remove(Removal::Unpinned) => "nothing is pinned: it goes with this process",
            Stop::Remove(Removal::Uninstall) => "the agents are being uninstalled",
        })
    }
}

/// The kernel path's sockets as a removal drains them, once the connect programs
/// are detached (sock_ops and sk_msg still on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DrainSeen {
    /// The sockets map's fill.
    pub fill: Fill,
    /// How long the drain has waited.
    pub waited: Duration,
    /// Whether `--drain-timeout` has passed.
    pub past_deadline: bool,
}

/// The next step of a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    /// Sockets still wait for their header, or a handshake may still be under way.
    Wait,
    /// Every header is out: sock_ops and sk_msg may go.
    Done,
    /// The deadline passed with this many sockets established and not yet written:
    /// they go without their header.
    GiveUp {
        /// Sockets in the map.
        unwritten: u64,
    },
}
