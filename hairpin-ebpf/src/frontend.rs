//! The frontend map's key and value ([`FrontendKey`] -> [`Redirect`]): which
//! LoadBalancer address and port a connect is aimed at, the relay listener it goes to
//! and whether the kernel writes the header instead; addresses encoded as the
//! kernel hands them to the connect programs in `bpf_sock_addr`.

use core::net::{IpAddr, SocketAddr};

/// `AF_INET`, as the kernel spells it in `bpf_sock_addr.user_family`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;
/// Capacity of [`MAP_FRONTENDS`](crate::MAP_FRONTENDS): the number of (LB IP, port) pairs one node can proxy.
pub const MAX_FRONTENDS: u32 = 65_536;
/// [`Redirect::header`] of a frontend taking the relay path: connects are rewritten
/// to the relay listener, which writes the header.
pub const HEADER_RELAY: u8 = 0;
/// [`Redirect::header`] of a frontend taking the kernel path with a PROXY v1 header.
pub const HEADER_V1: u8 = 1;
/// [`Redirect::header`] of a frontend taking the kernel path with a PROXY v2 header.
pub const HEADER_V2: u8 = 2;
/// [`Redirect::header`] of a frontend taking the relay path although the kernel path
/// is on, because its server speaks first: the programs treat it as
/// [`HEADER_RELAY`] (every value but [`HEADER_V1`] and [`HEADER_V2`] is the relay);
/// `dump` reads it to say why.
pub const HEADER_RELAY_SERVER_FIRST: u8 = 0x80;
/// [`Redirect::header`] of a frontend taking the relay path although the kernel path
/// is on, because its Service (`hairpin.dev/path: relay`) or frontends-file entry
/// (`path: relay`) asks for it, for a client that hits one of the kernel path's
/// known misses: the programs treat it as [`HEADER_RELAY`]; `dump` reads it to say why.
pub const HEADER_RELAY_CHOSEN: u8 = 0x81;

/// Key of [`MAP_FRONTENDS`](crate::MAP_FRONTENDS): one proxied frontend, a LoadBalancer IP and TCP port.
///
/// The address words and the port are kept in network byte order, exactly as the
/// kernel hands them to the program in `bpf_sock_addr`, so the connect path does
/// no conversions. An IPv4 address occupies `addr[0]`; the other words are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrontendKey {
    /// Address words in network byte order.
    pub addr: [u32; 4],
    /// TCP port in network byte order.
    pub port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u8,
    /// Always zero; makes the padding explicit so keys hash identically on both sides.
    pub pad: u8,
}

/// Value of [`MAP_FRONTENDS`](crate::MAP_FRONTENDS): the node-local relay listener a connect is rewritten
/// to, and whether the kernel writes the header instead.
///
/// Same encoding as [`FrontendKey`]. The family may differ from the key's only for
/// IPv4-mapped IPv6 connects, which are rewritten to the IPv4-mapped listener.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Redirect {
    /// Listener address words in network byte order.
    pub addr: [u32; 4],
    /// Listener TCP port in network byte order.
    pub port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u8,
    /// [`HEADER_RELAY`] (the listener writes the header), or [`HEADER_V1`] /
    /// [`HEADER_V2`]: the kernel path's connect programs leave the destination alone
    /// and the header is written on the client's own socket. The listener stays the
    /// fallback for a socket the kernel path cannot take. The plain connect programs
    /// ignore this byte.
    pub header: u8,
}

/// An address as the programs see it in `bpf_sock_addr`: address words and port in
/// network byte order, and the family. An IPv4 address occupies word 0.
fn encode(a: SocketAddr) -> ([u32; 4], u16, u8) {
    let port = a.port().to_be();
    match a.ip() {
        IpAddr::V4(ip) => ([u32::from_ne_bytes(ip.octets()), 0, 0, 0], port, AF_INET),
        IpAddr::V6(ip) => {
            let o = ip.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], port, AF_INET6)
        }
    }
}

/// The inverse of [`encode`](crate::encode).
fn decode(addr: [u32; 4], port: u16, family: u8) -> SocketAddr {
    let port = u16::from_be(port);
    if family == AF_INET {
        SocketAddr::from((addr[0].to_ne_bytes(), port))
    } else {
        let mut o = [0u8; 16];
        for (i, w) in addr.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        SocketAddr::from((o, port))
    }
}

