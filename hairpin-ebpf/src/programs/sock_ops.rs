//! The sock_ops program of the kernel path: when a marked socket's handshake is done
//! it formats the socket's header and puts the socket in `HAIRPIN_SOCKETS` (where
//! sk_msg sees its writes); once the header is out (the next RTT sample), or the
//! socket closed, it takes the socket out again and keeps the map's fill. Every
//! socket it cannot give a header is counted. It never reads the heartbeat: a socket
//! marked just before the agent's heartbeat expires still gets its header. It also
//! tells the connect programs' mesh cache of every new listener on a capture port
//! (see [`super::mesh`]).

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::read_volatile,
};

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_RTT_CB,
        BPF_SOCK_OPS_RTT_CB_FLAG, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_LISTEN_CB, bpf_sock_ops,
    },
    helpers::{
        bpf_get_socket_cookie, bpf_map_delete_elem, bpf_sk_storage_delete, bpf_sock_hash_update,
        bpf_sock_ops_cb_flags_set,
    },
    macros::sock_ops,
    programs::SockOpsContext,
};
use hairpin_ebpf::{
    AF_INET, Counter, MARK_LATEST_CONNECT, PENDING_CONNECTING, PENDING_FIRST_WRITE, PENDING_NONE,
    PENDING_WRITTEN, PendingHeader,
};

use super::{
    header::format_header,
    helpers::{array_value, count, pending_of},
    maps::{HAIRPIN_FILL, pending_map, sockets_map},
    mesh,
};

const TCP_CLOSE: u32 = 7;

#[sock_ops]
pub fn hairpin_sockops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        established(ctx.ops);
    } else if op == BPF_SOCK_OPS_RTT_CB {
        rtt(ctx.ops);
    } else if op == BPF_SOCK_OPS_STATE_CB && ctx.arg(1) == TCP_CLOSE {
        closed(ctx.ops);
    } else if op == BPF_SOCK_OPS_TCP_LISTEN_CB {
        // Every listen(2) in the attached cgroup: the mesh cache learns of a new
        // capture listener.
        mesh::listening(ctx.ops);
    }
    // sock_ops results travel in `reply`, which is left alone; 1 means "ok".
    1
}

/// The handshake is done: format the header and put the socket in the map.
#[inline(always)]
fn established(ops: *mut bpf_sock_ops) {
    // SAFETY: the kernel hands sock_ops a valid context; `sk` may be null.
    let Some(p) = pending_of(unsafe { (*ops).__bindgen_anon_2.sk }) else {
        // Not marked at connect (most sockets): not the kernel path's.
        return;
    };
    if p.state != PENDING_CONNECTING {
        // The mark is not for this handshake (spent on an earlier connection of the
        // socket, or given up): never a second header.
        return;
    }
    // SAFETY: context read (tcp_sock field; 0 on a request socket).
    if unsafe { (*ops).data_segs_out } != 0 {
        // TCP Fast Open data rode on the SYN: it already left without a header.
        p.state = PENDING_NONE;
        count(Counter::KernelMissedDataFirst);
        event!(
            debug,
            "kernel_missed_data_first: data went with the SYN (TCP Fast Open) on a connection to {:i} port {}: no header",
            p.family,
            p.dst,
            p.dst_port
        );
        return;
    }
    if p.flags & MARK_LATEST_CONNECT == 0 && !peer_is_marked_frontend(ops, p) {
        // A mark of an earlier build's connect program, which leaves a mark behind
        // when the socket connects again elsewhere: the peer must still be the
        // frontend. A mark with MARK_LATEST_CONNECT is this connection's whatever
        // its peer: the connect programs clear it on every later connect they do not
        // mark, and a connect program after ours (a socket load balancer rewriting
        // the LB address to a backend) changes the peer of a connection that was
        // aimed at the frontend all the same, so its header still names the LB
        // address the client dialled.
        p.state = PENDING_NONE;
        count(Counter::KernelSkippedElsewhere);
        event!(
            debug,
            "kernel_skipped_elsewhere: a socket marked for {:i} port {} connected elsewhere: no header",
            p.family,
            p.dst,
            p.dst_port
        );
        return;
    }
    format_header(ops, p);
    // Before the insert: sk_msg acts only on this state, and may run as soon as
    // the socket is in the map.
    p.state = PENDING_FIRST_WRITE;
    // SAFETY: a sock_ops context is a valid argument for the cookie helper.
    let mut cookie = unsafe { bpf_get_socket_cookie(ops.cast()) };
    // SAFETY: sock_ops context, the map, a stack key; the helper checks the socket.
    let inserted = unsafe {
        bpf_sock_hash_update(
            ops,
            sockets_map(),
            (&raw mut cookie).cast(),
            u64::from(BPF_NOEXIST),
        )
    };
    if inserted != 0 {
        // Full, or a socket a sockhash refuses: it will write without a header.
        p.state = PENDING_NONE;
        count(Counter::KernelMissedInsert);
        event!(
            debug,
            "kernel_missed_insert: a connection to {:i} port {} could not enter the sockets map (error {}): no header",
            p.family,
            p.dst,
            p.dst_port,
            inserted
        );
        return;
    }
    fill_add(1);
    count(Counter::KernelSocketsEntered);
    // RTT samples to take it out once the header is out; state changes to see a
    // close first (the map drops a closed socket by itself, the fill must follow).
    // SAFETY: context read and the flags helper on this context.
    unsafe {
        let flags =
            (*ops).bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG;
        bpf_sock_ops_cb_flags_set(ops, flags as i32);
    }
}

