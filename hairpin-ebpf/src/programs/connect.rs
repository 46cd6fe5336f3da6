//! The cgroup connect4/connect6 programs, as Cilium's `bpf_sock.c` reads: look the
//! frontend up, decide, rewrite. A connect aimed at a proxied LoadBalancer frontend
//! is rewritten to that frontend's relay slot (see [`super::slots`]), or (kernel
//! path) left alone and its socket marked for an in-kernel header; anything else is
//! left untouched. Every path returns 1 (allow): hairpin never rejects a connect.
//!
//! Three pairs of programs share one body through const generics: relay only
//! (`KERNEL` false, the kernel-path branch compiled out), the kernel path, and the
//! kernel path with CAP_PERFMON's helpers (`PERFMON`).

use core::ptr::{null_mut, read_volatile, write_volatile};

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{
        bpf_getsockopt, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_sk_storage_get,
        bpf_skc_to_mptcp_sock, bpf_skc_to_tcp_sock,
    },
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use hairpin_ebpf::{
    AF_INET, AF_INET6, Counter, FrontendKey, HEARTBEAT_BEAT, HEARTBEAT_TTL, MARK_LATEST_CONNECT,
    PENDING_CONNECTING, PENDING_NONE, PendingHeader, Redirect, SOL_TCP, TCP_NOTSENT_LOWAT,
};

use super::{
    helpers::{array_value, count, frontend_key},
    maps::{
        HAIRPIN_BYPASS_MARK, HAIRPIN_FASTOPEN_CONNECT_MASK, HAIRPIN_FASTOPEN_CONNECT_OFF,
        HAIRPIN_FASTOPEN_REQ_OFF, HAIRPIN_FILL, HAIRPIN_FRONTENDS, HAIRPIN_HEARTBEAT,
        HAIRPIN_PENDING, HAIRPIN_SOCKETS_LIMIT, fastopen_map, pending_map,
    },
    mesh::mesh_listens,
    slots::slot_target,
};

const SOCK_STREAM: u32 = 1;
const IPPROTO_TCP: u32 = 6;
/// `::ffff:0:0/96` as the third address word, in network byte order.
const V4_MAPPED_WORD: u32 = 0xffff_u32.to_be();

#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4(ctx: SockAddrContext) -> i32 {
    connect4::<false, false>(&ctx)
}

/// connect4 of the kernel path: kernel-path frontends are marked, not rewritten.
#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4_kernel(ctx: SockAddrContext) -> i32 {
    connect4::<true, false>(&ctx)
}

/// As [`hairpin_connect4_kernel`], and MPTCP subflows and sockets about to send Fast
/// Open data go to the relay (needs helpers only CAP_PERFMON may use: the loader
/// falls back to the one above).
#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4_kernel_perfmon(ctx: SockAddrContext) -> i32 {
    connect4::<true, true>(&ctx)
}

/// With `KERNEL` false this is exactly the relay-only program: the kernel-path branch
/// is compiled out. `PERFMON` asks the kernel's socket itself (see [`kernel_can_take`]).
#[inline(always)]
fn connect4<const KERNEL: bool, const PERFMON: bool>(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel hands every cgroup/connect4 program a valid bpf_sock_addr.
    let sa = unsafe { &mut *ctx.sock_addr };
    if is_tcp(sa) {
        let key = frontend_key([sa.user_ip4, 0, 0, 0], sa.user_port as u16, AF_INET);
        let mut to = NO_SLOT;
        if decide::<KERNEL, PERFMON>(ctx, sa, key.frontend(), &mut to) {
            let (addr, port) = to;
            // SAFETY: writable context fields; volatile so LLVM keeps two 32-bit
            // stores (a merged 64-bit store is rejected by the verifier).
            unsafe {
                write_volatile(&mut sa.user_ip4, addr[0]);
                write_volatile(&mut sa.user_port, u32::from(port));
            }
            count(Counter::Redirected);
        }
    }
    1
}

