use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{null_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_RTT_CB,
        BPF_SOCK_OPS_RTT_CB_FLAG, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, bpf_sock,
        bpf_sock_addr, bpf_sock_ops, sk_action::SK_PASS,
    },
    btf_maps::SkStorage,
    helpers::{
        bpf_get_socket_cookie, bpf_map_delete_elem, bpf_msg_pop_data, bpf_msg_pull_data,
        bpf_msg_push_data, bpf_sk_storage_delete, bpf_sk_storage_get, bpf_skc_to_mptcp_sock,
        bpf_sock_hash_update, bpf_sock_ops_cb_flags_set,
    },
    macros::{btf_map, cgroup_sock_addr, map, sk_msg, sock_ops},
    maps::{Array, HashMap, PerCpuArray, SockHash},
    programs::{SkMsgContext, SockAddrContext, SockOpsContext},
};
use hairpin_ebpf::{
    AF_INET, AF_INET6, Counter, DEFAULT_BYPASS_MARK, FrontendKey, HEADER_ROOM, HEADER_V2,
    MAX_FRONTENDS, MAX_KERNEL_SOCKETS, PENDING_CONNECTING, PENDING_FIRST_WRITE, PENDING_NONE,
    PENDING_WRITTEN, PendingHeader, Redirect,
};

const SOCK_STREAM: u32 = 1;
const IPPROTO_TCP: u32 = 6;
const TCP_CLOSE: u32 = 7;
/// `::ffff:0:0/96` as the third address word, in network byte order.
const V4_MAPPED_WORD: u32 = 0xffff_u32.to_be();

#[map(name = "HAIRPIN_FRONTENDS")]
static HAIRPIN_FRONTENDS: HashMap<FrontendKey, Redirect> =
    HashMap::with_max_entries(MAX_FRONTENDS, 0);

#[map(name = "HAIRPIN_COUNTERS")]
static HAIRPIN_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// Established sockets of the kernel path whose header is not out yet, by socket
/// cookie; [`hairpin_sk_msg`] runs on their writes. The loader sizes it.
#[map(name = "HAIRPIN_SOCKETS")]
static HAIRPIN_SOCKETS: SockHash<u64> = SockHash::with_max_entries(MAX_KERNEL_SOCKETS, 0);

/// How many sockets [`HAIRPIN_SOCKETS`] holds now: added to at each insert, taken
/// from when a socket leaves (header out, or closed), atomically.
#[map(name = "HAIRPIN_FILL")]
static HAIRPIN_FILL: Array<u64> = Array::with_max_entries(1, 0);

/// [`HAIRPIN_FILL`] at which connects go to the relay; the loader overrides it.
#[unsafe(no_mangle)]
static HAIRPIN_SOCKETS_LIMIT: u32 = hairpin_ebpf::sockets_limit(MAX_KERNEL_SOCKETS);

/// What a marked socket's header needs, on the socket itself: freed with it.
#[btf_map(name = "HAIRPIN_PENDING")]
static HAIRPIN_PENDING: SkStorage<PendingHeader> = SkStorage::new();

/// Mark on the relay's own upstream sockets; the loader overrides it.
#[unsafe(no_mangle)]
static HAIRPIN_BYPASS_MARK: u32 = DEFAULT_BYPASS_MARK;

/// The node's IPv4 address, network byte order (0: none); the loader overrides it.
#[unsafe(no_mangle)]
static HAIRPIN_NODE_IP4: u32 = 0;

/// The node's IPv6 address words, network byte order (all 0: none); the loader overrides it.
#[unsafe(no_mangle)]
static HAIRPIN_NODE_IP6: [u32; 4] = [0; 4];

#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4(ctx: SockAddrContext) -> i32 {
    connect4::<false, false>(&ctx)
}

/// connect4 of the kernel path: kernel-path frontends are marked, not rewritten.
#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4_kernel(ctx: SockAddrContext) -> i32 {
    connect4::<true, false>(&ctx)
}

/// As [`hairpin_connect4_kernel`], and MPTCP subflows go to the relay (needs a
/// helper only CAP_PERFMON may use: the loader falls back to the one above).
#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4_kernel_mptcp(ctx: SockAddrContext) -> i32 {
    connect4::<true, true>(&ctx)
}