/// Whether the established socket's peer is the frontend it was marked for. The
/// socket keeps the address its connect named (kube-proxy's DNAT rewrites packets,
/// not the socket), so a marked connection to the LB reads back the LB address
/// unless a connect program after hairpin's rewrote it. Only for marks without
/// [`MARK_LATEST_CONNECT`].
#[inline(always)]
fn peer_is_marked_frontend(ops: *mut bpf_sock_ops, p: &PendingHeader) -> bool {
    // SAFETY: context reads, one 32-bit load each (volatile: never merged).
    let (port, ip4, ip6) = unsafe {
        (
            read_volatile(&(*ops).remote_port),
            read_volatile(&(*ops).remote_ip4),
            [
                read_volatile(&(*ops).remote_ip6[0]),
                read_volatile(&(*ops).remote_ip6[1]),
                read_volatile(&(*ops).remote_ip6[2]),
                read_volatile(&(*ops).remote_ip6[3]),
            ],
        )
    };
    // sock_ops' `remote_port` holds the port in network byte order in its upper 16
    // bits (the kernel shifts it there on little-endian machines, the only ones BPF
    // here builds for); `dst_port` holds the same 16 bits.
    if (port >> 16) as u16 != p.dst_port {
        return false;
    }
    if p.family == AF_INET {
        // An AF_INET6 socket connected to ::ffff:a.b.c.d has its IPv4 peer here too.
        ip4 == p.dst[0]
    } else {
        ip6 == p.dst
    }
}

/// The socket closed while in the map: the map drops it, the fill follows.
#[inline(always)]
fn closed(ops: *mut bpf_sock_ops) {
    // SAFETY: as in `established`.
    let Some(p) = pending_of(unsafe { (*ops).__bindgen_anon_2.sk }) else {
        // Not marked (state callbacks another sock_ops program asked for): it was
        // never in the map, so the fill is not its to follow.
        return;
    };
    if leaves_the_map(ops, p, true) {
        p.state = PENDING_NONE;
        left_the_map();
    }
}

/// An RTT sample: once the header is out (or can no longer be), the socket leaves
/// the map, so its later writes take the plain TCP path.
#[inline(always)]
fn rtt(ops: *mut bpf_sock_ops) {
    // SAFETY: as in `established`.
    let sk = unsafe { (*ops).__bindgen_anon_2.sk };
    let Some(p) = pending_of(sk) else {
        // Not marked (RTT callbacks another sock_ops program asked for): never in
        // the map, nothing to take out.
        return;
    };
    if !leaves_the_map(ops, p, false) {
        return;
    }
    p.state = PENDING_NONE;
    left_the_map();
    // SAFETY: helpers on this context, a stack key, and this socket's storage (not
    // touched after its delete).
    unsafe {
        let cookie = bpf_get_socket_cookie(ops.cast());
        bpf_map_delete_elem(sockets_map(), (&raw const cookie).cast());
        let flags =
            (*ops).bpf_sock_ops_cb_flags & !(BPF_SOCK_OPS_RTT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG);
        bpf_sock_ops_cb_flags_set(ops, flags as i32);
        bpf_sk_storage_delete(pending_map(), sk.cast());
    }
}

/// Whether the socket of mark `p` is in the map and leaves it now: its header is
/// out, or it can no longer be (data went out that sk_msg never saw: a send() that
/// was already waiting for the handshake, or a path sk_msg does not cover; counted),
/// or the socket is `closing`. A socket that has sent nothing yet stays for its
/// first write; one not in the map (still connecting, refused at insert, or already
/// out) never counted in the fill.
#[inline(always)]
fn leaves_the_map(ops: *mut bpf_sock_ops, p: &PendingHeader, closing: bool) -> bool {
    if p.state == PENDING_WRITTEN {
        return true;
    }
    if p.state != PENDING_FIRST_WRITE {
        return false;
    }
    // SAFETY: context read.
    if unsafe { (*ops).data_segs_out } == 0 {
        return closing;
    }
    count(Counter::KernelMissedDataFirst);
    event!(
        debug,
        "kernel_missed_data_first: a connection to {:i} port {} sent data the header could not go ahead of: no header",
        p.family,
        p.dst,
        p.dst_port
    );
    true
}

/// Adds `delta` (1, or `u64::MAX` for -1) to the sockets map's fill.
#[inline(always)]
fn fill_add(delta: u64) {
    if let Some(p) = array_value::<_, u64>(&HAIRPIN_FILL, 0) {
        // SAFETY: a valid, aligned u64 slot shared by every CPU, only ever added to
        // atomically. The result is unused, so this is one atomic add instruction.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, delta) };
    }
}

/// A socket left the sockets map (its header is out, or it closed).
#[inline(always)]
fn left_the_map() {
    fill_add(u64::MAX);
    count(Counter::KernelSocketsLeft);
}