/// [`decide`]'s slot before it decides: the address and port a connect is rewritten
/// to are zeros, not left undefined, on every path that does not rewrite. Returned
/// as an `Option`, the address was undefined on those paths, and LLVM left a map
/// value pointer in its register there; without CAP_PERFMON, Linux 6.1 walks the
/// rewrite's branch mispredicted as a speculative path (`sanitize_speculative_path`)
/// and refused the program: "R7 leaks addr into ctx".
const NO_SLOT: ([u32; 4], u16) = ([0; 4], 0);

/// A TCP connect to `key`: the kernel path's frontend is marked (the destination
/// stays), a relayed one gets its slot's address and port to rewrite to in `to`
/// (only this frontend's own slot, on an address fixed at load, handed to a listener
/// of this agent) and true, anything else is left as before hairpin. A connect the
/// kernel path does not mark clears a mark an earlier connect of the socket left.
#[inline(always)]
fn decide<const KERNEL: bool, const PERFMON: bool>(
    ctx: &SockAddrContext,
    sa: &bpf_sock_addr,
    key: &FrontendKey,
    to: &mut ([u32; 4], u16),
) -> bool {
    let mut slot = None;
    if let Some(redirect) = lookup(sa, key) {
        if KERNEL
            && redirect.is_kernel()
            && kernel_can_take::<PERFMON>(sa, key)
            && mark(ctx, key, redirect.header)
        {
            return false;
        }
        slot = slot_target(key, &redirect).map(|addr| (addr, redirect.slot_port));
    }
    if KERNEL {
        unmark_stale(sa);
    }
    match slot {
        Some(slot) => {
            *to = slot;
            true
        }
        None => false,
    }
}

#[cgroup_sock_addr(connect6)]
pub fn hairpin_connect6(ctx: SockAddrContext) -> i32 {
    connect6::<false, false>(&ctx)
}

/// connect6 of the kernel path: kernel-path frontends are marked, not rewritten.
#[cgroup_sock_addr(connect6)]
pub fn hairpin_connect6_kernel(ctx: SockAddrContext) -> i32 {
    connect6::<true, false>(&ctx)
}

/// As [`hairpin_connect6_kernel`], and MPTCP subflows and sockets about to send Fast
/// Open data go to the relay.
#[cgroup_sock_addr(connect6)]
pub fn hairpin_connect6_kernel_perfmon(ctx: SockAddrContext) -> i32 {
    connect6::<true, true>(&ctx)
}

/// As [`connect4`]; an IPv4-mapped destination is marked with its IPv4 frontend, so
/// its header is TCP4 as the relay's is.
#[inline(always)]
fn connect6<const KERNEL: bool, const PERFMON: bool>(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel hands every cgroup/connect6 program a valid bpf_sock_addr.
    let sa = unsafe { &mut *ctx.sock_addr };
    if is_tcp(sa) {
        // SAFETY: plain reads of the context's address words.
        let ip6 = unsafe {
            [
                read_volatile(&sa.user_ip6[0]),
                read_volatile(&sa.user_ip6[1]),
                read_volatile(&sa.user_ip6[2]),
                read_volatile(&sa.user_ip6[3]),
            ]
        };
        // A dual-stack socket reaching an IPv4 LB through ::ffff:a.b.c.d uses the v4 entry.
        let mapped = ip6[0] == 0 && ip6[1] == 0 && ip6[2] == V4_MAPPED_WORD;
        let key = if mapped {
            frontend_key([ip6[3], 0, 0, 0], sa.user_port as u16, AF_INET)
        } else {
            frontend_key(ip6, sa.user_port as u16, AF_INET6)
        };
        let mut to = NO_SLOT;
        if decide::<KERNEL, PERFMON>(ctx, sa, key.frontend(), &mut to) {
            let (a, port) = to;
            // An IPv4 frontend's slot is IPv4: reached through its mapped address.
            let addr = if mapped {
                [0, 0, V4_MAPPED_WORD, a[0]]
            } else {
                a
            };
            // SAFETY: writable context fields, one 32-bit store each (see connect4).
            unsafe {
                write_volatile(&mut sa.user_ip6[0], addr[0]);
                write_volatile(&mut sa.user_ip6[1], addr[1]);
                write_volatile(&mut sa.user_ip6[2], addr[2]);
                write_volatile(&mut sa.user_ip6[3], addr[3]);
                write_volatile(&mut sa.user_port, u32::from(port));
            }
            count(Counter::Redirected);
        }
    }
    1
}