/// With `KERNEL` false this is exactly the relay-only program: the kernel-path branch
/// is compiled out. `MPTCP` asks whether the socket is an MPTCP subflow.
#[inline(always)]
fn connect4<const KERNEL: bool, const MPTCP: bool>(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel hands every cgroup/connect4 program a valid bpf_sock_addr.
    let sa = unsafe { &mut *ctx.sock_addr };
    if is_tcp(sa) {
        let key = FrontendKey {
            addr: [sa.user_ip4, 0, 0, 0],
            port: sa.user_port as u16,
            family: AF_INET,
            pad: 0,
        };
        if let Some(to) = lookup(sa, &key) {
            // The kernel writes the header on this socket: the destination stays.
            if KERNEL
                && to.is_kernel()
                && kernel_can_take::<MPTCP>(sa)
                && mark(ctx, &key, to.header)
            {
                return 1;
            }
            // A v6 listener cannot serve an AF_INET socket: only v4 redirects apply here.
            if to.family == AF_INET {
                // SAFETY: writable context fields; volatile so LLVM keeps two 32-bit
                // stores (a merged 64-bit store is rejected by the verifier).
                unsafe {
                    write_volatile(&mut sa.user_ip4, to.addr[0]);
                    write_volatile(&mut sa.user_port, u32::from(to.port));
                }
                count(Counter::Redirected);
            }
        }
    }
    1
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

/// As [`hairpin_connect6_kernel`], and MPTCP subflows go to the relay.
#[cgroup_sock_addr(connect6)]
pub fn hairpin_connect6_kernel_mptcp(ctx: SockAddrContext) -> i32 {
    connect6::<true, true>(&ctx)
}

/// As [`connect4`]; an IPv4-mapped destination is marked with its IPv4 frontend, so
/// its header is TCP4 as the relay's is.
#[inline(always)]
fn connect6<const KERNEL: bool, const MPTCP: bool>(ctx: &SockAddrContext) -> i32 {
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
            FrontendKey {
                addr: [ip6[3], 0, 0, 0],
                port: sa.user_port as u16,
                family: AF_INET,
                pad: 0,
            }
        } else {
            FrontendKey {
                addr: ip6,
                port: sa.user_port as u16,
                family: AF_INET6,
                pad: 0,
            }
        };
        if let Some(to) = lookup(sa, &key) {
            if KERNEL
                && to.is_kernel()
                && kernel_can_take::<MPTCP>(sa)
                && mark(ctx, &key, to.header)
            {
                return 1;
            }
            let addr = match (mapped, to.family) {
                (false, AF_INET6) => Some(to.addr),
                (true, AF_INET) => Some([0, 0, V4_MAPPED_WORD, to.addr[0]]),
                // Family mismatch: the agent never programs one; leave the socket alone.
                _ => None,
            };
            if let Some(addr) = addr {
                // SAFETY: writable context fields, one 32-bit store each (see connect4).
                unsafe {
                    write_volatile(&mut sa.user_ip6[0], addr[0]);
                    write_volatile(&mut sa.user_ip6[1], addr[1]);
                    write_volatile(&mut sa.user_ip6[2], addr[2]);
                    write_volatile(&mut sa.user_ip6[3], addr[3]);
                    write_volatile(&mut sa.user_port, u32::from(to.port));
                }
                count(Counter::Redirected);
            }
        }
    }
    1
}

/// Only TCP stream sockets are proxied; UDP and raw sockets pass untouched.
#[inline(always)]
fn is_tcp(sa: &bpf_sock_addr) -> bool {
    sa.type_ == SOCK_STREAM && sa.protocol == IPPROTO_TCP
}

/// The listener for `key`, unless the socket is one of the relay's own.
#[inline(always)]
fn lookup(sa: &bpf_sock_addr, key: &FrontendKey) -> Option<Redirect> {
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
    Some(to)
}

#[inline(always)]
fn count(c: Counter) {
    if let Some(v) = HAIRPIN_COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *v += 1 };
    }
}

