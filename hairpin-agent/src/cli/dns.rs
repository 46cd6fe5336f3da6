//! A minimal DNS client: one A and one AAAA query over UDP to a given server, as a
//! pod's resolver would ask kube-dns. Hand-written (about a hundred lines) rather than
//! a resolver crate: `check` needs exactly this and nothing of search lists or caches.

use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    time::Duration,
};

/// Errors of a DNS lookup.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DnsError {
    /// The name cannot be encoded (empty label, label over 63 bytes).
    #[error("invalid dns name {0:?}: labels must be 1 to 63 bytes")]
    Name(String),
    /// The socket failed or timed out.
    #[error("dns query to {server} failed: {source}")]
    Io {
        /// The server.
        server: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The answer did not parse.
    #[error("malformed dns answer from {server}: {detail}")]
    Malformed {
        /// The server.
        server: SocketAddr,
        /// What was wrong.
        detail: &'static str,
    },
    /// The server answered with an error code.
    #[error("dns server {server} answered rcode {rcode} ({})", rcode_name(*rcode))]
    Rcode {
        /// The server.
        server: SocketAddr,
        /// The rcode.
        rcode: u8,
    },
}

fn rcode_name(rcode: u8) -> &'static str {
    match rcode {
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        5 => "REFUSED",
        _ => "error",
    }
}

/// DNS record type A.
pub(crate) const TYPE_A: u16 = 1;
/// DNS record type AAAA.
pub(crate) const TYPE_AAAA: u16 = 28;

/// Encodes a recursive query for `name` of type `qtype`.
pub(crate) fn build_query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, DnsError> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00]); // RD
    q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(DnsError::Name(name.to_string()));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes()); // IN
    Ok(q)
}

/// The A and AAAA addresses in answer `buf` to query `id`.
pub(crate) fn parse_answer(
    server: SocketAddr,
    id: u16,
    buf: &[u8],
) -> Result<Vec<IpAddr>, DnsError> {
    let bad = |detail| DnsError::Malformed { server, detail };
    if buf.len() < 12 {
        return Err(bad("shorter than a header"));
    }
    if u16::from_be_bytes([buf[0], buf[1]]) != id || buf[2] & 0x80 == 0 {
        return Err(bad("not a response to our query"));
    }
    let rcode = buf[3] & 0x0f;
    if rcode != 0 {
        return Err(DnsError::Rcode { server, rcode });
    }
    let count = |i: usize| u16::from_be_bytes([buf[i], buf[i + 1]]) as usize;
    let (qd, an) = (count(4), count(6));
    let mut at = 12;
    for _ in 0..qd {
        at = skip_name(buf, at).ok_or(bad("truncated question"))? + 4;
    }
    let mut ips = Vec::new();
    for _ in 0..an {
        at = skip_name(buf, at).ok_or(bad("truncated answer name"))?;
        let fixed = buf.get(at..at + 10).ok_or(bad("truncated answer"))?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let len = u16::from_be_bytes([fixed[8], fixed[9]]) as usize;
        let data = buf
            .get(at + 10..at + 10 + len)
            .ok_or(bad("truncated rdata"))?;
        match (rtype, len) {
            (TYPE_A, 4) => ips.push(IpAddr::from(
                <[u8; 4]>::try_from(data).map_err(|_| bad("a"))?,
            )),
            (TYPE_AAAA, 16) => ips.push(IpAddr::from(
                <[u8; 16]>::try_from(data).map_err(|_| bad("aaaa"))?,
            )),
            _ => {} // CNAMEs: the server already followed them in this answer
        }
        at += 10 + len;
    }
    Ok(ips)
}

/// Index just past the (possibly compressed) name starting at `at`.
fn skip_name(buf: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *buf.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l => at += 1 + l as usize,
        }
    }
}

/// Asks `server` for the A and AAAA records of `name`.
pub(crate) fn lookup(
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Vec<IpAddr>, DnsError> {
    let io = |source| DnsError::Io { server, source };
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal address")
    } else {
        "[::]:0".parse().expect("literal address")
    };
    let sock = UdpSocket::bind(bind).map_err(io)?;
    sock.set_read_timeout(Some(timeout)).map_err(io)?;
    sock.connect(server).map_err(io)?;
    let mut ips = Vec::new();
    for (i, qtype) in [TYPE_A, TYPE_AAAA].into_iter().enumerate() {
        // Ids need not be unpredictable here: we talk to one server, once.
        let id = (std::process::id() as u16).wrapping_add(i as u16);
        sock.send(&build_query(id, name, qtype)?).map_err(io)?;
        let mut buf = [0u8; 1500];
        let n = sock.recv(&mut buf).map_err(io)?;
        ips.extend(parse_answer(server, id, &buf[..n])?);
    }
    Ok(ips)
}

#[cfg(test)]
mod tests;
