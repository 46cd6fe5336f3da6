//! What the kernel path's programs share about a marked socket: its pending header
//! (socket-local storage) and its states, the room for the header, how full the
//! sockets map may get, and the TCP options the programs read or watch.

/// `SOL_TCP`/`IPPROTO_TCP`, the level of TCP's socket options.
pub const SOL_TCP: i32 = 6;
/// `TCP_FASTOPEN_CONNECT`: connect() defers the SYN to the first write, which then
/// rides on it when the client holds a Fast Open cookie.
pub const TCP_FASTOPEN_CONNECT: i32 = 30;
/// `TCP_NOTSENT_LOWAT`: on an MPTCP subflow the kernel sets it to `u32::MAX` (the
/// subflow's own queue is never the limit), on a plain TCP socket it reads 0 until
/// the application sets it. The connect programs read it to tell an MPTCP subflow
/// without CAP_PERFMON (Linux 6.7 or newer; a test pins the behaviour).
pub const TCP_NOTSENT_LOWAT: i32 = 25;
/// Default capacity of [`MAP_SOCKETS`](crate::MAP_SOCKETS). A socket stays in it from the end of its
/// handshake until the first acknowledgement after its first write, so this bounds
/// the connections being opened at once, not the connections open.
pub const MAX_KERNEL_SOCKETS: u32 = 65_536;
/// The fill of a sockets map of `capacity` at which new connects go to the relay:
/// a sixteenth is kept for sockets marked but still connecting (not in the map yet,
/// not counted), so the map is never found full at the end of a handshake unless
/// that many connect at once; those are still counted as `kernel_missed_insert`.
pub const fn sockets_limit(capacity: u32) -> u32 {
    capacity - capacity / 16
}
/// Room for one header in [`PendingHeader::header`]: the longest v1 line is 104
/// bytes, v2 over IPv6 is 52. A power of two, so the programs can bound every
/// write position with a mask the verifier understands.
pub const HEADER_ROOM: usize = 128;
/// The largest first write, header included, that sk_msg joins with its header into
/// one buffer (one page: `bpf_msg_pull_data` copies whole buffers into a new
/// allocation of that size). Pushed room is a buffer of its own, and TCP sends each
/// buffer with its own push: with TCP_NODELAY the header would leave as a segment of
/// its own, ahead of the request, and the server would read the header alone.
pub const COALESCE_MAX: u32 = 4096;

/// [`PendingHeader::state`]: nothing to do (not marked, or done).
pub const PENDING_NONE: u8 = 0;
/// [`PendingHeader::state`]: marked at connect, waiting for the handshake to finish.
pub const PENDING_CONNECTING: u8 = 1;
/// [`PendingHeader::state`]: established and in [`MAP_SOCKETS`](crate::MAP_SOCKETS) with its header
/// formatted, waiting for the first write.
pub const PENDING_FIRST_WRITE: u8 = 2;
/// [`PendingHeader::state`]: the header went out; the socket leaves [`MAP_SOCKETS`](crate::MAP_SOCKETS)
/// at its next RTT callback.
pub const PENDING_WRITTEN: u8 = 3;

/// Value of [`MAP_PENDING`](crate::MAP_PENDING), socket-local storage of a socket marked for the kernel
/// path: what its header needs, and the header once formatted.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingHeader {
    /// The header's bytes (the first [`PendingHeader::len`] of them), formatted when
    /// the handshake finishes, when the socket's own address and port are known.
    pub header: [u8; HEADER_ROOM],
    /// The original destination (the LB address) in network byte order, IPv4 in word
    /// 0 (also for an IPv4-mapped connect6).
    pub dst: [u32; 4],
    /// The original destination port in network byte order.
    pub dst_port: u16,
    /// [`AF_INET`](crate::AF_INET) or [`AF_INET6`](crate::AF_INET6): the header's family (TCP4 or TCP6).
    pub family: u8,
    /// [`HEADER_V1`](crate::HEADER_V1) or [`HEADER_V2`](crate::HEADER_V2).
    pub version: u8,
    /// One of the `PENDING_*` states.
    pub state: u8,
    /// Length of the formatted header.
    pub len: u8,
    /// Always zero.
    pub pad: [u8; 2],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn the_pending_header_layout_matches_the_kernel_side() {
        assert_eq!(size_of::<PendingHeader>(), HEADER_ROOM + 24);
        assert_eq!(align_of::<PendingHeader>(), 4);
        assert!(HEADER_ROOM.is_power_of_two() && HEADER_ROOM >= 108);
    }

    #[test]
    fn the_sockets_limit_keeps_a_margin_and_never_reaches_zero() {
        assert_eq!(sockets_limit(MAX_KERNEL_SOCKETS), 61_440);
        assert_eq!(sockets_limit(1), 1);
        assert_eq!(sockets_limit(16), 15);
    }
}