// ---- The kernel path -----------------------------------------------------------
//
// connect marks the socket (socket storage: version and original destination) and
// leaves the destination alone; sock_ops, when the handshake is done, formats the
// header from the socket's own address and puts the socket in HAIRPIN_SOCKETS; sk_msg
// puts the header ahead of the first write; sock_ops takes the socket out of the map
// at the next RTT callback (a sockhash delete is refused inside sk_msg). Every way a
// marked connection can end up without its header is counted.

/// Whether the kernel path can be sure to write this socket's header; when not, the
/// reason is counted and the caller relays it. When in doubt, relay: a sockets map
/// at its limit, or (`MPTCP`) an MPTCP subflow, which a sockhash refuses. What this
/// kernel does not let a connect program see (TCP_FASTOPEN_CONNECT, MSG_FASTOPEN,
/// and MPTCP without CAP_PERFMON) is left to the miss counters.
#[inline(always)]
fn kernel_can_take<const MPTCP: bool>(sa: &bpf_sock_addr) -> bool {
    // SAFETY: a read-only global the loader may have rewritten before load.
    let limit = u64::from(unsafe { read_volatile(&HAIRPIN_SOCKETS_LIMIT) });
    if let Some(fill) = HAIRPIN_FILL.get_ptr(0) {
        // SAFETY: a valid slot of the array for this program run.
        if unsafe { read_volatile(fill) } >= limit {
            count(Counter::KernelFallbackFull);
            return false;
        }
    }
    if MPTCP {
        // SAFETY: `sk` is always set for connect hooks; the helper takes any socket
        // and returns the MPTCP socket a subflow belongs to, else null.
        let msk = unsafe { bpf_skc_to_mptcp_sock(sa.__bindgen_anon_1.sk.cast()) };
        if !msk.is_null() {
            count(Counter::KernelFallbackMptcp);
            return false;
        }
    }
    true
}

/// Adds `delta` (1, or `u64::MAX` for -1) to the sockets map's fill.
#[inline(always)]
fn fill_add(delta: u64) {
    if let Some(p) = HAIRPIN_FILL.get_ptr_mut(0) {
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

/// Marks the connecting socket for an in-kernel header to `key`; false when it
/// cannot be marked (no socket storage), and the caller relays it instead.
#[inline(always)]
fn mark(ctx: &SockAddrContext, key: &FrontendKey, header: u8) -> bool {
    // SAFETY: `sk` of a connect hook is a full socket; the helper checks the rest.
    let p = unsafe { HAIRPIN_PENDING.get_or_insert_ptr_mut(ctx, None) };
    if p.is_null() {
        count(Counter::KernelFallbackRelay);
        return false;
    }
    // SAFETY: non-null storage of this socket, valid while the program runs.
    let p = unsafe { &mut *p };
    p.dst = key.addr;
    p.dst_port = key.port;
    p.family = key.family;
    p.version = header;
    p.len = 0;
    p.state = PENDING_CONNECTING;
    count(Counter::KernelMarked);
    true
}

#[inline(always)]
fn sockets_map() -> *mut c_void {
    (&raw const HAIRPIN_SOCKETS).cast_mut().cast()
}

#[inline(always)]
fn pending_map() -> *mut c_void {
    (&raw const HAIRPIN_PENDING).cast_mut().cast()
}

/// The socket's storage, if connect marked it. One lookup in the socket's own
/// (usually empty) storage list: the cost every other socket pays.
#[inline(always)]
fn pending_of(sk: *mut bpf_sock) -> Option<&'static mut PendingHeader> {
    if sk.is_null() {
        return None;
    }
    // SAFETY: `sk` is a socket the kernel handed this program; no create flag.
    let p = unsafe { bpf_sk_storage_get(pending_map(), sk.cast(), null_mut(), 0) };
    // SAFETY: non-null storage stays valid while the program runs.
    unsafe { p.cast::<PendingHeader>().as_mut() }
}

#[sock_ops]
pub fn hairpin_sockops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        established(ctx.ops);
    } else if op == BPF_SOCK_OPS_RTT_CB {
        rtt(ctx.ops);
    } else if op == BPF_SOCK_OPS_STATE_CB && ctx.arg(1) == TCP_CLOSE {
        closed(ctx.ops);
    }
    // sock_ops results travel in `reply`, which is left alone; 1 means "ok".
    1
}

