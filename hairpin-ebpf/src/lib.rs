//! Types and names shared by hairpin's kernel programs and the agent.
//!
//! Everything here is `#[repr(C)]` and laid out identically on both sides of the
//! BPF map boundary; the sizes are asserted in the tests below so a change on
//! one side cannot silently misread the other.
#![no_std]

use core::net::{IpAddr, SocketAddr};

/// ELF name of the cgroup/connect4 program.
pub const PROG_CONNECT4: &str = "hairpin_connect4";
/// ELF name of the cgroup/connect6 program.
pub const PROG_CONNECT6: &str = "hairpin_connect6";
/// ELF name of the frontend map: [`FrontendKey`] -> [`Redirect`].
pub const MAP_FRONTENDS: &str = "HAIRPIN_FRONTENDS";
/// ELF name of the per-CPU counter array, indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "HAIRPIN_COUNTERS";
/// ELF name of the global holding the bypass mark, set by the loader.
pub const GLOBAL_BYPASS_MARK: &str = "HAIRPIN_BYPASS_MARK";

/// Default SO_MARK the relay puts on its upstream sockets so the programs skip them.
///
/// Chosen outside the bits the field already claims on packet marks: kube-proxy's
/// 0x4000 (masquerade) and 0x8000 (drop), Cilium's 0x0F00 magic nibble and
/// Calico's default 0xffff0000 mask.
pub const DEFAULT_BYPASS_MARK: u32 = 0x68;

/// Capacity of [`MAP_FRONTENDS`]: the number of (LB IP, port) pairs one node can proxy.
pub const MAX_FRONTENDS: u32 = 65_536;

/// `AF_INET`, as the kernel spells it in `bpf_sock_addr.user_family`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;

/// Key of [`MAP_FRONTENDS`]: one proxied frontend, a LoadBalancer IP and TCP port.
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

/// Value of [`MAP_FRONTENDS`]: the node-local relay listener a connect is rewritten to.
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
    /// Always zero.
    pub pad: u8,
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

/// The inverse of [`encode`].
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
            pad: 0,
        }
    }

    /// The listener this value rewrites to.
    pub fn socket_addr(&self) -> SocketAddr {
        decode(self.addr, self.port, self.family)
    }
}

/// Indices into [`MAP_COUNTERS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Connects rewritten to a relay listener.
    Redirected = 0,
    /// Connects to a proxied frontend left alone because the socket carries the bypass mark
    /// (the relay's own upstream connections).
    SkippedBypassMark = 1,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 2] = [Counter::Redirected, Counter::SkippedBypassMark];
    /// Length of [`MAP_COUNTERS`].
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// Stable snake_case name, for `status`, `dump` and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Redirected => "redirected",
            Counter::SkippedBypassMark => "skipped_bypass_mark",
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, #[repr(C)], every bit pattern valid, explicit padding.
    unsafe impl aya::Pod for super::FrontendKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Redirect {}
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

    #[test]
    fn counter_indices_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as u32, i as u32, "{}", c.name());
        }
    }
}
