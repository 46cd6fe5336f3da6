use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    mem::MaybeUninit,
    ptr::{null_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_RTT_CB, BPF_SOCK_OPS_RTT_CB_FLAG, BPF_SOCK_OPS_STATE_CB,
        BPF_SOCK_OPS_STATE_CB_FLAG, bpf_dynptr, bpf_sock, bpf_sock_addr, bpf_sock_ops, bpf_sockopt,
        sk_action::SK_PASS,
    },
    btf_maps::SkStorage,
    helpers::{
        bpf_dynptr_from_mem, bpf_dynptr_read, bpf_dynptr_write, bpf_get_socket_cookie,
        bpf_getsockopt, bpf_ktime_get_ns, bpf_map_delete_elem, bpf_map_lookup_elem,
        bpf_msg_pop_data, bpf_msg_pull_data, bpf_msg_push_data, bpf_probe_read_kernel,
        bpf_sk_release, bpf_sk_storage_delete, bpf_sk_storage_get, bpf_skc_to_mptcp_sock,
        bpf_skc_to_tcp_sock, bpf_sock_hash_update, bpf_sock_ops_cb_flags_set,
    },
    macros::{btf_map, cgroup_sock_addr, cgroup_sockopt, map, sk_msg, sock_ops},
    maps::{Array, HashMap, PerCpuArray, SockHash},
    programs::{SkMsgContext, SockAddrContext, SockOpsContext, SockoptContext},
};
use aya_log_ebpf::debug;
use hairpin_ebpf::{
    AF_INET, AF_INET6, COALESCE_MAX, Counter, DEFAULT_BYPASS_MARK, FrontendKey, HEADER_ROOM,
    HEADER_V2, HEARTBEAT_BEAT, HEARTBEAT_TTL, MAX_FRONTENDS, MAX_KERNEL_SOCKETS,
    PENDING_CONNECTING, PENDING_FIRST_WRITE, PENDING_NONE, PENDING_WRITTEN, PendingHeader,
    Redirect, SOL_TCP, TCP_FASTOPEN_CONNECT, TCP_NOTSENT_LOWAT,
    text::{IP6_FIRST, IP6_GAP, IP6_NEXT, dec, groups, hex, ip6_plan, pack, zero_groups},
};

const SOCK_STREAM: u32 = 1;
const IPPROTO_TCP: u32 = 6;
const TCP_CLOSE: u32 = 7;
/// `::ffff:0:0/96` as the third address word, in network byte order.
const V4_MAPPED_WORD: u32 = 0xffff_u32.to_be();

/// A diagnostic event through aya-log, naming the frontend (its address words and
/// port in network byte order, as in [`FrontendKey`] and [`PendingHeader`]) with
/// `{:i} port {}` in `$fmt`, then at most one more argument (an error number). One
/// format string serves both families: the address goes out as 4 or 16 bytes, and
/// user space prints either.
///
/// Only on the rare paths (fallbacks, misses, failures), never on a plain redirect
/// or a header written. Each event is its own `#[inline(never)]` function, a BPF
/// subprogram with its own stack frame: inlined, aya-log's record building (a ring
/// buffer reservation filled at constant offsets) reshuffles the caller's stack
/// slots, and without CAP_PERFMON the verifier refuses a scalar written over a
/// spilled pointer. aya-log's level check reads a read-only global the loader sets
/// from the agent's `--log`, so the verifier drops the events below it.
macro_rules! event {
    ($level:ident, $fmt:literal, $family:expr, $addr:expr, $port:expr) => {
        event!($level, $fmt, $family, $addr, $port, 0)
    };
    ($level:ident, $fmt:literal, $family:expr, $addr:expr, $port:expr, $arg:expr) => {{
        #[inline(never)]
        fn emit(family: u8, addr: &[u32; 4], port: u16, arg: i64) {
            let port = u16::from_be(port);
            // Only the events whose message has an `{}` for it print it.
            let _ = arg;
            if family == AF_INET {
                $level!((), $fmt, addr[0].to_ne_bytes(), port, arg);
            } else {
                $level!((), $fmt, ip6_octets(addr), port, arg);
            }
        }
        emit($family, &$addr, $port, $arg);
    }};
}

