//! One connection to the name relay: read until the first bytes name a host (TLS SNI
//! or HTTP Host), look it up, then relay to that LB exactly as the eBPF path's relay
//! does: marked upstream socket, PROXY header, the bytes already read, both ways.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::{Instant, timeout, timeout_at},
};
use tracing::{debug, info};

use super::{Peek, Shared, http_host::parse_host, sni::looks_like_tls, sni::parse_sni};
use crate::relay::proxy::{Upstream, proxy, true_client};

/// Most bytes read while looking for the name: a ClientHello fits one 16 KiB record,
/// and request heads beyond that are refused by most servers anyway.
pub const MAX_PEEK: usize = 16 * 1024;

/// TLS alert record: fatal `unrecognized_name` (RFC 6066 3), so a TLS client reports
/// "unrecognized name" instead of an unexplained EOF.
const TLS_UNRECOGNIZED_NAME: [u8; 7] = [21, 3, 1, 0, 2, 2, 112];

/// Why a connection was not relayed.
enum Refusal {
    /// The client closed or failed before naming a host.
    Closed,
    /// No complete name within the read timeout.
    Timeout,
    /// More than [`MAX_PEEK`] bytes without a complete ClientHello or request head.
    TooLarge,
    /// Not TLS or HTTP/1.x, or malformed.
    Invalid(&'static str),
    /// A ClientHello without SNI or a request without Host.
    NoName,
    /// No route for this name on this port.
    Unknown(String),
}

/// Serves one client accepted at `local` on a listener whose connections route as
/// `port`: the port the client dialled (the listener's own, or the Service port it
/// stands for).
pub(super) async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    port: u16,
    shared: Arc<Shared>,
) {
    shared.metrics.connection_opened();
    let mut buf = Vec::with_capacity(4096);
    match peek_name(&mut client, &mut buf, shared.peek_timeout).await {
        Ok((tls, name)) => {
            let route = shared.table.borrow().lookup(&name, port).cloned();
            match route {
                Some(route) => {
                    let target = SocketAddr::new(route.lb, port);
                    let source = true_client(peer, local, &shared.relay);
                    debug!(%name, %target, %source, version = %route.version, route = %route.source, "routing by name");
                    let to = Upstream {
                        target,
                        version: route.version,
                        source,
                    };
                    proxy(&mut client, &to, &buf, &shared.relay, &shared.metrics).await;
                }
                None => refuse(&mut client, tls, Refusal::Unknown(name)).await,
            }
        }
        Err((tls, why)) => refuse(&mut client, tls, why).await,
    }
    shared.metrics.connection_closed();
}

/// Reads into `buf` until the parser for the protocol the first byte announces
/// has a name; returns whether it is TLS, and the name.
async fn peek_name(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    within: Duration,
) -> Result<(bool, String), (bool, Refusal)> {
    let deadline = Instant::now() + within;
    let mut chunk = [0u8; 4096];
    loop {
        let tls = buf.first().is_some_and(|b| looks_like_tls(*b));
        if !buf.is_empty() {
            let peek = if tls { parse_sni(buf) } else { parse_host(buf) };
            match peek {
                Peek::NeedMore => {}
                Peek::Name(name) => return Ok((tls, name)),
                Peek::NoName => return Err((tls, Refusal::NoName)),
                Peek::Invalid(why) => return Err((tls, Refusal::Invalid(why))),
            }
        }
        let room = MAX_PEEK - buf.len();
        if room == 0 {
            return Err((tls, Refusal::TooLarge));
        }
        let want = room.min(chunk.len());
        match timeout_at(deadline, client.read(&mut chunk[..want])).await {
            Err(_) => return Err((tls, Refusal::Timeout)),
            Ok(Ok(0)) | Ok(Err(_)) => return Err((tls, Refusal::Closed)),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Answers a refused client as helpfully as its protocol allows, then closes.
///
/// HTTP gets `421 Misdirected Request` for a name this relay does not serve (RFC
/// 9110 15.5.20: "not able to produce a response for this authority", which is
/// exactly the case and tells the operator to look at name routing, where a 502
/// would point at the backend) and `400` for a request it cannot read. TLS gets an
/// `unrecognized_name` alert, or a plain close for bytes that are not TLS.
async fn refuse(client: &mut TcpStream, tls: bool, why: Refusal) {
    let (status, detail): (&str, String) = match &why {
        Refusal::Closed => return,
        Refusal::Timeout => (
            "408 Request Timeout",
            "no name within the read timeout".into(),
        ),
        Refusal::TooLarge => (
            "431 Request Header Fields Too Large",
            "request head too large".into(),
        ),
        Refusal::Invalid(w) => ("400 Bad Request", (*w).into()),
        Refusal::NoName => ("421 Misdirected Request", "no host name given".into()),
        Refusal::Unknown(name) => (
            "421 Misdirected Request",
            format!("no proxied loadbalancer serves {name:?}"),
        ),
    };
    info!(tls, reason = %detail, "name relay refused connection");
    let reply: Vec<u8> = if tls {
        match why {
            Refusal::NoName | Refusal::Unknown(_) => TLS_UNRECOGNIZED_NAME.to_vec(),
            _ => Vec::new(),
        }
    } else {
        let body = format!("hairpin: {detail}\n");
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    // Best effort, bounded: a client that does not read must not hold the task.
    let _ = timeout(Duration::from_secs(1), async {
        client.write_all(&reply).await?;
        client.shutdown().await
    })
    .await;
}
