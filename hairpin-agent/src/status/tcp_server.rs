//! Serving the admin router on a TCP address with bounds an open port needs: the
//! opt-in `--metrics-address` may listen where off-node peers reach it, and the
//! probes' address is reachable by every process on the node. `axum::serve` has no
//! connection cap and reads a request head for as long as a client trickles it
//! (hyper times out a head only with a timer, which axum does not set), so a peer
//! could hold sockets and buffers without end. Here every connection:
//! - takes one of [`Limits::max_connections`] places, and at most
//!   [`Limits::per_peer`] of them per peer address; past either it is closed at
//!   once, before a byte is read;
//! - must deliver each request head within [`Limits::header_timeout`] (hyper's
//!   `header_read_timeout`, with tokio's timer);
//! - lives at most [`Limits::lifetime`], keep-alive included: a scraper reconnects.
//!
//! The unix socket (root only, 0600) keeps `axum::serve`: whoever reaches it owns
//! the node already.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

/// The bounds of one TCP listener of the admin server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections served at once on the listener.
    pub max_connections: usize,
    /// Connections served at once from one peer address.
    pub per_peer: usize,
    /// How long a request head may take to arrive (slow-header clients are dropped).
    pub header_timeout: Duration,
    /// How long one connection may live, keep-alive included.
    pub lifetime: Duration,
}

impl Default for Limits {
    /// 64 connections, 8 per peer: a kubelet's probes and a Prometheus or two need
    /// a handful. A head within 5 s (a scraper's is one packet). A minute per
    /// connection, longer than the usual scrape interval so keep-alive still pays.
    fn default() -> Self {
        Limits {
            max_connections: 64,
            per_peer: 8,
            header_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// How long a connection told to close (lifetime over, or shutdown) may take to
/// finish the response it is writing.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Who holds the places of a listener: the count in all and per peer.
#[derive(Default)]
struct Places {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// One place taken; given back when dropped.
struct Place {
    places: Arc<Mutex<Places>>,
    peer: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut p = self.places.lock().unwrap_or_else(PoisonError::into_inner);
        p.total -= 1;
        if let Some(n) = p.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                p.by_peer.remove(&self.peer);
            }
        }
    }
}

/// Takes a place for `peer`, or `None` when the listener or the peer is at its cap.
fn take_place(places: &Arc<Mutex<Places>>, peer: IpAddr, limits: Limits) -> Option<Place> {
    let mut p = places.lock().unwrap_or_else(PoisonError::into_inner);
    let mine = p.by_peer.get(&peer).copied().unwrap_or(0);
    if p.total >= limits.max_connections || mine >= limits.per_peer {
        return None;
    }
    p.total += 1;
    *p.by_peer.entry(peer).or_default() += 1;
    Some(Place {
        places: places.clone(),
        peer,
    })
}

/// Serves `app` on `listener` within `limits` until `stop`, then lets open
/// connections finish their response (at most [`CLOSE_GRACE`]).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let places = Arc::new(Mutex::new(Places::default()));
    let conns = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and the like: wait rather than spin.
                    warn!(error = %e, "admin server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let Some(place) = take_place(&places, peer.ip().to_canonical(), limits) else {
            debug!(%peer, "admin server: at its connection cap, closed at once");
            drop(stream);
            continue;
        };
        let (app, stop) = (app.clone(), stop.clone());
        conns.spawn(async move {
            let _place = place;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
            let mut conn = std::pin::pin!(conn);
            let done = tokio::select! {
                r = conn.as_mut() => Some(r),
                () = tokio::time::sleep(limits.lifetime) => None,
                () = stop.cancelled() => None,
            };
            let result = match done {
                Some(r) => r,
                None => {
                    conn.as_mut().graceful_shutdown();
                    match tokio::time::timeout(CLOSE_GRACE, conn).await {
                        Ok(r) => r,
                        Err(_) => return,
                    }
                }
            };
            if let Err(e) = result {
                // A client that timed out, reset or sent garbage: its own business.
                debug!(%peer, error = %e, "admin server: connection ended");
            }
        });
    }
    conns.close();
    conns.wait().await;
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Instant};

    use axum::routing::get;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    async fn start(limits: Limits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let app = Router::new().route("/metrics", get(|| async { "ok\n" }));
        let task = tokio::spawn(serve(l, app, limits, stop.clone()));
        (addr, stop, task)
    }

    /// `GET /metrics` over a new connection; the status line.
    async fn get_metrics(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            .await
            .expect("write");
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.expect("read");
        reply.lines().next().unwrap_or_default().to_string()
    }

    /// Reads until the server closes `s`; how long that took, or `None` when it
    /// stays open past `within`.
    async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(within.saturating_sub(start.elapsed()), s.read(&mut buf))
                .await
            {
                Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
                Ok(Ok(_)) => continue,
                Err(_) => return None,
            }
        }
    }

    #[tokio::test]
    async fn a_client_trickling_its_request_head_is_dropped_at_the_header_timeout() {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, stop, task) = start(limits).await;
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            .await
            .expect("write");
        let took = closed_within(&mut slow, Duration::from_secs(5))
            .await
            .expect("the server closes a head that never ends");
        assert!(took >= Duration::from_millis(250), "closed after {took:?}");
        // A well-behaved client is served meanwhile and after.
        assert_eq!(get_metrics(addr).await, "HTTP/1.0 200 OK");
        stop.cancel();
        task.await.expect("server task");
    }

    #[tokio::test]
    async fn connections_past_the_per_peer_cap_are_closed_at_once_and_places_come_back() {
        let limits = Limits {
            max_connections: 64,
            per_peer: 3,
            ..Limits::default()
        };
        let (addr, stop, task) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            let s = TcpStream::connect(addr).await.expect("connect");
            held.push(s);
        }
        // Give the server the time to take the three places.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut extra = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_within(&mut extra, Duration::from_secs(2))
                .await
                .is_some(),
            "a fourth connection from the same peer is closed"
        );
        // Places come back when connections go.
        held.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(get_metrics(addr).await, "HTTP/1.0 200 OK");
        stop.cancel();
        task.await.expect("server task");
    }

    #[tokio::test]
    async fn a_connection_lives_at_most_its_lifetime_keep_alive_included() {
        let limits = Limits {
            lifetime: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, stop, task) = start(limits).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let took = closed_within(&mut s, Duration::from_secs(5))
            .await
            .expect("closed at the end of its lifetime");
        assert!(took < Duration::from_secs(2), "closed after {took:?}");
        stop.cancel();
        task.await.expect("server task");
    }

    #[test]
    fn the_listener_cap_holds_across_peers() {
        let places = Arc::new(Mutex::new(Places::default()));
        let limits = Limits {
            max_connections: 2,
            per_peer: 2,
            ..Limits::default()
        };
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let b: IpAddr = "192.0.2.2".parse().expect("ip");
        let first = take_place(&places, a, limits).expect("a place");
        let _second = take_place(&places, b, limits).expect("a place");
        assert!(
            take_place(&places, b, limits).is_none(),
            "the listener is full"
        );
        drop(first);
        assert!(
            take_place(&places, b, limits).is_some(),
            "a place came back"
        );
    }
}