/// The 16 bytes of an IPv6 address held as words in network byte order.
#[inline(always)]
fn ip6_octets(w: &[u32; 4]) -> [u8; 16] {
    let [a, b, c, d] = [
        w[0].to_ne_bytes(),
        w[1].to_ne_bytes(),
        w[2].to_ne_bytes(),
        w[3].to_ne_bytes(),
    ];
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

#[map(name = "HAIRPIN_FRONTENDS")]
static HAIRPIN_FRONTENDS: HashMap<FrontendKey, Redirect> =
    HashMap::with_max_entries(MAX_FRONTENDS, 0);

#[map(name = "HAIRPIN_COUNTERS")]
static HAIRPIN_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// The dead-man switch: the agent's last heartbeat and the TTL (see
/// [`hairpin_ebpf::MAP_HEARTBEAT`]). Read by the connect programs only.
#[map(name = "HAIRPIN_HEARTBEAT")]
static HAIRPIN_HEARTBEAT: Array<u64> = Array::with_max_entries(2, 0);

/// The relay's listening sockets by listener address: a connect goes to a listener
/// only while it is here (see [`hairpin_ebpf::MAP_RELAYS`]).
#[map(name = "HAIRPIN_RELAYS")]
static HAIRPIN_RELAYS: SockHash<FrontendKey> = SockHash::with_max_entries(MAX_FRONTENDS, 0);

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

/// Sockets that set TCP_FASTOPEN_CONNECT (to nonzero), marked by
/// [`hairpin_setsockopt`]; the connect programs relay them. A map of its own rather
/// than a state of [`HAIRPIN_PENDING`]: every socket that asks for Fast Open gets
/// it, whatever it connects to, and 4 bytes are all it needs where a
/// [`PendingHeader`] is 152; and sock_ops, sk_msg and the drain read the presence
/// of a [`PendingHeader`] as "marked for the kernel path", which stays true only
/// of sockets the connect programs marked.
#[btf_map(name = "HAIRPIN_FASTOPEN")]
static HAIRPIN_FASTOPEN: SkStorage<u32> = SkStorage::new();

/// Byte offset of `fastopen_req` in the running kernel's `struct tcp_sock` (0:
/// unknown); the loader sets it from the kernel's BTF.
#[unsafe(no_mangle)]
static HAIRPIN_FASTOPEN_REQ_OFF: u32 = 0;

/// Byte offset in `struct tcp_sock` of the byte holding `fastopen_connect` (0: unknown).
#[unsafe(no_mangle)]
static HAIRPIN_FASTOPEN_CONNECT_OFF: u32 = 0;

/// The `fastopen_connect` bit as a mask of that byte (0: unknown).
#[unsafe(no_mangle)]
static HAIRPIN_FASTOPEN_CONNECT_MASK: u32 = 0;

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
                && kernel_can_take::<PERFMON>(sa, &key)
                && mark(ctx, &key, to.header)
            {
                return 1;
            }
            // A v6 listener cannot serve an AF_INET socket: only v4 redirects apply here.
            // A listener that is not listening (no agent) is no target: as before hairpin.
            if to.family == AF_INET && relay_listening(&to) {
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
                && kernel_can_take::<PERFMON>(sa, &key)
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
            if let Some(addr) = addr
                && relay_listening(&to)
            {
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
        HAIRPIN_HEARTBEAT.get_ptr(HEARTBEAT_BEAT),
        HAIRPIN_HEARTBEAT.get_ptr(HEARTBEAT_TTL),
    ) else {
        return false;
    };
    // SAFETY: valid slots of the array for this program run; the agent writes them
    // whole (8-byte aligned stores).
    let (beat, ttl) = unsafe { (read_volatile(beat), read_volatile(ttl)) };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    beat != 0 && now.wrapping_sub(beat) <= ttl
}

/// Whether the relay listener a connect would go to is listening: its socket is in
/// [`HAIRPIN_RELAYS`], which the kernel empties of a listener as it closes. The
/// lookup takes a reference on the socket, released at once.
#[inline(always)]
fn relay_listening(to: &Redirect) -> bool {
    let key = FrontendKey {
        addr: to.addr,
        port: to.port,
        family: to.family,
        pad: 0,
    };
    // SAFETY: a sockhash lookup returns a referenced socket or null; a non-null one
    // is released before the program returns, as the verifier requires.
    unsafe {
        let sk = bpf_map_lookup_elem(relays_map(), (&raw const key).cast());
        if sk.is_null() {
            count(Counter::RelayDown);
            return false;
        }
        bpf_sk_release(sk);
    }
    true
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
    if let Some(fill) = HAIRPIN_FILL.get_ptr(0) {
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

/// The smallest page size of any architecture: setsockopt programs see at most a
/// page of the option's value.
const MIN_PAGE_SIZE: i32 = 4096;

/// Marks a socket that sets TCP_FASTOPEN_CONNECT (clears the mark when it sets 0).
/// It runs before the kernel handles the option and never changes or refuses one:
/// it returns 1 ("carry on") and leaves level, name and value alone. A value longer
/// than a page is the one thing it touches: it sets `optlen` to 0, the documented
/// "use the caller's own buffer" (the program sees only the first page; left as it
/// is, kernels before 6.5 fail such a setsockopt with EFAULT and later ones log a
/// line). Whether the kernel then accepts the option is not known here: a socket
/// marked for an option it refused (TCP_FASTOPEN_CONNECT with Fast Open off) is
/// relayed all the same, which costs it nothing but the relay.
#[cgroup_sockopt(setsockopt)]
pub fn hairpin_setsockopt(ctx: SockoptContext) -> i32 {
    let so = ctx.sockopt;
    // SAFETY: the kernel hands every cgroup/setsockopt program a valid bpf_sockopt.
    let (level, optname, optlen) = unsafe { ((*so).level, (*so).optname, (*so).optlen) };
    if level == SOL_TCP && optname == TCP_FASTOPEN_CONNECT && optlen >= 4 {
        fast_open_option(so);
    }
    if optlen > MIN_PAGE_SIZE {
        // SAFETY: `optlen` is a writable field of the context.
        unsafe { write_volatile(&mut (*so).optlen, 0) };
    }
    1
}

/// TCP_FASTOPEN_CONNECT is being set on the socket of `so`: mark or clear it.
#[inline(always)]
fn fast_open_option(so: *mut bpf_sockopt) {
    // SAFETY: context reads; `optval` is checked against `optval_end` before the read.
    unsafe {
        let optval = (*so).__bindgen_anon_2.optval as usize;
        let end = (*so).__bindgen_anon_3.optval_end as usize;
        if optval + 4 > end {
            return;
        }
        let on = read_volatile(optval as *const u32) != 0;
        let sk = (*so).__bindgen_anon_1.sk;
        if on {
            let p = bpf_sk_storage_get(
                fastopen_map(),
                sk.cast(),
                null_mut(),
                u64::from(BPF_SK_STORAGE_GET_F_CREATE),
            );
            if !p.is_null() {
                write_volatile(p.cast::<u32>(), 1);
            }
        } else {
            bpf_sk_storage_delete(fastopen_map(), sk.cast());
        }
    }
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
    p.state = PENDING_CONNECTING;
    count(Counter::KernelMarked);
    true
}

#[inline(always)]
fn relays_map() -> *mut c_void {
    (&raw const HAIRPIN_RELAYS).cast_mut().cast()
}

#[inline(always)]
fn sockets_map() -> *mut c_void {
    (&raw const HAIRPIN_SOCKETS).cast_mut().cast()
}

#[inline(always)]
fn fastopen_map() -> *mut c_void {
    (&raw const HAIRPIN_FASTOPEN).cast_mut().cast()
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
        event!(
            debug,
            "kernel_missed_data_first: data went with the SYN (TCP Fast Open) on a connection to {:i} port {}: no header",
            p.family,
            p.dst,
            p.dst_port
        );
        return;
    }
    if !peer_is_marked_frontend(ops, p) {
        // Disconnected (connect(AF_UNSPEC)) and connected elsewhere after the mark,
        // or rewritten by a connect program after ours: the header named a frontend
        // this connection does not reach.
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
/// not the socket), so a marked connection to the LB reads back the LB address.
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
        return;
    };
    if p.state == PENDING_FIRST_WRITE {
        // SAFETY: context read.
        if unsafe { (*ops).data_segs_out } != 0 {
            // Bytes left that sk_msg never saw, and no RTT sample came to say so.
            count(Counter::KernelMissedDataFirst);
            event!(
                debug,
                "kernel_missed_data_first: a connection to {:i} port {} sent data the header could not go ahead of, and closed: no header",
                p.family,
                p.dst,
                p.dst_port
            );
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
        event!(
            debug,
            "kernel_missed_data_first: a connection to {:i} port {} sent data the header could not go ahead of: no header",
            p.family,
            p.dst,
            p.dst_port
        );
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
        event!(
            debug,
            "kernel_missed_write: the header of a connection to {:i} port {} could not be formatted: no header",
            p.family,
            p.dst,
            p.dst_port
        );
        return SK_PASS;
    }
    // SAFETY: helper calls on this context.
    let pushed = unsafe { bpf_msg_push_data(msg, 0, len, 0) };
    if pushed != 0 {
        count(Counter::KernelMissedPush);
        event!(
            debug,
            "kernel_missed_push: no room for the header of a connection to {:i} port {} (error {}): no header",
            p.family,
            p.dst,
            p.dst_port,
            pushed
        );
        return SK_PASS;
    }
    // The room is a buffer of its own, and TCP pushes each buffer as it goes: with
    // TCP_NODELAY the header would be a segment of its own and the server would read
    // it alone, then wait for the request. So a first write that fits one page
    // (header included; most requests and TLS ClientHellos) is pulled into one
    // buffer with its header, and goes out as the client wrote it. A larger one, or
    // no memory for the page, pulls the room alone (it already is one buffer: no
    // copy), and the header goes ahead as its own segment.
    let size = ctx.size();
    // SAFETY: as above; the pushed room is taken out again when it cannot be filled,
    // so the server never sees uninitialised bytes.
    unsafe {
        let joined = size > len && size <= COALESCE_MAX && bpf_msg_pull_data(msg, 0, size, 0) == 0;
        if (!joined && bpf_msg_pull_data(msg, 0, len, 0) != 0)
            || !copy_header(ctx.data(), ctx.data_end(), p)
        {
            bpf_msg_pop_data(msg, 0, len, 0);
            count(Counter::KernelMissedWrite);
            event!(
                debug,
                "kernel_missed_write: the header of a connection to {:i} port {} could not be copied: no header",
                p.family,
                p.dst,
                p.dst_port
            );
            return SK_PASS;
        }
    }
    count(Counter::KernelHeadersWritten);
    SK_PASS
}

/// Copies the header into the pulled room at `data`, checking every byte against
/// `data_end` as the verifier needs. Unrolled by a macro so that every offset, into
/// the packet and into the storage, is a constant: without CAP_PERFMON the verifier
/// refuses packet pointer arithmetic with a register ("pointer arithmetic with it
/// prohibited for !root"), and would explore a speculative path at every
/// variable-offset access to the storage.
#[inline(always)]
fn copy_header(data: usize, data_end: usize, p: &PendingHeader) -> bool {
    let len = usize::from(p.len);
    macro_rules! bytes {
        ($($i:literal)*) => {$(
            if $i >= len {
                return true;
            }
            if data + $i + 1 > data_end {
                return false;
            }
            // SAFETY: inside [data, data_end), checked just above.
            unsafe { write_volatile((data + $i) as *mut u8, p.header[$i]) };
        )*};
    }
    bytes!(
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
        60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87
        88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111
        112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127
    );
    const _: () = assert!(HEADER_ROOM == 128, "copy_header unrolls HEADER_ROOM bytes");
    true
}

/// Formats the header into `p.header` (length in `p.len`; 0 when it could not be
/// formatted, which sk_msg counts as a miss): src is the socket's own address and
/// port (the node's address instead when that is loopback or the LB address itself,
/// as the relay does), dst the original destination.
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
    let (family, version) = (p.family, p.version);
    p.len = 0;
    // Made in place and never moved: the verifier refuses a dynptr read as plain
    // stack bytes.
    let mut d = MaybeUninit::<bpf_dynptr>::uninit();
    // SAFETY: `p.header` is this socket's storage, valid while the program runs; the
    // dynptr covers exactly its HEADER_ROOM bytes.
    let made = unsafe {
        bpf_dynptr_from_mem(
            (&raw mut p.header).cast(),
            HEADER_ROOM as u32,
            0,
            d.as_mut_ptr(),
        )
    };
    if made != 0 {
        return;
    }
    let mut out = Out {
        d: d.as_ptr(),
        pos: 0,
        ok: true,
    };
    if family == AF_INET {
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
        if version == HEADER_V2 {
            out.v2_prefix(0x11, 12);
            out.word(u64::from(src) | u64::from(dst[0]) << 32, 8);
            out.ports_v2(sport, dport);
        } else {
            out.v1_prefix(true);
            out.ip4(src, b' ');
            out.ip4(dst[0], b' ');
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
        if version == HEADER_V2 {
            out.v2_prefix(0x21, 36);
            out.word(u64::from(src[0]) | u64::from(src[1]) << 32, 8);
            out.word(u64::from(src[2]) | u64::from(src[3]) << 32, 8);
            out.word(u64::from(dst[0]) | u64::from(dst[1]) << 32, 8);
            out.word(u64::from(dst[2]) | u64::from(dst[3]) << 32, 8);
            out.ports_v2(sport, dport);
        } else {
            out.v1_prefix(false);
            out.ip6(src);
            out.word(u64::from(b' '), 1);
            out.ip6(dst);
            out.word(u64::from(b' '), 1);
            out.ports(sport, dport);
        }
    }
    if out.ok {
        // At most 104 bytes (a v1 TCP6 line): the position fits.
        p.len = out.pos as u8;
    }
}

/// Appends to a socket's header through a dynptr over it: every write is a helper
/// call at a position the helper checks, so the verifier sees no pointer arithmetic
/// with a variable offset (which, without CAP_PERFMON, it sanitizes by exploring a
/// speculative path at each one: past its limit for a v6 text line). Bytes go out in
/// words of up to 8, always writing 8 bytes (the next word overwrites the excess;
/// the longest header ends 8 bytes short of [`HEADER_ROOM`] at least).
struct Out {
    /// A dynptr over the header, on the stack of [`format_header`].
    d: *const bpf_dynptr,
    pos: u32,
    ok: bool,
}

impl Out {
    /// The first `n` (at most 8) bytes of `w`, first byte lowest.
    #[inline(always)]
    fn word(&mut self, w: u64, n: u32) {
        let mut buf = w;
        // SAFETY: the dynptr made in `new`, an 8-byte stack buffer; the helper checks
        // the range against the dynptr's size.
        let r = unsafe { bpf_dynptr_write(self.d, self.pos, (&raw mut buf).cast(), 8, 0) };
        self.ok &= r == 0;
        self.pos += n;
    }

    /// `PROXY TCP4 ` or `PROXY TCP6 ` (`four` false) of a v1 line.
    #[inline(always)]
    fn v1_prefix(&mut self, four: bool) {
        self.word(const { pack(b"PROXY TC") }, 8);
        if four {
            self.word(const { pack(b"P4 ") }, 3);
        } else {
            self.word(const { pack(b"P6 ") }, 3);
        }
    }

    /// The 12-byte signature, version 2 / PROXY, the family byte and the address length.
    #[inline(always)]
    fn v2_prefix(&mut self, family: u8, addr_len: u16) {
        self.word(const { pack(b"\r\n\r\n\0\r\nQ") }, 8);
        let [hi, lo] = addr_len.to_be_bytes();
        self.word(
            const { pack(b"UIT\n\x21") }
                | u64::from(family) << 40
                | u64::from(hi) << 48
                | u64::from(lo) << 56,
            8,
        );
    }

    /// The two ports of a v2 header, big-endian.
    #[inline(always)]
    fn ports_v2(&mut self, sport: u16, dport: u16) {
        let [s0, s1] = sport.to_be_bytes();
        let [d0, d1] = dport.to_be_bytes();
        self.word(
            u64::from(s0) | u64::from(s1) << 8 | u64::from(d0) << 16 | u64::from(d1) << 24,
            4,
        );
    }

    /// `SPORT DPORT\r\n`, the end of a v1 line.
    #[inline(always)]
    fn ports(&mut self, sport: u16, dport: u16) {
        let (w, n) = dec(u32::from(sport));
        self.word(w | u64::from(b' ') << (8 * n), n + 1);
        let (w, n) = dec(u32::from(dport));
        self.word(
            w | u64::from(b'\r') << (8 * n) | u64::from(b'\n') << (8 * n + 8),
            n + 2,
        );
    }

    /// Dotted quad of an address in network byte order, then `end`.
    #[inline(always)]
    fn ip4(&mut self, w: u32, end: u8) {
        let o = w.to_ne_bytes();
        for (i, sep) in [(0, b'.'), (1, b'.'), (2, b'.'), (3, end)] {
            let (w, n) = dec(u32::from(o[i]));
            self.word(w | u64::from(sep) << (8 * n), n + 1);
        }
    }

    /// An IPv6 address exactly as Rust's `Ipv6Addr` displays it (which the relay's
    /// header uses): the first longest run of two or more zero groups as `::`.
    /// IPv4-mapped addresses never get here (their header is TCP4). What each group
    /// prints comes from [`ip6_plan`] by the mask of zero groups: one table read
    /// instead of the branches over the runs, which the verifier would walk apart.
    #[inline(always)]
    fn ip6(&mut self, w: [u32; 4]) {
        let g = groups(w);
        let zeros = zero_groups(&g);
        let Some(plan) = plan_of(zeros) else {
            self.ok = false;
            return;
        };
        macro_rules! print_groups {
            ($($i:literal)*) => {$(
                match (plan >> (2 * $i)) & 3 {
                    IP6_GAP => self.word(const { pack(b"::") }, 2),
                    IP6_FIRST => {
                        let (h, n) = hex(g[$i]);
                        self.word(h, n);
                    }
                    IP6_NEXT => {
                        let (h, n) = hex(g[$i]);
                        self.word(u64::from(b':') | h << 8, n + 1);
                    }
                    _ => {}
                }
            )*};
        }
        print_groups!(0 1 2 3 4 5 6 7);
    }
}

/// [`ip6_plan`] of every mask, built at compile time. Writable only so that a dynptr
/// can be made over it: read through a helper, never at a variable offset (which the
/// verifier, without CAP_PERFMON, sanitizes and then stops pruning on scalars for
/// the whole program, `explore_alu_limits`). Nothing writes it.
static mut IP6_PLANS: [u32; 256] = {
    let mut t = [0; 256];
    let mut z = 0;
    while z < 256 {
        t[z] = ip6_plan(z as u32);
        z += 1;
    }
    t
};

/// [`ip6_plan`] of `zeros`, read from [`IP6_PLANS`] (None if the helpers fail).
#[inline(always)]
fn plan_of(zeros: u32) -> Option<u32> {
    let mut d = MaybeUninit::<bpf_dynptr>::uninit();
    let mut plan = 0u32;
    // SAFETY: the table is a global the program owns, valid for its whole run; the
    // dynptr covers exactly it and is read within it, by the helper.
    let read = unsafe {
        bpf_dynptr_from_mem((&raw mut IP6_PLANS).cast(), 256 * 4, 0, d.as_mut_ptr()) == 0
            && bpf_dynptr_read((&raw mut plan).cast(), 4, d.as_ptr(), (zeros & 0xff) * 4, 0) == 0
    };
    read.then_some(plan)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// The kernel reads this section at load: "Dual MIT/GPL" is in its list of
/// GPL-compatible licenses (`license_is_gpl_compatible`), so GPL-only helpers stay
/// available. It matches the crate's `MIT OR GPL-2.0-only`.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
