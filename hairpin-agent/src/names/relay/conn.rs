//! One connection to the name relay: read until the first bytes name a host (TLS SNI
//! or HTTP Host), look it up, then relay to that LB exactly as the eBPF path's relay
//! does: marked upstream socket, PROXY header, the bytes already read, both ways.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::BufMut;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::{Instant, timeout, timeout_at},
};
use tracing::debug;

use super::{
    Peek, Shared,
    http_host::parse_host,
    sni::{HelloScan, Scan, looks_like_tls, parse_sni},
};
use crate::relay::proxy::{Upstream, proxy, true_client};

/// Most bytes read while looking for the name: a ClientHello fits one 16 KiB record,
/// and request heads beyond that are refused by most servers anyway.
pub(crate) const MAX_PEEK: usize = 16 * 1024;

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
    // One allocation of the most that will be read, filled in place: every held
    // connection's buffer is the same size, so one freed by a connection that ended
    // fits the next exactly (a buffer grown 4 -> 8 -> 16 KiB left two smaller holes
    // behind per connection, and a flood's RSS grew with them), and the kernel
    // backs only the pages a head reaches.
    let mut buf = Vec::with_capacity(MAX_PEEK);
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
                    // Boxed: the relayed connection's state (6 KiB) is allocated
                    // once a name routes, not held by every connection still
                    // sending its head.
                    Box::pin(proxy(
                        &mut client,
                        &to,
                        &buf,
                        &shared.relay,
                        &shared.metrics,
                    ))
                    .await;
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
/// line, or a ClientHello's last record (its record headers walked once each, at
/// most [`super::sni::MAX_HELLO_RECORDS`] of them). A client trickling a 16 KiB
/// head byte by byte, or a ClientHello a record per byte, costs one parse, not one
/// per read.
async fn peek_name(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    within: Duration,
) -> Result<(bool, String), (bool, Refusal)> {
    let deadline = Instant::now() + within;
    let mut parsed_at = None;
    let mut scanned = 0;
    let mut hello = HelloScan::default();
    loop {
        let tls = buf.first().is_some_and(|b| looks_like_tls(*b));
        if !buf.is_empty() && worth_parsing(buf, tls, parsed_at, &mut scanned, &mut hello) {
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
        // Into the buffer's own spare room (never past MAX_PEEK): no chunk on the
        // task's stack to copy from.
        match timeout_at(deadline, client.read_buf(&mut (&mut *buf).limit(room))).await {
            Err(_) => return Err((tls, Refusal::Timeout)),
            Ok(Ok(0) | Err(_)) => return Err((tls, Refusal::Closed)),
            Ok(Ok(_)) => {}
        }
    }
}

/// Whether `buf`, last parsed when it was `parsed_at` bytes long, may now hold a
/// complete message: always on the first look; for HTTP when the bytes not yet
/// scanned (from `scanned`, with three before, for a terminator split across reads)
/// hold a line end followed by a blank line; for TLS once `hello` says the
/// ClientHello can be whole. Each byte is scanned once (`scanned` moves to the end;
/// `hello` walks each record header once), so a message that never ends costs
/// linear time, not a rescan per read.
fn worth_parsing(
    buf: &[u8],
    tls: bool,
    parsed_at: Option<usize>,
    scanned: &mut usize,
    hello: &mut HelloScan,
) -> bool {
    let from = std::mem::replace(scanned, buf.len());
    if tls {
        let scan = hello.advance(buf);
        return parsed_at.is_none() || scan == Scan::Parse;
    }
    if parsed_at.is_none() {
        return true;
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
            worth_parsing(head, false, None, &mut scanned, &mut HelloScan::default()),
            "the first look parses"
        );
        assert_eq!(scanned, head.len());
        let mut scanned = 10;
        assert!(
            !worth_parsing(
                head,
                false,
                Some(10),
                &mut scanned,
                &mut HelloScan::default()
            ),
            "no blank line yet"
        );
        let done = b"GET / HTTP/1.1\r\nHost: a.example.com\r\n\r\n";
        let mut scanned = head.len();
        assert!(worth_parsing(
            done,
            false,
            Some(head.len()),
            &mut scanned,
            &mut HelloScan::default()
        ));
        // The terminator split across reads: "\r\n" then "\r\n".
        let mut scanned = done.len() - 1;
        assert!(worth_parsing(
            done,
            false,
            Some(done.len() - 1),
            &mut scanned,
            &mut HelloScan::default()
        ));
        let mut scanned = 15;
        assert!(worth_parsing(
            b"GET / HTTP/1.0\n\n",
            false,
            Some(15),
            &mut scanned,
            &mut HelloScan::default()
        ));
    }

    #[test]
    fn a_head_that_never_ends_is_scanned_once() {
        // Trickled a byte at a time: every byte is looked at a bounded number of
        // times (the three before a read, for a split terminator), never rescanned
        // from the last parse.
        let mut buf = b"GET / HTTP/1.1\r\nHost: a.example.com\r\nX-Pad: ".to_vec();
        let mut scanned = 0;
        assert!(worth_parsing(
            &buf,
            false,
            None,
            &mut scanned,
            &mut HelloScan::default()
        ));
        let parsed_at = Some(buf.len());
        for _ in 0..16_000 {
            buf.push(b'a');
            assert!(!worth_parsing(
                &buf,
                false,
                parsed_at,
                &mut scanned,
                &mut HelloScan::default()
            ));
            assert_eq!(scanned, buf.len());
        }
        buf.extend_from_slice(b"\r\n\r\n");
        assert!(worth_parsing(
            &buf,
            false,
            parsed_at,
            &mut scanned,
            &mut HelloScan::default()
        ));
    }

    /// Issue 22: a ClientHello trickled a record per read is parsed once it can be
    /// whole, not once per record; one spread over thousands of one-byte records is
    /// refused at the cap. Prints what each costs (`--nocapture`).
    #[test]
    fn a_clienthello_in_many_records_costs_one_parse() {
        const HELLO: &[u8] =
            include_bytes!("../../../tests/fixtures/tls/clienthello-openssl-sni.bin");
        let records = |body: &[u8], size: usize| -> Vec<Vec<u8>> {
            body.chunks(size)
                .map(|part| {
                    let mut r = vec![22, 3, 1];
                    r.extend_from_slice(&(part.len() as u16).to_be_bytes());
                    r.extend_from_slice(part);
                    r
                })
                .collect()
        };
        // Feeds `reads` one at a time as peek_name does; (parses, verdict, time).
        let run = |reads: &[Vec<u8>]| {
            let started = std::time::Instant::now();
            let (mut buf, mut scanned, mut hello) = (Vec::new(), 0, HelloScan::default());
            let (mut parsed_at, mut parses, mut verdict) = (None, 0, Peek::NeedMore);
            for read in reads {
                buf.extend_from_slice(read);
                if worth_parsing(&buf, true, parsed_at, &mut scanned, &mut hello) {
                    parsed_at = Some(buf.len());
                    parses += 1;
                    verdict = parse_sni(&buf);
                    if verdict != Peek::NeedMore {
                        break;
                    }
                }
            }
            (parses, verdict, started.elapsed())
        };
        // The first run pays for warming up; the figures are the second's.
        let _ = run(&[HELLO.to_vec()]);
        let one = run(&[HELLO.to_vec()]);
        assert_eq!((one.0, &one.1), (1, &Peek::Name("app.example.com".into())));
        // 20 records of 16 bytes, one per read: the first look and the last record.
        let sixteen = run(&records(&HELLO[5..], 16));
        assert_eq!(
            (sixteen.0, &sixteen.1),
            (2, &Peek::Name("app.example.com".into()))
        );
        // 3,000 one-byte records, one per read: refused once past the cap.
        let mut body = HELLO[5..].to_vec();
        body.resize(3_000, 0);
        let many = run(&records(&body, 1));
        assert_eq!(
            (many.0, &many.1),
            (
                2,
                &Peek::Invalid("clienthello spread over too many tls records")
            )
        );
        eprintln!(
            "clienthello: one record {:?}; 20 records of 16 bytes {:?}; 3,000 one-byte records {:?}",
            one.2, sixteen.2, many.2
        );
    }
}
