//! PROXY protocol headers (v1 text and v2 binary), as the HAProxy spec defines them:
//! <https://www.haproxy.org/download/2.6/doc/proxy-protocol.txt>.
//!
//! Encoding is on the connect path of every relayed connection, so it writes into a
//! fixed stack buffer and never allocates. (The `ppp` crate's builder allocates a Vec
//! per header; the tests use its parser to check our bytes.)

use std::{
    io::{Cursor, Write},
    net::{IpAddr, SocketAddr},
};

use crate::model::ProxyVersion;

/// The 12-byte v2 signature.
pub(crate) const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Longest header we produce: a v1 TCP6 line is at most 104 bytes, v2 TCP6 is 52.
const MAX_LEN: usize = 108;

/// An encoded header, ready to be written before any client byte.
#[derive(Clone, Copy)]
pub struct Header {
    buf: [u8; MAX_LEN],
    len: usize,
}

impl Header {
    /// Encodes a header saying the connection came from `src` and was addressed to `dst`.
    ///
    /// Mixed families (an IPv4 client reaching an IPv6 LB through a dual-stack socket)
    /// are expressed as TCP6 with the IPv4 side mapped, which the spec allows;
    /// IPv4-mapped IPv6 addresses on both sides are unmapped to TCP4.
    pub fn new(version: ProxyVersion, src: SocketAddr, dst: SocketAddr) -> Header {
        let (src, dst) = normalize(src, dst);
        let mut h = Header {
            buf: [0; MAX_LEN],
            len: 0,
        };
        match version {
            ProxyVersion::V1 => h.len = encode_v1(&mut h.buf, src, dst),
            ProxyVersion::V2 => h.len = encode_v2(&mut h.buf, src, dst),
        }
        h
    }

    /// The header's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Header({:?})",
            self.as_bytes().escape_ascii().to_string()
        )
    }
}

fn normalize(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let unmap = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    };
    let (src, dst) = (unmap(src), unmap(dst));
    let map = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    };
    if src.is_ipv4() == dst.is_ipv4() {
        (src, dst)
    } else {
        (map(src), map(dst))
    }
}

fn encode_v1(buf: &mut [u8; MAX_LEN], src: SocketAddr, dst: SocketAddr) -> usize {
    let proto = if src.is_ipv4() { "TCP4" } else { "TCP6" };
    let mut cur = Cursor::new(&mut buf[..]);
    // The buffer is sized for the longest possible line, so this write cannot fail.
    write!(
        cur,
        "PROXY {proto} {} {} {} {}\r\n",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port()
    )
    .expect("MAX_LEN holds the longest v1 header");
    cur.position() as usize
}

fn encode_v2(buf: &mut [u8; MAX_LEN], src: SocketAddr, dst: SocketAddr) -> usize {
    buf[..12].copy_from_slice(&V2_SIGNATURE);
    buf[12] = 0x21; // version 2, command PROXY
    let mut at = 16;
    let mut put = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    let family = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            put(&s.octets());
            put(&d.octets());
            0x11 // AF_INET, STREAM
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            put(&s.octets());
            put(&d.octets());
            0x21 // AF_INET6, STREAM
        }
        _ => unreachable!("normalize() gives both addresses one family"),
    };
    put(&src.port().to_be_bytes());
    put(&dst.port().to_be_bytes());
    buf[13] = family;
    let addr_len = (at - 16) as u16;
    buf[14..16].copy_from_slice(&addr_len.to_be_bytes());
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn v1_tcp4_matches_the_spec_example_shape() {
        let h = Header::new(
            ProxyVersion::V1,
            sa("192.0.2.10:43210"),
            sa("203.0.113.10:443"),
        );
        assert_eq!(
            h.as_bytes(),
            b"PROXY TCP4 192.0.2.10 203.0.113.10 43210 443\r\n"
        );
    }

    #[test]
    fn v1_tcp6_longest_fits() {
        let long = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:65535";
        let h = Header::new(ProxyVersion::V1, sa(long), sa(long));
        assert!(h.as_bytes().len() <= 107, "spec maximum is 107 bytes");
        assert!(h.as_bytes().starts_with(b"PROXY TCP6 ffff:"));
    }

    #[test]
    fn v2_parses_with_ppp() {
        let (src, dst) = (sa("[2001:db8:1::10]:5555"), sa("[2001:db8:ffff::10]:80"));
        let h = Header::new(ProxyVersion::V2, src, dst);
        let parsed = ppp::v2::Header::try_from(h.as_bytes()).expect("valid v2");
        assert_eq!(parsed.command, ppp::v2::Command::Proxy);
        assert_eq!(parsed.addresses, ppp::v2::Addresses::from((src, dst)));
        assert_eq!(parsed.len(), h.as_bytes().len());
    }

    #[test]
    fn v2_tcp4_parses_with_ppp() {
        let (src, dst) = (sa("192.0.2.10:43210"), sa("203.0.113.10:443"));
        let h = Header::new(ProxyVersion::V2, src, dst);
        assert_eq!(h.as_bytes().len(), 16 + 12);
        let parsed = ppp::v2::Header::try_from(h.as_bytes()).expect("valid v2");
        assert_eq!(parsed.addresses, ppp::v2::Addresses::from((src, dst)));
    }

    #[test]
    fn v1_parses_with_ppp() {
        let (src, dst) = (sa("192.0.2.10:1"), sa("203.0.113.10:65535"));
        let h = Header::new(ProxyVersion::V1, src, dst);
        let text = std::str::from_utf8(h.as_bytes()).expect("ascii");
        let parsed = ppp::v1::Header::try_from(text).expect("valid v1");
        assert_eq!(parsed.addresses, ppp::v1::Addresses::from((src, dst)));
    }

    #[test]
    fn mapped_addresses_are_unmapped_and_mixed_families_mapped() {
        let h = Header::new(
            ProxyVersion::V1,
            sa("[::ffff:192.0.2.10]:1000"),
            sa("203.0.113.10:80"),
        );
        assert_eq!(
            h.as_bytes(),
            b"PROXY TCP4 192.0.2.10 203.0.113.10 1000 80\r\n"
        );
        let h = Header::new(
            ProxyVersion::V1,
            sa("192.0.2.10:1000"),
            sa("[2001:db8::1]:80"),
        );
        assert_eq!(
            h.as_bytes(),
            b"PROXY TCP6 ::ffff:192.0.2.10 2001:db8::1 1000 80\r\n"
        );
    }
}
