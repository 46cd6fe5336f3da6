//! The reconciler against a recording map and slots: the ordering invariant (a
//! slot is bound before the redirect to it, and retires after it), one failure
//! leaving the others alone, and which failures are retried.

use std::{cell::RefCell, collections::BTreeSet, rc::Rc, time::Duration};

use super::*;
use crate::model::{FirstSpeaker, PathChoice, ProxyVersion};

/// Every call, in order, as `op addr`.
type Log = Rc<RefCell<Vec<String>>>;

#[derive(Default)]
struct FakeMap {
    log: Log,
    entries: BTreeSet<SocketAddr>,
    capacity: usize,
    refuse_remove: bool,
    /// Entries give the kernel path, as a datapath with it on does.
    kernel: bool,
}

impl RedirectMap for FakeMap {
    fn insert(&mut self, f: &Frontend, slot: Option<SlotRef>) -> Result<Route, FrontendError> {
        let (frontend, version) = (f.addr(), f.version);
        let mut line = if self.entries.contains(&frontend) {
            format!("rewrite {frontend} {version}")
        } else {
            format!("redirect {frontend}")
        };
        if slot.is_none() {
            line.push_str(" without a slot");
        }
        self.log.borrow_mut().push(line);
        if self.entries.len() >= self.capacity && !self.entries.contains(&frontend) {
            return Err(map_full());
        }
        self.entries.insert(frontend);
        // As the datapath: a server-speaks-first frontend, or one that asks for
        // the relay, is relayed.
        Ok(if self.takes_kernel_path(f) {
            Route {
                path: LivePath::Kernel,
                why: Some("kernel".into()),
            }
        } else {
            Route {
                path: LivePath::Relay,
                why: self.kernel.then(|| "relay".into()),
            }
        })
    }

    fn takes_kernel_path(&self, f: &Frontend) -> bool {
        self.kernel && f.first_speaker == FirstSpeaker::Client && f.path == PathChoice::Auto
    }

    fn remove(&mut self, frontend: SocketAddr) -> Result<(), FrontendError> {
        self.log.borrow_mut().push(format!("unredirect {frontend}"));
        if self.refuse_remove {
            return Err(map_refused());
        }
        self.entries.remove(&frontend);
        Ok(())
    }

    fn redirect(&mut self, dialled: SocketAddr, _slot: SlotRef) -> Result<(), FrontendError> {
        self.log.borrow_mut().push(format!("redirect {dialled}"));
        self.entries.insert(dialled);
        Ok(())
    }

    fn retain(&mut self, live: &BTreeSet<SocketAddr>) {
        for gone in self.entries.iter().filter(|e| !live.contains(e)) {
            self.log.borrow_mut().push(format!("unredirect {gone}"));
        }
        self.entries.retain(|e| live.contains(e));
    }
}

#[derive(Default)]
struct FakeSlots {
    log: Log,
    bound: BTreeSet<SocketAddr>,
    /// Frontends whose family has no slot left (transient).
    exhausted: BTreeSet<SocketAddr>,
    /// Frontends whose family has no slot address (permanent).
    no_address_v6: bool,
    next_port: u16,
}

impl Slots for FakeSlots {
    fn bind(
        &mut self,
        frontend: SocketAddr,
        listener: u8,
        version: u8,
        _namespace: Option<&str>,
    ) -> Result<(SlotRef, SocketAddr), FrontendError> {
        self.log
            .borrow_mut()
            .push(format!("bind {frontend} v{version}"));
        if self.no_address_v6 && frontend.is_ipv6() {
            return Err(FrontendError::NoListenAddress { family: "IPv6" });
        }
        if self.exhausted.contains(&frontend) {
            return Err(no_slot());
        }
        self.bound.insert(frontend);
        self.next_port += 1;
        let slot = SlotRef {
            addr: 0,
            port: 1024 + self.next_port,
            listener,
        };
        Ok((slot, SocketAddr::new([192, 0, 2, 1].into(), slot.port)))
    }

    fn retire(&mut self, frontend: SocketAddr) {
        self.log.borrow_mut().push(format!("retire {frontend}"));
        self.bound.remove(&frontend);
    }

    fn retire_all_but(&mut self, live: &BTreeSet<SocketAddr>) {
        let gone: Vec<SocketAddr> = self.bound.difference(live).copied().collect();
        for f in gone {
            self.retire(f);
        }
    }

