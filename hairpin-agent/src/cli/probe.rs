//! One connection attempt of `check`: connect, optionally with the bypass mark and a
//! PROXY v1 header first, then an HTTP `GET /` or a TLS ClientHello, and report
//! whether the server answered. The `curl` / `curl --haproxy-protocol` pair operators
//! run by hand, with the mark so the eBPF redirect leaves the marked probes alone.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::Duration,
};

use rustls::pki_types::ServerName;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};

use crate::{model::ProxyVersion, relay::header::Header};

/// One probe to run.
#[derive(Clone, Debug)]
pub(crate) struct Probe {
    /// Where to connect.
    pub addr: SocketAddr,
    /// Host header and TLS server name.
    pub host: String,
    /// A TLS handshake rather than HTTP.
    pub tls: bool,
    /// Send a PROXY v1 header first.
    pub header: bool,
    /// SO_MARK to set (the agent's bypass mark), so the connect programs skip the socket.
    pub mark: Option<u32>,
    /// Connect and read timeout.
    pub timeout: Duration,
}

/// How a probe ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// The server answered: an HTTP status line, or a completed TLS handshake.
    Answered,
    /// Connected, but the server closed, reset or stayed silent.
    NoAnswer,
    /// The connection was not made (refused, unreachable, timeout, mark not allowed).
    ConnectFailed,
}

/// What a probe saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ProbeResult {
    /// How it ended.
    pub outcome: Outcome,
    /// The status line, TLS version, or error.
    pub detail: String,
}

impl ProbeResult {
    fn new(outcome: Outcome, detail: impl Into<String>) -> ProbeResult {
        ProbeResult {
            outcome,
            detail: printable(&detail.into()),
        }
    }

    /// True when the server answered.
    pub(crate) fn answered(&self) -> bool {
        self.outcome == Outcome::Answered
    }
}

/// `s` with every control character escaped (`\u{1b}`): a status line is the
/// server's own bytes, and printed raw its terminal escapes would drive the
/// operator's terminal (clear it, rewrite earlier lines, set its title).
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Sends `p` and reads what comes back.
pub(crate) fn send(p: &Probe) -> ProbeResult {
    let mut stream = match connect(p) {
        Ok(s) => s,
        Err(e) => return ProbeResult::new(Outcome::ConnectFailed, e.to_string()),
    };
    if p.header {
        // The header names this socket as the client, as the cloud LB would.
        let header = match stream.local_addr() {
            Ok(local) => Header::new(ProxyVersion::V1, local, p.addr),
            Err(e) => return ProbeResult::new(Outcome::ConnectFailed, e.to_string()),
        };
        if let Err(e) = stream.write_all(header.as_bytes()) {
            return no_answer(&e, p.timeout);
        }
    }
    if p.tls {
        tls(p, stream)
    } else {
        http(p, stream)
    }
}

/// Why a probe's connection was not made.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    /// No socket.
    #[error("socket: {0}")]
    Socket(io::Error),
    /// The mark could not be set.
    #[error("could not set SO_MARK {mark:#x} (needs CAP_NET_ADMIN or CAP_NET_RAW): {source}")]
    Mark {
        /// The mark asked for.
        mark: u32,
        /// The kernel's refusal.
        source: io::Error,
    },
    /// The connect failed or timed out.
    #[error("connect: {0}")]
    Connect(io::Error),
}

fn connect(p: &Probe) -> Result<TcpStream, ConnectError> {
    let sock = Socket::new(
        Domain::for_address(p.addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(ConnectError::Socket)?;
    if let Some(mark) = p.mark {
        sock.set_mark(mark)
            .map_err(|source| ConnectError::Mark { mark, source })?;
    }
    sock.connect_timeout(&p.addr.into(), p.timeout)
        .map_err(ConnectError::Connect)?;
    let stream: TcpStream = sock.into();
    stream.set_read_timeout(Some(p.timeout)).ok();
    stream.set_write_timeout(Some(p.timeout)).ok();
    Ok(stream)
}

fn no_answer(e: &io::Error, timeout: Duration) -> ProbeResult {
    let detail = match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no reply within {}", humantime::format_duration(timeout))
        }
        io::ErrorKind::UnexpectedEof => "empty reply: the server closed the connection".into(),
        _ => e.to_string(),
    };
    ProbeResult::new(Outcome::NoAnswer, detail)
}

fn http(p: &Probe, mut stream: TcpStream) -> ProbeResult {
    let req = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nUser-Agent: hairpin-agent-check\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        p.host
    );
    if let Err(e) = stream.write_all(req.as_bytes()) {
        return no_answer(&e, p.timeout);
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    // The status line is all we need; stop at its end or at 4 KiB.
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if buf.is_empty() => return no_answer(&e, p.timeout),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().next().unwrap_or("").trim();
    if line.starts_with("HTTP/") {
        ProbeResult::new(Outcome::Answered, line)
    } else if buf.is_empty() {
        no_answer(&io::ErrorKind::UnexpectedEof.into(), p.timeout)
    } else {
        ProbeResult::new(Outcome::NoAnswer, format!("not an HTTP reply: {line:?}"))
    }
}

fn tls(p: &Probe, mut stream: TcpStream) -> ProbeResult {
    // `check` asks "does the server answer", not "is it who it claims".
    let config = match crate::tls::accept_any_certificate() {
        Ok(config) => config,
        Err(e) => return ProbeResult::new(Outcome::ConnectFailed, format!("tls setup: {e}")),
    };
    // An IP target sends no SNI, as curl does for https://IP/.
    let name = match ServerName::try_from(p.host.clone()) {
        Ok(n) => n,
        Err(e) => return ProbeResult::new(Outcome::ConnectFailed, format!("server name: {e}")),
    };
    let mut conn = match rustls::ClientConnection::new(Arc::new(config), name) {
        Ok(c) => c,
        Err(e) => return ProbeResult::new(Outcome::ConnectFailed, format!("tls: {e}")),
    };
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut stream) {
            return no_answer(&e, p.timeout);
        }
    }
    let version = conn
        .protocol_version()
        .map(|v| format!("{v:?}"))
        .unwrap_or_default();
    ProbeResult::new(
        Outcome::Answered,
        format!("TLS handshake complete ({version})"),
    )
}

#[cfg(test)]
mod tests;
