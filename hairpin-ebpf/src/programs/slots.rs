//! The relay's slots, as the connect programs and `hairpin_sk_lookup` check them
//! (see `hairpin_ebpf::slot`): a slot address is one fixed in this object's
//! read-only data at load; a slot is a frontend's only while `HAIRPIN_SLOTS` says
//! so; a listener is the agent's only while it carries the bypass mark (set with
//! CAP_NET_ADMIN) on a privileged port (bound with CAP_NET_BIND_SERVICE).
//!
//! The sk_lookup program: a connection aimed at a slot (a port no socket binds, on a
//! slot address) is handed to the relay listener the slot names. Anything else goes
//! to the kernel's own lookup, untouched.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::{bpf_sk_lookup, bpf_sock},
    helpers::{bpf_map_lookup_elem, bpf_sk_assign, bpf_sk_release},
    macros::sk_lookup,
    programs::SkLookupContext,
};
use hairpin_ebpf::{AF_INET, AF_INET6, Counter, FrontendKey, Redirect, SLOT_PORT_MIN};

use super::{
    helpers::{count, slot_key},
    maps::{
        HAIRPIN_BYPASS_MARK, HAIRPIN_SLOT_ADDRS4, HAIRPIN_SLOT_ADDRS6, HAIRPIN_SLOTS, relays_map,
    },
};

const IPPROTO_TCP: u32 = 6;
/// sk_lookup's verdict that lets the lookup go on (with the socket assigned, if any).
const SK_PASS: u32 = 1;

/// Where a connect to `key` whose entry is `to` may be rewritten: the slot's address
/// (IPv4 in word 0), when the slot address is one of this object's, the slot names
/// this very frontend and is live, and its listener is the agent's and listening.
/// Anything else is counted and left alone: the connect goes as before hairpin.
#[inline(always)]
pub(super) fn slot_target(key: &FrontendKey, to: &Redirect) -> Option<[u32; 4]> {
    let Some(addr) = slot_address(key.family, to.slot_addr) else {
        // An index past the addresses this agent loaded: not a slot of this object.
        count(Counter::RelayUnverified);
        return None;
    };
    let slot = slot_key(to.slot_port, to.slot_addr, key.family);
    // SAFETY: a hash lookup returns a pointer valid for this program run, or None.
    let owner = unsafe { HAIRPIN_SLOTS.get(slot.slot()) };
    let own = owner.is_some_and(|s| {
        s.retired == 0
            && s.listener == to.listener
            && s.frontend.addr == key.addr
            && s.frontend.port == key.port
            && s.frontend.family == key.family
    });
    if !own {
        // The slot serves another frontend (or none, or retired): never a target.
        count(Counter::RelayUnverified);
        return None;
    }
    match listener(to.listener) {
        Listener::Ours => Some(addr),
        Listener::Absent => {
            // No relay listens there (no agent, or its relay is down): as before hairpin.
            count(Counter::RelayDown);
            None
        }
        Listener::Foreign => {
            count(Counter::RelayUnverified);
            None
        }
    }
}

/// What sits at an index of the relays' listener map.
enum Listener {
    /// A listener of this agent: the bypass mark, a privileged port.
    Ours,
    /// Nothing: no relay listens (no agent, or its relay is down).
    Absent,
    /// A socket that is not the agent's.
    Foreign,
}

/// What is at index `index` of `HAIRPIN_RELAYS`. The lookup takes a reference on
/// the socket, released at once.
#[inline(always)]
fn listener(index: u8) -> Listener {
    let index = u32::from(index);
    // SAFETY: a sockmap lookup returns a referenced socket or null; a non-null one
    // is read (plain bpf_sock fields) and released before the program returns, as
    // the verifier requires.
    unsafe {
        let sk = bpf_map_lookup_elem(relays_map(), (&raw const index).cast()).cast::<bpf_sock>();
        if sk.is_null() {
            return Listener::Absent;
        }
        let ours = is_ours(sk);
        bpf_sk_release(sk.cast());
        if ours {
            Listener::Ours
        } else {
            Listener::Foreign
        }
    }
}

/// Whether `sk` (a referenced socket from the listener map) is one of the agent's
/// listeners: the bypass mark, which only CAP_NET_ADMIN sets, on a privileged port.
///
/// # Safety
/// `sk` is a non-null socket the caller holds a reference on.
#[inline(always)]
unsafe fn is_ours(sk: *mut bpf_sock) -> bool {
    // SAFETY: the caller's socket; plain field reads.
    let (mark, port) = unsafe { ((*sk).mark, (*sk).src_port) };
    // SAFETY: a read-only global the loader may have rewritten before load.
    let bypass = unsafe { read_volatile(&HAIRPIN_BYPASS_MARK) };
    mark == bypass && port != 0 && port < u32::from(SLOT_PORT_MIN)
}

