//! The executor's order rules, run against the fake kernel (fake.rs) without root:
//! consumers first on attach, producers first on detach, a new link before the
//! stale one goes, the compare-and-swap of an adopted link's program, and a
//! hand-over that defers the connect links until this agent's frontends are live.
//! Each is a row of the transition table in docs/architecture.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hairpin_ebpf::{PROG_CONNECT4, PROG_CONNECT6, PROG_SETSOCKOPT, PROG_SK_MSG, PROG_SOCK_OPS};

use super::execute::Links;
use super::fake::{CGROUP_ID, Call, Fake, FakePrograms, SOCKETS_ID};
use super::state::ForeignLayout;
use super::takeover::Handover;
use crate::datapath::attach::Adoption;
use crate::datapath::liveness::HeartbeatState;
use crate::datapath::order::{LinkOrder, Unordered};
use crate::datapath::pin::{PinDir, Pinning};
use crate::datapath::role::Role;
use crate::datapath::sys::BPF_F_BEFORE;

const CGROUP: &str = "/fake/cgroup";
const LAYOUT: u32 = 7;

/// A node with the fake kernel: this agent's programs loaded, nothing attached.
struct Node {
    kernel: Fake,
    programs: FakePrograms,
    links: Links<Fake>,
    pins: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

fn node(pinned: bool, kernel_hooks: bool, order: LinkOrder, handover: Option<Handover>) -> Node {
    let kernel = Fake::default();
    let programs = FakePrograms::new(
        &kernel,
        &[
            PROG_SK_MSG,
            PROG_SOCK_OPS,
            PROG_SETSOCKOPT,
            PROG_CONNECT4,
            PROG_CONNECT6,
        ],
        kernel_hooks,
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (pinning, pins) = if pinned {
        let pins = PinDir::for_tests(dir.path(), LAYOUT);
        let layout = pins.layout_dir();
        (Pinning::Pinned(pins), Some(layout))
    } else {
        (Pinning::Off, None)
    };
    let sockets = (kernel.sockets_map(), SOCKETS_ID);
    let links = Links::new(kernel.clone(), pinning, order, sockets, handover);
    Node {
        kernel,
        programs,
        links,
        pins,
        _dir: dir,
    }
}

impl Node {
    fn attach(&mut self) {
        self.links
            .attach(&mut self.programs, Path::new(CGROUP), || {})
            .expect("attach with the fake kernel");
    }

    fn link_pin(&self, role: Role) -> PathBuf {
        self.pins
            .as_ref()
            .expect("pinned")
            .join("links")
            .join(role.name())
    }

    fn prog_pin(&self, role: Role) -> PathBuf {
        self.pins
            .as_ref()
            .expect("pinned")
            .join("progs")
            .join(role.name())
    }
}

/// The hooks links were created at, in order.
fn created(calls: &[Call]) -> Vec<Role> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Create { hook, .. } => Some(*hook),
            _ => None,
        })
        .collect()
}