/// The handshake is done: format the header and put the socket in the map.
#[inline(always)]
fn established(ops: *mut bpf_sock_ops) {
    // SAFETY: the kernel hands sock_ops a valid context; `sk` may be null.
    let Some(p) = pending_of(unsafe { (*ops).__bindgen_anon_2.sk }) else {
        return;
    };
    if p.state != PENDING_CONNECTING {
        return;
    }
    // SAFETY: context read (tcp_sock field; 0 on a request socket).
    if unsafe { (*ops).data_segs_out } != 0 {
        // TCP Fast Open data rode on the SYN: it already left without a header.
        p.state = PENDING_NONE;
        count(Counter::KernelMissedDataFirst);
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

/// The socket closed while in the map: the map drops it, the fill follows.
#[inline(always)]
fn closed(ops: *mut bpf_sock_ops) {
    // SAFETY: as in `established`.
    let Some(p) = pending_of(unsafe { (*ops).__bindgen_anon_2.sk }) else {
        return;
    };
    if p.state == PENDING_FIRST_WRITE {
        // SAFETY: context read.
        if unsafe { (*ops).data_segs_out } != 0 {
            // Bytes left that sk_msg never saw, and no RTT sample came to say so.
            count(Counter::KernelMissedDataFirst);
        }
    } else if p.state != PENDING_WRITTEN {
        return;
    }
    p.state = PENDING_NONE;
    left_the_map();
}

/// An RTT sample: once the header is out (or can no longer be), the socket leaves
/// the map, so its later writes take the plain TCP path.
#[inline(always)]
fn rtt(ops: *mut bpf_sock_ops) {
    // SAFETY: as in `established`.
    let sk = unsafe { (*ops).__bindgen_anon_2.sk };
    let Some(p) = pending_of(sk) else {
        return;
    };
    if p.state == PENDING_FIRST_WRITE {
        // SAFETY: context read.
        if unsafe { (*ops).data_segs_out } == 0 {
            return;
        }
        // Data went out but sk_msg never saw it: a send() that was already
        // waiting for the handshake, or a path sk_msg does not cover.
        count(Counter::KernelMissedDataFirst);
    } else if p.state != PENDING_WRITTEN {
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

#[sk_msg]
pub fn hairpin_sk_msg(ctx: SkMsgContext) -> u32 {
    let msg = ctx.msg;
    // SAFETY: the kernel hands sk_msg a valid context; `sk` is checked for null.
    let Some(p) = pending_of(unsafe { (*msg).__bindgen_anon_3.sk }) else {
        return SK_PASS;
    };
    if p.state != PENDING_FIRST_WRITE {
        return SK_PASS;
    }
    // Whatever happens next, this was the first write: never a header mid-stream.
    p.state = PENDING_WRITTEN;
    let len = u32::from(p.len);
    if len == 0 || len as usize > HEADER_ROOM {
        count(Counter::KernelMissedWrite);
        return SK_PASS;
    }
    // SAFETY: helper calls on this context.
    if unsafe { bpf_msg_push_data(msg, 0, len, 0) } != 0 {
        count(Counter::KernelMissedPush);
        return SK_PASS;
    }
    // SAFETY: as above; the pushed room is taken out again when it cannot be filled,
    // so the server never sees uninitialised bytes.
    unsafe {
        if bpf_msg_pull_data(msg, 0, len, 0) != 0 || !copy_header(ctx.data(), ctx.data_end(), p) {
            bpf_msg_pop_data(msg, 0, len, 0);
            count(Counter::KernelMissedWrite);
            return SK_PASS;
        }
    }
    count(Counter::KernelHeadersWritten);
    SK_PASS
}

/// Copies the header into the pulled room at `data`, checking every byte against
/// `data_end` as the verifier needs.
#[inline(always)]
fn copy_header(data: usize, data_end: usize, p: &PendingHeader) -> bool {
    let len = usize::from(p.len);
    let mut i = 0;
    while i < HEADER_ROOM {
        if i >= len {
            return true;
        }
        let at = data + i;
        if at + 1 > data_end {
            return false;
        }
        // SAFETY: inside [data, data_end), checked just above.
        unsafe { write_volatile(at as *mut u8, p.header[i]) };
        i += 1;
    }
    true
}

/// Formats the header into `p.header` (length in `p.len`): src is the socket's own
/// address and port (the node's address instead when that is loopback or the LB
/// address itself, as the relay does), dst the original destination.
#[inline(always)]
fn format_header(ops: *mut bpf_sock_ops, p: &mut PendingHeader) {
    // SAFETY: context reads, one 32-bit load each (volatile: never merged).
    let (sock_family, local4, local6, sport) = unsafe {
        (
            read_volatile(&(*ops).family),
            read_volatile(&(*ops).local_ip4),
            [
                read_volatile(&(*ops).local_ip6[0]),
                read_volatile(&(*ops).local_ip6[1]),
                read_volatile(&(*ops).local_ip6[2]),
                read_volatile(&(*ops).local_ip6[3]),
            ],
            read_volatile(&(*ops).local_port) as u16,
        )
    };
    let dport = u16::from_be(p.dst_port);
    let dst = p.dst;
    let out = Out(p);
    out.reset();
    if p_family(&out) == AF_INET {
        // An AF_INET6 socket that connected to ::ffff:a.b.c.d has a mapped address.
        let mut src = if sock_family == u32::from(AF_INET6) {
            local6[3]
        } else {
            local4
        };
        if src.to_ne_bytes()[0] == 127 || src == dst[0] {
            // SAFETY: read-only global the loader may have rewritten.
            let node = unsafe { read_volatile(&HAIRPIN_NODE_IP4) };
            if node != 0 {
                src = node;
            }
        }
        if p_version(&out) == HEADER_V2 {
            out.v2_prefix(0x11, 12);
            out.bytes4(src);
            out.bytes4(dst[0]);
            out.be16(sport);
            out.be16(dport);
        } else {
            out.text(b"PROXY TCP4 ");
            out.ip4(src);
            out.put(b' ');
            out.ip4(dst[0]);
            out.ports(sport, dport);
        }
    } else {
        let mut src = local6;
        let loopback = src[0] == 0 && src[1] == 0 && src[2] == 0 && src[3] == 1u32.to_be();
        if loopback || src == dst {
            // SAFETY: read-only global the loader may have rewritten.
            let node = unsafe {
                [
                    read_volatile(&HAIRPIN_NODE_IP6[0]),
                    read_volatile(&HAIRPIN_NODE_IP6[1]),
                    read_volatile(&HAIRPIN_NODE_IP6[2]),
                    read_volatile(&HAIRPIN_NODE_IP6[3]),
                ]
            };
            if node != [0; 4] {
                src = node;
            }
        }
        if p_version(&out) == HEADER_V2 {
            out.v2_prefix(0x21, 36);
            for w in src {
                out.bytes4(w);
            }
            for w in dst {
                out.bytes4(w);
            }
            out.be16(sport);
            out.be16(dport);
        } else {
            out.text(b"PROXY TCP6 ");
            out.ip6(src);
            out.put(b' ');
            out.ip6(dst);
            out.ports(sport, dport);
        }
    }
}

#[inline(always)]
fn p_family(out: &Out) -> u8 {
    // SAFETY: `out` holds a valid storage pointer.
    unsafe { (*out.0).family }
}

#[inline(always)]
fn p_version(out: &Out) -> u8 {
    // SAFETY: as above.
    unsafe { (*out.0).version }
}

/// Appends to a socket's header. The write position lives in the storage itself and
/// is re-read (volatile) for every byte, so the verifier sees an unknown position
/// masked below [`HEADER_ROOM`]: one bounds proof per byte, and the paths through
/// numbers of different widths meet in one state instead of multiplying.
struct Out(*mut PendingHeader);

impl Out {
    #[inline(always)]
    fn reset(&self) {
        // SAFETY: valid storage pointer for this program run.
        unsafe { write_volatile(&raw mut (*self.0).len, 0) };
    }

    #[inline(always)]
    fn put(&self, b: u8) {
        // SAFETY: as above; the index is masked into the buffer.
        unsafe {
            let at = usize::from(read_volatile(&raw const (*self.0).len)) & (HEADER_ROOM - 1);
            (*self.0).header[at] = b;
            write_volatile(&raw mut (*self.0).len, (at + 1) as u8);
        }
    }

    #[inline(always)]
    fn text(&self, s: &[u8]) {
        for b in s {
            self.put(*b);
        }
    }

    /// The 12-byte signature, version 2 / PROXY, the family byte and the address length.
    #[inline(always)]
    fn v2_prefix(&self, family: u8, addr_len: u16) {
        self.text(b"\r\n\r\n\0\r\nQUIT\n");
        self.put(0x21);
        self.put(family);
        self.be16(addr_len);
    }

    /// An address word (network byte order) as its four bytes.
    #[inline(always)]
    fn bytes4(&self, w: u32) {
        for b in w.to_ne_bytes() {
            self.put(b);
        }
    }

    #[inline(always)]
    fn be16(&self, v: u16) {
        for b in v.to_be_bytes() {
            self.put(b);
        }
    }

    /// ` SPORT DPORT\r\n` of a v1 line.
    #[inline(always)]
    fn ports(&self, sport: u16, dport: u16) {
        self.put(b' ');
        self.dec(u32::from(sport));
        self.put(b' ');
        self.dec(u32::from(dport));
        self.text(b"\r\n");
    }

    /// `v` (below 100000) in decimal, without leading zeros.
    #[inline(always)]
    fn dec(&self, v: u32) {
        let mut started = false;
        for div in [10_000, 1_000, 100, 10] {
            let d = (v / div) % 10;
            if d != 0 || started {
                started = true;
                self.put(b'0' + d as u8);
            }
        }
        self.put(b'0' + (v % 10) as u8);
    }

    /// `v` in lowercase hex, without leading zeros (Rust's `{:x}`).
    #[inline(always)]
    fn hex(&self, v: u16) {
        let mut started = false;
        for shift in [12, 8, 4] {
            let d = ((v >> shift) & 0xf) as u8;
            if d != 0 || started {
                started = true;
                self.put(hex_digit(d));
            }
        }
        self.put(hex_digit((v & 0xf) as u8));
    }

    /// Dotted quad of an address in network byte order.
    #[inline(always)]
    fn ip4(&self, w: u32) {
        let o = w.to_ne_bytes();
        self.dec(u32::from(o[0]));
        self.put(b'.');
        self.dec(u32::from(o[1]));
        self.put(b'.');
        self.dec(u32::from(o[2]));
        self.put(b'.');
        self.dec(u32::from(o[3]));
    }

    /// An IPv6 address exactly as Rust's `Ipv6Addr` displays it (which the relay's
    /// header uses): the first longest run of two or more zero groups as `::`.
    /// IPv4-mapped addresses never get here (their header is TCP4).
    #[inline(always)]
    fn ip6(&self, w: [u32; 4]) {
        let mut g = [0u16; 8];
        for i in 0..4 {
            let b = w[i].to_ne_bytes();
            g[2 * i] = u16::from_be_bytes([b[0], b[1]]);
            g[2 * i + 1] = u16::from_be_bytes([b[2], b[3]]);
        }
        let (mut start, mut len, mut cur_start, mut cur_len) = (0usize, 0usize, 0usize, 0usize);
        for (i, v) in g.iter().enumerate() {
            if *v == 0 {
                if cur_len == 0 {
                    cur_start = i;
                }
                cur_len += 1;
                if cur_len > len {
                    start = cur_start;
                    len = cur_len;
                }
            } else {
                cur_len = 0;
            }
        }
        if len < 2 {
            len = 0;
        }
        for (i, v) in g.iter().enumerate() {
            if len > 0 && i >= start && i < start + len {
                if i == start {
                    self.put(b':');
                    self.put(b':');
                }
                continue;
            }
            if i > 0 && !(len > 0 && i == start + len) {
                self.put(b':');
            }
            self.hex(*v);
        }
    }
}

#[inline(always)]
fn hex_digit(d: u8) -> u8 {
    if d < 10 { b'0' + d } else { b'a' + d - 10 }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The kernel reads this section at load: "Dual MIT/GPL" is in its list of
/// GPL-compatible licenses (`license_is_gpl_compatible`), so GPL-only helpers stay
/// available. It matches the crate's `MIT OR GPL-2.0-only`.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
