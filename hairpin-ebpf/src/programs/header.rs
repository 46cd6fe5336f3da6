//! The PROXY header of a kernel-path socket, formatted by sock_ops into the socket's
//! storage once its handshake is done (when its own address and port are known):
//! v1 text or v2 binary, byte for byte what the relay writes. Written so the
//! verifier walks one path: every write through a dynptr helper at a checked
//! position, the text pieces branch-free (`hairpin_ebpf::text`).

use core::{mem::MaybeUninit, ptr::read_volatile};

use aya_ebpf::{
    bindings::{bpf_dynptr, bpf_sock_ops},
    helpers::{bpf_dynptr_from_mem, bpf_dynptr_read, bpf_dynptr_write},
};
use hairpin_ebpf::{
    AF_INET, AF_INET6, HEADER_ROOM, HEADER_V2, PendingHeader,
    text::{IP6_FIRST, IP6_GAP, IP6_NEXT, dec, groups, hex, ip6_plan, pack, zero_groups},
};

use super::maps;

/// Formats the header into `p.header` (length in `p.len`; 0 when it could not be
/// formatted, which sk_msg counts as a miss): src is the socket's own address and
/// port (the node's address instead when that is loopback or the LB address itself,
/// as the relay does), dst the original destination.
#[inline(always)]
pub(super) fn format_header(ops: *mut bpf_sock_ops, p: &mut PendingHeader) {
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
        // No dynptr, no header: `p.len` stays 0, which sk_msg counts as a miss.
        return;
    }
    // The IPv6 text's plans, read through a dynptr made here, once: Linux 6.1's
    // verifier refuses to make a dynptr where one was made before on the same path
    // ("Dynptr has to be an uninitialized dynptr", fixed in 6.3), and a dynptr made
    // per address would reuse its stack slot for the second address of a line.
    let mut plans = MaybeUninit::<bpf_dynptr>::uninit();
    // SAFETY: the table is a global the program owns, valid for its whole run; the
    // dynptr covers exactly it and is only ever read within it, by the helper.
    let plans_made = unsafe {
        bpf_dynptr_from_mem(
            (&raw mut IP6_PLANS).cast(),
            IP6_PLANS_SIZE,
            0,
            plans.as_mut_ptr(),
        )
    } == 0;
    let mut out = Out {
        d: d.as_ptr(),
        plans: plans.as_ptr(),
        plans_made,
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
            let node = unsafe { read_volatile(&maps::HAIRPIN_NODE_IP4) };
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
                    read_volatile(&maps::HAIRPIN_NODE_IP6[0]),
                    read_volatile(&maps::HAIRPIN_NODE_IP6[1]),
                    read_volatile(&maps::HAIRPIN_NODE_IP6[2]),
                    read_volatile(&maps::HAIRPIN_NODE_IP6[3]),
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
    /// A dynptr over [`IP6_PLANS`], on the stack of [`format_header`].
    plans: *const bpf_dynptr,
    /// Whether `plans` was made.
    plans_made: bool,
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

    /// [`ip6_plan`] of `zeros`, read from [`IP6_PLANS`] (None if the helpers fail).
    #[inline(always)]
    fn plan_of(&self, zeros: u32) -> Option<u32> {
        if !self.plans_made {
            return None;
        }
        let mut plan = 0u32;
        // SAFETY: the dynptr made in `format_header` over the table, read within it
        // by the helper into a stack word.
        let read = unsafe {
            bpf_dynptr_read((&raw mut plan).cast(), 4, self.plans, (zeros & 0xff) * 4, 0)
        };
        (read == 0).then_some(plan)
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
        let Some(plan) = self.plan_of(zeros) else {
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

/// The size of [`IP6_PLANS`] in bytes.
const IP6_PLANS_SIZE: u32 = 256 * 4;
