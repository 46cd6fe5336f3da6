//! What several hooks share: the counters, a socket's pending header (the mark the
//! connect programs leave for sock_ops and sk_msg) and the address bytes of the
//! diagnostic events.

use core::ptr::null_mut;

use aya_ebpf::{bindings::bpf_sock, helpers::bpf_sk_storage_get};
use hairpin_ebpf::{Counter, PendingHeader};

use super::maps;

/// The 16 bytes of an IPv6 address held as words in network byte order.
#[inline(always)]
pub(super) fn ip6_octets(w: &[u32; 4]) -> [u8; 16] {
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

/// Adds one to the counter `c` on this CPU.
#[inline(always)]
pub(super) fn count(c: Counter) {
    if let Some(v) = maps::HAIRPIN_COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *v += 1 };
    }
}

/// The socket's storage, if connect marked it. One lookup in the socket's own
/// (usually empty) storage list: the cost every other socket pays.
#[inline(always)]
pub(super) fn pending_of(sk: *mut bpf_sock) -> Option<&'static mut PendingHeader> {
    if sk.is_null() {
        // A callback without a full socket (sock_ops may have none): no storage.
        return None;
    }
    // SAFETY: `sk` is a socket the kernel handed this program; no create flag.
    let p = unsafe { bpf_sk_storage_get(maps::pending_map(), sk.cast(), null_mut(), 0) };
    // SAFETY: non-null storage stays valid while the program runs.
    unsafe { p.cast::<PendingHeader>().as_mut() }
}