    fn sweep(&mut self) {}
}

/// A file-sourced, client-first frontend at `addr` (shared with `plan`'s tests).
pub(super) fn fe(addr: &str, version: ProxyVersion) -> Frontend {
    let a: SocketAddr = addr.parse().expect("addr");
    Frontend {
        ip: a.ip(),
        port: a.port(),
        version,
        source: crate::model::Origin::File {
            path: std::path::Path::new("test").into(),
            entry: None,
        },
        first_speaker: FirstSpeaker::Client,
        path: Default::default(),
    }
}

fn set(frontends: &[Frontend]) -> Frontends {
    let mut s = Frontends::new();
    for f in frontends {
        s.insert(f.clone()).expect("one per address");
    }
    s
}

fn reconciler(capacity: usize) -> (Reconciler<FakeMap, FakeSlots>, Log) {
    let log = Log::default();
    let map = FakeMap {
        log: log.clone(),
        capacity,
        ..FakeMap::default()
    };
    let slots = FakeSlots {
        log: log.clone(),
        no_address_v6: true,
        ..FakeSlots::default()
    };
    (Reconciler::new(Some(map), Some(slots)), log)
}

fn take(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.borrow_mut())
}

use ProxyVersion::{V1, V2};

#[test]
fn a_slot_is_bound_before_its_redirect_and_retires_after_it() {
    let (mut r, log) = reconciler(16);
    let a = fe("203.0.113.10:80", V1);
    r.apply(&set(std::slice::from_ref(&a)), Trigger::Change);
    assert_eq!(
        take(&log),
        ["bind 203.0.113.10:80 v1", "redirect 203.0.113.10:80"]
    );
    r.apply(&Frontends::new(), Trigger::Change);
    assert_eq!(
        take(&log),
        ["unredirect 203.0.113.10:80", "retire 203.0.113.10:80"]
    );
    assert_eq!(r.active().count(), 0);
}

#[test]
fn retirements_come_before_starts_so_a_full_map_makes_room_first() {
    let (mut r, log) = reconciler(1);
    r.apply(&set(&[fe("203.0.113.20:80", V1)]), Trigger::Change);
    take(&log);
    // Swap the one frontend for another in one change: the map holds only one.
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    assert_eq!(
        take(&log),
        [
            "unredirect 203.0.113.20:80",
            "retire 203.0.113.20:80",
            "bind 203.0.113.10:80 v1",
            "redirect 203.0.113.10:80",
        ]
    );
    assert!(r.failed().is_empty());
}

#[test]
fn a_version_change_updates_the_slot_and_the_map_entry_in_place() {
    let (mut r, log) = reconciler(16);
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    take(&log);
    r.apply(&set(&[fe("203.0.113.10:80", V2)]), Trigger::Change);
    // The map entry carries the version for the kernel path.
    assert_eq!(
        take(&log),
        ["bind 203.0.113.10:80 v2", "rewrite 203.0.113.10:80 v2"]
    );
    let live: Vec<ProxyVersion> = r.active().map(|a| a.frontend.version).collect();
    assert_eq!(live, [V2]);
}

#[test]
fn each_active_frontend_records_the_path_its_map_entry_gives() {
    let (mut r, _log) = reconciler(16);
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    let paths: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(paths, [LivePath::Relay]);

    let (mut r, log) = reconciler(16);
    if let Some(m) = r.map_mut() {
        m.kernel = true;
    }
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    // Still the slot first: it is the fallback for sockets the kernel path cannot take.
    assert_eq!(
        take(&log),
        ["bind 203.0.113.10:80 v1", "redirect 203.0.113.10:80"]
    );
    let paths: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(paths, [LivePath::Kernel]);
}

