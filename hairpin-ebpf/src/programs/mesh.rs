//! The mesh check of the kernel path's connect programs: whether a mesh proxy
//! listens for the connects it captures in the client's network namespace (see
//! [`mesh_listens`]), and what sock_ops tells them of a new listener.
//!
//! The probes (up to four `bpf_sk_lookup_tcp`, each an established-table and a
//! listener lookup) are most of what the check costs, and nearly every namespace
//! has no capture listener. So where the loader turned [`HAIRPIN_MESH_CACHE`] on,
//! a namespace whose probes found none is remembered in [`HAIRPIN_MESH_NS`], and its
//! later connects skip them. A listener that appears later makes it stale: sock_ops
//! runs at every listen(2) (`BPF_SOCK_OPS_TCP_LISTEN_CB`, whatever the socket's
//! callback flags) after the socket is in the listening hash, and for a capture
//! port it writes "listens" over the namespace's entries, which the connect
//! programs never write over (they add "none" only where no entry is). The two
//! writes meet under the map bucket's lock, so whichever order a probe, the
//! listener's hashing and the two writes take, a "none" written from a probe that
//! missed the listener is overwritten or never written: no ordering of plain loads
//! is relied on. A namespace that was found listening is probed on every connect,
//! as before (its connects take the relay, which costs far more than the probes).

use core::{
    mem::MaybeUninit,
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::{
        BPF_ANY, BPF_F_CURRENT_NETNS, BPF_NOEXIST, bpf_sock_addr, bpf_sock_ops, bpf_sock_tuple,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2,
    },
    helpers::{bpf_get_netns_cookie, bpf_sk_lookup_tcp, bpf_sk_release},
};
use hairpin_ebpf::{
    AF_INET, Counter, MESH_NETNS_LISTENS, MESH_NETNS_NONE, MESH_PORTS, mesh_netns_key,
};

use super::{
    helpers::count,
    maps::{HAIRPIN_MESH_CACHE, HAIRPIN_MESH_NS, HAIRPIN_MESH_PORTS},
};

/// 127.0.0.1 in network byte order, as a `bpf_sock_tuple` holds it.
const LOOPBACK4: u32 = u32::from_ne_bytes([127, 0, 0, 1]);
/// The last word of ::1 in network byte order.
const LOOPBACK6_LAST: u32 = u32::from_ne_bytes([0, 0, 0, 1]);

/// Whether a mesh proxy listens for the connects it captures in the client's own
/// network namespace: a TCP listener on loopback (where iptables' REDIRECT sends a
/// pod's own connects: 127.0.0.1, or ::1 for IPv6) at one of the outbound capture
/// ports in [`HAIRPIN_MESH_PORTS`] (Istio's sidecar and ztunnel's in-pod listener
/// 15001, Linkerd's 4140, by default). Such a pod's connect to the LB is redirected
/// into the proxy, which dials the LB on a socket of its own: a header written on
/// the client's socket would reach the proxy, which passes it on as the request's
/// first bytes, and the LB would get a second header on the proxy's socket. The
/// relay path gives one header: the client's connect goes to the relay listener,
/// the proxy dials that, and the relay writes the header. A listener there that is
/// no mesh proxy costs its connects the relay, and the header is still right. The
/// lookup looks in the socket's own namespace (the pod's), the one the proxy
/// listens in; only kernel-path frontend hits pay it, never the miss path, and with
/// the cache on (see the module's comment) only the first of a namespace without
/// a listener.
#[inline(always)]
pub(super) fn mesh_listens(sa: &bpf_sock_addr, family: u8) -> bool {
    let ports = capture_ports();
    if ports[0] | ports[1] | ports[2] | ports[3] == 0 {
        // `--mesh-capture-ports none`.
        return false;
    }
    let v6 = family != AF_INET;
    // SAFETY: a read-only global the loader may have rewritten before load.
    let cached = unsafe { read_volatile(&HAIRPIN_MESH_CACHE) } != 0;
    let mut key = 0;
    if cached {
        // SAFETY: the context of a connect hook; the cookie of its socket's netns.
        let cookie =
            unsafe { bpf_get_netns_cookie((sa as *const bpf_sock_addr).cast_mut().cast()) };
        key = mesh_netns_key(cookie, v6);
        // SAFETY: a value of this program run, or None on a miss.
        if unsafe { HAIRPIN_MESH_NS.get(&key) }.is_some_and(|s| *s == MESH_NETNS_NONE) {
            count(Counter::KernelMeshCached);
            return false;
        }
    }
    // Each call has a constant tuple size: the verifier checks the stack buffer the
    // helper reads against it.
    let listens = |port: u16| {
        port != 0
            && if v6 {
                loopback_listener::<true>(sa, port)
            } else {
                loopback_listener::<false>(sa, port)
            }
    };
    let found = listens(ports[0]) || listens(ports[1]) || listens(ports[2]) || listens(ports[3]);
    if cached && !found {
        // Only where no entry is: never over a "listens" sock_ops wrote after these
        // probes ran. A full map evicts its least recently used entry; a write
        // that fails leaves the namespace to be probed again.
        put(key, MESH_NETNS_NONE, BPF_NOEXIST);
    }
    found
}

