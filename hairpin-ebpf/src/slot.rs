//! The relay's slots: where the connect programs send a connect that the relay
//! serves, and how the relay learns which frontend it was for.
//!
//! A slot is a port of one of the relay's slot addresses (the listen addresses, fixed
//! in the object's read-only data at load: [`GLOBAL_SLOT_ADDRS4`](crate::GLOBAL_SLOT_ADDRS4),
//! [`GLOBAL_SLOT_ADDRS6`](crate::GLOBAL_SLOT_ADDRS6)). No socket binds it, so a slot
//! never takes a port from the node: the `hairpin_sk_lookup` program, attached to the
//! agent's network namespace, hands a connection aimed at a slot to the relay listener
//! the slot names, a handful of listeners in all (one per family, one per names
//! port), each on a privileged port. The accepted socket's own address is the slot,
//! and [`MAP_SLOTS`](crate::MAP_SLOTS) says whose it is. A connection's destination
//! keeps naming its frontend all the way, also when a mesh proxy in the pod takes the
//! connection and dials its original destination again from a socket of its own.
//!
//! A slot stays bound to its frontend while the frontend is live and for
//! [`SLOT_QUARANTINE_NS`] after it retires, in a pinned map that the next agent
//! adopts: a slot is never handed to another frontend while a connect aimed at it
//! may still arrive, across restarts included.

use core::net::SocketAddr;

use crate::{FrontendKey, frontend::encode};

/// How many slot addresses each family may have.
pub const SLOT_ADDRS: usize = 4;
/// The lowest slot port. The privileged ports below are where the agent's own
/// listeners live (the relay's, the name relay's): a slot never hides one of them.
pub const SLOT_PORT_MIN: u16 = 1024;
/// Slots per slot address: every port from [`SLOT_PORT_MIN`] up.
pub const SLOTS_PER_ADDR: u32 = 65_536 - SLOT_PORT_MIN as u32;
/// Capacity of [`MAP_RELAYS`](crate::MAP_RELAYS): the relay listeners a slot can name.
pub const RELAY_LISTENERS: u32 = 16;
/// [`MAP_RELAYS`](crate::MAP_RELAYS) index of the relay's IPv4 listener.
pub const LISTENER_RELAY4: u8 = 0;
/// [`MAP_RELAYS`](crate::MAP_RELAYS) index of the relay's IPv6 listener.
pub const LISTENER_RELAY6: u8 = 1;
/// [`MAP_RELAYS`](crate::MAP_RELAYS) index of the name relay's first redirected
/// listener; each names port has its own, after it.
pub const LISTENER_NAMES_FIRST: u8 = 2;
/// How long a retired slot stays bound to its frontend before another may take it:
/// longer than a connect's SYN retries (1 + 2 + ... + 64 s at the kernel's default
/// six), so a connect rewritten just before its frontend retired still reaches the
/// frontend it was aimed at.
pub const SLOT_QUARANTINE_NS: u64 = 180 * 1_000_000_000;

/// A slot as user space names it: which slot address of the family, the port (host
/// byte order), and the relay listener it is handed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotRef {
    /// Index of the slot address (below [`SLOT_ADDRS`]).
    pub addr: u8,
    /// The port, host byte order.
    pub port: u16,
    /// The [`MAP_RELAYS`](crate::MAP_RELAYS) index of its listener.
    pub listener: u8,
}

impl SlotRef {
    /// No slot: the value of a kernel-path frontend that went live while no slot could
    /// be had (every slot taken, its namespace at its cap). Its index names no slot
    /// address, so the programs never rewrite a connect to it: a socket the kernel
    /// path cannot take goes as before hairpin (counted `relay_unverified`) until the
    /// agent binds a slot and writes it in.
    pub const NONE: SlotRef = SlotRef {
        addr: u8::MAX,
        port: 0,
        listener: u8::MAX,
    };

    /// Whether this is [`SlotRef::NONE`].
    pub const fn is_none(&self) -> bool {
        self.addr == u8::MAX
    }
}

/// `#ADDRESS:PORT`: the slot address's index among the family's (which the
/// loader fixed in the object: `/status` lists them) and the port, as `dump`, which
/// reads only the maps, can name a slot.
impl core::fmt::Display for SlotRef {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_none() {
            return f.write_str("none");
        }
        write!(f, "#{}:{}", self.addr, self.port)
    }
}

