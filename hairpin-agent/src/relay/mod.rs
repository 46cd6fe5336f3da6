//! The relays' shared machinery and the relay of frontends.
//!
//! [`Relay`] runs a handful of listeners (one per family), each on a privileged
//! port of the listen address: the connect programs send a frontend's connects to
//! its slot (a port of a slot address that no socket binds), the kernel hands them
//! to the listener, and the accepted socket's own address, the slot, names the
//! frontend ([`SlotLookup`]). No port of the node's is held per frontend.
//! [`listener`] (bind, accept, client policy, drain), [`proxy`] (upstream connect,
//! PROXY [`header`]) and [`carry`] (the bytes both ways: copied, then spliced) are
//! shared with the name relay (`crate::names::relay`), which routes by TLS SNI or
//! HTTP Host instead.
//!
//! Owns sockets and bytes; does not decide which frontends exist nor which slot
//! serves which (the agent's reconciler does), nor touch the BPF maps: the kernel
//! splice reaches them through [`carry::KernelSplice`], which the datapath
//! implements.

pub(crate) mod carry;
pub(crate) mod client_policy;
mod config;
pub(crate) mod header;
pub(crate) mod listener;
pub(crate) mod peer_owner;
pub(crate) mod proxy;

pub use carry::{
    KernelSplice, NoKernelSplice, SpliceConfig, SpliceMode, resolve as resolve_splice,
};
pub use client_policy::{ClientPolicy, LearnedClients, parse_net};
pub use config::RelayConfig;
pub use header::Header;
pub use listener::{Admission, ConnGate, ConnLimits, accept_loop, bind as bind_listener};

use std::{
    io,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use tokio::{net::TcpStream, time::timeout};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, debug_span, info, info_span, warn};

use proxy::{Upstream, proxy, true_client};

use crate::{model::ProxyVersion, status::metrics::Metrics};

/// Errors starting a listener.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// bind() or listen() failed.
    #[error("the relay cannot listen on a privileged port of {ip}: {source}")]
    Listen {
        /// The address we tried.
        ip: IpAddr,
        /// The error.
        source: io::Error,
    },
    /// The listener could not be registered as listening (see [`ListenHook`]):
    /// nothing would be sent to it, so it is not kept.
    #[error("relay listener {addr} could not be registered as live: {source}")]
    Register {
        /// The listener.
        addr: SocketAddr,
        /// What failed: the hook owner's error.
        source: ListenHookError,
    },
}

