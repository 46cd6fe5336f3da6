//! One connection to the name relay: read until the first bytes name a host (TLS SNI
//! or HTTP Host), look it up, then relay to that LB exactly as the eBPF path's relay
//! does: marked upstream socket, PROXY header, the bytes already read, both ways.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::{Instant, timeout, timeout_at},
};
use tracing::debug;

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
///
/// The parser runs on the first bytes (so garbage is refused at once) and then
/// only when what arrived can have completed the message: an HTTP head's blank
/// line, or a TLS record's full length. A client trickling a 16 KiB head byte by
/// byte costs one parse, not one per read.
async fn peek_name(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    within: Duration,
) -> Result<(bool, String), (bool, Refusal)> {
    let deadline = Instant::now() + within;
    let mut chunk = [0u8; 4096];
    let mut parsed_at = None;
    let mut scanned = 0;
    loop {
        let tls = buf.first().is_some_and(|b| looks_like_tls(*b));
        if !buf.is_empty() && worth_parsing(buf, tls, parsed_at, &mut scanned) {
            parsed_at = Some(buf.len());
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

/// Whether `buf`, last parsed when it was `parsed_at` bytes long, may now hold a
/// complete message: always on the first look; for HTTP when the bytes not yet
/// scanned (from `scanned`, with three before, for a terminator split across reads)
/// hold a line end followed by a blank line; for TLS once the first record is
/// complete. Each byte is scanned once (`scanned` moves to the end), so a head that
/// never ends costs linear time, not a rescan per read.
fn worth_parsing(buf: &[u8], tls: bool, parsed_at: Option<usize>, scanned: &mut usize) -> bool {
    let from = std::mem::replace(scanned, buf.len());
    if parsed_at.is_none() {
        return true;
    }
    if tls {
        // Record header: type, version (2), length (2).
        let record = buf
            .get(3..5)
            .map(|l| 5 + usize::from(u16::from_be_bytes([l[0], l[1]])));
        // A ClientHello spread over several records: parse as they come.
        return record.is_none_or(|len| buf.len() >= len);
    }
    let fresh = &buf[from.min(buf.len()).saturating_sub(3)..];
    fresh.windows(2).any(|w| w == b"\n\n") || fresh.windows(3).any(|w| w == b"\n\r\n")
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
    // Debug: a client may send many; each refusal is answered and counted by the
    // client, and a flood must not flood the log.
    debug!(tls, reason = %detail, "name relay refused connection");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trickled_head_is_parsed_when_it_can_have_ended() {
        let head = b"GET / HTTP/1.1\r\nHost: a.example.com\r\n";
        let mut scanned = 0;
        assert!(
            worth_parsing(head, false, None, &mut scanned),
            "the first look parses"
        );
        assert_eq!(scanned, head.len());
        let mut scanned = 10;
        assert!(
            !worth_parsing(head, false, Some(10), &mut scanned),
            "no blank line yet"
        );
        let done = b"GET / HTTP/1.1\r\nHost: a.example.com\r\n\r\n";
        let mut scanned = head.len();
        assert!(worth_parsing(done, false, Some(head.len()), &mut scanned));
        // The terminator split across reads: "\r\n" then "\r\n".
        let mut scanned = done.len() - 1;
        assert!(worth_parsing(
            done,
            false,
            Some(done.len() - 1),
            &mut scanned
        ));
        let mut scanned = 15;
        assert!(worth_parsing(
            b"GET / HTTP/1.0\n\n",
            false,
            Some(15),
            &mut scanned
        ));
    }

    #[test]
    fn a_head_that_never_ends_is_scanned_once() {
        // Trickled a byte at a time: every byte is looked at a bounded number of
        // times (the three before a read, for a split terminator), never rescanned
        // from the last parse.
        let mut buf = b"GET / HTTP/1.1\r\nHost: a.example.com\r\nX-Pad: ".to_vec();
        let mut scanned = 0;
        assert!(worth_parsing(&buf, false, None, &mut scanned));
        let parsed_at = Some(buf.len());
        for _ in 0..16_000 {
            buf.push(b'a');
            assert!(!worth_parsing(&buf, false, parsed_at, &mut scanned));
            assert_eq!(scanned, buf.len());
        }
        buf.extend_from_slice(b"\r\n\r\n");
        assert!(worth_parsing(&buf, false, parsed_at, &mut scanned));
    }

    #[test]
    fn a_tls_record_is_parsed_once_it_is_whole() {
        let mut record = vec![22, 3, 1, 0, 10];
        record.extend_from_slice(&[1; 4]);
        let mut scanned = 5;
        assert!(!worth_parsing(&record, true, Some(5), &mut scanned));
        record.extend_from_slice(&[1; 6]);
        assert!(worth_parsing(&record, true, Some(9), &mut scanned));
        assert!(
            worth_parsing(&[22, 3], true, Some(1), &mut 1),
            "no length yet: parse"
        );
    }
}
