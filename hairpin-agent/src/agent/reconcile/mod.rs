//! Turning a desired set of frontends into listeners and map entries.
//!
//! [`plan`] decides the steps from what is live, what failed and what is wanted,
//! touching nothing; [`Reconciler::apply`] performs them through two small traits,
//! [`RedirectMap`] (the BPF frontend map) and [`Listeners`] (the relay), so the
//! order and the retry policy are unit-tested without a kernel.
//!
//! Order is what keeps traffic flowing: a listener exists before the redirect to
//! it, and the redirect is gone before its listener stops. One frontend's failure
//! never blocks another's; a failed frontend stays on the pre-hairpin path (fail
//! open). A transient failure (a port or an address not free yet) is retried with
//! backoff; a permanent one (no listen address for its family, a full map) waits
//! for the next change, since retrying cannot fix it.

mod plan;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tracing::{debug, error, info, warn};

pub use plan::{Hold, Step, Trigger, plan};

use crate::{
    datapath::{DatapathError, FrontendsMap},
    model::{Frontend, Frontends, LivePath, ProxyVersion},
    relay::Relay,
};

/// A frontend being proxied now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Active {
    /// What was asked for.
    pub frontend: Frontend,
    /// Its relay listener.
    pub listener: SocketAddr,
    /// How its clients get their header: [`LivePath::Relay`] (the relay) or
    /// [`LivePath::Kernel`], as the map entry says.
    pub path: LivePath,
    /// Why it takes that path, when the kernel path was asked for (a
    /// server-speaks-first frontend is relayed, an unavailable kernel path relays all).
    pub why: Option<String>,
}

/// The path a map entry gives a frontend, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// [`LivePath::Relay`] (the relay) or [`LivePath::Kernel`].
    pub path: LivePath,
    /// Why, when the kernel path was asked for.
    pub why: Option<String>,
}

/// A frontend that could not be made live, as it was asked for and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    /// What was asked for.
    pub frontend: Frontend,
    /// Why it is not live.
    pub error: FrontendError,
}

/// Why a frontend is not live.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrontendError {
    /// No listen address of the frontend's family is configured.
    #[error("no {family} listen address: pass --listen-address or --node-ip with one")]
    NoListenAddress {
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },
    /// The listener could not be started (its message names the address).
    #[error("{0}")]
    Listen(String),
    /// The frontend map has no room left.
    #[error("{0}")]
    MapFull(String),
    /// The map refused the entry for another reason.
    #[error("{0}")]
    Map(String),
}

impl FrontendError {
    /// True when retrying cannot help until something changes: the configuration
    /// (no listen address) or the set of frontends (a full map).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            FrontendError::NoListenAddress { .. } | FrontendError::MapFull(_)
        )
    }
}

/// The BPF frontend map, as the reconciler uses it.
pub trait RedirectMap {
    /// Redirects connects to `frontend` to `listener`, which writes its version's
    /// headers (or has the kernel write them, where the kernel path is on and the
    /// client speaks first). Inserting an address again replaces its entry. Returns
    /// the path the entry gives it.
    fn insert(&mut self, frontend: &Frontend, listener: SocketAddr)
    -> Result<Route, FrontendError>;
    /// Stops redirecting connects to `frontend`; absent is not an error.
    fn remove(&mut self, frontend: SocketAddr) -> Result<(), FrontendError>;
    /// Redirects connects to `dialled` to `listener`, a plain relay redirect (the
    /// names ports to the name relay's listeners).
    fn redirect(&mut self, dialled: SocketAddr, listener: SocketAddr) -> Result<(), FrontendError>;
    /// Removes every entry but those of `live`: what an earlier agent left.
    fn retain(&mut self, live: &BTreeSet<SocketAddr>);
}

/// The relay's per-frontend listeners, as the reconciler uses them.
pub trait Listeners {
    /// Starts a listener for `frontend` on `bind` (an ephemeral port); its address.
    fn start(&mut self, frontend: &Frontend, bind: IpAddr) -> Result<SocketAddr, FrontendError>;
    /// Changes the header version new connections to `frontend` get.
    fn set_version(&mut self, frontend: SocketAddr, version: ProxyVersion);
    /// Stops accepting for `frontend`; connections already accepted run on.
    fn stop(&mut self, frontend: SocketAddr);
}

