//! The pieces of a v1 header's text, as the kernel path's sock_ops program formats
//! them: in words of up to 8 bytes (first byte lowest), without branches where a
//! branch would multiply what the verifier walks. Shared with the host, where the
//! tests hold them to Rust's own formatting.

/// The eight 16-bit groups of an address in network byte order.
#[inline(always)]
pub fn groups(w: [u32; 4]) -> [u16; 8] {
    let [a, b, c, d] = w.map(u32::to_ne_bytes);
    [
        u16::from_be_bytes([a[0], a[1]]),
        u16::from_be_bytes([a[2], a[3]]),
        u16::from_be_bytes([b[0], b[1]]),
        u16::from_be_bytes([b[2], b[3]]),
        u16::from_be_bytes([c[0], c[1]]),
        u16::from_be_bytes([c[2], c[3]]),
        u16::from_be_bytes([d[0], d[1]]),
        u16::from_be_bytes([d[2], d[3]]),
    ]
}

/// [`ip6_plan`]: a group inside the `::` run after its first, printed as nothing.
pub const IP6_SKIP: u32 = 0;
/// [`ip6_plan`]: the first group of the `::` run, printed as `::`.
pub const IP6_GAP: u32 = 1;
/// [`ip6_plan`]: a group printed in hex with no `:` before it (the first group, or
/// the one right after `::`).
pub const IP6_FIRST: u32 = 2;
/// [`ip6_plan`]: a group printed as `:` and hex.
pub const IP6_NEXT: u32 = 3;

/// How each group of an IPv6 address whose zero groups are the bits of `zeros`
/// (bit i: group i is 0) prints as Rust's `Ipv6Addr` displays it: two bits per
/// group, group i at bits 2i, one of the `IP6_*` values. The programs read it from a
/// table built with this at compile time.
#[inline(always)]
pub const fn ip6_plan(zeros: u32) -> u32 {
    // The first longest run of zero groups.
    let (mut start, mut len, mut cur_start, mut cur_len) = (0, 0, 0, 0);
    let mut i = 0;
    while i < 8 {
        if (zeros >> i) & 1 == 1 {
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
        i += 1;
    }
    if len < 2 {
        len = 0;
    }
    let mut plan = 0;
    let mut i = 0;
    while i < 8 {
        let how = if len > 0 && i >= start && i < start + len {
            if i == start { IP6_GAP } else { IP6_SKIP }
        } else if i > 0 && !(len > 0 && i == start + len) {
            IP6_NEXT
        } else {
            IP6_FIRST
        };
        plan |= how << (2 * i);
        i += 1;
    }
    plan
}

/// Up to 8 bytes as a word, first byte lowest (for constants).
pub const fn pack(s: &[u8]) -> u64 {
    let mut w = 0;
    let mut i = 0;
    while i < s.len() && i < 8 {
        w |= (s[i] as u64) << (8 * i);
        i += 1;
    }
    w
}

/// `v` (below 65536) in decimal without leading zeros: its digits, first lowest, and
/// how many there are. Branch-free, so the verifier walks one path.
#[inline(always)]
pub fn dec(v: u32) -> (u64, u32) {
    let v = v & 0xffff;
    let digits = u64::from(v / 10_000)
        | u64::from(v / 1_000 % 10) << 8
        | u64::from(v / 100 % 10) << 16
        | u64::from(v / 10 % 10) << 24
        | u64::from(v % 10) << 32;
    // 1 + (v >= 10) + (v >= 100) + ..., each as the carry into bit 17.
    let n = 1
        + ((v + (0x2_0000 - 10)) >> 17)
        + ((v + (0x2_0000 - 100)) >> 17)
        + ((v + (0x2_0000 - 1_000)) >> 17)
        + ((v + (0x2_0000 - 10_000)) >> 17);
    ((digits + 0x30_3030_3030) >> (8 * (5 - n)), n)
}

/// `v` in lowercase hex without leading zeros (Rust's `{:x}`), as [`dec`].
#[inline(always)]
pub fn hex(v: u16) -> (u64, u32) {
    let v = u32::from(v);
    let nibbles = (v >> 12) | ((v >> 8) & 0xf) << 8 | ((v >> 4) & 0xf) << 16 | (v & 0xf) << 24;
    // '0' + d, and 'a' - '0' - 10 more for the nibbles above 9 (carry into bit 4).
    let chars = nibbles + 0x3030_3030 + (((nibbles + 0x0606_0606) >> 4) & 0x0101_0101) * 39;
    let n = 1 + ((v + 0xfff0) >> 16) + ((v + 0xff00) >> 16) + ((v + 0xf000) >> 16);
    (u64::from(chars >> (8 * (4 - n))), n)
}

/// The zero groups of `g` as bits (bit i: group i is 0), without a branch.
#[inline(always)]
pub fn zero_groups(g: &[u16; 8]) -> u32 {
    let mut zeros = 0;
    macro_rules! bits {
        ($($i:literal)*) => {$(
            zeros |= ((u32::from(g[$i]).wrapping_sub(1) >> 31) & 1) << $i;
        )*};
    }
    bits!(0 1 2 3 4 5 6 7);
    zeros
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    /// A v1 TCP6 address as sock_ops writes it: the words of this module laid end to end.
    fn ip6_text(ip: core::net::Ipv6Addr) -> std::string::String {
        let o = ip.octets();
        let w = core::array::from_fn(|i| {
            u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
        });
        let g = groups(w);
        let plan = ip6_plan(zero_groups(&g));
        let mut out = std::vec::Vec::new();
        let mut put = |w: u64, n: u32| out.extend_from_slice(&w.to_le_bytes()[..n as usize]);
        for (i, v) in g.iter().enumerate() {
            match (plan >> (2 * i)) & 3 {
                IP6_GAP => put(pack(b"::"), 2),
                IP6_FIRST => {
                    let (h, n) = hex(*v);
                    put(h, n);
                }
                IP6_NEXT => {
                    let (h, n) = hex(*v);
                    put(u64::from(b':') | h << 8, n + 1);
                }
                _ => {}
            }
        }
        std::string::String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn the_kernels_text_pieces_match_rusts_formatting() {
        extern crate std;
        use std::format;
        for v in 0..=u16::MAX {
            let (w, n) = dec(u32::from(v));
            assert_eq!(&w.to_le_bytes()[..n as usize], format!("{v}").as_bytes());
            let (w, n) = hex(v);
            assert!(n <= 4 && (n == 4 || w >> (8 * n) == 0), "{v:x}");
            assert_eq!(&w.to_le_bytes()[..n as usize], format!("{v:x}").as_bytes());
        }
        // Every pattern of zero groups, with non-zero groups of every width.
        for zeros in 0..256u32 {
            for fill in [1u16, 0xa, 0x1f, 0xbeef, 0xffff] {
                let mut g = [0u16; 8];
                for (i, x) in g.iter_mut().enumerate() {
                    if (zeros >> i) & 1 == 0 {
                        *x = fill.wrapping_add(i as u16) | 1;
                    }
                }
                let ip = core::net::Ipv6Addr::from(g);
                if ip.to_ipv4_mapped().is_some() {
                    // Rust prints these with a dotted quad; their header is TCP4.
                    continue;
                }
                assert_eq!(ip6_text(ip), format!("{ip}"), "{g:x?}");
            }
        }
    }
}