/// Issue: every slot taken (quarantined by another frontend's churn) used to fail
/// kernel-path frontends too, which need a slot only for the sockets the kernel
/// path cannot take.
#[test]
fn a_kernel_path_frontend_goes_live_without_a_slot_and_gets_one_once_one_is_free() {
    let (mut r, log) = reconciler(16);
    if let Some(m) = r.map_mut() {
        m.kernel = true;
    }
    let kernel = fe("203.0.113.10:80", V1);
    let relayed = Frontend {
        path: PathChoice::Relay,
        ..fe("203.0.113.11:80", V1)
    };
    for f in [&kernel, &relayed] {
        r.slots.as_mut().expect("slots").exhausted.insert(f.addr());
    }
    let want = set(&[kernel.clone(), relayed.clone()]);
    r.apply(&want, Trigger::Change);
    assert_eq!(
        take(&log),
        [
            "bind 203.0.113.10:80 v1",
            "redirect 203.0.113.10:80 without a slot",
            "bind 203.0.113.11:80 v1",
        ]
    );
    let live: Vec<(String, LivePath, Option<SocketAddr>)> = r
        .active()
        .map(|a| (a.frontend.addr().to_string(), a.path, a.listener))
        .collect();
    assert_eq!(
        live,
        [("203.0.113.10:80".to_string(), LivePath::Kernel, None)]
    );
    let why = r
        .active()
        .next()
        .and_then(Active::reason)
        .expect("a reason");
    assert!(
        why.starts_with("kernel; no relay slot for the sockets the kernel path cannot take"),
        "{why}"
    );
    // The relayed one needs its slot: failed, retried.
    let failed: Vec<String> = r.failed().keys().map(ToString::to_string).collect();
    assert_eq!(failed, ["203.0.113.11:80"]);
    assert!(r.has_transient_failures());

    // Slots free again: a retry binds both, the kernel-path one's entry gets its slot.
    r.slots.as_mut().expect("slots").exhausted.clear();
    r.apply(&want, Trigger::Retry);
    assert_eq!(
        take(&log),
        [
            "bind 203.0.113.11:80 v1",
            "redirect 203.0.113.11:80",
            "bind 203.0.113.10:80 v1",
            "rewrite 203.0.113.10:80 v1",
        ]
    );
    assert!(
        r.active()
            .all(|a| a.listener.is_some() && a.no_slot.is_none())
    );
    assert!(!r.has_transient_failures());

    // Live without a slot, then asking for the relay: made live anew, slot first.
    let (mut r, log) = reconciler(16);
    if let Some(m) = r.map_mut() {
        m.kernel = true;
    }
    r.slots
        .as_mut()
        .expect("slots")
        .exhausted
        .insert(kernel.addr());
    r.apply(&set(std::slice::from_ref(&kernel)), Trigger::Change);
    take(&log);
    let to_relay = Frontend {
        path: PathChoice::Relay,
        ..kernel
    };
    r.apply(&set(&[to_relay]), Trigger::Change);
    assert_eq!(
        take(&log),
        [
            "unredirect 203.0.113.10:80",
            "retire 203.0.113.10:80",
            "bind 203.0.113.10:80 v1",
        ]
    );
    assert_eq!(r.active().count(), 0);
    assert_eq!(r.failed().len(), 1);
}

#[test]
fn a_frontend_turning_server_first_has_its_entry_rewritten_to_the_relay_path() {
    let (mut r, log) = reconciler(16);
    if let Some(m) = r.map_mut() {
        m.kernel = true;
    }
    let client = fe("203.0.113.10:25", V1);
    let server = Frontend {
        first_speaker: FirstSpeaker::Server,
        ..client.clone()
    };
    r.apply(&set(std::slice::from_ref(&server)), Trigger::Change);
    let got: Vec<(LivePath, Option<String>)> =
        r.active().map(|a| (a.path, a.why.clone())).collect();
    assert_eq!(got, [(LivePath::Relay, Some("relay".to_string()))]);
    take(&log);
    // Only the first speaker changes: the entry is rewritten, the slot stays.
    r.apply(&set(std::slice::from_ref(&client)), Trigger::Change);
    assert_eq!(take(&log), ["rewrite 203.0.113.10:25 v1"]);
    let got: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(got, [LivePath::Kernel]);
    r.apply(&set(&[server]), Trigger::Change);
    assert_eq!(take(&log), ["rewrite 203.0.113.10:25 v1"]);
    let got: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(got, [LivePath::Relay]);
}

#[test]
fn a_frontend_asking_for_the_relay_has_its_entry_rewritten_to_the_relay_path() {
    let (mut r, log) = reconciler(16);
    if let Some(m) = r.map_mut() {
        m.kernel = true;
    }
    let auto = fe("203.0.113.10:443", V2);
    let relay = Frontend {
        path: PathChoice::Relay,
        ..auto.clone()
    };
    r.apply(&set(std::slice::from_ref(&auto)), Trigger::Change);
    let got: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(got, [LivePath::Kernel]);
    take(&log);
    // Only the path asked for changes: the entry is rewritten, the slot stays.
    r.apply(&set(std::slice::from_ref(&relay)), Trigger::Change);
    assert_eq!(take(&log), ["rewrite 203.0.113.10:443 v2"]);
    let got: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(got, [LivePath::Relay]);
    r.apply(&set(&[auto]), Trigger::Change);
    assert_eq!(take(&log), ["rewrite 203.0.113.10:443 v2"]);
    let got: Vec<LivePath> = r.active().map(|a| a.path).collect();
    assert_eq!(got, [LivePath::Kernel]);
}