/// Clears the mark of an earlier connect() call of this socket that never reached
/// its handshake: a connect program after hairpin's refused it, or TCP failed it
/// before sending a SYN (no route, no source port), and the socket is connecting
/// again, and this time not marked. sock_ops writes a header for a mark with
/// [`MARK_LATEST_CONNECT`] whatever the socket's peer (a socket load balancer after
/// hairpin's program changes it), so a mark must never outlive its call: left, it
/// would put a header naming the LB on a connection elsewhere. One lookup without
/// create in the socket's own (almost always empty) storage list: the cost every
/// TCP connect of the kernel path's programs pays besides the frontend lookup.
#[inline(always)]
fn unmark_stale(sa: &bpf_sock_addr) {
    // SAFETY: `sk` of a connect hook is a full socket; no create flag.
    let p =
        unsafe { bpf_sk_storage_get(pending_map(), sa.__bindgen_anon_1.sk.cast(), null_mut(), 0) };
    // SAFETY: non-null storage of this socket, valid while the program runs.
    if let Some(p) = unsafe { p.cast::<PendingHeader>().as_mut() }
        && p.state == PENDING_CONNECTING
    {
        p.state = PENDING_NONE;
        count(Counter::KernelSkippedElsewhere);
    }
}

/// Only TCP stream sockets are proxied; UDP and raw sockets pass untouched.
#[inline(always)]
fn is_tcp(sa: &bpf_sock_addr) -> bool {
    sa.type_ == SOCK_STREAM && sa.protocol == IPPROTO_TCP
}

/// The listener for `key`, unless the socket is one of the relay's own.
#[inline(always)]
fn lookup(sa: &bpf_sock_addr, key: &FrontendKey) -> Option<Redirect> {
    // A miss is not a proxied frontend (nearly every connect): left alone.
    // SAFETY: map lookups return a pointer valid for this program run, or None on a miss.
    let to = unsafe { HAIRPIN_FRONTENDS.get(key) }.copied()?;
    // The mark is only read for frontend hits, keeping the miss path to one lookup.
    // SAFETY: `sk` is always set for connect hooks; the verifier checks the read.
    let mark = unsafe { (*sa.__bindgen_anon_1.sk).mark };
    // SAFETY: a read-only global the loader may have rewritten before load.
    if mark == unsafe { read_volatile(&HAIRPIN_BYPASS_MARK) } {
        // The relay's upstream connect to the LB itself: redirecting it would loop.
        count(Counter::SkippedBypassMark);
        return None;
    }
    if !alive() {
        // No agent has beaten within the TTL: the datapath is abandoned, and a
        // connect goes as before hairpin rather than to a relay no one runs or with
        // a header no one keeps up to date.
        count(Counter::Expired);
        return None;
    }
    Some(to)
}

/// Whether the agent's heartbeat is younger than its TTL. Both clocks are
/// `CLOCK_MONOTONIC` (`bpf_ktime_get_ns`; not the boot clock, which counts suspend).
/// A heartbeat slot that cannot be read, or was never written, is not alive.
#[inline(always)]
fn alive() -> bool {
    let (Some(beat), Some(ttl)) = (
        array_value::<_, u64>(&HAIRPIN_HEARTBEAT, HEARTBEAT_BEAT),
        array_value::<_, u64>(&HAIRPIN_HEARTBEAT, HEARTBEAT_TTL),
    ) else {
        // An array's slots always read; should one not, fail open: not alive.
        return false;
    };
    // SAFETY: valid slots of the array for this program run; the agent writes them
    // whole (8-byte aligned stores).
    let (beat, ttl) = unsafe { (read_volatile(beat), read_volatile(ttl)) };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    beat != 0 && now.wrapping_sub(beat) <= ttl
}

