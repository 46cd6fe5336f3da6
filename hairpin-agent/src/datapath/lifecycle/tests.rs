//! Every transition of the lifecycle, without root: each test names the row of the
//! transition table (docs/architecture.md, "The lifecycle") it pins.

use std::{path::PathBuf, time::Duration};

use super::decide;
use super::state::*;
use crate::datapath::counters::Fill;
use crate::datapath::liveness::HeartbeatState;
use crate::datapath::role::Role;
use crate::datapath::sys;
use crate::status::ForeignProgram;

fn seen(pins: PinDirSeen, own_links: bool, foreign: Vec<ForeignLayout>) -> StartSeen {
    StartSeen {
        pins,
        dir: Some(PathBuf::from("/sys/fs/bpf/hairpin")),
        own_links,
        foreign,
    }
}

fn layout(n: u32, heartbeat: HeartbeatState) -> ForeignLayout {
    ForeignLayout {
        dir: PathBuf::from(format!("/sys/fs/bpf/hairpin/v{n}")),
        heartbeat,
    }
}

const LIVE: HeartbeatState = HeartbeatState::Live(Duration::from_secs(540));
const EXPIRED: HeartbeatState = HeartbeatState::Expired(Duration::from_secs(3));

#[test]
fn without_a_pin_dir_the_datapath_is_the_processs_own() {
    let s = StartSeen {
        pins: PinDirSeen::Off,
        dir: None,
        own_links: false,
        foreign: Vec::new(),
    };
    assert_eq!(decide::start(&s), Start::Go(Go::Unpinned(None)));
}

#[test]
fn an_unusable_pin_dir_leaves_the_datapath_unpinned_and_says_why() {
    let s = seen(PinDirSeen::Unusable(not_bpffs()), false, vec![]);
    assert_eq!(
        decide::start(&s),
        Start::Go(Go::Unpinned(Some(not_bpffs())))
    );
}

#[test]
fn a_pin_dir_another_agent_holds_is_waited_for() {
    // Even with another layout's datapath in it: only the lock's holder reads that.
    let s = seen(PinDirSeen::Busy, true, vec![layout(1, LIVE)]);
    let Start::Wait(wait) = decide::start(&s) else {
        panic!("a busy pin dir must be waited for");
    };
    assert_eq!(
        wait,
        Wait::ForLock {
            dir: PathBuf::from("/sys/fs/bpf/hairpin")
        }
    );
    let text = wait.to_string();
    assert!(
        text.starts_with("waiting for the pin directory: "),
        "{text}"
    );
    assert!(
        text.contains("another hairpin agent owns this node's datapath"),
        "{text}"
    );
}

#[test]
fn an_empty_pin_dir_starts_fresh() {
    let s = seen(PinDirSeen::Locked, false, vec![]);
    assert_eq!(decide::start(&s), Start::Go(Go::Fresh));
}

#[test]
fn an_earlier_agents_datapath_of_this_layout_is_adopted() {
    let s = seen(PinDirSeen::Locked, true, vec![]);
    assert_eq!(decide::start(&s), Start::Go(Go::Adopt));
}

#[test]
fn a_live_datapath_of_another_layout_is_handed_over_at_once() {
    // The lock is this agent's: the other layout's agent has exited, whatever its
    // heartbeat says. Its datapath serves until this agent's is ready for it.
    let s = seen(PinDirSeen::Locked, false, vec![layout(1, LIVE)]);
    let go = decide::start(&s);
    assert_eq!(
        go,
        Start::Go(Go::HandOver {
            live: vec![layout(1, LIVE)],
            expired: vec![],
            then: Box::new(Go::Fresh),
        })
    );
    let Start::Go(go) = go else { unreachable!() };
    assert_eq!(
        go.to_string(),
        "hand over from layout v1 (live, its agent gone), then fresh"
    );
}

#[test]
fn expired_layouts_go_first_and_live_ones_are_handed_over() {
    let s = seen(
        PinDirSeen::Locked,
        true,
        vec![layout(1, EXPIRED), layout(3, LIVE)],
    );
    assert_eq!(
        decide::start(&s),
        Start::Go(Go::HandOver {
            live: vec![layout(3, LIVE)],
            expired: vec![layout(1, EXPIRED)],
            then: Box::new(Go::Adopt),
        })
    );
}