#[test]
fn one_failure_leaves_the_others_live_and_a_failed_redirect_retires_its_slot() {
    let (mut r, log) = reconciler(2);
    r.slots
        .as_mut()
        .expect("slots")
        .exhausted
        .insert("203.0.113.11:80".parse().expect("addr"));
    let want = set(&[
        fe("203.0.113.10:80", V1),
        fe("203.0.113.11:80", V1),
        fe("203.0.113.12:80", V1),
        fe("203.0.113.13:80", V1),
        fe("[2001:db8::10]:80", V1),
    ]);
    r.apply(&want, Trigger::Change);
    let live: Vec<String> = r.active().map(|a| a.frontend.addr().to_string()).collect();
    assert_eq!(live, ["203.0.113.10:80", "203.0.113.12:80"]);
    let failed: Vec<(String, bool)> = r
        .failed()
        .iter()
        .map(|(a, f)| (a.to_string(), f.error.is_permanent()))
        .collect();
    assert_eq!(
        failed,
        [
            ("203.0.113.11:80".to_string(), false), // no slot for now: transient
            ("203.0.113.13:80".to_string(), true),  // map full: permanent
            ("[2001:db8::10]:80".to_string(), true), // no IPv6 address: permanent
        ]
    );
    // The full map's refusal retired the slot it had bound; no redirect ever
    // pointed at a slot that is not bound.
    assert!(
        !r.slots
            .as_ref()
            .expect("slots")
            .bound
            .contains(&"203.0.113.13:80".parse().expect("a"))
    );
    let log = take(&log);
    let started = log.iter().position(|l| l == "bind 203.0.113.13:80 v1");
    let refused = log.iter().position(|l| l == "redirect 203.0.113.13:80");
    let stopped = log.iter().position(|l| l == "retire 203.0.113.13:80");
    assert!(started < refused && refused < stopped, "{log:?}");
    assert!(
        !log.iter().any(|l| l == "redirect 203.0.113.11:80"),
        "{log:?}"
    );
}

#[test]
fn a_retry_tries_transient_failures_and_leaves_permanent_ones_for_a_change() {
    let (mut r, log) = reconciler(1);
    r.slots
        .as_mut()
        .expect("slots")
        .exhausted
        .insert("203.0.113.10:80".parse().expect("addr"));
    let want = set(&[
        fe("203.0.113.10:80", V1),
        fe("203.0.113.11:80", V1),
        fe("203.0.113.12:80", V1),
    ]);
    r.apply(&want, Trigger::Change);
    // .10 no slot (transient), .11 live, .12 map full (permanent).
    assert!(r.has_transient_failures());
    take(&log);
    r.apply(&want, Trigger::Retry);
    assert_eq!(
        take(&log),
        ["bind 203.0.113.10:80 v1"],
        "only the transient one"
    );

    // A slot is free again: the next retry makes it live... into a map with no
    // room (capacity 1), a permanent failure, so nothing is left to retry.
    r.slots.as_mut().expect("slots").exhausted.clear();
    r.apply(&want, Trigger::Retry);
    assert!(!r.has_transient_failures());
    assert_eq!(r.failed().len(), 2);

    // A change (the live one gone) frees the map: permanent failures are tried again.
    take(&log);
    let smaller = set(&[fe("203.0.113.10:80", V1), fe("203.0.113.12:80", V1)]);
    r.apply(&smaller, Trigger::Change);
    assert_eq!(
        take(&log),
        [
            "unredirect 203.0.113.11:80",
            "retire 203.0.113.11:80",
            "bind 203.0.113.10:80 v1",
            "redirect 203.0.113.10:80",
            "bind 203.0.113.12:80 v1",
            "redirect 203.0.113.12:80",
            "retire 203.0.113.12:80",
        ]
    );
    let live: Vec<String> = r.active().map(|a| a.frontend.addr().to_string()).collect();
    assert_eq!(live, ["203.0.113.10:80"]);
    let failed: Vec<String> = r.failed().keys().map(ToString::to_string).collect();
    assert_eq!(
        failed,
        ["203.0.113.12:80"],
        "forgotten once no longer wanted: .11"
    );
}

