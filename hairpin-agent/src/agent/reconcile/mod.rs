//! Turning a desired set of frontends into relay slots and map entries.
//!
//! [`plan`] decides the steps from what is live, what failed and what is wanted,
//! touching nothing; [`Reconciler::apply`] performs them through two small traits,
//! [`RedirectMap`] (the BPF frontend map) and [`Slots`] (the relay's slots map), so
//! the order and the retry policy are unit-tested without a kernel.
//!
//! Order is what keeps traffic flowing and every connection at its own frontend: a
//! slot is bound to its frontend before the redirect to it, and the redirect is gone
//! before the slot retires (a retired slot still serves its frontend for its
//! quarantine). One frontend's failure never blocks another's; a failed frontend
//! stays on the pre-hairpin path (fail open). A transient failure (every slot taken
//! for now, its namespace at its cap of slots) is retried with backoff; a permanent
//! one (no listen address for its family, a full map) waits for the next change,
//! since retrying cannot fix it. A kernel-path frontend needs its slot only for the
//! sockets the kernel path cannot take: it goes live without one when none can be
//! had, and gets one when one can.

mod backoff;
mod plan;
#[cfg(test)]
pub(crate) mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::Arc,
};

use hairpin_ebpf::{LISTENER_RELAY4, LISTENER_RELAY6, SlotRef};
use tracing::{debug, error, info, warn};

pub(crate) use backoff::{Backoff, FAILED_RETRY_FIRST, FAILED_RETRY_MAX};
pub(crate) use plan::{Hold, Step, Trigger, plan};

use crate::{
    datapath::{DatapathError, FrontendsMap, SlotError, SlotTable, monotonic_ns},
    logs::LogBudget,
    model::{Frontend, Frontends, LivePath, Origin},
};

/// A frontend being proxied now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Active {
    /// What was asked for.
    pub frontend: Frontend,
    /// Its relay slot: where connects to it are sent (the kernel path's fallback).
    /// `None`: a kernel-path frontend live without a slot yet.
    pub listener: Option<SocketAddr>,
    /// The slot as the map names it (`None` as for `listener`).
    pub slot: Option<SlotRef>,
    /// Why a kernel-path frontend has no slot yet: retried with the failures
    /// (see [`Reconciler::has_transient_failures`]).
    pub no_slot: Option<FrontendError>,
    /// How its clients get their header: [`LivePath::Relay`] (the relay) or
    /// [`LivePath::Kernel`], as the map entry says.
    pub path: LivePath,
    /// Why it takes that path, when the kernel path was asked for (a
    /// server-speaks-first frontend is relayed, an unavailable kernel path relays all).
    pub why: Option<String>,
}

impl Active {
    /// Why it takes its path, as `status` says it: with what a kernel-path frontend
    /// live without a slot goes without.
    pub(crate) fn reason(&self) -> Option<String> {
        match &self.no_slot {
            Some(e) => Some(without_slot(self.why.as_deref(), e)),
            None => self.why.clone(),
        }
    }
}

#[cfg(test)]
impl Active {
    /// `frontend` active at `listener` on `path`, with slot 0 of the first address.
    pub(crate) fn for_test(frontend: Frontend, listener: &str, path: LivePath) -> Active {
        Active {
            frontend,
            listener: Some(listener.parse().expect("a listener address")),
            slot: Some(SlotRef {
                addr: 0,
                port: 1024,
                listener: 0,
            }),
            no_slot: None,
            path,
            why: None,
        }
    }
}

/// The path a map entry gives a frontend, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// [`LivePath::Relay`] (the relay) or [`LivePath::Kernel`].
    pub path: LivePath,
    /// Why, when the kernel path was asked for.
    pub why: Option<String>,
}

/// A frontend that could not be made live, as it was asked for and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failed {
    /// What was asked for.
    pub frontend: Frontend,
    /// Why it is not live.
    pub error: FrontendError,
}

