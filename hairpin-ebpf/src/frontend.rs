//! The frontend map's key and value ([`FrontendKey`] -> [`Redirect`]): which
//! LoadBalancer address and port a connect is aimed at, the relay slot it goes to
//! and whether the kernel writes the header instead; addresses encoded as the
//! kernel hands them to the connect programs in `bpf_sock_addr`.

use core::net::{IpAddr, SocketAddr};

use crate::SlotRef;

/// `AF_INET`, as the kernel spells it in `bpf_sock_addr.user_family`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;
/// Default capacity of [`MAP_FRONTENDS`](crate::MAP_FRONTENDS): the number of (LB
/// IP, port) pairs one node can proxy (`--max-frontends`).
pub const MAX_FRONTENDS: u32 = 131_072;
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

/// Value of [`MAP_FRONTENDS`](crate::MAP_FRONTENDS): the relay slot a connect to
/// the frontend is rewritten to, and whether the kernel writes the header instead.
///
/// A slot is a port of one of the relay's slot addresses (fixed in the object's
/// read-only data, [`GLOBAL_SLOT_ADDRS4`](crate::GLOBAL_SLOT_ADDRS4)); nothing binds
/// it. The `hairpin_sk_lookup` program hands a connection to a slot to the relay
/// listener the slot names ([`Slot`](crate::Slot)), so the connection's own
/// destination names its frontend, as a listener per frontend did, without a port
/// of the node's held per frontend. The connect programs rewrite to a slot only
/// when [`MAP_SLOTS`](crate::MAP_SLOTS) says it is this very frontend's.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Redirect {
    /// The slot's port, network byte order.
    pub slot_port: u16,
    /// Which of the family's slot addresses the slot is on (below
    /// [`SLOT_ADDRS`](crate::SLOT_ADDRS)).
    pub slot_addr: u8,
    /// The relay listener the slot is handed to: an index of
    /// [`MAP_RELAYS`](crate::MAP_RELAYS).
    pub listener: u8,
    /// [`HEADER_RELAY`] (the relay writes the header), or [`HEADER_V1`] /
    /// [`HEADER_V2`]: the kernel path's connect programs leave the destination alone
    /// and the header is written on the client's own socket. The slot stays the
    /// fallback for a socket the kernel path cannot take. The plain connect programs
    /// ignore this byte.
    pub header: u8,
    /// The PROXY version the relay writes for this frontend (1 or 2; also the
    /// kernel path's fallback), for `dump`; the relay reads it from the slot.
    pub version: u8,
    /// Always zero.
    pub pad: [u8; 2],
}

/// An address as the programs see it in `bpf_sock_addr`: address words and port in
/// network byte order, and the family. An IPv4 address occupies word 0.
pub(crate) fn encode(a: SocketAddr) -> ([u32; 4], u16, u8) {
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
pub(crate) fn decode(addr: [u32; 4], port: u16, family: u8) -> SocketAddr {
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
    /// The value that rewrites a connect to `slot` (the relay writes a `version`
    /// header).
    pub fn new(slot: SlotRef, version: u8) -> Redirect {
        Redirect {
            slot_port: slot.port.to_be(),
            slot_addr: slot.addr,
            listener: slot.listener,
            header: HEADER_RELAY,
            version,
            pad: [0; 2],
        }
    }

    /// The value for a kernel-path frontend: the kernel writes a `header`
    /// ([`HEADER_V1`] or [`HEADER_V2`], the version's number) on the client's
    /// socket; a socket the kernel path cannot take is still rewritten to `slot`.
    pub fn kernel(slot: SlotRef, header: u8) -> Redirect {
        Redirect {
            header,
            ..Redirect::new(slot, header)
        }
    }

    /// The value for a frontend whose server speaks first, with the kernel path on:
    /// the relay path, saying why.
    pub fn server_first(slot: SlotRef, version: u8) -> Redirect {
        Redirect {
            header: HEADER_RELAY_SERVER_FIRST,
            ..Redirect::new(slot, version)
        }
    }

    /// The value for a frontend that asks for the relay (`hairpin.dev/path:
    /// relay`), with the kernel path on: the relay path, saying why.
    pub fn relay_chosen(slot: SlotRef, version: u8) -> Redirect {
        Redirect {
            header: HEADER_RELAY_CHOSEN,
            ..Redirect::new(slot, version)
        }
    }

    /// The slot this value rewrites to.
    pub fn slot(&self) -> SlotRef {
        SlotRef {
            addr: self.slot_addr,
            port: u16::from_be(self.slot_port),
            listener: self.listener,
        }
    }

    /// Whether the kernel path's connect programs mark sockets for this frontend
    /// (an in-kernel header) rather than rewrite them to the slot. Any value
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
        assert_eq!(size_of::<Redirect>(), 8);
        assert_eq!(align_of::<Redirect>(), 2);
    }

    #[test]
    fn a_kernel_value_keeps_its_slot_for_the_fallback() {
        let slot = SlotRef {
            addr: 1,
            port: 40000,
            listener: 0,
        };
        let v = Redirect::kernel(slot, HEADER_V2);
        assert_eq!(v.slot(), slot);
        assert_eq!(v.slot_port.to_ne_bytes(), 40000u16.to_be_bytes());
        assert_eq!((v.header, v.version), (HEADER_V2, 2));
        assert_eq!(Redirect::new(slot, 1).header, HEADER_RELAY);
        assert!(v.is_kernel() && Redirect::kernel(slot, HEADER_V1).is_kernel());
        let s = Redirect::server_first(slot, 2);
        assert_eq!((s.slot(), s.version), (slot, 2));
        assert!(!s.is_kernel() && !Redirect::new(slot, 1).is_kernel());
        let c = Redirect::relay_chosen(slot, 1);
        assert_eq!((c.slot(), c.header), (slot, HEADER_RELAY_CHOSEN));
        assert!(!c.is_kernel());
        assert!(!Redirect::kernel(slot, 7).is_kernel());
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
