//! The PROXY header writer (`proxy_header`, used by both relays) against the `ppp`
//! crate, for any pair of socket addresses and either version.
//!
//! Invariants:
//! - the expected addresses are computed here from the spec, independently of the
//!   writer: IPv4-mapped IPv6 addresses are unmapped; if the families then differ,
//!   the IPv4 side is mapped and the header is TCP6;
//! - v1: ASCII, at most 107 bytes (the spec's maximum), one `\r\n` at the end, and
//!   byte for byte what `ppp` renders for those addresses; `ppp` parses it back;
//! - v2: byte for byte what `ppp`'s builder produces (PROXY command, STREAM), and
//!   `ppp` parses it back to the same addresses over the whole header.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use arbitrary::Arbitrary;
use hairpin_agent::{ProxyVersion, relay::Header};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Addr {
    V4([u8; 4]),
    V6([u8; 16]),
    /// `::ffff:a.b.c.d`, as a dual-stack socket reports an IPv4 peer.
    Mapped([u8; 4]),
}

#[derive(Arbitrary, Debug)]
struct Input {
    v2: bool,
    src: Addr,
    dst: Addr,
    src_port: u16,
    dst_port: u16,
    /// A dual-stack socket's flow label and scope, which the header must ignore.
    flowinfo: u32,
    scope_id: u32,
}

fn socket(addr: &Addr, port: u16, flowinfo: u32, scope_id: u32) -> SocketAddr {
    match addr {
        Addr::V4(o) => SocketAddr::new(IpAddr::V4(Ipv4Addr::from(*o)), port),
        Addr::V6(o) => SocketAddrV6::new(Ipv6Addr::from(*o), port, flowinfo, scope_id).into(),
        Addr::Mapped(o) => SocketAddrV6::new(
            Ipv4Addr::from(*o).to_ipv6_mapped(),
            port,
            flowinfo,
            scope_id,
        )
        .into(),
    }
}

/// What the header must say, from the spec: one family for both ends.
fn expected(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let unmap = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => SocketAddr::new(IpAddr::V6(v6), a.port()),
        },
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
    };
    let (src, dst) = (unmap(src), unmap(dst));
    if src.is_ipv4() == dst.is_ipv4() {
        return (src, dst);
    }
    let map = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    };
    (map(src), map(dst))
}

fuzz_target!(|input: Input| {
    let src = socket(&input.src, input.src_port, input.flowinfo, input.scope_id);
    let dst = socket(&input.dst, input.dst_port, input.flowinfo, input.scope_id);
    let (want_src, want_dst) = expected(src, dst);
    if input.v2 {
        let header = Header::new(ProxyVersion::V2, src, dst);
        let bytes = header.as_bytes();
        let want_addresses = ppp::v2::Addresses::from((want_src, want_dst));
        let built = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            want_addresses,
        )
        .build()
        .expect("ppp builds a header for two socket addresses");
        assert_eq!(bytes, built.as_slice(), "{src} -> {dst}");
        assert_eq!(bytes.len(), if want_src.is_ipv4() { 28 } else { 52 });
        let parsed = ppp::v2::Header::try_from(bytes).expect("ppp parses our v2 header");
        assert_eq!(parsed.command, ppp::v2::Command::Proxy);
        assert_eq!(parsed.protocol, ppp::v2::Protocol::Stream);
        assert_eq!(parsed.addresses, want_addresses);
        assert_eq!(parsed.len(), bytes.len());
    } else {
        let header = Header::new(ProxyVersion::V1, src, dst);
        let bytes = header.as_bytes();
        assert!(bytes.is_ascii() && bytes.len() <= 107, "{bytes:?}");
        assert!(bytes.ends_with(b"\r\n"));
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
        let want_addresses = ppp::v1::Addresses::from((want_src, want_dst));
        assert_eq!(
            bytes,
            want_addresses.to_string().as_bytes(),
            "{src} -> {dst}"
        );
        let text = std::str::from_utf8(bytes).expect("ASCII");
        let parsed = ppp::v1::Header::try_from(text).expect("ppp parses our v1 header");
        assert_eq!(parsed.addresses, want_addresses);
        assert_eq!(parsed.header.len(), bytes.len());
    }
});