/// sock_ops at `BPF_SOCK_OPS_TCP_LISTEN_CB`: a socket of `ops` started listening
/// (it is in the listening hash already). On a capture port, whatever its address,
/// its namespace's entries say "listens" for both families, written over a "none"
/// a probe left, so the connect programs probe again. Where the write fails, the
/// entry goes, which makes them probe too.
#[inline(always)]
pub(super) fn listening(ops: *mut bpf_sock_ops) {
    // SAFETY: a read-only global the loader may have rewritten before load.
    if unsafe { read_volatile(&HAIRPIN_MESH_CACHE) } == 0 {
        return;
    }
    // SAFETY: a context read; sock_ops holds the local port in host byte order.
    let port = (unsafe { read_volatile(&(*ops).local_port) } as u16).to_be();
    let ports = capture_ports();
    if port == 0 || (port != ports[0] && port != ports[1] && port != ports[2] && port != ports[3]) {
        return;
    }
    // SAFETY: a sock_ops context is a valid argument for the cookie helper.
    let cookie = unsafe { bpf_get_netns_cookie(ops.cast()) };
    listens_in(mesh_netns_key(cookie, false));
    listens_in(mesh_netns_key(cookie, true));
}

/// Writes "listens" at `key`, or removes its entry where that fails.
#[inline(always)]
fn listens_in(key: u64) {
    if !put(key, MESH_NETNS_LISTENS, BPF_ANY) {
        let _ = HAIRPIN_MESH_NS.remove(&key);
    }
}

/// Writes `state` at `key` as `flags` say; whether it was written.
#[inline(always)]
fn put(key: u64, state: u32, flags: u32) -> bool {
    let mut value = 0u32;
    // SAFETY: a store to this frame's own variable; volatile, so the helper gets a
    // pointer to the stack rather than to a constant LLVM might put in .rodata.
    unsafe { write_volatile(&raw mut value, state) };
    HAIRPIN_MESH_NS
        .insert(&key, &value, u64::from(flags))
        .is_ok()
}

/// [`HAIRPIN_MESH_PORTS`] (network byte order; 0 a slot not in use).
#[inline(always)]
fn capture_ports() -> [u16; MESH_PORTS] {
    // SAFETY: read-only globals the loader may have rewritten before load.
    unsafe {
        [
            read_volatile(&HAIRPIN_MESH_PORTS[0]),
            read_volatile(&HAIRPIN_MESH_PORTS[1]),
            read_volatile(&HAIRPIN_MESH_PORTS[2]),
            read_volatile(&HAIRPIN_MESH_PORTS[3]),
        ]
    }
}

/// Whether a TCP socket listens on 127.0.0.1 (`V6`: ::1) at `port` (network byte
/// order) in the connecting socket's network namespace, or on the wildcard address
/// (a dual-stack [::] listener answers an IPv4 lookup too). The lookup takes a
/// reference on the socket, released at once.
#[inline(always)]
fn loopback_listener<const V6: bool>(sa: &bpf_sock_addr, port: u16) -> bool {
    // Every byte the helper reads is written field by field: a zeroed() or a struct
    // literal may become a memset call, whose loop the verifier refuses without
    // CAP_PERFMON (pointer arithmetic on the stack).
    let mut v6 = MaybeUninit::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>::uninit();
    let mut v4 = MaybeUninit::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>::uninit();
    // SAFETY: plain stores into this frame's tuples, every field of the one passed.
    let (tuple, size) = unsafe {
        if V6 {
            let t = v6.as_mut_ptr();
            for i in 0..4 {
                write_volatile(&raw mut (*t).saddr[i], 0);
            }
            write_volatile(&raw mut (*t).daddr[0], 0);
            write_volatile(&raw mut (*t).daddr[1], 0);
            write_volatile(&raw mut (*t).daddr[2], 0);
            write_volatile(&raw mut (*t).daddr[3], LOOPBACK6_LAST);
            write_volatile(&raw mut (*t).sport, 0);
            write_volatile(&raw mut (*t).dport, port);
            (
                t.cast::<bpf_sock_tuple>(),
                size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>(),
            )
        } else {
            let t = v4.as_mut_ptr();
            write_volatile(&raw mut (*t).saddr, 0);
            write_volatile(&raw mut (*t).daddr, LOOPBACK4);
            write_volatile(&raw mut (*t).sport, 0);
            write_volatile(&raw mut (*t).dport, port);
            (
                t.cast::<bpf_sock_tuple>(),
                size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>(),
            )
        }
    };
    // SAFETY: the context of a connect hook, a stack tuple of `size` bytes, all
    // written; the namespace is the socket's own (BPF_F_CURRENT_NETNS). A found
    // socket is released before the program returns, as the verifier requires.
    unsafe {
        let sk = bpf_sk_lookup_tcp(
            (sa as *const bpf_sock_addr).cast_mut().cast(),
            tuple,
            size as u32,
            BPF_F_CURRENT_NETNS as u64,
            0,
        );
        if sk.is_null() {
            return false;
        }
        bpf_sk_release(sk.cast());
    }
    true
}
