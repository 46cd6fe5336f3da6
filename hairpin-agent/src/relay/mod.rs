//! The relays' shared machinery and the per-frontend relay.
//!
//! [`Relay`] runs one listener per proxied frontend: the eBPF redirect sends a
//! frontend's connects to its listener, so the listener itself names the original
//! destination. [`listener`] (bind, accept, client policy, drain), [`proxy`]
//! (upstream connect, PROXY [`header`]) and [`carry`] (the bytes both ways: copied,
//! then spliced) are shared with the name relay (`crate::names::relay`), which
//! routes by TLS SNI or HTTP Host instead.
//!
//! Owns sockets and bytes; does not decide which frontends exist (the agent's
//! reconciler does) nor touch the BPF maps: the kernel splice reaches them through
//! [`carry::KernelSplice`], which the datapath implements.

pub mod carry;
pub mod client_policy;
mod config;
pub mod header;
pub mod listener;
pub mod proxy;

pub use config::RelayConfig;

use std::{
    collections::BTreeMap,
    io,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    time::Duration,
};

use tokio::{net::TcpStream, time::timeout};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, debug_span, info, info_span, warn};

pub use listener::KEEPALIVE_PROBES;
use proxy::{Upstream, proxy, true_client};

use crate::{
    model::{Frontend, ProxyVersion},
    status::metrics::Metrics,
};

/// Errors starting a listener.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// bind() or listen() failed.
    #[error("failed to listen on {addr} for frontend {frontend}: {source}")]
    Listen {
        /// The address we tried.
        addr: SocketAddr,
        /// The frontend it was for.
        frontend: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// The listener could not be registered as listening (see [`ListenHook`]):
    /// nothing would be sent to it, so it is not kept.
    #[error("listener {addr} for frontend {frontend} could not be registered as live: {source}")]
    Register {
        /// The listener.
        addr: SocketAddr,
        /// The frontend it was for.
        frontend: SocketAddr,
        /// What failed: the hook owner's error.
        source: ListenHookError,
    },
}

/// Called with each listener's address and socket once it listens: the datapath
/// registers it in its liveness map, from which the kernel removes it as it closes,
/// so the connect programs send connects only to a listener that listens.
pub type ListenHook = Arc<
    dyn Fn(SocketAddr, std::os::fd::BorrowedFd<'_>) -> Result<(), ListenHookError> + Send + Sync,
>;

/// Why a [`ListenHook`] could not register a listener: its owner's own error (the
/// datapath's), boxed so that the relay names no BPF type.
pub type ListenHookError = Box<dyn std::error::Error + Send + Sync>;

struct ListenerHandle {
    local: SocketAddr,
    version: Arc<AtomicU8>,
    stop: CancellationToken,
}

/// All listeners, and every connection they accepted.
pub struct Relay {
    cfg: Arc<RelayConfig>,
    metrics: Metrics,
    listeners: BTreeMap<SocketAddr, ListenerHandle>,
    connections: TaskTracker,
    on_listen: Option<ListenHook>,
}

impl Relay {
    /// A relay with no listeners.
    pub fn new(cfg: RelayConfig, metrics: Metrics) -> Relay {
        Relay {
            cfg: Arc::new(cfg),
            metrics,
            listeners: BTreeMap::new(),
            connections: TaskTracker::new(),
            on_listen: None,
        }
    }

    /// Calls `hook` with every listener started from now on, before it is used.
    pub fn on_listen(&mut self, hook: ListenHook) {
        self.on_listen = Some(hook);
    }

    /// Starts a listener for `frontend` on `bind_ip` (an ephemeral port) and
    /// returns its address. Must run inside a tokio runtime.
    pub fn start(
        &mut self,
        frontend: &Frontend,
        bind_ip: IpAddr,
    ) -> Result<SocketAddr, RelayError> {
        let target = SocketAddr::new(frontend.ip, frontend.port);
        let want = SocketAddr::new(bind_ip, 0);
        let listen_err = |source| RelayError::Listen {
            addr: want,
            frontend: target,
            source,
        };
        let listener = listener::bind(want, self.cfg.keepalive).map_err(listen_err)?;
        let local = listener.local_addr().map_err(listen_err)?;
        if let Some(hook) = &self.on_listen {
            use std::os::fd::AsFd;
            hook(local, listener.as_fd()).map_err(|source| RelayError::Register {
                addr: local,
                frontend: target,
                source,
            })?;
        }
        let version = Arc::new(AtomicU8::new(frontend.version.number()));
        let stop = CancellationToken::new();
        let (cfg, metrics, current) = (self.cfg.clone(), self.metrics.clone(), version.clone());
        let serve = move |client, peer, local| {
            let conn = Connection {
                client,
                peer,
                local,
                target,
                // Only `ProxyVersion::number`s are ever stored.
                version: ProxyVersion::from_number(current.load(Ordering::Relaxed))
                    .unwrap_or(ProxyVersion::V1),
                cfg: cfg.clone(),
                metrics: metrics.clone(),
            };
            // Debug level: an enabled span per connection costs a formatted
            // allocation on the accept path (seen in `cargo xtask bench --profile`);
            // failures name the client themselves, inside the listener's span.
            conn.serve().instrument(debug_span!("conn", client = %peer))
        };
        tokio::spawn(
            listener::accept_loop(
                listener,
                local,
                stop.clone(),
                self.cfg.admission(&self.metrics, &self.connections),
                serve,
            )
            .instrument(info_span!("listener", %local, frontend = %target)),
        );
        self.listeners.insert(
            target,
            ListenerHandle {
                local,
                version,
                stop,
            },
        );
        info!(%local, frontend = %target, version = %frontend.version, "listener started");
        Ok(local)
    }

    /// Changes the header version of a running listener; new connections use it.
    pub fn set_version(&self, frontend: SocketAddr, version: ProxyVersion) {
        if let Some(l) = self.listeners.get(&frontend) {
            l.version.store(version.number(), Ordering::Relaxed);
        }
    }

    /// Stops accepting for `frontend`. Connections already accepted run to completion.
    /// Call only after the redirect to it is gone.
    pub fn stop(&mut self, frontend: SocketAddr) {
        if let Some(l) = self.listeners.remove(&frontend) {
            l.stop.cancel();
            info!(local = %l.local, frontend = %frontend, "listener stopped");
        }
    }

    /// Stops every listener, then waits up to `deadline` for open connections to
    /// finish. Returns the number still open when it gave up.
    pub async fn drain(&mut self, deadline: Duration) -> i64 {
        for (_, l) in std::mem::take(&mut self.listeners) {
            l.stop.cancel();
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
