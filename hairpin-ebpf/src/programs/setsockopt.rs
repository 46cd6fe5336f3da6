//! The cgroup setsockopt program of the kernel path: notes in `HAIRPIN_FASTOPEN`
//! which sockets set TCP_FASTOPEN_CONNECT, so that the connect programs send them to
//! the relay (their first bytes could ride on the SYN, ahead of any header). It
//! never changes or refuses an option.

use core::ptr::{null_mut, read_volatile, write_volatile};

use aya_ebpf::{
    bindings::{BPF_SK_STORAGE_GET_F_CREATE, bpf_sockopt},
    helpers::{bpf_sk_storage_delete, bpf_sk_storage_get},
    macros::cgroup_sockopt,
    programs::SockoptContext,
};
use hairpin_ebpf::{SOL_TCP, TCP_FASTOPEN_CONNECT};

use super::maps::fastopen_map;

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
            // The value's bytes are not in what the program sees (the verifier's bound):
            // the option goes as asked, unmarked.
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