#[test]
fn a_permanent_failure_is_retried_on_retry_when_what_is_asked_changed() {
    let (mut r, log) = reconciler(0);
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    take(&log);
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Retry);
    assert!(take(&log).is_empty());
    r.apply(&set(&[fe("203.0.113.10:80", V2)]), Trigger::Retry);
    assert_eq!(
        take(&log),
        [
            "bind 203.0.113.10:80 v2",
            "redirect 203.0.113.10:80",
            "retire 203.0.113.10:80"
        ]
    );
}

#[test]
fn a_redirect_that_cannot_be_removed_keeps_its_slot() {
    let (mut r, log) = reconciler(16);
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    r.map.as_mut().expect("map").refuse_remove = true;
    take(&log);
    r.apply(&Frontends::new(), Trigger::Change);
    assert_eq!(take(&log), ["unredirect 203.0.113.10:80"]);
    assert_eq!(r.active().count(), 1, "still live: connects still land");
}

#[test]
fn without_a_datapath_nothing_is_started() {
    let mut r: Reconciler<FakeMap, FakeSlots> = Reconciler::new(None, None);
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    assert_eq!(r.active().count(), 0);
    assert!(r.failed().is_empty());
}

#[test]
fn failed_frontend_retries_double_up_to_the_cap_and_reset() {
    let mut b = Backoff::new(FAILED_RETRY_FIRST, FAILED_RETRY_MAX);
    let secs: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
    b.reset();
    assert_eq!(b.next_delay(), Duration::from_secs(1));
}

#[test]
fn the_names_ports_are_redirected_and_their_old_entries_removed_by_the_one_writer() {
    let (mut r, log) = reconciler(16);
    let names: SocketAddr = "169.254.104.1:443".parse().expect("addr");
    r.redirect_names(vec![(names, 3)]);
    assert_eq!(
        take(&log),
        ["bind 169.254.104.1:443 v0", "redirect 169.254.104.1:443"]
    );
    // Unchanged: nothing written again.
    r.redirect_names(vec![(names, 3)]);
    assert!(take(&log).is_empty());
    r.redirect_names(Vec::new());
    assert_eq!(
        take(&log),
        ["unredirect 169.254.104.1:443", "retire 169.254.104.1:443"]
    );
    assert!(r.name_redirects().is_empty());
}

#[test]
fn after_the_first_apply_only_the_entries_and_slots_this_agent_made_stay() {
    let (mut r, log) = reconciler(16);
    // What an earlier agent left in the adopted maps.
    if let Some(m) = r.map_mut() {
        m.entries.insert("203.0.113.99:443".parse().expect("addr"));
        m.entries.insert("203.0.113.10:80".parse().expect("addr"));
    }
    if let Some(s) = r.slots.as_mut() {
        s.bound.insert("203.0.113.99:443".parse().expect("addr"));
    }
    r.apply(&set(&[fe("203.0.113.10:80", V1)]), Trigger::Change);
    let names: SocketAddr = "169.254.104.1:80".parse().expect("addr");
    r.redirect_names(vec![(names, 2)]);
    take(&log);
    r.forget_earlier_entries();
    assert_eq!(
        take(&log),
        ["unredirect 203.0.113.99:443", "retire 203.0.113.99:443"]
    );
}

/// A full frontends map, as the map says it.
pub(crate) fn map_full() -> FrontendError {
    FrontendError::MapFull(std::sync::Arc::new(
        crate::datapath::DatapathError::MapFull {
            frontend: "203.0.113.10:443".parse().expect("an address"),
            capacity: 1,
        },
    ))
}

/// The map refusing an entry for another reason.
pub(crate) fn map_refused() -> FrontendError {
    FrontendError::Map(std::sync::Arc::new(
        crate::datapath::DatapathError::Missing {
            kind: "map",
            name: "HAIRPIN_FRONTENDS",
        },
    ))
}

/// No slot free for now.
pub(crate) fn no_slot() -> FrontendError {
    FrontendError::Slot(std::sync::Arc::new(crate::datapath::SlotError::Exhausted {
        family: "IPv4",
        addresses: 1,
    }))
}