/// Why a frontend is not live.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum FrontendError {
    /// No listen address of the frontend's family is configured.
    #[error("no {family} listen address: pass --listen-address or --node-ip with one")]
    NoListenAddress {
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },
    /// No relay slot could be bound for it.
    #[error("{0}")]
    Slot(#[source] Arc<SlotError>),
    /// The frontend map has no room left.
    #[error("{0}")]
    MapFull(#[source] Arc<DatapathError>),
    /// The map refused the entry for another reason.
    #[error("{0}")]
    Map(#[source] Arc<DatapathError>),
    /// No eBPF datapath on this node.
    #[error("eBPF is not live on this node: nothing would redirect to the relay")]
    NotLive,
}

/// Equal when the same kind of failure says the same: the causes (kernel errors)
/// have no equality of their own, and a plan compares failures to retry only what
/// changed.
impl PartialEq for FrontendError {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl Eq for FrontendError {}

impl FrontendError {
    /// True when retrying cannot help until something changes: the configuration
    /// (no listen address) or the set of frontends (a full map).
    pub(crate) fn is_permanent(&self) -> bool {
        matches!(
            self,
            FrontendError::NoListenAddress { .. } | FrontendError::MapFull(_)
        )
    }
}

/// The BPF frontend map, as the reconciler uses it.
pub(crate) trait RedirectMap {
    /// Redirects connects to `frontend` to `slot`, whose relay writes its version's
    /// headers (or has the kernel write them, where the kernel path is on and the
    /// client speaks first; `None`: no slot for the kernel path's fallback yet).
    /// Inserting an address again replaces its entry. Returns the path the entry
    /// gives it.
    fn insert(
        &mut self,
        frontend: &Frontend,
        slot: Option<SlotRef>,
    ) -> Result<Route, FrontendError>;
    /// Whether an entry would give `frontend` the kernel path.
    fn takes_kernel_path(&self, frontend: &Frontend) -> bool;
    /// Stops redirecting connects to `frontend`; absent is not an error.
    fn remove(&mut self, frontend: SocketAddr) -> Result<(), FrontendError>;
    /// Redirects connects to `dialled` to `slot`, a plain relay redirect (the names
    /// ports, to the name relay's listeners).
    fn redirect(&mut self, dialled: SocketAddr, slot: SlotRef) -> Result<(), FrontendError>;
    /// Removes every entry but those of `live`: what an earlier agent left.
    fn retain(&mut self, live: &BTreeSet<SocketAddr>);
}

/// The relay's slots, as the reconciler uses them (see [`SlotTable`]).
pub(crate) trait Slots {
    /// Binds a slot to `frontend` (what clients dial), handed to relay listener
    /// `listener` (a [`hairpin_ebpf::MAP_RELAYS`] index) with `version` headers,
    /// charged to `namespace` (a Service's; see [`SlotTable::cap_namespaces`]): the
    /// one it holds already, else a free one. The slot, and where clients are sent.
    fn bind(
        &mut self,
        frontend: SocketAddr,
        listener: u8,
        version: u8,
        namespace: Option<&str>,
    ) -> Result<(SlotRef, SocketAddr), FrontendError>;
    /// Retires `frontend`'s slot, after its redirect is gone.
    fn retire(&mut self, frontend: SocketAddr);
    /// Retires every slot but those of `live`: what an earlier agent left.
    fn retire_all_but(&mut self, live: &BTreeSet<SocketAddr>);
    /// Frees the slots whose quarantine has ended.
    fn sweep(&mut self);
}

impl Slots for SlotTable {
    fn bind(
        &mut self,
        frontend: SocketAddr,
        listener: u8,
        version: u8,
        namespace: Option<&str>,
    ) -> Result<(SlotRef, SocketAddr), FrontendError> {
        SlotTable::bind(self, frontend, listener, version, namespace).map_err(|e| match e {
            SlotError::NoAddress { family } => FrontendError::NoListenAddress { family },
            e => FrontendError::Slot(Arc::new(e)),
        })
    }

    fn retire(&mut self, frontend: SocketAddr) {
        SlotTable::retire(self, frontend);
    }

    fn retire_all_but(&mut self, live: &BTreeSet<SocketAddr>) {
        SlotTable::retire_all_but(self, live);
    }

    fn sweep(&mut self) {
        SlotTable::sweep(self, monotonic_ns());
    }
}

impl RedirectMap for FrontendsMap {
    fn insert(
        &mut self,
        frontend: &Frontend,
        slot: Option<SlotRef>,
    ) -> Result<Route, FrontendError> {
        let kernel = FrontendsMap::insert(
            self,
            frontend.addr(),
            slot.unwrap_or(SlotRef::NONE),
            frontend.version,
            frontend.first_speaker,
            frontend.path,
        )
        .map_err(|e| match e {
            DatapathError::MapFull { .. } => FrontendError::MapFull(Arc::new(e)),
            e => FrontendError::Map(Arc::new(e)),
        })?;
        Ok(Route {
            path: if kernel {
                LivePath::Kernel
            } else {
                LivePath::Relay
            },
            why: self
                .kernel_path()
                .why(frontend.first_speaker, frontend.path),
        })
    }

    fn takes_kernel_path(&self, frontend: &Frontend) -> bool {
        FrontendsMap::takes_kernel_path(self, frontend.first_speaker, frontend.path)
    }

    fn remove(&mut self, frontend: SocketAddr) -> Result<(), FrontendError> {
        FrontendsMap::remove(self, frontend).map_err(|e| FrontendError::Map(Arc::new(e)))
    }

    fn redirect(&mut self, dialled: SocketAddr, slot: SlotRef) -> Result<(), FrontendError> {
        FrontendsMap::redirect(self, dialled, slot).map_err(|e| FrontendError::Map(Arc::new(e)))
    }

    fn retain(&mut self, live: &BTreeSet<SocketAddr>) {
        FrontendsMap::retain(self, live);
    }
}

/// Listener addresses per family: the first listen address of each (see
/// `--listen-address`), where the relay's listener of that family binds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ListenAddresses {
    /// For IPv4 frontends.
    pub v4: Option<std::net::IpAddr>,
    /// For IPv6 frontends.
    pub v6: Option<std::net::IpAddr>,
}

/// The map and the slots (when a datapath is live), and what is live and failed.
pub(crate) struct Reconciler<M, S> {
    map: Option<M>,
    slots: Option<S>,
    active: BTreeMap<SocketAddr, Active>,
    failed: BTreeMap<SocketAddr, Failed>,
    /// The frontends the last apply left as they were, and why.
    held: BTreeMap<SocketAddr, Hold>,
    /// The names ports' entries (dialled address, the name relay listener's index),
    /// as last written.
    name_redirects: Vec<(SocketAddr, u8)>,
    /// This apply's per-frontend lines (started, updated, retired), and its
    /// failures': a few each, the rest counted (see [`LogBudget`]).
    said: LogBudget,
    said_errors: LogBudget,
}

impl<M: RedirectMap, S: Slots> Reconciler<M, S> {
    /// A reconciler with nothing live yet. Without a datapath (`map` and `slots`
    /// both `None`: eBPF is not live on this node) nothing redirects, so nothing is
    /// made live.
    pub(crate) fn new(map: Option<M>, slots: Option<S>) -> Self {
        Reconciler {
            map,
            slots,
            active: BTreeMap::new(),
            failed: BTreeMap::new(),
            held: BTreeMap::new(),
            name_redirects: Vec::new(),
            said: LogBudget::default(),
            said_errors: LogBudget::default(),
        }
    }

    /// Frontends live now.
    pub(crate) fn active(&self) -> impl Iterator<Item = &Active> {
        self.active.values()
    }

    /// Frontends that could not be made live, by address.
    pub(crate) fn failed(&self) -> &BTreeMap<SocketAddr, Failed> {
        &self.failed
    }

    /// The frontends asked for that the last apply left as they were, and why.
    pub(crate) fn held(&self) -> &BTreeMap<SocketAddr, Hold> {
        &self.held
    }

    /// Whether some failure is worth retrying before the next change: a failed
    /// frontend's, or a kernel-path frontend's that is live without a slot.
    pub(crate) fn has_transient_failures(&self) -> bool {
        self.failed.values().any(|f| !f.error.is_permanent())
            || self
                .active
                .values()
                .any(|a| a.no_slot.as_ref().is_some_and(|e| !e.is_permanent()))
    }

    /// The map, to set up a fake one in tests.
    #[cfg(test)]
    pub(crate) fn map_mut(&mut self) -> Option<&mut M> {
        self.map.as_mut()
    }

    /// The names ports' entries (dialled address, listener index), as last written.
    #[cfg(test)]
    pub(crate) fn name_redirects(&self) -> &[(SocketAddr, u8)] {
        &self.name_redirects
    }

    /// The names ports are frontends like any LB's: a connect to the names address
    /// is sent to a slot handed to the name relay's listener for that port (index
    /// `listener` of the relays' listener map), and nothing binds the ports
    /// themselves. Writes `redirects` when they changed, and removes the entries of
    /// those gone (unless an LB frontend now holds the address).
    pub(crate) fn redirect_names(&mut self, redirects: Vec<(SocketAddr, u8)>) {
        if redirects == self.name_redirects {
            return;
        }
        let (Some(map), Some(slots)) = (self.map.as_mut(), self.slots.as_mut()) else {
            self.name_redirects = redirects;
            return;
        };
        let mut written = Vec::with_capacity(redirects.len());
        for (dialled, listener) in &redirects {
            let made = slots
                .bind(*dialled, *listener, 0, None)
                .and_then(|(slot, _)| map.redirect(*dialled, slot));
            match made {
                Ok(()) => written.push((*dialled, *listener)),
                Err(e) => {
                    warn!(%dialled, listener, error = %e, "the names port cannot be redirected to the name relay")
                }
            }
        }
        for (dialled, _) in &self.name_redirects {
            let kept = written.iter().any(|(d, _)| d == dialled);
            if !kept && !self.active.contains_key(dialled) {
                match map.remove(*dialled) {
                    Ok(()) => slots.retire(*dialled),
                    Err(e) => {
                        warn!(%dialled, error = %e, "a names port's old redirect could not be removed")
                    }
                }
            }
        }
        self.name_redirects = written;
    }

    /// Removes the entries this reconciler did not make: after the first apply, an
    /// adopted map still holds the earlier agent's entries, which kept traffic served
    /// until now; those not made live again name frontends that went away while no
    /// agent ran. Their slots retire after them.
    pub(crate) fn forget_earlier_entries(&mut self) {
        let live: BTreeSet<SocketAddr> = self
            .active
            .keys()
            .copied()
            .chain(self.name_redirects.iter().map(|(dialled, _)| *dialled))
            .collect();
        if let Some(map) = self.map.as_mut() {
            map.retain(&live);
        }
        if let Some(slots) = self.slots.as_mut() {
            slots.retire_all_but(&live);
        }
    }

    /// Converges on `desired`: plans the steps and performs them in order.
    pub(crate) fn apply(&mut self, desired: &Frontends, trigger: Trigger) {
        let redirecting = self.map.is_some() && self.slots.is_some();
        // A failure no longer asked for is forgotten.
        self.failed
            .retain(|a, _| redirecting && desired.contains(a));
        self.held.clear();
        self.said = LogBudget::default();
        self.said_errors = LogBudget::default();
        // Those made live now were just refused a slot, if they have none.
        let mut started = BTreeSet::new();
        for step in plan(&self.active, &self.failed, desired, redirecting, trigger) {
            match step {
                Step::Retire(addr) => self.retire(addr),
                Step::Update(f) => self.update(f),
                Step::Start(f) => {
                    started.insert(f.addr());
                    self.start(f);
                }
                Step::Hold(addr, why) => {
                    self.held.insert(addr, why);
                }
            }
        }
        if let Some(slots) = self.slots.as_mut() {
            slots.sweep();
        }
        self.bind_missing_slots(&started);
        self.said.more(|n| {
            info!(
                more = n,
                "and more frontends proxied, updated or retired (each at log level debug)"
            )
        });
        self.said_errors.more(|n| error!(more = n, "and more frontends not proxied (each at log level debug; `hairpin-agent status` lists them all)"));
    }

    fn update(&mut self, f: Frontend) {
        let addr = f.addr();
        // A frontend live without a slot that now needs the relay path: made live
        // anew, as a relayed frontend is (a slot first, or it fails).
        let needs_slot = self.active.get(&addr).is_some_and(|a| a.slot.is_none())
            && self
                .map
                .as_ref()
                .is_some_and(|map| !map.takes_kernel_path(&f));
        if needs_slot {
            self.retire(addr);
            self.start(f);
            return;
        }
        let Some(a) = self.active.get_mut(&addr) else {
            return;
        };
        if a.frontend.version != f.version
            && let Some(slots) = self.slots.as_mut()
            && let Some(slot) = a.slot
            && let Err(e) = slots.bind(addr, slot.listener, f.version.number(), namespace_of(&f))
        {
            error!(frontend = %addr, error = %e,
                "could not change the frontend's slot: its relay keeps the old header version");
            return;
        }
        // The kernel path reads the version and the path from the map entry.
        if a.frontend.version != f.version
            || a.frontend.first_speaker != f.first_speaker
            || a.frontend.path != f.path
        {
            match self.map.as_mut().map(|map| map.insert(&f, a.slot)) {
                Some(Ok(route)) => {
                    a.path = route.path;
                    a.why = route.why;
                }
                Some(Err(e)) => {
                    error!(frontend = %addr, error = %e,
                        "could not change the frontend's map entry: it keeps its old header version and path");
                    // Keep what the map still says, so the next change tries again.
                    return;
                }
                None => {}
            }
        }
        crate::item!(self.said, info, frontend = %addr, version = %f.version, source = %f.source,
            first_speaker = %f.first_speaker, asked = %f.path, path = %a.path, "frontend updated");
        a.frontend = f;
    }

    fn start(&mut self, f: Frontend) {
        let addr = f.addr();
        match self.make_live(&f) {
            Ok(Live {
                slot,
                listener,
                no_slot,
                route,
            }) => {
                self.failed.remove(&addr);
                let at = listener.map_or_else(|| "none".to_string(), |l| l.to_string());
                crate::item!(self.said, info, frontend = %addr, listener = %at, version = %f.version, source = %f.source,
                    first_speaker = %f.first_speaker, path = %route.path,
                    why = route.why.as_deref().unwrap_or(""), "frontend proxied");
                self.active.insert(
                    addr,
                    Active {
                        frontend: f,
                        listener,
                        slot,
                        no_slot,
                        path: route.path,
                        why: route.why,
                    },
                );
            }
            Err(error) => {
                // Retries repeat the error: say it once per reason.
                if self.failed.get(&addr).map(|x| &x.error) == Some(&error) {
                    debug!(frontend = %addr, reason = %error, "frontend still not proxied");
                } else {
                    crate::item!(self.said_errors, error, frontend = %addr, source = %f.source,
                        reason = %error, permanent = error.is_permanent(), "frontend not proxied");
                }
                self.failed.insert(addr, Failed { frontend: f, error });
            }
        }
    }

    /// The slot first, then the redirect; a redirect that fails retires its slot.
    /// A frontend the entry gives the kernel path goes live without a slot when none
    /// can be had (every slot taken, its namespace at its cap): only the sockets the
    /// kernel path cannot take need one, and they go as before hairpin meanwhile.
    fn make_live(&mut self, f: &Frontend) -> Result<Live, FrontendError> {
        let addr = f.addr();
        let (Some(map), Some(slots)) = (self.map.as_mut(), self.slots.as_mut()) else {
            return Err(FrontendError::NotLive);
        };
        let (slot, at, no_slot) = match slots.bind(
            addr,
            relay_listener(addr),
            f.version.number(),
            namespace_of(f),
        ) {
            Ok((slot, at)) => (Some(slot), Some(at), None),
            Err(e) if map.takes_kernel_path(f) => (None, None, Some(e)),
            Err(e) => return Err(e),
        };
        match map.insert(f, slot) {
            Ok(route) => Ok(Live {
                slot,
                listener: at,
                no_slot,
                route,
            }),
            Err(e) => {
                if slot.is_some() {
                    slots.retire(addr);
                }
                Err(e)
            }
        }
    }

    /// Binds a slot for each kernel-path frontend live without one (but those
    /// `started` in this apply), now that one may be had, and writes it into its
    /// entry as the fallback.
    fn bind_missing_slots(&mut self, started: &BTreeSet<SocketAddr>) {
        let (Some(map), Some(slots)) = (self.map.as_mut(), self.slots.as_mut()) else {
            return;
        };
        let waiting = self
            .active
            .values_mut()
            .filter(|a| a.no_slot.is_some() && !started.contains(&a.frontend.addr()));
        for a in waiting {
            let f = &a.frontend;
            let addr = f.addr();
            match slots.bind(
                addr,
                relay_listener(addr),
                f.version.number(),
                namespace_of(f),
            ) {
                Ok((slot, at)) => match map.insert(f, Some(slot)) {
                    Ok(route) => {
                        crate::item!(self.said, info, frontend = %addr, listener = %at,
                            "a kernel-path frontend got its relay slot for the sockets the kernel path cannot take");
                        a.slot = Some(slot);
                        a.listener = Some(at);
                        a.no_slot = None;
                        a.path = route.path;
                        a.why = route.why;
                    }
                    Err(e) => {
                        // The entry keeps no slot: the slot goes back.
                        slots.retire(addr);
                        debug!(frontend = %addr, error = %e, "a kernel-path frontend's slot could not be written into its entry");
                    }
                },
                Err(e) => a.no_slot = Some(e),
            }
        }
    }

    fn retire(&mut self, addr: SocketAddr) {
        // Redirect first: once the map entry is gone no new connect is sent to the slot.
        if let Some(map) = self.map.as_mut()
            && let Err(e) = map.remove(addr)
        {
            // Keep the slot bound so redirected connects still reach their frontend.
            error!(frontend = %addr, error = %e, "could not remove redirect; keeping its slot");
            return;
        }
        if let Some(slots) = self.slots.as_mut() {
            slots.retire(addr);
        }
        self.active.remove(&addr);
        crate::item!(self.said, info, frontend = %addr, "frontend retired");
    }
}

/// What [`Reconciler::make_live`] made: the slot (none for a kernel-path frontend
/// that could not have one: `no_slot` says why), where its clients are sent, and
/// the path its entry gives.
struct Live {
    slot: Option<SlotRef>,
    listener: Option<SocketAddr>,
    no_slot: Option<FrontendError>,
    route: Route,
}

/// The relay listener that serves `addr`'s family.
fn relay_listener(addr: SocketAddr) -> u8 {
    if addr.ip().to_canonical().is_ipv4() {
        LISTENER_RELAY4
    } else {
        LISTENER_RELAY6
    }
}

/// The namespace a frontend's slot is charged to: its Service's. The operator's
/// frontends file is charged to none.
fn namespace_of(f: &Frontend) -> Option<&str> {
    match &f.source {
        Origin::Service(s) => Some(&s.namespace),
        Origin::File { .. } => None,
    }
}

/// Why a kernel-path frontend live without a slot takes its path (`why`), and
/// what that costs.
fn without_slot(why: Option<&str>, e: &FrontendError) -> String {
    let why = why.unwrap_or("kernel");
    format!(
        "{why}; no relay slot for the sockets the kernel path cannot take ({e}): they go as \
         before hairpin until one is free"
    )
}