impl RedirectMap for FrontendsMap {
    fn insert(
        &mut self,
        frontend: &Frontend,
        listener: SocketAddr,
    ) -> Result<Route, FrontendError> {
        let kernel = FrontendsMap::insert_frontend(
            self,
            frontend.addr(),
            listener,
            frontend.version,
            frontend.first_speaker,
            frontend.path,
        )
        .map_err(|e| match e {
            DatapathError::MapFull { .. } => FrontendError::MapFull(e.to_string()),
            e => FrontendError::Map(e.to_string()),
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

    fn remove(&mut self, frontend: SocketAddr) -> Result<(), FrontendError> {
        FrontendsMap::remove(self, frontend).map_err(|e| FrontendError::Map(e.to_string()))
    }

    fn redirect(&mut self, dialled: SocketAddr, listener: SocketAddr) -> Result<(), FrontendError> {
        FrontendsMap::insert(self, dialled, listener).map_err(|e| FrontendError::Map(e.to_string()))
    }

    fn retain(&mut self, live: &BTreeSet<SocketAddr>) {
        FrontendsMap::retain(self, live);
    }
}

impl Listeners for Relay {
    fn start(&mut self, frontend: &Frontend, bind: IpAddr) -> Result<SocketAddr, FrontendError> {
        Relay::start(self, frontend, bind).map_err(|e| FrontendError::Listen(e.to_string()))
    }

    fn set_version(&mut self, frontend: SocketAddr, version: ProxyVersion) {
        Relay::set_version(self, frontend, version);
    }

    fn stop(&mut self, frontend: SocketAddr) {
        Relay::stop(self, frontend);
    }
}

/// Listener addresses per family.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListenAddresses {
    /// For IPv4 frontends.
    pub v4: Option<IpAddr>,
    /// For IPv6 frontends.
    pub v6: Option<IpAddr>,
}

/// The map (when a datapath is live), the listeners, and what is live and failed.
pub struct Reconciler<M, L> {
    map: Option<M>,
    listeners: L,
    listen: ListenAddresses,
    active: BTreeMap<SocketAddr, Active>,
    failed: BTreeMap<SocketAddr, Failed>,
    /// The frontends the last apply left as they were, and why.
    held: BTreeMap<SocketAddr, Hold>,
    /// The names ports' entries (dialled address, the name relay's listener), as
    /// last written.
    name_redirects: Vec<(SocketAddr, SocketAddr)>,
}

impl<M: RedirectMap, L: Listeners> Reconciler<M, L> {
    /// A reconciler with nothing live yet. Without a `map` (eBPF is not live on
    /// this node) nothing redirects to a per-frontend listener, so none is started.
    pub fn new(map: Option<M>, listeners: L, listen: ListenAddresses) -> Self {
        Reconciler {
            map,
            listeners,
            listen,
            active: BTreeMap::new(),
            failed: BTreeMap::new(),
            held: BTreeMap::new(),
            name_redirects: Vec::new(),
        }
    }

    /// Frontends live now.
    pub fn active(&self) -> impl Iterator<Item = &Active> {
        self.active.values()
    }

    /// Frontends that could not be made live, by address.
    pub fn failed(&self) -> &BTreeMap<SocketAddr, Failed> {
        &self.failed
    }

    /// The frontends asked for that the last apply left as they were, and why.
    pub fn held(&self) -> &BTreeMap<SocketAddr, Hold> {
        &self.held
    }

    /// Whether some failure is worth retrying before the next change.
    pub fn has_transient_failures(&self) -> bool {
        self.failed.values().any(|f| !f.error.is_permanent())
    }

    /// The map, when a datapath is live (read only: the reconciler is its one
    /// writer).
    pub fn map(&self) -> Option<&M> {
        self.map.as_ref()
    }

    /// The map, to set up a fake one in tests.
    #[cfg(test)]
    pub(crate) fn map_mut(&mut self) -> Option<&mut M> {
        self.map.as_mut()
    }

    /// The names ports' entries, as last written.
    pub fn name_redirects(&self) -> &[(SocketAddr, SocketAddr)] {
        &self.name_redirects
    }

    /// The names ports are frontends like any LB's: a connect to the names address
    /// is sent to the name relay's listener, and nothing binds the ports themselves.
    /// Writes `redirects` when they changed, and removes the entries of those gone
    /// (unless an LB frontend now holds the address).
    pub fn redirect_names(&mut self, redirects: Vec<(SocketAddr, SocketAddr)>) {
        if redirects == self.name_redirects {
            return;
        }
        let Some(map) = self.map.as_mut() else {
            self.name_redirects = redirects;
            return;
        };
        for (dialled, listener) in &redirects {
            if let Err(e) = map.redirect(*dialled, *listener) {
                warn!(%dialled, %listener, error = %e, "the names port cannot be redirected to the name relay");
            }
        }
        for (dialled, _) in &self.name_redirects {
            let kept = redirects.iter().any(|(d, _)| d == dialled);
            if !kept
                && !self.active.contains_key(dialled)
                && let Err(e) = map.remove(*dialled)
            {
                warn!(%dialled, error = %e, "a names port's old redirect could not be removed");
            }
        }
        self.name_redirects = redirects;
    }

    /// Removes the entries this reconciler did not make: after the first apply, an
    /// adopted map still holds the earlier agent's entries, which kept traffic served
    /// until now; those not made live again name frontends that went away while no
    /// agent ran.
    pub fn forget_earlier_entries(&mut self) {
        let live: BTreeSet<SocketAddr> = self
            .active
            .keys()
            .copied()
            .chain(self.name_redirects.iter().map(|(dialled, _)| *dialled))
            .collect();
        if let Some(map) = self.map.as_mut() {
            map.retain(&live);
        }
    }

    /// The listeners.
    pub fn listeners_mut(&mut self) -> &mut L {
        &mut self.listeners
    }

    /// Converges on `desired`: plans the steps and performs them in order.
    pub fn apply(&mut self, desired: &Frontends, trigger: Trigger) {
        let redirecting = self.map.is_some();
        // A failure no longer asked for is forgotten.
        self.failed
            .retain(|a, _| redirecting && desired.contains(a));
        self.held.clear();
        for step in plan(&self.active, &self.failed, desired, redirecting, trigger) {
            match step {
                Step::Retire(addr) => self.retire(addr),
                Step::Update(f) => self.update(f),
                Step::Start(f) => self.start(f),
                Step::Hold(addr, why) => {
                    self.held.insert(addr, why);
                }
            }
        }
    }

    fn update(&mut self, f: Frontend) {
        let addr = f.addr();
        if let Some(a) = self.active.get_mut(&addr) {
            if a.frontend.version != f.version {
                self.listeners.set_version(addr, f.version);
            }
            // The kernel path reads the version and the path from the map entry.
            if a.frontend.version != f.version
                || a.frontend.first_speaker != f.first_speaker
                || a.frontend.path != f.path
            {
                match self.map.as_mut().map(|map| map.insert(&f, a.listener)) {
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
            info!(frontend = %addr, version = %f.version, source = %f.source,
                first_speaker = %f.first_speaker, asked = %f.path, path = %a.path, "frontend updated");
            a.frontend = f;
        }
    }

    fn start(&mut self, f: Frontend) {
        let addr = f.addr();
        match self.make_live(&f) {
            Ok((listener, route)) => {
                self.failed.remove(&addr);
                info!(frontend = %addr, %listener, version = %f.version, source = %f.source,
                    first_speaker = %f.first_speaker, path = %route.path,
                    why = route.why.as_deref().unwrap_or(""), "frontend proxied");
                self.active.insert(
                    addr,
                    Active {
                        frontend: f,
                        listener,
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
                    error!(frontend = %addr, source = %f.source, reason = %error,
                        permanent = error.is_permanent(), "frontend not proxied");
                }
                self.failed.insert(addr, Failed { frontend: f, error });
            }
        }
    }

    /// Listener first, then the redirect; a redirect that fails takes its listener
    /// down. The listener and the path the map entry gives the frontend.
    fn make_live(&mut self, f: &Frontend) -> Result<(SocketAddr, Route), FrontendError> {
        let addr = f.addr();
        let bind = match addr {
            SocketAddr::V4(_) => self
                .listen
                .v4
                .ok_or(FrontendError::NoListenAddress { family: "IPv4" }),
            SocketAddr::V6(_) => self
                .listen
                .v6
                .ok_or(FrontendError::NoListenAddress { family: "IPv6" }),
        }?;
        let Some(map) = self.map.as_mut() else {
            return Err(FrontendError::Map(
                "eBPF is not live on this node: nothing would redirect to a listener".into(),
            ));
        };
        let listener = self.listeners.start(f, bind)?;
        match map.insert(f, listener) {
            Ok(route) => Ok((listener, route)),
            Err(e) => {
                self.listeners.stop(addr);
                Err(e)
            }
        }
    }

    fn retire(&mut self, addr: SocketAddr) {
        // Redirect first: once the map entry is gone no new connect reaches the listener.
        if let Some(map) = self.map.as_mut()
            && let Err(e) = map.remove(addr)
        {
            // Keep the listener so redirected connects still land somewhere.
            error!(frontend = %addr, error = %e, "could not remove redirect; keeping its listener");
            return;
        }
        self.listeners.stop(addr);
        self.active.remove(&addr);
        info!(frontend = %addr, "frontend retired");
    }
}

/// First retry of failed frontends after an apply that left some failed.
pub const FAILED_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between retries of failed frontends.
pub const FAILED_RETRY_MAX: Duration = Duration::from_secs(30);

/// Doubling delays with a cap: 1 s, 2 s, 4 s ... 30 s, back to the first on reset
/// (a change from the source, or nothing left to retry).
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, never above `max`.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The delay to wait now; the one after is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}
