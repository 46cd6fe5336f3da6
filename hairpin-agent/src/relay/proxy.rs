//! One relayed connection, as both relays carry it: a marked upstream socket to the
//! LoadBalancer address, the PROXY header naming the true client, the bytes the
//! client already sent, then both ways with half-close; a failure resets the
//! client at once instead of leaving it an empty reply or a hang.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::{io::AsyncWriteExt, net::TcpStream, time::timeout};
use tracing::{debug, warn};

use super::{
    carry::{self, Carried, Fault, Side},
    config::RelayConfig,
    header::Header,
    listener::set_keepalive,
};
use crate::{
    model::ProxyVersion,
    status::metrics::{ConnError, Direction, Metrics},
};

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
/// relay needed to route), then both ways with half-close ([`carry`]: copied, then
/// spliced). Counts the bytes; on failure counts the error and resets the client at
/// once, instead of an empty reply or a hang.
pub(crate) async fn proxy(
    client: &mut TcpStream,
    to: &Upstream,
    first: &[u8],
    cfg: &RelayConfig,
    metrics: &Metrics,
) {
    match relay(client, to, first, cfg).await {
        Ok(Carried {
            up,
            down,
            kernel,
            piped,
            left,
            pauses,
        }) => {
            metrics.bytes(Direction::Upstream, up);
            metrics.bytes(Direction::Downstream, down);
            metrics.spliced("kernel", u64::from(kernel));
            metrics.spliced("pipe", u64::from(piped));
            metrics.spliced_left(left, pauses);
            debug!(
                bytes_up = up,
                bytes_down = down,
                ways_kernel = kernel,
                ways_piped = piped,
                bytes_left = left,
                pauses,
                "closed"
            );
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

async fn relay(
    client: &mut TcpStream,
    to: &Upstream,
    first: &[u8],
    cfg: &RelayConfig,
) -> Result<Carried, (Side, ConnError, io::Error)> {
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
    // The client's socket has NODELAY and keepalive from its listener
    // (`listener::bind`); the upstream's NODELAY is set by the carry, only if the
    // client sends more after the first write (see `carry::carry`).
    let header = Header::new(to.version, to.source, to.target);
    // Not before the kernel's splice: joined after a read that took part of a
    // received chunk, its verdict is handed that chunk whole and sends the part
    // already read again (tests/tests/relay_splice.rs saw the client's first
    // 16 KiB arrive twice). Its ways read only what they copy before they join.
    let read_early = !matches!(cfg.splice.splicer, carry::Splicer::Kernel(..));
    let head = first_write(client, header.as_bytes(), first, read_early)?;
    let sent = head.len() as u64;
    let early = sent - header.as_bytes().len() as u64;
    upstream
        .write_all(&head)
        .await
        .map_err(|e| (Side::Upstream, classify(&e), e))?;
    drop(head);
    let carried = carry::carry(client, &upstream, sent, &cfg.splice, cfg.buffer_size);
    keepalive_later(&upstream, cfg.keepalive, carried)
        .await
        .map(|carried| Carried {
            up: carried.up + early,
            ..carried
        })
        .map_err(|Fault { side, error }| {
            // The connection is dead: the upstream learns at once too. A plain close
            // would send a FIN, and bytes the kernel splice left with the upstream
            // socket (not in its receive queue, which makes close() reset) would
            // keep its sender waiting on a closed window.
            let _ = socket2::SockRef::from(&upstream).set_linger(Some(Duration::ZERO));
            (side, classify(&error), error)
        })
}

/// How long a relayed connection lives before its upstream socket gets TCP
/// keepalive (at most; less when the keepalive idle time is shorter).
const KEEPALIVE_AFTER: Duration = Duration::from_secs(1);

/// Runs `carried`, turning on TCP keepalive on `upstream` as `idle` says once it
/// has run for [`KEEPALIVE_AFTER`] (or half of `idle`, if shorter). Most relayed
/// connections are an exchange that ends well within that, and keepalive costs the
/// upstream four setsockopt calls (an accepted client inherits it from its
/// listener; a connected socket cannot): done at once it was a sixth of the
/// relay's syscalls per connection. Late, it probes the same: the kernel counts
/// the idle time from the last segment received, not from when keepalive was
/// turned on, so a connection idle from its start is probed at most that much later.
async fn keepalive_later<F: std::future::Future>(
    upstream: &TcpStream,
    idle: Option<Duration>,
    carried: F,
) -> F::Output {
    let Some(idle) = idle else {
        return carried.await;
    };
    tokio::pin!(carried);
    tokio::select! {
        biased;
        out = &mut carried => return out,
        () = tokio::time::sleep(KEEPALIVE_AFTER.min(idle / 2)) => {}
    }
    set_keepalive(upstream, Some(idle));
    carried.await
}

/// Most bytes of the client's read at once into the header's write.
const FIRST_READ: usize = 16 * 1024;

/// The upstream's first write: the header, `first` (bytes the caller already read),
/// then whatever the client sent while the upstream connected (a request usually
/// arrives within that round trip), read without waiting. One write, one segment,
/// as the cloud LB sends them: written apart, with NODELAY, the header went out
/// alone and the server woke once for it and again for the request. A client that
/// has ended reads 0 here and again in the carry, which ends its way then. Without
/// `read`, only the header and `first`.
fn first_write(
    client: &TcpStream,
    header: &[u8],
    first: &[u8],
    read: bool,
) -> Result<Vec<u8>, (Side, ConnError, io::Error)> {
    let mut head = Vec::with_capacity(header.len() + first.len() + FIRST_READ);
    head.extend_from_slice(header);
    head.extend_from_slice(first);
    if !read {
        return Ok(head);
    }
    // A short read (the usual request) clears the readiness: the carry's first
    // read of the client then waits instead of failing with EAGAIN.
    match carry::try_read_buf(client, &mut head) {
        Ok(_) => Ok(head),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(head),
        Err(e) => Err((Side::Client, classify(&e), e)),
    }
}

/// The address the PROXY header names as the client: the peer itself for pods;
/// for processes on the node (loopback, or the listener's own address as source)
/// the node's primary IP, which is what the cloud LB would have seen.
pub(crate) fn true_client(peer: SocketAddr, local: SocketAddr, cfg: &RelayConfig) -> SocketAddr {
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
///
/// Returns once the socket is writable: connected, or failed. A failed connect's
/// error (refused, unreachable, timed out) is the one the first write returns, so
/// it is not read apart with `SO_ERROR` as `TcpSocket::connect` does: one syscall
/// fewer per relayed connection, and the header is written at once either way.
async fn connect_marked(target: SocketAddr, mark: Option<u32>) -> io::Result<TcpStream> {
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    // Non-blocking: EINPROGRESS is the connect under way.
    match socket.connect(&target.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(socket.into())?;
    stream.writable().await?;
    Ok(stream)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::{io::AsyncReadExt, net::TcpListener};

    /// An accepted socket and its client, on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (a, _) = l.accept().await.expect("accept");
        (a, c)
    }

    /// The connect is not checked apart (`SO_ERROR`): a refused one is the first
    /// write's error, classified as the upstream's refusal; a made one carries it.
    #[tokio::test]
    async fn a_refused_upstream_connect_is_the_first_writes_error() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let open = l.local_addr().expect("addr");
        let closed = {
            let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            gone.local_addr().expect("addr")
        };
        let mut up = connect_marked(closed, None).await.expect("writable");
        let e = up.write_all(b"HDR ").await.expect_err("refused");
        assert_eq!(classify(&e), ConnError::Refused, "{e}");
        let mut up = connect_marked(open, None).await.expect("connected");
        up.write_all(b"HDR GET").await.expect("write");
        up.shutdown().await.expect("end");
        let (mut a, _) = l.accept().await.expect("accept");
        let mut got = Vec::new();
        a.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"HDR GET");
    }

    #[tokio::test]
    async fn the_first_write_takes_the_header_then_what_the_client_already_sent() {
        let (accepted, mut client) = pair().await;
        // Nothing sent yet: the header (and `first`) alone, without waiting.
        let head = first_write(&accepted, b"HDR ", b"peeked ", true).expect("first write");
        assert_eq!(head, b"HDR peeked ");
        client
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("send");
        accepted.readable().await.expect("readable");
        let head = first_write(&accepted, b"HDR ", b"", false).expect("header only");
        assert_eq!(head, b"HDR ", "not read without `read`");
        let head = first_write(&accepted, b"HDR ", b"", true).expect("first write");
        assert_eq!(head, b"HDR GET / HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn a_client_that_ended_reads_its_end_again_after_the_first_write() {
        let (mut accepted, mut client) = pair().await;
        client.write_all(b"last words").await.expect("send");
        client.shutdown().await.expect("half-close");
        drop(client);
        accepted.readable().await.expect("readable");
        let head = first_write(&accepted, b"HDR ", b"", true).expect("first write");
        assert_eq!(head, b"HDR last words");
        assert_eq!(
            first_write(&accepted, b"", b"", true).expect("the end"),
            b""
        );
        let mut rest = Vec::new();
        accepted
            .read_to_end(&mut rest)
            .await
            .expect("the end again");
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_client_reset_before_the_first_write_is_the_clients_fault() {
        let (accepted, client) = pair().await;
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        drop(client);
        accepted.readable().await.expect("readable");
        match first_write(&accepted, b"HDR ", b"", true) {
            Err((Side::Client, ConnError::Reset, _)) => {}
            other => panic!("expected a client reset, got {other:?}"),
        }
    }
}
