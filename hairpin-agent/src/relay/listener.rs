//! Listening, as both relays do it: a socket whose accepted connections inherit
//! TCP keepalive, an accept loop that resets peers outside the client policy, and
//! a stop that still takes the connects already queued.

use std::{future::Future, io, net::SocketAddr, time::Duration};

use tokio::{
    net::{TcpListener, TcpSocket, TcpStream},
    time::timeout,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

use super::clients::ClientPolicy;
use crate::status::metrics::Metrics;

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

/// A listener on `addr` (port 0: an ephemeral one) whose accepted sockets inherit
/// TCP keepalive as `keepalive` says. `SO_REUSEADDR`: a relay restarted within
/// TIME_WAIT must be able to take its ports again.
pub fn bind(addr: SocketAddr, keepalive: Option<Duration>) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    set_keepalive(&socket, keepalive);
    socket.listen(1024)
}

/// Accepts on `listener` (bound at `local`) until `stop`, resets peers outside
/// `clients`, and runs `serve(client, peer, local)` for every other connection as
/// a task of `connections`. `local` is the connection's own address unless the
/// listener is bound to a wildcard, when the kernel is asked.
///
/// Once stopped it still takes what is queued or arrives within a short quiet
/// period: connects redirected just before their redirect went away sit in the
/// accept queue, and closing at once would reset them.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    local: SocketAddr,
    stop: CancellationToken,
    clients: ClientPolicy,
    metrics: Metrics,
    connections: TaskTracker,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handle = |accepted: io::Result<(TcpStream, SocketAddr)>| {
        let (client, peer) = match accepted {
            Ok(a) => a,
            Err(e) => return Err(e),
        };
        if !clients.allows(peer.ip()) {
            refuse(&client, peer, &metrics);
            return Ok(());
        }
        let local = if local.ip().is_unspecified() {
            client.local_addr().unwrap_or(local)
        } else {
            local
        };
        connections.spawn(serve(client, peer, local));
        Ok(())
    };
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        if let Err(e) = handle(accepted) {
            warn!(error = %e, "accept failed");
            // EMFILE/ENFILE persist until something closes: do not spin on them.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    while let Ok(accepted) = timeout(Duration::from_millis(50), listener.accept()).await {
        if handle(accepted).is_err() {
            break;
        }
    }
}

/// Closes a connection from a peer outside the client policy with a reset.
fn refuse(client: &TcpStream, peer: SocketAddr, metrics: &Metrics) {
    metrics.refused_client();
    debug!(%peer, "client outside the relay client policy: refused (reset)");
    let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
}