/// Called with each redirected listener's index in the relays' listener map, its
/// address and its socket once it listens, before it serves: the datapath marks it
/// and registers it in its liveness map, from which the kernel removes it as it
/// closes, so connects are sent only to a listener that listens.
pub type ListenHook = Arc<
    dyn Fn(u8, SocketAddr, std::os::fd::BorrowedFd<'_>) -> Result<(), ListenHookError>
        + Send
        + Sync,
>;

/// Why a [`ListenHook`] could not register a listener: its owner's own error (the
/// datapath's), boxed so that the relay names no BPF type.
pub(crate) type ListenHookError = Box<dyn std::error::Error + Send + Sync>;

/// Whose slot a connection accepted at an address came to: the frontend and the
/// header version its relay writes, read from the datapath's slots map. `None`: no
/// frontend holds that slot, and the connection is reset, never relayed to a guess.
pub type SlotLookup = Arc<dyn Fn(SocketAddr) -> Option<(SocketAddr, ProxyVersion)> + Send + Sync>;

/// `lookup`, refusing a frontend that the refusal table of LoadBalancer addresses
/// refuses whatever the policy (loopback, link-local, multicast, a metadata or
/// platform endpoint, in every IPv6 spelling: `k8s/decide/lb_address.rs`). The slots
/// map is written by the agent only from frontends that passed the whole table, but
/// whoever can write the map (its pin) could name such an address, and the relay
/// dials with the bypass mark: a connection to such a slot is reset, never relayed.
pub(crate) fn refusing_targets(lookup: SlotLookup) -> SlotLookup {
    Arc::new(move |local| {
        let (target, version) = lookup(local)?;
        match crate::k8s::decide::lb_address::builtin_refusal(target.ip()) {
            None => Some((target, version)),
            Some(why) => {
                tracing::warn!(slot = %local, %target, why, "a slot names a refused address: not relayed");
                None
            }
        }
    })
}

/// The relay's listeners, and every connection they accepted.
pub struct Relay {
    cfg: Arc<RelayConfig>,
    metrics: Metrics,
    listeners: Vec<(SocketAddr, CancellationToken)>,
    connections: TaskTracker,
}

impl Relay {
    /// A relay with no listeners.
    pub fn new(cfg: RelayConfig, metrics: Metrics) -> Relay {
        Relay {
            cfg: Arc::new(cfg),
            metrics,
            listeners: Vec::new(),
            connections: TaskTracker::new(),
        }
    }

    /// Starts a listener on `ip` at the highest free privileged port not in
    /// `avoid`, registers it with `hook` as listener `index`, and relays every
    /// connection it accepts to the frontend `slots` names for the connection's own
    /// address (its slot). Returns the listener's address. Must run inside a tokio
    /// runtime.
    pub(crate) fn listen(
        &mut self,
        ip: IpAddr,
        index: u8,
        avoid: &[u16],
        hook: &ListenHook,
        slots: SlotLookup,
    ) -> Result<SocketAddr, RelayError> {
        let listener =
            listener::bind_privileged(ip, self.cfg.keepalive, avoid, &listener::reserved_ports())
                .map_err(|source| RelayError::Listen { ip, source })?;
        self.serve(listener, index, hook, slots)
    }

    /// As [`Relay::listen`], on a listener already bound (by [`listener::bind`]).
    pub fn serve(
        &mut self,
        listener: tokio::net::TcpListener,
        index: u8,
        hook: &ListenHook,
        slots: SlotLookup,
    ) -> Result<SocketAddr, RelayError> {
        let local = listener.local_addr().map_err(|source| RelayError::Listen {
            ip: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            source,
        })?;
        {
            use std::os::fd::AsFd;
            hook(index, local, listener.as_fd()).map_err(|source| RelayError::Register {
                addr: local,
                source,
            })?;
        }
        let stop = CancellationToken::new();
        let (cfg, metrics) = (self.cfg.clone(), self.metrics.clone());
        let serve = move |client: TcpStream, peer: SocketAddr, local: SocketAddr| {
            let owner = slots(local);
            let (cfg, metrics) = (cfg.clone(), metrics.clone());
            // Debug level: an enabled span per connection costs a formatted
            // allocation on the accept path (seen in `cargo xtask bench --profile`);
            // failures name the client themselves, inside the listener's span.
            async move {
                let Some((target, version)) = owner else {
                    // The slot names no frontend (it retired past its quarantine, or
                    // the connection was aimed at it by hand): reset, never a guess.
                    metrics.shed("no_slot");
                    debug!(%peer, %local, "no frontend holds this slot: reset");
                    listener::reset(&client);
                    return;
                };
                let conn = Connection {
                    client,
                    peer,
                    local,
                    target,
                    version,
                    cfg,
                    metrics,
                };
                conn.serve().await;
            }
            .instrument(debug_span!("conn", client = %peer))
        };
        tokio::spawn(
            listener::accept_loop(
                listener,
                local,
                stop.clone(),
                self.cfg.admission(&self.metrics, &self.connections),
                serve,
            )
            .instrument(info_span!("relay_listener", %local)),
        );
        self.listeners.push((local, stop));
        info!(%local, index, "relay listening");
        Ok(local)
    }

    /// Stops every listener, then waits up to `deadline` for open connections to
    /// finish. Returns the number still open when it gave up.
    pub async fn drain(&mut self, deadline: Duration) -> i64 {
        for (_, stop) in std::mem::take(&mut self.listeners) {
            stop.cancel();
        }
        self.connections.close();
        let active = self.metrics.active_connections();
        info!(active, ?deadline, "draining connections");
        if timeout(deadline, self.connections.wait()).await.is_err() {
            let left = self.metrics.active_connections();
            warn!(
                left,
                "drain deadline reached; closing remaining connections"
            );
            return left;
        }
        0
    }
}

struct Connection {
    client: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    target: SocketAddr,
    version: ProxyVersion,
    cfg: Arc<RelayConfig>,
    metrics: Metrics,
}

impl Connection {
    async fn serve(mut self) {
        self.metrics.connection_opened();
        let source = true_client(self.peer, self.local, &self.cfg);
        debug!(%source, "accepted");
        let to = Upstream {
            target: self.target,
            version: self.version,
            source,
        };
        proxy(&mut self.client, &to, &[], &self.cfg, &self.metrics).await;
        self.metrics.connection_closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot naming loopback, the metadata endpoint (also as NAT64) or a
    /// link-local address is not relayed; a LoadBalancer's address is.
    #[test]
    fn a_slot_naming_a_refused_address_is_not_relayed() {
        for target in [
            "127.0.0.1:10250",
            "169.254.169.254:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "[fe80::1]:80",
            "[::ffff:127.0.0.1]:22",
        ] {
            let target: SocketAddr = target.parse().expect("addr");
            let lookup: SlotLookup = Arc::new(move |_| Some((target, ProxyVersion::V1)));
            let slot: SocketAddr = "169.254.104.1:2000".parse().expect("addr");
            assert_eq!(refusing_targets(lookup)(slot), None, "{target}");
        }
        let lb: SocketAddr = "203.0.113.7:443".parse().expect("addr");
        let lookup: SlotLookup = Arc::new(move |_| Some((lb, ProxyVersion::V2)));
        let slot: SocketAddr = "169.254.104.1:2000".parse().expect("addr");
        assert_eq!(refusing_targets(lookup)(slot), Some((lb, ProxyVersion::V2)));
    }
}