#[test]
fn an_expired_datapath_of_another_layout_is_taken_over() {
    // Expired, never written and unreadable heartbeats all leave traffic alone.
    let gone = vec![
        layout(1, EXPIRED),
        layout(3, HeartbeatState::Never),
        layout(4, HeartbeatState::Unreadable),
    ];
    let fresh = seen(PinDirSeen::Locked, false, gone.clone());
    assert_eq!(
        decide::start(&fresh),
        Start::Go(Go::TakeOver {
            expired: gone.clone(),
            then: Box::new(Go::Fresh)
        })
    );
    let adopt = seen(PinDirSeen::Locked, true, gone.clone());
    assert_eq!(
        decide::start(&adopt),
        Start::Go(Go::TakeOver {
            expired: gone,
            then: Box::new(Go::Adopt)
        })
    );
}

fn hook(wanted: bool, pinned: PinnedLink) -> Hook {
    decide::hook(&HookSeen {
        role: Role::Connect4,
        wanted,
        pinned,
        theirs: PinnedLink::Absent,
        frontends_live: false,
    })
}

fn handed_over(role: Role, pinned: PinnedLink, theirs: PinnedLink, frontends_live: bool) -> Hook {
    decide::hook(&HookSeen {
        role,
        wanted: true,
        pinned,
        theirs,
        frontends_live,
    })
}

#[test]
fn a_handed_over_connect_link_serves_until_the_frontends_are_live_then_is_taken_over() {
    for role in [Role::Connect4, Role::Connect6] {
        for own in [PinnedLink::Absent, PinnedLink::NotPinning] {
            assert_eq!(
                handed_over(role, own.clone(), PinnedLink::Matches, false),
                Hook::Defer,
                "{role:?}"
            );
            assert_eq!(
                handed_over(role, own, PinnedLink::Matches, true),
                Hook::TakeOverLink,
                "{role:?}"
            );
        }
        // Its link elsewhere or gone: this agent links its own.
        assert_eq!(
            handed_over(
                role,
                PinnedLink::Absent,
                PinnedLink::Stale(Stale::Gone),
                true
            ),
            Hook::NewLink
        );
        // This layout's own link wins: swapped in place as in any adoption.
        assert_eq!(
            handed_over(role, PinnedLink::Matches, PinnedLink::Matches, false),
            Hook::SwapInPlace
        );
    }
}

#[test]
fn a_handed_over_layouts_consumers_stay_beside_this_agents_new_ones() {
    for role in [Role::SkMsg, Role::SockOps, Role::SetSockopt] {
        assert_eq!(
            handed_over(role, PinnedLink::Absent, PinnedLink::Matches, false),
            Hook::NewLink,
            "{role:?}"
        );
    }
}

#[test]
fn a_wanted_hook_with_nothing_pinned_gets_a_new_link() {
    assert_eq!(hook(true, PinnedLink::NotPinning), Hook::NewLink);
    assert_eq!(hook(true, PinnedLink::Absent), Hook::NewLink);
}

#[test]
fn a_wanted_hooks_own_pinned_link_is_swapped_in_place() {
    assert_eq!(hook(true, PinnedLink::Matches), Hook::SwapInPlace);
}

#[test]
fn a_stale_pinned_link_is_replaced_new_first() {
    let why = Stale::AttachType {
        found: 9,
        expected: 10,
    };
    assert_eq!(
        hook(true, PinnedLink::Stale(why.clone())),
        Hook::Replace(Replace::Stale(why.clone()))
    );
    assert_eq!(why.to_string(), "attach type 9 (expected 10)");
}

#[test]
fn a_pinned_connect_link_behind_another_program_is_re_created_in_front() {
    let front = vec![ForeignProgram {
        id: 9,
        name: Some("socklb4_connect".into()),
        name_unknown: None,
    }];
    let Hook::Replace(why) = hook(true, PinnedLink::Behind(front.clone())) else {
        panic!("a link behind another program must be replaced")
    };
    assert!(
        why.to_string()
            .contains("socklb4_connect (id 9) runs in front"),
        "{why}"
    );
    assert_eq!(hook(false, PinnedLink::Behind(front)), Hook::DetachUnused);
}

#[test]
fn a_pinned_link_at_a_hook_no_longer_used_is_detached() {
    assert_eq!(hook(false, PinnedLink::Matches), Hook::DetachUnused);
    assert_eq!(
        hook(false, PinnedLink::Stale(Stale::Gone)),
        Hook::DetachUnused
    );
    assert_eq!(hook(false, PinnedLink::Absent), Hook::Leave);
    assert_eq!(hook(false, PinnedLink::NotPinning), Hook::Leave);
}

fn info(link_type: u32, role: Role, target_id: u64) -> sys::LinkInfo {
    sys::LinkInfo {
        link_type,
        id: 7,
        prog_id: 70,
        attach_type: role.attach_type().raw(),
        target_id,
    }
}

