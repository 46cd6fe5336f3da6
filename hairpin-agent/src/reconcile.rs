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
};

use tracing::{error, info};

use crate::{ebpf::Datapath, frontends::Frontend, relay::Relay};

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
                        error!(frontend = %addr, source = %f.source, %reason, "frontend not proxied");
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
