//! The relay: one listener per proxied frontend. Each accepted connection is
//! forwarded to the real LoadBalancer address with the PROXY header naming the true
//! client first, then relayed both ways with half-close propagated.

pub mod clients;
pub mod header;

use std::{
    collections::BTreeMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use nix::sys::socket::{setsockopt, sockopt};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::{TcpListener, TcpSocket, TcpStream},
    time::timeout,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, debug_span, info, info_span, warn};

use crate::{
    model::{Frontend, ProxyVersion},
    relay::header::Header,
    status::metrics::{ConnError, Direction, Metrics},
};

/// Relay settings, validated once at startup.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// SO_MARK put on upstream sockets so the connect programs skip them; `None`
    /// when no program is attached (fallback-only nodes), since setting a mark needs
    /// CAP_NET_ADMIN and serves nothing there.
    pub bypass_mark: Option<u32>,
    /// How long an upstream connect may take before the client is closed.
    pub connect_timeout: Duration,
    /// The node's IPv4 address: the PROXY source for IPv4 host processes.
    pub node_ipv4: Option<Ipv4Addr>,
    /// The node's IPv6 address: the PROXY source for IPv6 host processes.
    pub node_ipv6: Option<Ipv6Addr>,
    /// Which peers may use the relays (this node and its pods).
    pub clients: crate::relay::clients::ClientPolicy,
    /// Size of each direction's copy buffer.
    pub buffer_size: usize,
    /// TCP keepalive on both sides of every relayed connection: idle time before the
    /// first probe (`None`: off). A peer that vanished without a FIN or RST (a pod
    /// whose network namespace went away) is dropped after [`KEEPALIVE_PROBES`]
    /// unanswered probes instead of holding two sockets and its buffers forever.
    pub keepalive: Option<Duration>,
}

/// Unanswered keepalive probes before a relayed connection is dropped; they are sent
/// every `min(keepalive, 10 s)`.
pub const KEEPALIVE_PROBES: u32 = 3;

/// Turns on TCP keepalive on `s` as `idle` says (see [`RelayConfig::keepalive`]).
/// Set on a listener, every accepted socket inherits it (the kernel clones the
/// listener's options and arms the timer), so clients cost no syscall per connection.
pub(crate) fn set_keepalive<S: std::os::fd::AsFd>(s: &S, idle: Option<Duration>) {
    let Some(idle) = idle else { return };
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(idle.min(Duration::from_secs(10)))
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(s).set_tcp_keepalive(&ka) {
        debug!(error = %e, "TCP keepalive not set");
    }
}

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
}

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
}

