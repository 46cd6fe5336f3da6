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
use crate::datapath::order::LinkOrder;
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