impl FrontendKey {
    /// The key for the frontend `a` (LoadBalancer IP and TCP port).
    pub fn new(a: SocketAddr) -> FrontendKey {
        let (addr, port, family) = encode(a);
        FrontendKey {
            addr,
            port,
            family,
            pad: 0,
        }
    }

    /// The frontend this key names.
    pub fn socket_addr(&self) -> SocketAddr {
        decode(self.addr, self.port, self.family)
    }
}

impl Redirect {
    /// The value that rewrites a connect to the listener `a`.
    pub fn new(a: SocketAddr) -> Redirect {
        let (addr, port, family) = encode(a);
        Redirect {
            addr,
            port,
            family,
            header: HEADER_RELAY,
        }
    }

    /// The value for a kernel-path frontend: the kernel writes a `header`
    /// ([`HEADER_V1`] or [`HEADER_V2`]) on the client's socket; a socket the kernel
    /// path cannot take is still rewritten to the listener `a`.
    pub fn kernel(a: SocketAddr, header: u8) -> Redirect {
        Redirect {
            header,
            ..Redirect::new(a)
        }
    }

    /// The value for a frontend whose server speaks first, with the kernel path on:
    /// the relay path, saying why.
    pub fn server_first(a: SocketAddr) -> Redirect {
        Redirect {
            header: HEADER_RELAY_SERVER_FIRST,
            ..Redirect::new(a)
        }
    }

    /// The value for a frontend that asks for the relay (`hairpin.dev/path:
    /// relay`), with the kernel path on: the relay path, saying why.
    pub fn relay_chosen(a: SocketAddr) -> Redirect {
        Redirect {
            header: HEADER_RELAY_CHOSEN,
            ..Redirect::new(a)
        }
    }

    /// The listener this value rewrites to.
    pub fn socket_addr(&self) -> SocketAddr {
        decode(self.addr, self.port, self.family)
    }

    /// Whether the kernel path's connect programs mark sockets for this frontend
    /// (an in-kernel header) rather than rewrite them to the listener. Any value
    /// but the two versions is the relay: when in doubt, relay.
    pub const fn is_kernel(&self) -> bool {
        self.header == HEADER_V1 || self.header == HEADER_V2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layouts_match_the_kernel_side() {
        assert_eq!(size_of::<FrontendKey>(), 20);
        assert_eq!(align_of::<FrontendKey>(), 4);
        assert_eq!(size_of::<Redirect>(), 20);
        assert_eq!(align_of::<Redirect>(), 4);
    }

    #[test]
    fn a_kernel_value_keeps_its_listener_for_the_fallback() {
        let l: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        let v = Redirect::kernel(l, HEADER_V2);
        assert_eq!(v.socket_addr(), l);
        assert_eq!(v.header, HEADER_V2);
        assert_eq!(Redirect::new(l).header, HEADER_RELAY);
        assert!(v.is_kernel() && Redirect::kernel(l, HEADER_V1).is_kernel());
        let s = Redirect::server_first(l);
        assert_eq!(s.socket_addr(), l);
        assert!(!s.is_kernel() && !Redirect::new(l).is_kernel());
        let c = Redirect::relay_chosen(l);
        assert_eq!((c.socket_addr(), c.header), (l, HEADER_RELAY_CHOSEN));
        assert!(!c.is_kernel());
        assert!(!Redirect::kernel(l, 7).is_kernel());
    }

    #[test]
    fn encoding_round_trips_both_families() {
        for a in [
            "203.0.113.10:443",
            "[2001:db8::10]:80",
            "[::ffff:192.0.2.1]:1",
        ] {
            let a: SocketAddr = a.parse().expect("addr");
            assert_eq!(FrontendKey::new(a).socket_addr(), a);
            assert_eq!(Redirect::new(a).socket_addr(), a);
        }
    }

    #[test]
    fn encoding_is_network_byte_order_like_bpf_sock_addr() {
        let k = FrontendKey::new("203.0.113.10:80".parse().expect("addr"));
        // The kernel's user_ip4 is the address bytes as they sit in memory.
        assert_eq!(k.addr[0].to_ne_bytes(), [203, 0, 113, 10]);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
        assert_eq!(k.family, AF_INET);
        assert_eq!(k.pad, 0);
    }
}