/// Whether the kernel path can be sure to write this socket's header; when not, the
/// reason is counted and the caller relays it. When in doubt, relay: a sockets map
/// at its limit; a socket that set TCP_FASTOPEN_CONNECT (its first bytes would ride
/// on the SYN once the client holds a cookie, before sock_ops or sk_msg can act);
/// and (`PERFMON`) an MPTCP subflow, which a sockhash refuses, or a socket whose
/// `tcp_sock` says Fast Open (`sendto(MSG_FASTOPEN)`, or TCP_FASTOPEN_CONNECT set
/// before the setsockopt program attached). Without CAP_PERFMON those last ones are
/// left to the miss counters.
#[inline(always)]
fn kernel_can_take<const PERFMON: bool>(sa: &bpf_sock_addr, key: &FrontendKey) -> bool {
    // SAFETY: a read-only global the loader may have rewritten before load.
    let limit = u64::from(unsafe { read_volatile(&HAIRPIN_SOCKETS_LIMIT) });
    if let Some(fill) = array_value::<_, u64>(&HAIRPIN_FILL, 0) {
        // SAFETY: a valid slot of the array for this program run.
        if unsafe { read_volatile(fill) } >= limit {
            count(Counter::KernelFallbackFull);
            // Under load this is every new connect until a slot frees: the counter
            // says how many.
            event!(
                debug,
                "kernel_fallback_full: the sockets map is at its limit, the connect to {:i} port {} goes to the relay",
                key.family,
                key.addr,
                key.port
            );
            return false;
        }
    }
    if is_mptcp_subflow::<PERFMON>(sa) {
        count(Counter::KernelFallbackMptcp);
        // Every subflow of an MPTCP client: expected, so debug.
        event!(
            debug,
            "kernel_fallback_mptcp: an MPTCP subflow to {:i} port {} goes to the relay",
            key.family,
            key.addr,
            key.port
        );
        return false;
    }
    if asked_fast_open(sa) || (PERFMON && tcp_sock_says_fast_open(sa)) {
        count(Counter::KernelFallbackFastOpen);
        // A client's choice, made for every connection it opens: debug.
        event!(
            debug,
            "kernel_fallback_fastopen: a TCP Fast Open connect to {:i} port {} goes to the relay",
            key.family,
            key.addr,
            key.port
        );
        return false;
    }
    if mesh_listens(sa, key.family) {
        count(Counter::KernelFallbackMesh);
        // Every connect of a meshed pod to the LB: expected, so debug.
        event!(
            debug,
            "kernel_fallback_mesh: a mesh proxy listens in the client's network namespace, the connect to {:i} port {} goes to the relay",
            key.family,
            key.addr,
            key.port
        );
        return false;
    }
    true
}

/// Whether the connecting socket is an MPTCP subflow (the connect hook sees the
/// first subflow as plain TCP; a sockhash refuses it, so the kernel path could not
/// write its header). With CAP_PERFMON `bpf_skc_to_mptcp_sock` says so; without it,
/// the subflow's TCP_NOTSENT_LOWAT does: MPTCP sets it to `u32::MAX` on every
/// subflow, and a plain TCP socket reads 0 until its application sets it (Linux 6.7
/// or newer; earlier kernels read 0 and the subflow is a counted miss). An
/// application that set `u32::MAX` itself is relayed too, which costs it nothing
/// but the relay.
#[inline(always)]
fn is_mptcp_subflow<const PERFMON: bool>(sa: &bpf_sock_addr) -> bool {
    if PERFMON {
        // SAFETY: `sk` is always set for connect hooks; the helper takes any socket
        // and returns the MPTCP socket a subflow belongs to, else null.
        let msk = unsafe { bpf_skc_to_mptcp_sock(sa.__bindgen_anon_1.sk.cast()) };
        return !msk.is_null();
    }
    let mut lowat: u32 = 0;
    // SAFETY: the context of a connect hook, a 4-byte stack buffer of that length.
    let read = unsafe {
        bpf_getsockopt(
            (sa as *const bpf_sock_addr).cast_mut().cast(),
            SOL_TCP,
            TCP_NOTSENT_LOWAT,
            (&raw mut lowat).cast(),
            4,
        )
    };
    read == 0 && lowat == u32::MAX
}