impl Relay {
    /// A relay with no listeners.
    pub fn new(cfg: RelayConfig, metrics: Metrics) -> Relay {
        Relay {
            cfg: Arc::new(cfg),
            metrics,
            listeners: BTreeMap::new(),
            connections: TaskTracker::new(),
        }
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
        let socket = match bind_ip {
            IpAddr::V4(_) => TcpSocket::new_v4(),
            IpAddr::V6(_) => TcpSocket::new_v6(),
        }
        .map_err(listen_err)?;
        // A relay restarted within TIME_WAIT must be able to take a port again.
        socket.set_reuseaddr(true).map_err(listen_err)?;
        socket.bind(want).map_err(listen_err)?;
        set_keepalive(&socket, self.cfg.keepalive);
        let listener = socket.listen(1024).map_err(listen_err)?;
        let local = listener.local_addr().map_err(listen_err)?;
        let version = Arc::new(AtomicU8::new(encode_version(frontend.version)));
        let stop = CancellationToken::new();
        let accept = AcceptLoop {
            listener,
            local,
            target,
            version: version.clone(),
            stop: stop.clone(),
            cfg: self.cfg.clone(),
            metrics: self.metrics.clone(),
            connections: self.connections.clone(),
        };
        tokio::spawn(
            accept
                .run()
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
            l.version.store(encode_version(version), Ordering::Relaxed);
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

fn encode_version(v: ProxyVersion) -> u8 {
    match v {
        ProxyVersion::V1 => 1,
        ProxyVersion::V2 => 2,
    }
}

fn decode_version(v: u8) -> ProxyVersion {
    if v == 2 {
        ProxyVersion::V2
    } else {
        ProxyVersion::V1
    }
}

struct AcceptLoop {
    listener: TcpListener,
    /// The listener's address: bound to one address, so every accepted socket's too.
    local: SocketAddr,
    target: SocketAddr,
    version: Arc<AtomicU8>,
    stop: CancellationToken,
    cfg: Arc<RelayConfig>,
    metrics: Metrics,
    connections: TaskTracker,
}

impl AcceptLoop {
    async fn run(self) {
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                accepted = self.listener.accept() => self.handle(accepted).await,
            }
        }
        // Connects that were redirected just before the redirect went away may sit in
        // the accept queue: closing now would reset them. Take what is queued or
        // arrives within a short quiet period, then close.
        while let Ok(accepted) = timeout(Duration::from_millis(50), self.listener.accept()).await {
            self.handle(accepted).await;
        }
    }

    async fn handle(&self, accepted: io::Result<(TcpStream, SocketAddr)>) {
        match accepted {
            Ok((client, peer)) => {
                if !self.cfg.clients.allows(peer.ip()) {
                    refuse(&client, peer, &self.metrics);
                    return;
                }
                // Bound to one address, so the connection's own; a wildcard bind
                // (`--listen-address 0.0.0.0`) needs the kernel's answer.
                let local = if self.local.ip().is_unspecified() {
                    client.local_addr().unwrap_or(self.local)
                } else {
                    self.local
                };
                let conn = Connection {
                    client,
                    peer,
                    local,
                    target: self.target,
                    version: decode_version(self.version.load(Ordering::Relaxed)),
                    cfg: self.cfg.clone(),
                    metrics: self.metrics.clone(),
                };
                // Debug level: an enabled span per connection costs a formatted
                // allocation on the accept path (seen in `cargo xtask bench --profile`);
                // failures name the client themselves, inside the listener's span.
                let span = debug_span!("conn", client = %peer);
                self.connections.spawn(conn.serve().instrument(span));
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                // EMFILE/ENFILE persist until something closes: do not spin on them.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Closes a connection from a peer outside the client policy with a reset.
pub(crate) fn refuse(client: &TcpStream, peer: SocketAddr, metrics: &Metrics) {
    metrics.refused_client();
    debug!(%peer, "client outside the relay client policy: refused (reset)");
    let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
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

/// Where and how one accepted connection is relayed.
pub(crate) struct Upstream {
    /// The LoadBalancer address.
    pub target: SocketAddr,
    /// The header version its ingress expects.
    pub version: ProxyVersion,
    /// The true client the header names.
    pub source: SocketAddr,
}

/// Relays `client` to `to.target` as both relays do: marked upstream socket, the
/// PROXY header, then `first` (bytes already read from the client, which the name
/// relay needed to route), then both ways with half-close. Counts the bytes; on
/// failure counts the error and resets the client at once, instead of an empty
/// reply or a hang.
pub(crate) async fn proxy(
    client: &mut TcpStream,
    to: &Upstream,
    first: &[u8],
    cfg: &RelayConfig,
    metrics: &Metrics,
) {
    match relay(client, to, first, cfg).await {
        Ok((up, down)) => {
            let up = up + first.len() as u64;
            metrics.bytes(Direction::Upstream, up);
            metrics.bytes(Direction::Downstream, down);
            debug!(bytes_up = up, bytes_down = down, "closed");
        }
        Err((side, kind, e)) => {
            match side {
                Side::Upstream => {
                    metrics.upstream_error(kind);
                    warn!(?kind, error = %e, client = %to.source, target = %to.target, "relay failed");
                }
                // A client resetting or found gone by keepalive is the client's
                // business: counted apart, so upstream error alerts mean the LB path.
                Side::Client => {
                    metrics.client_error(kind);
                    debug!(?kind, error = %e, client = %to.source, target = %to.target, "client side failed");
                }
            }
            let _ = socket2::SockRef::from(&*client).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Which end of a relayed connection an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    Upstream,
}

/// Marks an error as the upstream socket's, so a failed copy can say which side broke.
#[derive(Debug)]
struct UpstreamFault(io::Error);

impl std::fmt::Display for UpstreamFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "upstream: {}", self.0)
    }
}

impl std::error::Error for UpstreamFault {}

/// The upstream stream, with every error it returns tagged [`UpstreamFault`].
struct Tagged<'a>(&'a mut TcpStream);

fn tag<T>(r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
    r.map_err(|e| io::Error::new(e.kind(), UpstreamFault(e)))
}

impl AsyncRead for Tagged<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        tag(Pin::new(&mut *self.0).poll_read(cx, buf))
    }
}

impl AsyncWrite for Tagged<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        tag(Pin::new(&mut *self.0).poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tag(Pin::new(&mut *self.0).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tag(Pin::new(&mut *self.0).poll_shutdown(cx))
    }
}

/// The side and kind of a copy error: upstream when [`Tagged`] marked it.
fn side_of(e: io::Error) -> (Side, ConnError, io::Error) {
    let kind = classify(&e);
    let upstream = e.get_ref().is_some_and(|inner| inner.is::<UpstreamFault>());
    (
        if upstream {
            Side::Upstream
        } else {
            Side::Client
        },
        kind,
        e,
    )
}

async fn relay(
    client: &mut TcpStream,
    to: &Upstream,
    first: &[u8],
    cfg: &RelayConfig,
) -> Result<(u64, u64), (Side, ConnError, io::Error)> {
    let mut upstream = match timeout(
        cfg.connect_timeout,
        connect_marked(to.target, cfg.bypass_mark),
    )
    .await
    {
        Err(_) => {
            return Err((
                Side::Upstream,
                ConnError::Timeout,
                io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"),
            ));
        }
        Ok(Err(e)) => return Err((Side::Upstream, classify(&e), e)),
        Ok(Ok(s)) => s,
    };
    // The header is a small write followed by the client's bytes: without NODELAY,
    // Nagle holds the client's first segment behind the header's delayed ACK.
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    // The client's socket has it from its listener (see `set_keepalive`).
    set_keepalive(&upstream, cfg.keepalive);
    let header = Header::new(to.version, to.source, to.target);
    let written = if first.is_empty() {
        upstream.write_all(header.as_bytes()).await
    } else {
        // Header and the bytes already read in one write, as the cloud LB sends them.
        let mut both = Vec::with_capacity(header.as_bytes().len() + first.len());
        both.extend_from_slice(header.as_bytes());
        both.extend_from_slice(first);
        upstream.write_all(&both).await
    };
    written.map_err(|e| (Side::Upstream, classify(&e), e))?;
    // tokio's copy_bidirectional, not splice(2): a splice relay measured 978 MB/s
    // on the 1 GiB bulk case of `cargo xtask bench`, this path 1041 and 833 MB/s in
    // two runs: within run-to-run spread, so the well-kept path stays. On the 2-core
    // bench machine the relay shares a core with nginx, which bounds bulk anyway.
    let size = cfg.buffer_size;
    tokio::io::copy_bidirectional_with_sizes(client, &mut Tagged(&mut upstream), size, size)
        .await
        .map_err(side_of)
}

/// The address the PROXY header names as the client: the peer itself for pods;
/// for processes on the node (loopback, or the listener's own address as source)
/// the node's primary IP, which is what the cloud LB would have seen.
pub fn true_client(peer: SocketAddr, local: SocketAddr, cfg: &RelayConfig) -> SocketAddr {
    let ip = peer.ip().to_canonical();
    let from_host = ip.is_loopback() || ip == local.ip().to_canonical();
    let node = match ip {
        IpAddr::V4(_) => cfg.node_ipv4.map(IpAddr::V4),
        IpAddr::V6(_) => cfg.node_ipv6.map(IpAddr::V6),
    };
    match (from_host, node) {
        (true, Some(node)) => SocketAddr::new(node, peer.port()),
        _ => SocketAddr::new(ip, peer.port()),
    }
}

/// Connects to `target` from a socket carrying `mark`, so the connect programs let
/// it through to the real LB (and kube-proxy's DNAT) instead of back to us.
/// Shared with the name relay, whose upstream connects need the same guard.
async fn connect_marked(target: SocketAddr, mark: Option<u32>) -> io::Result<TcpStream> {
    let socket = match target {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(mark) = mark {
        setsockopt(&socket, sockopt::Mark, &mark).map_err(io::Error::from)?;
    }
    socket.connect(target).await
}

/// The metrics label for an upstream failure (shared with the name relay).
fn classify(e: &io::Error) -> ConnError {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => ConnError::Refused,
        io::ErrorKind::TimedOut => ConnError::Timeout,
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => ConnError::Reset,
        _ => ConnError::Other,
    }
}
