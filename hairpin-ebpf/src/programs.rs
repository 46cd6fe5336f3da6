use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    bindings::bpf_sock_addr,
    macros::{cgroup_sock_addr, map},
    maps::{HashMap, PerCpuArray},
    programs::SockAddrContext,
};
use hairpin_ebpf::{
    AF_INET, AF_INET6, Counter, DEFAULT_BYPASS_MARK, FrontendKey, MAX_FRONTENDS, Redirect,
};

const SOCK_STREAM: u32 = 1;
const IPPROTO_TCP: u32 = 6;
/// `::ffff:0:0/96` as the third address word, in network byte order.
const V4_MAPPED_WORD: u32 = 0xffff_u32.to_be();

#[map(name = "HAIRPIN_FRONTENDS")]
static HAIRPIN_FRONTENDS: HashMap<FrontendKey, Redirect> =
    HashMap::with_max_entries(MAX_FRONTENDS, 0);

#[map(name = "HAIRPIN_COUNTERS")]
static HAIRPIN_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// Mark on the relay's own upstream sockets; the loader overrides it.
#[unsafe(no_mangle)]
static HAIRPIN_BYPASS_MARK: u32 = DEFAULT_BYPASS_MARK;

#[cgroup_sock_addr(connect4)]
pub fn hairpin_connect4(ctx: SockAddrContext) -> i32 {
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