/// Key of [`MAP_SLOTS`](crate::MAP_SLOTS): a slot as the programs see it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// The slot's port, network byte order.
    pub port: u16,
    /// Index of the slot address.
    pub addr: u8,
    /// [`AF_INET`](crate::AF_INET) or [`AF_INET6`](crate::AF_INET6).
    pub family: u8,
}

/// Value of [`MAP_SLOTS`](crate::MAP_SLOTS): whose a slot is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The frontend the slot serves: connections to the slot are relayed to it.
    pub frontend: FrontendKey,
    /// The [`MAP_RELAYS`](crate::MAP_RELAYS) index of the listener it is handed to.
    pub listener: u8,
    /// The PROXY version the relay writes (1 or 2).
    pub version: u8,
    /// Nonzero once the frontend retired: connections still reaching the slot are
    /// relayed to it, no connect is rewritten to it any more.
    pub retired: u8,
    /// Always zero.
    pub pad: u8,
    /// `CLOCK_MONOTONIC` nanoseconds when it retired (0: live); freed
    /// [`SLOT_QUARANTINE_NS`] later.
    pub retired_at: u64,
}

impl SlotKey {
    /// The key of `slot` in `family`.
    pub fn new(family: u8, slot: SlotRef) -> SlotKey {
        SlotKey {
            port: slot.port.to_be(),
            addr: slot.addr,
            family,
        }
    }
}

impl Slot {
    /// A live slot serving `frontend` through `listener`, writing `version` headers.
    pub fn live(frontend: SocketAddr, listener: u8, version: u8) -> Slot {
        Slot {
            frontend: FrontendKey::new(frontend),
            listener,
            version,
            retired: 0,
            pad: 0,
            retired_at: 0,
        }
    }

    /// The frontend it serves.
    pub fn frontend(&self) -> SocketAddr {
        self.frontend.socket_addr()
    }
}

/// Slot addresses as the loader writes them into the object: IPv4 words in network
/// byte order (0: no address at that index).
pub fn slot_addrs4(addrs: &[core::net::Ipv4Addr]) -> [u32; SLOT_ADDRS] {
    let mut out = [0; SLOT_ADDRS];
    for (o, a) in out.iter_mut().zip(addrs) {
        *o = u32::from_ne_bytes(a.octets());
    }
    out
}

/// As [`slot_addrs4`] for IPv6: address words in network byte order (all 0: none).
pub fn slot_addrs6(addrs: &[core::net::Ipv6Addr]) -> [[u32; 4]; SLOT_ADDRS] {
    let mut out = [[0; 4]; SLOT_ADDRS];
    for (o, a) in out.iter_mut().zip(addrs) {
        *o = encode(SocketAddr::new((*a).into(), 0)).0;
    }
    out
}

// The quarantine outlasts a connect's SYN retries (tcp_syn_retries 6: 1 + 2 + 4 + 8
// + 16 + 32 + 64 s before it gives up), checked when the crate builds.
const _: () = assert!(SLOT_QUARANTINE_NS > 127 * 1_000_000_000);
const _: () = assert!(SLOTS_PER_ADDR == 64_512);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layouts_match_the_kernel_side() {
        assert_eq!(size_of::<SlotKey>(), 4);
        assert_eq!(size_of::<Slot>(), 32);
        assert_eq!(align_of::<Slot>(), 8);
        assert_eq!(core::mem::offset_of!(Slot, retired_at), 24);
    }

    #[test]
    fn slot_addresses_are_encoded_as_the_context_holds_them() {
        let v4 = slot_addrs4(&["169.254.104.1".parse().expect("ip")]);
        assert_eq!(v4[0].to_ne_bytes(), [169, 254, 104, 1]);
        assert_eq!(v4[1..], [0; SLOT_ADDRS - 1]);
        let v6 = slot_addrs6(&["fd68::2".parse().expect("ip")]);
        assert_eq!(v6[0][0].to_ne_bytes(), [0xfd, 0x68, 0, 0]);
        assert_eq!(v6[0][3].to_ne_bytes(), [0, 0, 0, 2]);
        assert_eq!(v6[1], [0; 4]);
        let k = SlotKey::new(
            crate::AF_INET,
            SlotRef {
                addr: 1,
                port: 1024,
                listener: 0,
            },
        );
        assert_eq!(k.port.to_ne_bytes(), [4, 0]);
    }
}
