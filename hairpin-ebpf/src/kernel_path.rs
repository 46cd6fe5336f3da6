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

/// How many outbound capture ports of mesh proxies the connect programs look for
/// ([`GLOBAL_MESH_PORTS`](crate::GLOBAL_MESH_PORTS)).
pub const MESH_PORTS: usize = 4;
/// The outbound capture ports looked for by default: 15001, where Istio's sidecar
/// (`istio-iptables -p`) and ambient's in-pod ztunnel take a pod's outbound
/// connects (also Consul's, Kuma's and Open Service Mesh's transparent proxies),
/// and 4140, Linkerd's proxy's outbound listener (`proxy-init --outgoing-proxy-port`).
pub const DEFAULT_MESH_PORTS: [u16; MESH_PORTS] = [15001, 4140, 0, 0];

/// `ports` in network byte order, as the connect programs compare them.
pub const fn mesh_ports_be(ports: [u16; MESH_PORTS]) -> [u16; MESH_PORTS] {
    let mut out = [0; MESH_PORTS];
    let mut i = 0;
    while i < MESH_PORTS {
        out[i] = ports[i].to_be();
        i += 1;
    }
    out
}

/// Capacity of [`MAP_MESH_NETNS`](crate::MAP_MESH_NETNS): two entries (IPv4 and
/// IPv6) per network namespace, for a node's pods many times over. Least recently
/// used entries go first: those of namespaces gone.
pub const MESH_NETNS_ENTRIES: u32 = 4096;
/// [`MAP_MESH_NETNS`](crate::MAP_MESH_NETNS) value: the loopback probes of this
/// namespace and family found no capture listener, and no socket has started
/// listening on a capture port there since (connect programs write it, and only
/// where no entry is).
pub const MESH_NETNS_NONE: u32 = 1;
/// [`MAP_MESH_NETNS`](crate::MAP_MESH_NETNS) value: a socket started listening on a
/// capture port in this namespace (sock_ops writes it over any entry): probe.
pub const MESH_NETNS_LISTENS: u32 = 2;

/// The [`MAP_MESH_NETNS`](crate::MAP_MESH_NETNS) key of a network namespace's
/// cookie (`bpf_get_netns_cookie`, a counter from 1 that never nears 2^63) and a
/// probe's family: the IPv4 and IPv6 probes look at different addresses.
pub const fn mesh_netns_key(netns_cookie: u64, v6: bool) -> u64 {
    (netns_cookie << 1) | v6 as u64
}

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

/// [`PendingHeader::flags`]: the mark belongs to the socket's latest connect() call,
/// whatever peer that call reached. Set by connect programs that also clear a
/// [`PENDING_CONNECTING`] mark on every connect they do not mark, so a mark left by a
/// connect() that failed before its handshake (a later connect program refused it,
/// no route, no source port) never outlives that call. sock_ops then writes the
/// header even when a connect program that ran after hairpin's (a socket load
/// balancer) changed the socket's peer to a backend. A mark without it (left by a
/// connect program of an earlier build, which clears nothing) gets its header only
/// when the peer is still the frontend it names. Older sock_ops programs ignore the
/// byte, so both builds read each other's marks during an upgrade or a rollback.
pub const MARK_LATEST_CONNECT: u8 = 1;

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
    /// `MARK_*` bits (zero in marks of builds before [`MARK_LATEST_CONNECT`], whose
    /// byte was padding).
    pub flags: u8,
    /// Always zero.
    pub pad: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn the_pending_header_layout_matches_the_kernel_side() {
        assert_eq!(size_of::<PendingHeader>(), HEADER_ROOM + 24);
        assert_eq!(align_of::<PendingHeader>(), 4);
        // The flags took the first byte of what was padding: every other field keeps
        // its offset, so a pinned storage is read alike by builds before and after.
        assert_eq!(
            core::mem::offset_of!(PendingHeader, state),
            HEADER_ROOM + 20
        );
        assert_eq!(
            core::mem::offset_of!(PendingHeader, flags),
            HEADER_ROOM + 22
        );
        assert!(HEADER_ROOM.is_power_of_two() && HEADER_ROOM >= 108);
    }

    #[test]
    fn a_namespaces_two_families_never_share_a_mesh_key_with_another() {
        let keys = [
            mesh_netns_key(1, false),
            mesh_netns_key(1, true),
            mesh_netns_key(2, false),
            mesh_netns_key(2, true),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_ne!(MESH_NETNS_NONE, MESH_NETNS_LISTENS);
        assert_ne!(MESH_NETNS_NONE, 0, "a zeroed value must not read as none");
    }

    #[test]
    fn the_sockets_limit_keeps_a_margin_and_never_reaches_zero() {
        assert_eq!(sockets_limit(MAX_KERNEL_SOCKETS), 61_440);
        assert_eq!(sockets_limit(1), 1);
        assert_eq!(sockets_limit(16), 15);
    }
}