/// The hooks of the links detached, in order (`made`: the calls that created them).
fn detached(calls: &[Call], made: &[Call]) -> Vec<Role> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Detach { link } => made.iter().find_map(|m| match m {
                Call::Create { link: l, hook, .. } if l == link => Some(*hook),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

fn position(calls: &[Call], what: impl Fn(&Call) -> bool) -> usize {
    calls
        .iter()
        .position(what)
        .unwrap_or_else(|| panic!("no such call in {calls:#?}"))
}

#[test]
fn attach_links_consumers_first_then_connect() {
    let mut n = node(false, true, LinkOrder::Before, None);
    n.attach();
    let calls = n.kernel.calls();
    assert_eq!(
        created(&calls),
        [
            Role::SkMsg,
            Role::SockOps,
            Role::SetSockopt,
            Role::Connect4,
            Role::Connect6
        ],
        "{calls:#?}"
    );
    // Only the connect links go before every other program at the cgroup.
    for c in &calls {
        if let Call::Create { hook, flags, .. } = c {
            let want = if matches!(hook, Role::Connect4 | Role::Connect6) {
                BPF_F_BEFORE
            } else {
                0
            };
            assert_eq!(*flags, want, "{c:?}");
        }
    }
}

#[test]
fn detach_takes_producers_first() {
    let mut n = node(true, true, LinkOrder::Disabled, None);
    n.attach();
    let made = n.kernel.calls();
    n.kernel.clear();
    assert!(
        n.links.detach_connect(&n.programs),
        "sock_ops stays attached"
    );
    assert_eq!(
        detached(&n.kernel.calls(), &made),
        [Role::Connect6, Role::Connect4, Role::SetSockopt]
    );
    n.links.detach(&n.programs);
    let calls = n.kernel.calls();
    assert_eq!(
        detached(&calls, &made),
        [
            Role::Connect6,
            Role::Connect4,
            Role::SetSockopt,
            Role::SockOps,
            Role::SkMsg
        ],
        "{calls:#?}"
    );
    // Each link's pin goes with it.
    assert_eq!(n.kernel.pinned(&n.link_pin(Role::SockOps)), None);
}

#[test]
fn a_stale_pinned_link_is_replaced_new_link_before_the_old_detaches() {
    let mut n = node(true, false, LinkOrder::Disabled, None);
    let (old_prog, old_id) = n.kernel.program("an earlier connect4");
    // Linked at another cgroup (the old one is gone): stale.
    let old = n.kernel.pinned_link(
        Role::Connect4,
        (&old_prog, old_id),
        CGROUP_ID + 1,
        (&n.link_pin(Role::Connect4), &n.prog_pin(Role::Connect4)),
    );
    n.attach();
    let calls = n.kernel.calls();
    let create = position(&calls, |c| {
        matches!(
            c,
            Call::Create {
                hook: Role::Connect4,
                ..
            }
        )
    });
    let detach = position(&calls, |c| *c == Call::Detach { link: old });
    assert!(create < detach, "the new link first: {calls:#?}");
    let att = n.links.attachment().expect("attached");
    assert!(
        matches!(&att.adopted[0], ("connect4", Adoption::Replaced(_))),
        "{:?}",
        att.adopted
    );
    let Call::Create { link: new, .. } = &calls[create] else {
        unreachable!()
    };
    assert_eq!(
        n.kernel.pinned(&n.link_pin(Role::Connect4)),
        Some(format!("link {new}"))
    );
}

#[test]
fn an_adopted_link_has_its_program_swapped_compare_and_swap() {
    let mut n = node(true, false, LinkOrder::Disabled, None);
    let (old_prog, old_id) = n.kernel.program("an earlier connect4");
    let old = n.kernel.pinned_link(
        Role::Connect4,
        (&old_prog, old_id),
        CGROUP_ID,
        (&n.link_pin(Role::Connect4), &n.prog_pin(Role::Connect4)),
    );
    n.attach();
    let calls = n.kernel.calls();
    assert!(
        calls.contains(&Call::Update {
            link: old,
            prog: PROG_CONNECT4.into(),
            replace: Some("an earlier connect4".into()),
        }),
        "BPF_F_REPLACE against the pinned program: {calls:#?}"
    );
    assert_eq!(
        created(&calls),
        [Role::Connect6],
        "connect4 is not linked anew"
    );
    assert!(!calls.contains(&Call::Detach { link: old }), "{calls:#?}");
    assert_eq!(n.kernel.running(old), Some(PROG_CONNECT4.into()));
    assert_eq!(
        n.kernel.pinned(&n.prog_pin(Role::Connect4)),
        Some(PROG_CONNECT4.into())
    );
}

#[test]
fn a_handover_defers_the_connect_links_until_the_frontends_are_live() {
    let kernel_dir = tempfile::tempdir().expect("a temporary directory");
    let theirs = kernel_dir.path().join("v6");
    let handover = Handover::of(&[ForeignLayout {
        dir: theirs.clone(),
        heartbeat: HeartbeatState::Live(Duration::from_secs(60)),
    }]);
    let mut n = node(true, true, LinkOrder::Disabled, Some(handover));
    let mut their_links = Vec::new();
    for (role, name) in [
        (Role::Connect4, "their connect4"),
        (Role::Connect6, "their connect6"),
    ] {
        let prog = n.kernel.program(name);
        let link_pin = theirs.join("links").join(role.name());
        let prog_pin = theirs.join("progs").join(role.name());
        let id = n
            .kernel
            .pinned_link(role, (&prog.0, prog.1), CGROUP_ID, (&link_pin, &prog_pin));
        their_links.push((role, id, name, link_pin));
    }
    n.attach();
    let calls = n.kernel.calls();
    assert_eq!(
        created(&calls),
        [Role::SkMsg, Role::SockOps, Role::SetSockopt],
        "the connect hooks keep the other layout's links: {calls:#?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| matches!(c, Call::Update { .. } | Call::Detach { .. })),
        "{calls:#?}"
    );
    assert!(n.links.handover_pending());

    n.kernel.clear();
    assert!(n.links.complete_handover(&n.programs));
    let calls = n.kernel.calls();
    assert!(created(&calls).is_empty(), "{calls:#?}");
    for (role, id, name, link_pin) in &their_links {
        let ours = if *role == Role::Connect4 {
            PROG_CONNECT4
        } else {
            PROG_CONNECT6
        };
        assert!(
            calls.contains(&Call::Update {
                link: *id,
                prog: ours.into(),
                replace: Some((*name).into()),
            }),
            "{calls:#?}"
        );
        assert_eq!(n.kernel.running(*id), Some(ours.into()));
        assert_eq!(
            n.kernel.pinned(&n.link_pin(*role)),
            Some(format!("link {id}"))
        );
        assert_eq!(n.kernel.pinned(link_pin), None, "their pin goes");
    }
    assert!(!n.links.handover_pending());
    let att = n.links.attachment().expect("attached");
    assert_eq!(att.program(Role::Connect4), Some(PROG_CONNECT4));
}

#[test]
fn a_kernel_path_hook_that_cannot_link_costs_the_kernel_path_only() {
    let mut n = node(false, true, LinkOrder::Disabled, None);
    n.kernel.fail_create(Role::SockOps, libc::EPERM);
    n.attach();
    let calls = n.kernel.calls();
    assert_eq!(
        created(&calls),
        [Role::SkMsg, Role::Connect4, Role::Connect6],
        "{calls:#?}"
    );
    // What of the kernel path was linked goes before the connect links are made.
    assert_eq!(detached(&calls, &calls), [Role::SkMsg]);
    let detach = position(&calls, |c| matches!(c, Call::Detach { .. }));
    let connect = position(&calls, |c| {
        matches!(
            c,
            Call::Create {
                hook: Role::Connect4,
                ..
            }
        )
    });
    assert!(detach < connect, "{calls:#?}");
    let att = n.links.attachment().expect("attached");
    assert_eq!(att.program(Role::SkMsg), None);
}

/// On a kernel that cannot order cgroup links, with a socket load balancer's
/// program at the root's connect hooks: `children` under the root.
fn beside_a_socket_lb(children: &[&str]) -> Node {
    let n = node(true, true, LinkOrder::Unsupported(Unordered::Refused), None);
    n.kernel.set_children(children);
    n.kernel.foreign_program(Role::Connect4, 9001);
    n.kernel.foreign_program(Role::Connect6, 9002);
    n
}

/// The hooks and cgroup ids of the links created, in order.
fn created_at(k: &Fake, calls: &[Call]) -> Vec<(Role, u64)> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Create { hook, link, .. } => Some((*hook, k.live_at(*link).unwrap_or(0))),
            _ => None,
        })
        .collect()
}

