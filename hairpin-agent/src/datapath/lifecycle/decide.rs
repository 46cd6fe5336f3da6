//! The lifecycle's decisions: pure functions from what the agent observed to what it
//! does, one per moment it decides. No I/O and no kernel here (the executor,
//! execute.rs, observes and acts); every transition has a unit test (tests.rs) and a
//! row in docs/architecture.md's transition table.

use std::time::Duration;

use super::state::{
    Drain, DrainSeen, Go, Hook, HookSeen, LinkFailed, PinDirSeen, PinnedLink, Removal, Replace,
    Stale, Start, StartSeen, Stop, StopSeen, Wait,
};
use crate::datapath::liveness::HeartbeatState;
use crate::datapath::role::Role;
use crate::datapath::sys;

/// How long a handshake already under way when the connect programs detach may
/// still take to reach sock_ops: a lost SYN is sent again 1 s after the connect.
pub(crate) const HANDSHAKE_SETTLE: Duration = Duration::from_millis(1500);

/// At start: wait while another agent holds the lock; else take over what of other
/// layouts has expired, hand over what of them is live (the lock is this agent's,
/// so their agent has exited), then adopt this layout's datapath or start fresh.
/// Without a usable pin directory the datapath is the process's own.
pub(crate) fn start(seen: &StartSeen) -> Start {
    let dir = seen.dir.clone().unwrap_or_default();
    match &seen.pins {
        PinDirSeen::Off => Start::Go(Go::Unpinned(None)),
        PinDirSeen::Unusable(why) => Start::Go(Go::Unpinned(Some(why.clone()))),
        PinDirSeen::Busy => Start::Wait(Wait::ForLock { dir }),
        PinDirSeen::Locked => {
            let (live, expired): (Vec<_>, Vec<_>) = seen
                .foreign
                .iter()
                .cloned()
                .partition(|f| matches!(f.heartbeat, HeartbeatState::Live(_)));
            let then = if seen.own_links { Go::Adopt } else { Go::Fresh };
            if !live.is_empty() {
                return Start::Go(Go::HandOver {
                    live,
                    expired,
                    then: Box::new(then),
                });
            }
            if expired.is_empty() {
                Start::Go(then)
            } else {
                Start::Go(Go::TakeOver {
                    expired,
                    then: Box::new(then),
                })
            }
        }
    }
}

/// At one hook while linking: a wanted hook gets a new link when none is pinned,
/// its pinned link's program swapped in place when that link is its own, or a new
/// link before the stale one goes; a hook no longer wanted loses the link an earlier
/// agent left there.
///
/// During a hand-over, a connect hook with nothing of this layout pinned and the
/// other layout's link there keeps that link: its program serves until this agent's
/// frontends are live, then this agent's is swapped into it in place. Never two
/// connect programs that mark at once, never none.
pub(crate) fn hook(seen: &HookSeen) -> Hook {
    let own_absent = matches!(seen.pinned, PinnedLink::NotPinning | PinnedLink::Absent);
    if seen.wanted
        && !seen.role.kernel_path_only()
        && own_absent
        && seen.theirs == PinnedLink::Matches
    {
        return if seen.frontends_live {
            Hook::TakeOverLink
        } else {
            Hook::Defer
        };
    }
    match (seen.wanted, &seen.pinned) {
        (true, PinnedLink::NotPinning | PinnedLink::Absent) => Hook::NewLink,
        (true, PinnedLink::Matches) => Hook::SwapInPlace,
        (true, PinnedLink::Stale(why)) => Hook::Replace(Replace::Stale(why.clone())),
        // A new link goes before every program there: the old one is detached
        // after it, so the hook never runs without hairpin's program.
        (true, PinnedLink::Behind(front)) => Hook::Replace(Replace::Behind(front.clone())),
        (false, PinnedLink::Matches | PinnedLink::Stale(_) | PinnedLink::Behind(_)) => {
            Hook::DetachUnused
        }
        (false, PinnedLink::NotPinning | PinnedLink::Absent) => Hook::Leave,
    }
}

/// What a pinned link `info` is to `role` at `target_id` (the cgroup's id, or the
/// sockets map's for sk_msg): its own, or stale, with why. The kernel checks neither
/// the attach type nor the target on update, so this does.
pub(crate) fn pinned_link(role: Role, info: &sys::LinkInfo, target_id: u64) -> PinnedLink {
    let expected_type = if role == Role::SkMsg {
        sys::LINK_TYPE_SOCKMAP
    } else {
        sys::LINK_TYPE_CGROUP
    };
    if info.link_type != expected_type {
        PinnedLink::Stale(Stale::LinkType {
            found: info.link_type,
            expected: expected_type,
        })
    } else if info.attach_type != role.attach_type().raw() {
        PinnedLink::Stale(Stale::AttachType {
            found: info.attach_type,
            expected: role.attach_type().raw(),
        })
    } else if info.target_id != target_id {
        PinnedLink::Stale(Stale::Target {
            found: info.target_id,
            expected: target_id,
            sockets_map: role == Role::SkMsg,
        })
    } else {
        PinnedLink::Matches
    }
}

/// A hook's link could not be made: a kernel path hook costs the kernel path only
/// (the relay path still serves every frontend); a connect hook stops the attach.
pub(crate) fn link_failed(role: Role) -> LinkFailed {
    if role.kernel_path_only() {
        LinkFailed::RelayPathOnly
    } else {
        LinkFailed::Stop
    }
}

/// At stop: a pinned datapath is kept for the next agent unless the agents are
/// being uninstalled; an unpinned one goes with the process anyway.
pub(crate) fn stop(seen: &StopSeen) -> Stop {
    match (seen.uninstall, seen.pinned) {
        (true, _) => Stop::Remove(Removal::Uninstall),
        (false, false) => Stop::Remove(Removal::Unpinned),
        (false, true) => Stop::Keep,
    }
}

/// While a removal drains the kernel path's sockets: done once the sockets map is
/// empty and no marked socket can still be connecting (for at most
/// [`HANDSHAKE_SETTLE`]); at the deadline, what is still in the map goes without
/// its header.
pub(crate) fn drain(seen: &DrainSeen) -> Drain {
    let settled = seen.fill.connecting == 0 || seen.waited >= HANDSHAKE_SETTLE;
    if seen.fill.in_map == 0 && settled {
        Drain::Done
    } else if seen.past_deadline {
        Drain::GiveUp {
            unwritten: seen.fill.in_map,
        }
    } else {
        Drain::Wait
    }
}

pub(crate) use crate::datapath::role::{attach_order, detach_order};
