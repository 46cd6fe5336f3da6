//! Turning a desired set of frontends into listeners and map entries.
//!
//! Order matters for never breaking traffic: a listener exists before the redirect
//! to it, and the redirect is gone before its listener stops.
//!
//! Without a datapath (`--mode fallback`, or `auto` where the programs could not
//! attach) nothing redirects to a per-IP listener, so none is started: they would
//! only hold ports. The name relay serves those nodes instead.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tracing::{debug, error, info};

use crate::{datapath::Datapath, model::Frontend, relay::Relay};

/// A frontend being proxied now.
#[derive(Clone, Debug)]
pub struct Active {
    /// What was asked for.
    pub frontend: Frontend,
    /// Its relay listener.
    pub listener: SocketAddr,
}

/// Listener addresses per family.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListenAddresses {
    /// For IPv4 frontends.
    pub v4: Option<IpAddr>,
    /// For IPv6 frontends.
    pub v6: Option<IpAddr>,
}

/// Holds the relay, the datapath and what is live.
pub struct Reconciler {
    /// The relay; owned here so listeners and redirects change together.
    pub relay: Relay,
    /// The loaded programs; `None` when eBPF is not live on this node.
    pub datapath: Option<Datapath>,
    listen: ListenAddresses,
    active: BTreeMap<SocketAddr, Active>,
    failed: BTreeMap<SocketAddr, String>,
}

impl Reconciler {
    /// A reconciler with nothing live yet.
    pub fn new(relay: Relay, datapath: Option<Datapath>, listen: ListenAddresses) -> Reconciler {
        Reconciler {
            relay,
            datapath,
            listen,
            active: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Frontends live now.
    pub fn active(&self) -> impl Iterator<Item = &Active> {
        self.active.values()
    }

    /// Frontends that could not be made live, with the reason.
    pub fn failed(&self) -> &BTreeMap<SocketAddr, String> {
        &self.failed
    }

    /// Converges on `desired`. One frontend's failure never blocks the others:
    /// it is recorded, logged, and left on the pre-hairpin path (fail open).
    /// Without a datapath nothing is made live (see the module docs).
    pub fn apply(&mut self, desired: &BTreeSet<Frontend>) {
        // The first entry for an address wins; the set's order makes that deterministic.
        let mut want: BTreeMap<SocketAddr, &Frontend> = BTreeMap::new();
        let redirectable = if self.datapath.is_some() {
            desired
        } else {
            &BTreeSet::new()
        };
        for f in redirectable {
            want.entry(SocketAddr::new(f.ip, f.port)).or_insert(f);
        }
        self.failed.retain(|addr, _| want.contains_key(addr));

        let gone: Vec<SocketAddr> = self
            .active
            .keys()
            .filter(|a| !want.contains_key(a))
            .copied()
            .collect();
        for addr in gone {
            self.retire(addr);
        }
        for (addr, f) in want {
            match self.active.get_mut(&addr) {
                Some(a) if a.frontend.version != f.version || a.frontend.source != f.source => {
                    self.relay.set_version(addr, f.version);
                    info!(frontend = %addr, version = %f.version, "frontend updated");
                    a.frontend = f.clone();
                }
                Some(_) => {}
                None => match self.start(addr, f) {
                    Ok(listener) => {
                        self.failed.remove(&addr);
                        self.active.insert(
                            addr,
                            Active {
                                frontend: f.clone(),
                                listener,
                            },
                        );
                    }
                    Err(reason) => {
                        // Retries repeat the error: say it once per reason.
                        if self.failed.get(&addr) == Some(&reason) {
                            debug!(frontend = %addr, %reason, "frontend still not proxied");
                        } else {
                            error!(frontend = %addr, source = %f.source, %reason, "frontend not proxied");
                        }
                        self.failed.insert(addr, reason);
                    }
                },
            }
        }
    }

    fn start(&mut self, addr: SocketAddr, f: &Frontend) -> Result<SocketAddr, String> {
        let bind = match addr {
            SocketAddr::V4(_) => self.listen.v4,
            SocketAddr::V6(_) => self.listen.v6,
        }
        .ok_or_else(|| {
            format!(
                "no {} listen address: pass --listen-address or --node-ip with one",
                if addr.is_ipv4() { "IPv4" } else { "IPv6" }
            )
        })?;
        let Some(datapath) = self.datapath.as_mut() else {
            return Err(
                "eBPF is not live on this node: nothing would redirect to a listener".into(),
            );
        };
        let listener = self.relay.start(f, bind).map_err(|e| e.to_string())?;
        if let Err(e) = datapath.insert(addr, listener) {
            self.relay.stop(addr);
            return Err(e.to_string());
        }
        info!(frontend = %addr, %listener, version = %f.version, source = %f.source, "frontend proxied");
        Ok(listener)
    }

    fn retire(&mut self, addr: SocketAddr) {
        // Redirect first: once the map entry is gone no new connect reaches the listener.
        let removed = match self.datapath.as_mut() {
            Some(d) => d.remove(addr),
            None => Ok(()),
        };
        if let Err(e) = removed {
            // Keep the listener so redirected connects still land somewhere.
            error!(frontend = %addr, error = %e, "could not remove redirect; keeping its listener");
            return;
        }
        self.relay.stop(addr);
        self.active.remove(&addr);
        info!(frontend = %addr, "frontend retired");
    }
}
/// First retry of failed frontends after an apply that left some failed.
pub const FAILED_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between retries of failed frontends.
pub const FAILED_RETRY_MAX: Duration = Duration::from_secs(30);

/// Doubling delays with a cap: 1 s, 2 s, 4 s ... 30 s, back to the first on reset
/// (a change from the source, or nothing left failed).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_frontend_retries_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(FAILED_RETRY_FIRST, FAILED_RETRY_MAX);
        let secs: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }
}