#[test]
fn a_pinned_link_is_the_hooks_own_only_with_its_type_attach_type_and_target() {
    let cgroup = 4242;
    let own = info(sys::LINK_TYPE_CGROUP, Role::Connect4, cgroup);
    assert_eq!(
        decide::pinned_link(Role::Connect4, &own, cgroup),
        PinnedLink::Matches
    );
    let sk_msg = info(sys::LINK_TYPE_SOCKMAP, Role::SkMsg, 31);
    assert_eq!(
        decide::pinned_link(Role::SkMsg, &sk_msg, 31),
        PinnedLink::Matches
    );
    let stale = |role, info: &sys::LinkInfo, target| match decide::pinned_link(role, info, target) {
        PinnedLink::Stale(why) => why.to_string(),
        other => panic!("expected stale, got {other:?}"),
    };
    // A connect4 link found at the connect6 pin (the kernel would not refuse it).
    assert!(stale(Role::Connect6, &own, cgroup).starts_with("attach type"));
    assert!(stale(Role::SkMsg, &own, 31).starts_with("link type"));
    // The cgroup the link was made at is gone (its id reads 0) or another.
    assert!(
        stale(
            Role::Connect4,
            &info(sys::LINK_TYPE_CGROUP, Role::Connect4, 0),
            cgroup
        )
        .contains("this cgroup")
    );
    assert!(stale(Role::SkMsg, &sk_msg, 32).contains("the pinned sockets map"));
}

#[test]
fn a_kernel_path_hook_that_cannot_be_linked_costs_the_kernel_path_only() {
    for role in [Role::SkMsg, Role::SockOps, Role::SetSockopt] {
        assert_eq!(
            decide::link_failed(role),
            LinkFailed::RelayPathOnly,
            "{role:?}"
        );
    }
    for role in [Role::Connect4, Role::Connect6] {
        assert_eq!(decide::link_failed(role), LinkFailed::Stop, "{role:?}");
    }
}

#[test]
fn hooks_are_linked_consumers_first_and_detached_producers_first() {
    let attach: Vec<Role> = decide::attach_order().collect();
    assert_eq!(
        attach,
        [
            Role::SkMsg,
            Role::SockOps,
            Role::SetSockopt,
            Role::Connect4,
            Role::Connect6
        ]
    );
    let mut detach: Vec<Role> = decide::detach_order().collect();
    detach.reverse();
    assert_eq!(detach, attach);
}

#[test]
fn a_stopping_agent_keeps_a_pinned_datapath_for_the_next() {
    let s = StopSeen {
        pinned: true,
        uninstall: false,
    };
    assert_eq!(decide::stop(&s), Stop::Keep);
}

#[test]
fn a_stopping_agent_removes_an_unpinned_datapath() {
    let s = StopSeen {
        pinned: false,
        uninstall: false,
    };
    assert_eq!(decide::stop(&s), Stop::Remove(Removal::Unpinned));
}

#[test]
fn an_uninstall_removes_the_datapath_pinned_or_not() {
    for pinned in [true, false] {
        let s = StopSeen {
            pinned,
            uninstall: true,
        };
        assert_eq!(decide::stop(&s), Stop::Remove(Removal::Uninstall));
    }
}

fn drain(in_map: u64, connecting: u64, waited_ms: u64, past_deadline: bool) -> Drain {
    decide::drain(&DrainSeen {
        fill: Fill { in_map, connecting },
        waited: Duration::from_millis(waited_ms),
        past_deadline,
    })
}

#[test]
fn a_drain_waits_for_every_header_and_every_handshake_under_way() {
    assert_eq!(drain(0, 0, 0, false), Drain::Done);
    assert_eq!(drain(3, 0, 0, false), Drain::Wait);
    // A marked socket still connecting may reach sock_ops for HANDSHAKE_SETTLE.
    assert_eq!(drain(0, 1, 100, false), Drain::Wait);
    assert_eq!(drain(0, 1, 1500, false), Drain::Done);
}

#[test]
fn a_drain_gives_up_at_the_deadline_with_the_sockets_left_unwritten() {
    assert_eq!(drain(4, 0, 30_000, true), Drain::GiveUp { unwritten: 4 });
    assert_eq!(drain(0, 2, 100, true), Drain::GiveUp { unwritten: 0 });
    assert_eq!(drain(0, 0, 30_000, true), Drain::Done);
}

fn not_bpffs() -> crate::datapath::pin::Unusable {
    crate::datapath::pin::Unusable::new(crate::datapath::pin::PinError::NotBpffs {
        path: PathBuf::from("/tmp/pins"),
        found: 0x0102_1994,
    })
}