#[test]
fn without_ordering_beside_another_program_the_connect_links_go_at_each_child_consumers_first() {
    let mut n = beside_a_socket_lb(&["kubepods.slice", "system.slice"]);
    n.attach();
    let calls = n.kernel.calls();
    let (kube, system) = (
        Fake::child_id("kubepods.slice"),
        Fake::child_id("system.slice"),
    );
    assert_eq!(
        created_at(&n.kernel, &calls),
        [
            (Role::SkMsg, SOCKETS_ID),
            (Role::SockOps, CGROUP_ID),
            (Role::SetSockopt, CGROUP_ID),
            (Role::Connect4, kube),
            (Role::Connect4, system),
            (Role::Connect6, kube),
            (Role::Connect6, system),
        ],
        "{calls:#?}"
    );
    let links = n.pins.as_ref().expect("pinned").join("links");
    for pin in ["connect4@kubepods.slice", "connect6@system.slice"] {
        assert!(n.kernel.pinned(&links.join(pin)).is_some(), "{pin}");
    }
    // Never at the root too: its run after the socket LB's would clear the mark.
    assert_eq!(n.kernel.pinned(&n.link_pin(Role::Connect4)), None);
    assert_eq!(
        n.links.attachment().map(|a| a.children()),
        Some(vec!["kubepods.slice", "system.slice"])
    );
}

#[test]
fn without_ordering_and_nothing_else_at_the_root_the_connect_links_stay_at_the_root() {
    let mut n = node(true, true, LinkOrder::Unsupported(Unordered::Refused), None);
    n.kernel.set_children(&["kubepods.slice"]);
    n.attach();
    let calls = n.kernel.calls();
    assert!(
        created_at(&n.kernel, &calls).iter().all(|(hook, at)| *at
            == if *hook == Role::SkMsg {
                SOCKETS_ID
            } else {
                CGROUP_ID
            }),
        "{calls:#?}"
    );
}

#[test]
fn where_the_kernel_orders_links_the_children_are_never_used() {
    let mut n = beside_a_socket_lb(&["kubepods.slice"]);
    n.links = Links::new(
        n.kernel.clone(),
        Pinning::Off,
        LinkOrder::Before,
        (n.kernel.sockets_map(), SOCKETS_ID),
        None,
    );
    n.attach();
    let calls = n.kernel.calls();
    assert!(
        created_at(&n.kernel, &calls)
            .iter()
            .all(|(_, at)| *at != Fake::child_id("kubepods.slice")),
        "{calls:#?}"
    );
}

