//! The relay's stream verdict (`sk_skb`), on `HAIRPIN_SPLICE`: the bytes a spliced
//! relay socket receives go out of its peer (the accepted client's to its upstream,
//! the upstream's to the client) without crossing user space, within the credit
//! the agent grants (`hairpin_ebpf::splice` says why there is one).
//!
//! It runs only on the sockets the agent put in `HAIRPIN_SPLICE`, which are its
//! own relay sockets: no other socket on the node ever meets it. Every chunk is
//! either sent on or left with the socket that received it (`SK_PASS` without a
//! peer: it waits in that socket's receive queue, counted against its buffer, for
//! the agent to read), never dropped here:
//! - sent on while the socket's credit covers it and nothing it left behind is
//!   still unread by the agent (so the two ways never reorder a byte);
//! - left behind otherwise, and when the peer is gone (it closed: the agent then
//!   closes this side too), or the socket's records are missing.

use aya_ebpf::{
    bindings::sk_action::SK_PASS, helpers::bpf_get_socket_cookie, macros::stream_verdict,
    programs::SkBuffContext,
};

use super::maps::{HAIRPIN_CREDIT, HAIRPIN_PEERS, HAIRPIN_REFILL, HAIRPIN_SPLICED};

#[stream_verdict]
pub fn hairpin_splice(ctx: SkBuffContext) -> u32 {
    // SAFETY: the kernel hands a stream verdict a valid skb owned by its socket.
    let mut cookie = unsafe { bpf_get_socket_cookie(ctx.skb.skb.cast()) };
    // The agent writes both records before the socket can run this program.
    let (Some(credit), Some(seen)) = (
        HAIRPIN_CREDIT.get_ptr(&cookie),
        HAIRPIN_SPLICED.get_ptr_mut(&cookie),
    ) else {
        return SK_PASS;
    };
    // SAFETY: map values stay valid while the program runs. The program runs for
    // one socket at a time (under the socket's lock) and is the only writer of
    // `seen`; the agent is the only writer of `credit`.
    let (credit, seen) = unsafe { (&*credit, &mut *seen) };
    let len = u64::from(ctx.len());
    if seen.passed == credit.resume && seen.redirected + len <= credit.limit {
        // SK_PASS (the peer set on the skb) when the peer is in the map.
        if HAIRPIN_PEERS.redirect_skb(&ctx, &mut cookie, 0) == i64::from(SK_PASS) {
            seen.redirected += len;
            if seen.redirected >= credit.low && seen.notified != credit.limit {
                // A full ring only delays the refill: the credit runs out, the
                // bytes stay with the socket and the agent, woken by them, refills.
                if HAIRPIN_REFILL.output::<u64>(&cookie, 0).is_ok() {
                    seen.notified = credit.limit;
                }
            }
            return SK_PASS;
        }
    }
    seen.passed += len;
    SK_PASS
}