/// Slot address `index` of `family` as the context holds addresses (IPv4 in word
/// 0), when this object was loaded with one there. Constant offsets only: a
/// variable offset into a map value makes the verifier compare every later scalar
/// exactly without CAP_PERFMON.
#[inline(always)]
fn slot_address(family: u8, index: u8) -> Option<[u32; 4]> {
    // SAFETY: read-only globals the loader wrote before load.
    unsafe {
        if family == AF_INET {
            let a = match index {
                0 => read_volatile(&HAIRPIN_SLOT_ADDRS4[0]),
                1 => read_volatile(&HAIRPIN_SLOT_ADDRS4[1]),
                2 => read_volatile(&HAIRPIN_SLOT_ADDRS4[2]),
                3 => read_volatile(&HAIRPIN_SLOT_ADDRS4[3]),
                _ => 0,
            };
            (a != 0).then_some([a, 0, 0, 0])
        } else if family == AF_INET6 {
            let a = match index {
                0 => read6(0),
                1 => read6(1),
                2 => read6(2),
                3 => read6(3),
                _ => [0; 4],
            };
            (a != [0; 4]).then_some(a)
        } else {
            None
        }
    }
}

/// IPv6 slot address `I`, one volatile 32-bit load per word.
#[inline(always)]
fn read6(i: usize) -> [u32; 4] {
    // SAFETY: a read-only global; `i` is a constant at every call.
    unsafe {
        [
            read_volatile(&HAIRPIN_SLOT_ADDRS6[i][0]),
            read_volatile(&HAIRPIN_SLOT_ADDRS6[i][1]),
            read_volatile(&HAIRPIN_SLOT_ADDRS6[i][2]),
            read_volatile(&HAIRPIN_SLOT_ADDRS6[i][3]),
        ]
    }
}

/// Which slot address of `family` `addr` is (IPv4 in word 0).
#[inline(always)]
fn slot_index(family: u8, addr: &[u32; 4]) -> Option<u8> {
    for i in 0..4u8 {
        if let Some(a) = slot_address(family, i)
            && a == *addr
        {
            return Some(i);
        }
    }
    None
}

/// Hands a TCP connection aimed at a slot to the listener the slot names, while
/// that listener is the agent's. A retired slot is still handed on: a connect
/// rewritten just before its frontend retired is relayed to that frontend. Every
/// other packet's lookup goes on untouched (a slot no one holds is refused by the
/// kernel as a port nothing listens on).
#[sk_lookup]
pub fn hairpin_sk_lookup(ctx: SkLookupContext) -> u32 {
    // SAFETY: the kernel hands every sk_lookup program a valid context.
    let c = unsafe { &*ctx.lookup };
    if c.protocol != IPPROTO_TCP {
        return SK_PASS;
    }
    let Some((family, addr)) = local_address(c) else {
        return SK_PASS;
    };
    let Some(index) = slot_index(family, &addr) else {
        // Not a slot address (nearly every packet): the kernel's own lookup.
        return SK_PASS;
    };
    // `local_port` is in host byte order here, unlike the connect hooks' ports.
    let port = c.local_port as u16;
    if port < SLOT_PORT_MIN {
        return SK_PASS;
    }
    let slot = slot_key(port.to_be(), index, family);
    // SAFETY: a hash lookup returns a pointer valid for this program run, or None.
    let Some(owner) = (unsafe { HAIRPIN_SLOTS.get(slot.slot()) }) else {
        return SK_PASS;
    };
    let index = u32::from(owner.listener);
    // SAFETY: as in `listener`: a referenced socket or null, released below.
    unsafe {
        let sk = bpf_map_lookup_elem(relays_map(), (&raw const index).cast()).cast::<bpf_sock>();
        if sk.is_null() {
            return SK_PASS;
        }
        if is_ours(sk) {
            // A failure (the listener closing) leaves the lookup to the kernel.
            let _ = bpf_sk_assign(ctx.lookup.cast(), sk.cast(), 0);
        }
        bpf_sk_release(sk.cast());
    }
    SK_PASS
}

/// The packet's local (destination) address as the connect hooks hold it.
#[inline(always)]
fn local_address(c: &bpf_sk_lookup) -> Option<(u8, [u32; 4])> {
    // SAFETY: plain context reads, one 32-bit load each.
    unsafe {
        match read_volatile(&c.family) {
            2 => Some((AF_INET, [read_volatile(&c.local_ip4), 0, 0, 0])),
            10 => Some((
                AF_INET6,
                [
                    read_volatile(&c.local_ip6[0]),
                    read_volatile(&c.local_ip6[1]),
                    read_volatile(&c.local_ip6[2]),
                    read_volatile(&c.local_ip6[3]),
                ],
            )),
            _ => None,
        }
    }
}