#[test]
fn an_earlier_agents_root_connect_link_is_detached_after_the_children_are_linked() {
    let mut n = beside_a_socket_lb(&["kubepods.slice"]);
    let (old_prog, old_id) = n.kernel.program("an earlier connect4");
    let old = n.kernel.pinned_link(
        Role::Connect4,
        (&old_prog, old_id),
        CGROUP_ID,
        (&n.link_pin(Role::Connect4), &n.prog_pin(Role::Connect4)),
    );
    n.kernel.foreign_program(Role::Connect4, old_id);
    n.attach();
    let calls = n.kernel.calls();
    let child = position(&calls, |c| {
        matches!(
            c,
            Call::Create {
                hook: Role::Connect4,
                ..
            }
        )
    });
    let gone = position(&calls, |c| *c == Call::Detach { link: old });
    assert!(child < gone, "the child's link first: {calls:#?}");
    assert_eq!(n.kernel.pinned(&n.link_pin(Role::Connect4)), None);
    // Its program's pin is this agent's program now.
    assert_eq!(
        n.kernel.pinned(&n.prog_pin(Role::Connect4)).as_deref(),
        Some(PROG_CONNECT4)
    );
}

#[test]
fn the_next_agent_swaps_each_childs_link_in_place_and_follows_children_made_and_removed() {
    let mut n = beside_a_socket_lb(&["kubepods.slice", "system.slice"]);
    n.attach();
    let root = n._dir.path().to_path_buf();
    // The first agent exits (its lock with it); the next starts on the same pins.
    n.links = Links::new(
        n.kernel.clone(),
        Pinning::Off,
        LinkOrder::Disabled,
        (n.kernel.sockets_map(), SOCKETS_ID),
        None,
    );
    n.programs = FakePrograms::new(
        &n.kernel,
        &[
            PROG_SK_MSG,
            PROG_SOCK_OPS,
            PROG_SETSOCKOPT,
            PROG_CONNECT4,
            PROG_CONNECT6,
        ],
        true,
    );
    n.links = Links::new(
        n.kernel.clone(),
        Pinning::Pinned(PinDir::for_tests(&root, LAYOUT)),
        LinkOrder::Unsupported(Unordered::Refused),
        (n.kernel.sockets_map(), SOCKETS_ID),
        None,
    );
    n.kernel.clear();
    n.attach();
    let calls = n.kernel.calls();
    assert!(created(&calls).is_empty(), "swapped, none new: {calls:#?}");
    let swaps = calls
        .iter()
        .filter(|c| {
            matches!(
                c,
                Call::Update {
                    replace: Some(_),
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        swaps, 7,
        "3 at the root, 2 per child, each compare-and-swap: {calls:#?}"
    );
    // A child made since is linked; one removed has its pins go.
    n.kernel.set_children(&["kubepods.slice", "user.slice"]);
    n.kernel.clear();
    assert_eq!(n.links.rescan_children(&n.programs), (1, 1));
    let calls = n.kernel.calls();
    assert_eq!(
        created_at(&n.kernel, &calls),
        [
            (Role::Connect4, Fake::child_id("user.slice")),
            (Role::Connect6, Fake::child_id("user.slice"))
        ],
        "{calls:#?}"
    );
    let links = n.pins.as_ref().expect("pinned").join("links");
    assert_eq!(n.kernel.pinned(&links.join("connect4@system.slice")), None);
    assert!(
        n.kernel
            .pinned(&links.join("connect6@user.slice"))
            .is_some()
    );
    // Removed: the children's connect links go before the consumers.
    let att = n.links.attachment().expect("attached");
    let (connect, consumers): (Vec<_>, Vec<_>) =
        att.links.iter().partition(|l| l.role.is_connect());
    let ids = |ls: &[&crate::datapath::attach::Link]| -> Vec<u32> {
        ls.iter().filter_map(|l| l.id).collect()
    };
    let (connect, consumers) = (ids(&connect), ids(&consumers));
    assert_eq!(connect.len(), 4, "{:?}", att.links);
    n.kernel.clear();
    n.links.uninstall(&n.programs);
    let calls = n.kernel.calls();
    let at = |ids: &[u32]| -> Vec<usize> {
        ids.iter()
            .map(|id| position(&calls, |c| *c == Call::Detach { link: *id }))
            .collect()
    };
    let last_connect = at(&connect).into_iter().max();
    let first_consumer = at(&consumers).into_iter().min();
    assert!(last_connect < first_consumer, "{calls:#?}");
}
