//! The counters: the indices of [`MAP_COUNTERS`](crate::MAP_COUNTERS), one per
//! thing the programs do or skip, and their stable names for `status`, `dump` and
//! metrics. An index is part of the pinned layout.

/// Indices into [`MAP_COUNTERS`](crate::MAP_COUNTERS).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Connects rewritten to a relay slot.
    Redirected = 0,
    /// Connects to a proxied frontend left alone because the socket carries the bypass mark
    /// (the relay's own upstream connections).
    SkippedBypassMark = 1,
    /// Connects to a kernel-path frontend marked for an in-kernel header.
    KernelMarked = 2,
    /// Headers the kernel path wrote ahead of a socket's first bytes.
    KernelHeadersWritten = 3,
    /// Connects to a kernel-path frontend that could not be marked (no socket
    /// storage): rewritten to the relay listener instead, which writes the header.
    KernelFallbackRelay = 4,
    /// Established marked sockets that could not enter [`MAP_SOCKETS`](crate::MAP_SOCKETS) (full, or a
    /// socket the map refuses): their connection has no header.
    KernelMissedInsert = 5,
    /// Marked sockets whose first bytes left before the header could be put ahead of
    /// them (TCP Fast Open, a send() queued while connecting): no header.
    KernelMissedDataFirst = 6,
    /// First writes where inserting room for the header failed (memory): no header.
    KernelMissedPush = 7,
    /// First writes where the room was made but the header could not be copied into
    /// it; the room is taken out again: no header.
    KernelMissedWrite = 8,
    /// Connects to a kernel-path frontend from an MPTCP subflow (a sockhash refuses
    /// it, so the kernel could not write its header): sent to the relay listener
    /// instead, which it reaches as plain TCP.
    KernelFallbackMptcp = 9,
    /// Connects to a kernel-path frontend while [`MAP_SOCKETS`](crate::MAP_SOCKETS) holds its limit
    /// ([`sockets_limit`](crate::sockets_limit)): sent to the relay listener instead.
    KernelFallbackFull = 10,
    /// Sockets that entered [`MAP_SOCKETS`](crate::MAP_SOCKETS).
    KernelSocketsEntered = 11,
    /// Sockets that left [`MAP_SOCKETS`](crate::MAP_SOCKETS) (header out, or closed); the map holds the
    /// difference from [`Counter::KernelSocketsEntered`].
    KernelSocketsLeft = 12,
    /// Connects to a kernel-path frontend from a socket that asked for TCP Fast Open
    /// (TCP_FASTOPEN_CONNECT; with CAP_PERFMON also `sendto(MSG_FASTOPEN)`), whose
    /// first bytes could ride on the SYN ahead of any header: sent to the relay
    /// listener instead, which takes no SYN data, so they follow the handshake.
    KernelFallbackFastOpen = 13,
    /// Connects to a proxied frontend left alone because no agent has written the
    /// heartbeat within its TTL (the agent is gone and none took its place): they go
    /// as before hairpin.
    Expired = 14,
    /// Connects that would go to a relay listener that is not listening (no agent,
    /// or its relay is down): left alone, they go as before hairpin.
    RelayDown = 15,
    /// Marks given up because the socket connected elsewhere: a marked socket whose
    /// handshake never came (a connect program after hairpin's refused the connect,
    /// or TCP failed it before its SYN) connecting again without a mark, or, for a
    /// mark left by a connect program of an earlier build, a peer at the end of the
    /// handshake that is not the frontend it names. No header.
    KernelSkippedElsewhere = 16,
    /// Connects to a kernel-path frontend from a network namespace where a mesh
    /// proxy listens on its outbound capture port (Istio's and ztunnel's 15001,
    /// Linkerd's 4140; [`GLOBAL_MESH_PORTS`](crate::GLOBAL_MESH_PORTS)): such a
    /// connect is usually redirected into the proxy, which dials the LB again, so a
    /// header on the client's own socket would reach the proxy and the LB would get
    /// a second one. Sent to the relay listener instead, which the proxy then dials:
    /// one header, from the relay.
    KernelFallbackMesh = 17,
    /// Connects that would go to a relay slot left alone because it did not check
    /// out: the slot does not name the frontend dialled (or is retired), the
    /// frontend has none (a kernel-path frontend live without a slot:
    /// [`SlotRef::NONE`](crate::SlotRef::NONE)), or the socket in the relay's
    /// listener map lacks the bypass mark or a privileged port, so it is none of
    /// the agent's listeners. They go as before hairpin.
    RelayUnverified = 18,
    /// Connects to a kernel-path frontend whose network namespace is known to have
    /// no mesh capture listener ([`MAP_MESH_NETNS`](crate::MAP_MESH_NETNS)): the
    /// loopback probes behind [`Counter::KernelFallbackMesh`] were skipped.
    KernelMeshCached = 19,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 20] = [
        Counter::Redirected,
        Counter::SkippedBypassMark,
        Counter::KernelMarked,
        Counter::KernelHeadersWritten,
        Counter::KernelFallbackRelay,
        Counter::KernelMissedInsert,
        Counter::KernelMissedDataFirst,
        Counter::KernelMissedPush,
        Counter::KernelMissedWrite,
        Counter::KernelFallbackMptcp,
        Counter::KernelFallbackFull,
        Counter::KernelSocketsEntered,
        Counter::KernelSocketsLeft,
        Counter::KernelFallbackFastOpen,
        Counter::Expired,
        Counter::RelayDown,
        Counter::KernelSkippedElsewhere,
        Counter::KernelFallbackMesh,
        Counter::RelayUnverified,
        Counter::KernelMeshCached,
    ];
    /// Length of [`MAP_COUNTERS`](crate::MAP_COUNTERS).
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// Stable snake_case name, for `status`, `dump` and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Redirected => "redirected",
            Counter::SkippedBypassMark => "skipped_bypass_mark",
            Counter::KernelMarked => "kernel_marked",
            Counter::KernelHeadersWritten => "kernel_headers_written",
            Counter::KernelFallbackRelay => "kernel_fallback_relay",
            Counter::KernelMissedInsert => "kernel_missed_insert",
            Counter::KernelMissedDataFirst => "kernel_missed_data_first",
            Counter::KernelMissedPush => "kernel_missed_push",
            Counter::KernelMissedWrite => "kernel_missed_write",
            Counter::KernelFallbackMptcp => "kernel_fallback_mptcp",
            Counter::KernelFallbackFull => "kernel_fallback_full",
            Counter::KernelSocketsEntered => "kernel_sockets_entered",
            Counter::KernelSocketsLeft => "kernel_sockets_left",
            Counter::KernelFallbackFastOpen => "kernel_fallback_fastopen",
            Counter::Expired => "expired",
            Counter::RelayDown => "relay_down",
            Counter::KernelSkippedElsewhere => "kernel_skipped_elsewhere",
            Counter::KernelFallbackMesh => "kernel_fallback_mesh",
            Counter::RelayUnverified => "relay_unverified",
            Counter::KernelMeshCached => "kernel_mesh_cached",
        }
    }

    /// True for the counters of a connection the kernel path left without its header.
    pub const fn is_kernel_miss(self) -> bool {
        matches!(
            self,
            Counter::KernelMissedInsert
                | Counter::KernelMissedDataFirst
                | Counter::KernelMissedPush
                | Counter::KernelMissedWrite
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_missed_counters_are_misses() {
        for c in Counter::ALL {
            assert_eq!(
                c.is_kernel_miss(),
                c.name().starts_with("kernel_missed_"),
                "{}",
                c.name()
            );
        }
    }

    #[test]
    fn counter_indices_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as u32, i as u32, "{}", c.name());
        }
    }
}
