//! What the relay's splice shares with its stream-verdict program: the size of its
//! socket maps and the two per-socket records of its flow control. The maps hold
//! the relay's own sockets only (an accepted client and its upstream, each pair
//! put there by the agent after the header went out) and belong to the running
//! agent: never pinned, they go with it, as the relayed connections do.
//!
//! Flow control: a redirect queues the bytes on the peer's socket without any
//! limit of the kernel's own (they are taken off the receiving socket's buffer at
//! once, and wait, unaccounted, for the peer's send buffer). So the program
//! redirects only within a credit the agent grants per receiving socket
//! ([`SpliceCredit::limit`]): past it, it leaves the bytes with the receiving
//! socket (its receive buffer fills and TCP's own window stops the sender), where
//! the agent reads and writes them itself once the peer has taken the rest. A
//! granted credit is at most a window beyond what the peer has sent, so a spliced
//! direction holds at most one window in the kernel beyond its sockets' buffers.

/// Default capacity of [`MAP_SPLICE`](crate::MAP_SPLICE) and
/// [`MAP_SPLICE_PEERS`](crate::MAP_SPLICE_PEERS): two sockets per relayed
/// connection. The loader sizes both for the relay's connection cap; a full map
/// leaves a connection to the relay's copy, never refused.
pub const MAX_SPLICE_SOCKETS: u32 = 32_768;

/// Bytes of the refill ring buffer: 8 bytes (a socket cookie) plus the ring's
/// 8-byte record header per request, so room for 8,192 requests in flight; a
/// request that finds it full is not lost work, only a later refill (see
/// [`SpliceSeen::notified`]).
pub const SPLICE_REFILL_BYTES: u32 = 128 * 1024;

/// What the agent grants a spliced socket, on the socket itself (socket storage
/// [`MAP_SPLICE_CREDIT`](crate::MAP_SPLICE_CREDIT)); written by the agent only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpliceCredit {
    /// The program redirects a received chunk only while
    /// [`SpliceSeen::redirected`] stays within it, counting the chunk.
    pub limit: u64,
    /// Once [`SpliceSeen::redirected`] reaches it, the program asks for a refill
    /// (once per limit).
    pub low: u64,
    /// The program redirects only while [`SpliceSeen::passed`] equals it: every
    /// byte it left with the socket has been read, and written to the peer, by the
    /// agent. Bytes are therefore never reordered between the two ways.
    pub resume: u64,
}

/// What the program did with a spliced socket's received bytes, on the socket
/// itself (socket storage [`MAP_SPLICE_SEEN`](crate::MAP_SPLICE_SEEN)); written
/// by the program only (created by it with its first chunk).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpliceSeen {
    /// Bytes sent on to the peer.
    pub redirected: u64,
    /// Bytes left with the socket for the agent to read (past the credit, or with
    /// the peer gone).
    pub passed: u64,
    /// The [`SpliceCredit::limit`] for which a refill was last asked for: one
    /// request per limit, however many chunks arrive meanwhile.
    pub notified: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_records_keep_their_layout() {
        assert_eq!(core::mem::size_of::<SpliceCredit>(), 24);
        assert_eq!(core::mem::size_of::<SpliceSeen>(), 24);
    }
}