/// Whether the socket set TCP_FASTOPEN_CONNECT since [`hairpin_setsockopt`] was
/// attached: one lookup, without create, in its own storage list. Only frontend
/// hits of the kernel path pay it.
#[inline(always)]
fn asked_fast_open(sa: &bpf_sock_addr) -> bool {
    // SAFETY: `sk` of a connect hook is a full socket; no create flag.
    let p =
        unsafe { bpf_sk_storage_get(fastopen_map(), sa.__bindgen_anon_1.sk.cast(), null_mut(), 0) };
    !p.is_null()
}

/// Whether the kernel's own `tcp_sock` says this connect is a Fast Open one:
/// `fastopen_req` is set (`sendto(MSG_FASTOPEN)` allocates it before it connects,
/// and this hook runs inside that connect) or the `fastopen_connect` bit is
/// (TCP_FASTOPEN_CONNECT, also when set before [`hairpin_setsockopt`] was attached).
/// Read with `bpf_probe_read_kernel` at offsets the loader found in the kernel's
/// BTF; a read that fails relays the socket too (when in doubt, relay). Only in the
/// programs loaded with CAP_PERFMON, and only with the offsets known.
#[inline(always)]
fn tcp_sock_says_fast_open(sa: &bpf_sock_addr) -> bool {
    // SAFETY: read-only globals the loader wrote before load.
    let (req_off, connect_off, connect_mask) = unsafe {
        (
            read_volatile(&HAIRPIN_FASTOPEN_REQ_OFF),
            read_volatile(&HAIRPIN_FASTOPEN_CONNECT_OFF),
            read_volatile(&HAIRPIN_FASTOPEN_CONNECT_MASK),
        )
    };
    if req_off == 0 || connect_off == 0 || connect_mask == 0 {
        // Never loaded so: the loader loads these programs only with the offsets.
        return false;
    }
    // SAFETY: `sk` is always set for connect hooks; the helper returns the socket as
    // a tcp_sock, or null when it is not one.
    let tp = unsafe { bpf_skc_to_tcp_sock(sa.__bindgen_anon_1.sk.cast()) };
    if tp.is_null() {
        // Not a tcp_sock (a request or timewait socket): no Fast Open state to read.
        return false;
    }
    let base = tp as usize;
    // SAFETY: the helper reads kernel memory safely (an error on a fault) into a
    // stack value of the type's size.
    let (req, bits) = unsafe {
        (
            bpf_probe_read_kernel((base + req_off as usize) as *const u64),
            bpf_probe_read_kernel((base + connect_off as usize) as *const u8),
        )
    };
    match (req, bits) {
        (Ok(req), Ok(bits)) => req != 0 || u32::from(bits) & connect_mask != 0,
        _ => true,
    }
}

/// Marks the connecting socket for an in-kernel header to `key`; false when it
/// cannot be marked (no socket storage), and the caller relays it instead.
#[inline(always)]
fn mark(ctx: &SockAddrContext, key: &FrontendKey, header: u8) -> bool {
    // SAFETY: `sk` of a connect hook is a full socket; the helper checks the rest.
    let p = unsafe { HAIRPIN_PENDING.get_or_insert_ptr_mut(ctx, None) };
    if p.is_null() {
        count(Counter::KernelFallbackRelay);
        event!(
            debug,
            "kernel_fallback_relay: no socket storage could be created for the connect to {:i} port {}: it goes to the relay",
            key.family,
            key.addr,
            key.port
        );
        return false;
    }
    // SAFETY: non-null storage of this socket, valid while the program runs.
    let p = unsafe { &mut *p };
    p.dst = key.addr;
    p.dst_port = key.port;
    p.family = key.family;
    p.version = header;
    p.len = 0;
    p.flags = MARK_LATEST_CONNECT;
    p.state = PENDING_CONNECTING;
    count(Counter::KernelMarked);
    true
}
