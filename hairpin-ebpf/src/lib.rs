//! Types and names shared by hairpin's kernel programs and the agent.
//!
//! Everything here is `#[repr(C)]` and laid out identically on both sides of the
//! BPF map boundary; the sizes are asserted in the tests below so a change on
//! one side cannot silently misread the other.
#![no_std]

use core::net::{IpAddr, SocketAddr};

/// ELF name of the cgroup/connect4 program.
pub const PROG_CONNECT4: &str = "hairpin_connect4";
/// ELF name of the cgroup/connect6 program.
pub const PROG_CONNECT6: &str = "hairpin_connect6";
/// ELF name of the frontend map: [`FrontendKey`] -> [`Redirect`].
pub const MAP_FRONTENDS: &str = "HAIRPIN_FRONTENDS";
/// ELF name of the per-CPU counter array, indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "HAIRPIN_COUNTERS";
/// ELF name of the global holding the bypass mark, set by the loader.
pub const GLOBAL_BYPASS_MARK: &str = "HAIRPIN_BYPASS_MARK";

/// ELF name of the cgroup/connect4 program of the kernel path: as [`PROG_CONNECT4`],
/// and a frontend marked for the kernel header leaves the destination alone and marks
/// the socket instead. Loaded instead of [`PROG_CONNECT4`] when the kernel path is on.
/// (The kernel cuts both names to the same 15 bytes, `hairpin_connect`.)
pub const PROG_CONNECT4_KERNEL: &str = "hairpin_connect4_kernel";
/// ELF name of the cgroup/connect6 program of the kernel path (see [`PROG_CONNECT4_KERNEL`]).
pub const PROG_CONNECT6_KERNEL: &str = "hairpin_connect6_kernel";
/// ELF name of the cgroup/connect4 program of the kernel path that also sends to the
/// relay what only CAP_PERFMON's helpers can see at connect: MPTCP subflows
/// (`bpf_skc_to_mptcp_sock`) and sockets about to send TCP Fast Open data that the
/// setsockopt program did not see (`sendto(MSG_FASTOPEN)`, TCP_FASTOPEN_CONNECT set
/// before it attached), read from `tcp_sock` with `bpf_skc_to_tcp_sock` and
/// `bpf_probe_read_kernel` at offsets the loader finds in the kernel's BTF. Where it
/// does not load (no CAP_PERFMON, or no offsets), [`PROG_CONNECT4_KERNEL`] is loaded
/// instead and those sockets are counted misses.
pub const PROG_CONNECT4_KERNEL_PERFMON: &str = "hairpin_connect4_kernel_perfmon";
/// ELF name of the connect6 twin of [`PROG_CONNECT4_KERNEL_PERFMON`].
pub const PROG_CONNECT6_KERNEL_PERFMON: &str = "hairpin_connect6_kernel_perfmon";
/// ELF name of the cgroup/setsockopt program of the kernel path: records in
/// [`MAP_FASTOPEN`] that a socket set TCP_FASTOPEN_CONNECT, so that the connect
/// programs send it to the relay. It never changes or refuses an option.
pub const PROG_SETSOCKOPT: &str = "hairpin_setsockopt";
/// ELF name of the socket-local storage marking sockets that set
/// TCP_FASTOPEN_CONNECT (a nonzero value; setting it to 0 clears the mark).
pub const MAP_FASTOPEN: &str = "HAIRPIN_FASTOPEN";
/// ELF name of the global holding the byte offset of `fastopen_req` in the running
/// kernel's `struct tcp_sock` (0: unknown), set by the loader from its BTF.
pub const GLOBAL_FASTOPEN_REQ_OFF: &str = "HAIRPIN_FASTOPEN_REQ_OFF";
/// ELF name of the global holding the byte offset in `struct tcp_sock` of the byte
/// holding the `fastopen_connect` bit (0: unknown).
pub const GLOBAL_FASTOPEN_CONNECT_OFF: &str = "HAIRPIN_FASTOPEN_CONNECT_OFF";
/// ELF name of the global holding the `fastopen_connect` bit as a mask of that byte
/// (0: unknown).
pub const GLOBAL_FASTOPEN_CONNECT_MASK: &str = "HAIRPIN_FASTOPEN_CONNECT_MASK";
/// `SOL_TCP`/`IPPROTO_TCP`, the level of TCP's socket options.
pub const SOL_TCP: i32 = 6;
/// `TCP_FASTOPEN_CONNECT`: connect() defers the SYN to the first write, which then
/// rides on it when the client holds a Fast Open cookie.
pub const TCP_FASTOPEN_CONNECT: i32 = 30;
/// ELF name of the sock_ops program: puts established marked sockets in
/// [`MAP_SOCKETS`] and takes them out once their header went out.
pub const PROG_SOCK_OPS: &str = "hairpin_sockops";
/// ELF name of the sk_msg program on [`MAP_SOCKETS`]: writes the header ahead of a
/// marked socket's first bytes.
pub const PROG_SK_MSG: &str = "hairpin_sk_msg";
/// ELF name of the SOCKHASH (socket cookie -> socket) holding established sockets
/// whose header is not written yet.
pub const MAP_SOCKETS: &str = "HAIRPIN_SOCKETS";
/// ELF name of the socket-local storage holding each marked socket's [`PendingHeader`].
pub const MAP_PENDING: &str = "HAIRPIN_PENDING";
/// ELF name of the one-slot array holding how many sockets are in [`MAP_SOCKETS`]
/// now (added to and taken from atomically), which the connect programs compare
/// with [`GLOBAL_SOCKETS_LIMIT`].
pub const MAP_SOCKETS_FILL: &str = "HAIRPIN_FILL";
/// ELF name of the global holding how many sockets [`MAP_SOCKETS`] may hold before
/// the connect programs send new connects to the relay instead: its capacity less a
/// margin for sockets still connecting (see [`sockets_limit`]). Set by the loader.
pub const GLOBAL_SOCKETS_LIMIT: &str = "HAIRPIN_SOCKETS_LIMIT";
/// ELF name of the global holding the node's IPv4 address (network byte order), the
/// header's source for a socket whose own address is loopback or the LB address itself.
pub const GLOBAL_NODE_IP4: &str = "HAIRPIN_NODE_IP4";
/// ELF name of the global holding the node's IPv6 address words (network byte order).
pub const GLOBAL_NODE_IP6: &str = "HAIRPIN_NODE_IP6";

/// ELF name of the dead-man switch: a two-slot array, [`HEARTBEAT_BEAT`] the
/// `CLOCK_MONOTONIC` nanoseconds of the agent's last heartbeat and [`HEARTBEAT_TTL`]
/// how long after it the connect programs still act. Once the heartbeat is older
/// (the agent is gone and none took its place) they leave every connect alone:
/// traffic goes as before hairpin. sock_ops and sk_msg never read it, so a socket
/// marked just before expiry still gets its header.
pub const MAP_HEARTBEAT: &str = "HAIRPIN_HEARTBEAT";
/// [`MAP_HEARTBEAT`] slot of the last heartbeat (`CLOCK_MONOTONIC` ns; 0: never).
pub const HEARTBEAT_BEAT: u32 = 0;
/// [`MAP_HEARTBEAT`] slot of the TTL in nanoseconds.
pub const HEARTBEAT_TTL: u32 = 1;
/// ELF name of the relay's liveness map: a SOCKHASH of the relay's listening
/// sockets by listener address ([`FrontendKey`] encoding). The connect programs send
/// a connect to a listener only while it is in this map; the kernel takes a closed
/// listener out at once, so a dead agent's relay is never a target.
pub const MAP_RELAYS: &str = "HAIRPIN_RELAYS";

/// Version of the layout of everything pinned under the agent's bpf pin directory:
/// the maps' types, key and value layouts, the counters' indices and what the
/// programs expect of each other. The pins live under `v<LAYOUT>`, so an agent of
/// another layout never reuses a map it would misread; bump it with any such change.
pub const PIN_LAYOUT: u32 = 1;

/// `TCP_NOTSENT_LOWAT`: on an MPTCP subflow the kernel sets it to `u32::MAX` (the
/// subflow's own queue is never the limit), on a plain TCP socket it reads 0 until
/// the application sets it. The connect programs read it to tell an MPTCP subflow
/// without CAP_PERFMON (Linux 6.7 or newer; a test pins the behaviour).
pub const TCP_NOTSENT_LOWAT: i32 = 25;

/// Default capacity of [`MAP_SOCKETS`]. A socket stays in it from the end of its
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
/// [`Redirect::header`] of a frontend taking the relay path: connects are rewritten
/// to the relay listener, which writes the header.
pub const HEADER_RELAY: u8 = 0;
/// [`Redirect::header`] of a frontend taking the kernel path with a PROXY v1 header.
pub const HEADER_V1: u8 = 1;
/// [`Redirect::header`] of a frontend taking the kernel path with a PROXY v2 header.
pub const HEADER_V2: u8 = 2;
/// [`Redirect::header`] of a frontend taking the relay path although the kernel path
/// is on, because its server speaks first: the programs treat it as
/// [`HEADER_RELAY`] (every value but [`HEADER_V1`] and [`HEADER_V2`] is the relay);
/// `dump` reads it to say why.
pub const HEADER_RELAY_SERVER_FIRST: u8 = 0x80;
/// [`Redirect::header`] of a frontend taking the relay path although the kernel path
/// is on, because its Service (`hairpin.dev/path: relay`) or frontends-file entry
/// (`path: relay`) asks for it, for a client that hits one of the kernel path's
/// known misses: the programs treat it as [`HEADER_RELAY`]; `dump` reads it to say why.
pub const HEADER_RELAY_CHOSEN: u8 = 0x81;

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

/// Default SO_MARK the relay puts on its upstream sockets so the programs skip them.
///
/// Chosen outside the bits the field already claims on packet marks: kube-proxy's
/// 0x4000 (masquerade) and 0x8000 (drop), Cilium's 0x0F00 magic nibble and
/// Calico's default 0xffff0000 mask.
pub const DEFAULT_BYPASS_MARK: u32 = 0x68;

/// Capacity of [`MAP_FRONTENDS`]: the number of (LB IP, port) pairs one node can proxy.
pub const MAX_FRONTENDS: u32 = 65_536;

/// `AF_INET`, as the kernel spells it in `bpf_sock_addr.user_family`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;

/// Key of [`MAP_FRONTENDS`]: one proxied frontend, a LoadBalancer IP and TCP port.
///
/// The address words and the port are kept in network byte order, exactly as the
/// kernel hands them to the program in `bpf_sock_addr`, so the connect path does
/// no conversions. An IPv4 address occupies `addr[0]`; the other words are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrontendKey {
    /// Address words in network byte order.
    pub addr: [u32; 4],
    /// TCP port in network byte order.
    pub port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u8,
    /// Always zero; makes the padding explicit so keys hash identically on both sides.
    pub pad: u8,
}

/// Value of [`MAP_FRONTENDS`]: the node-local relay listener a connect is rewritten
/// to, and whether the kernel writes the header instead.
///
/// Same encoding as [`FrontendKey`]. The family may differ from the key's only for
/// IPv4-mapped IPv6 connects, which are rewritten to the IPv4-mapped listener.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Redirect {
    /// Listener address words in network byte order.
    pub addr: [u32; 4],
    /// Listener TCP port in network byte order.
    pub port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u8,
    /// [`HEADER_RELAY`] (the listener writes the header), or [`HEADER_V1`] /
    /// [`HEADER_V2`]: the kernel path's connect programs leave the destination alone
    /// and the header is written on the client's own socket. The listener stays the
    /// fallback for a socket the kernel path cannot take. The plain connect programs
    /// ignore this byte.
    pub header: u8,
}

/// [`PendingHeader::state`]: nothing to do (not marked, or done).
pub const PENDING_NONE: u8 = 0;
/// [`PendingHeader::state`]: marked at connect, waiting for the handshake to finish.
pub const PENDING_CONNECTING: u8 = 1;
/// [`PendingHeader::state`]: established and in [`MAP_SOCKETS`] with its header
/// formatted, waiting for the first write.
pub const PENDING_FIRST_WRITE: u8 = 2;
/// [`PendingHeader::state`]: the header went out; the socket leaves [`MAP_SOCKETS`]
/// at its next RTT callback.
pub const PENDING_WRITTEN: u8 = 3;

/// Value of [`MAP_PENDING`], socket-local storage of a socket marked for the kernel
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
    /// [`AF_INET`] or [`AF_INET6`]: the header's family (TCP4 or TCP6).
    pub family: u8,
    /// [`HEADER_V1`] or [`HEADER_V2`].
    pub version: u8,
    /// One of the `PENDING_*` states.
    pub state: u8,
    /// Length of the formatted header.
    pub len: u8,
    /// Always zero.
    pub pad: [u8; 2],
}

/// An address as the programs see it in `bpf_sock_addr`: address words and port in
/// network byte order, and the family. An IPv4 address occupies word 0.
fn encode(a: SocketAddr) -> ([u32; 4], u16, u8) {
    let port = a.port().to_be();
    match a.ip() {
        IpAddr::V4(ip) => ([u32::from_ne_bytes(ip.octets()), 0, 0, 0], port, AF_INET),
        IpAddr::V6(ip) => {
            let o = ip.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], port, AF_INET6)
        }
    }
}

/// The inverse of [`encode`].
fn decode(addr: [u32; 4], port: u16, family: u8) -> SocketAddr {
    let port = u16::from_be(port);
    if family == AF_INET {
        SocketAddr::from((addr[0].to_ne_bytes(), port))
    } else {
        let mut o = [0u8; 16];
        for (i, w) in addr.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        SocketAddr::from((o, port))
    }
}

impl FrontendKey {
    /// The key for the frontend `a` (LoadBalancer IP and TCP port).
    pub fn new(a: SocketAddr) -> FrontendKey {
        let (addr, port, family) = encode(a);
        FrontendKey {
            addr,
            port,
            family,
            pad: 0,
        }
    }

    /// The frontend this key names.
    pub fn socket_addr(&self) -> SocketAddr {
        decode(self.addr, self.port, self.family)
    }
}

impl Redirect {
    /// The value that rewrites a connect to the listener `a`.
    pub fn new(a: SocketAddr) -> Redirect {
        let (addr, port, family) = encode(a);
        Redirect {
            addr,
            port,
            family,
            header: HEADER_RELAY,
        }
    }

    /// The value for a kernel-path frontend: the kernel writes a `header`
    /// ([`HEADER_V1`] or [`HEADER_V2`]) on the client's socket; a socket the kernel
    /// path cannot take is still rewritten to the listener `a`.
    pub fn kernel(a: SocketAddr, header: u8) -> Redirect {
        Redirect {
            header,
            ..Redirect::new(a)
        }
    }

    /// The value for a frontend whose server speaks first, with the kernel path on:
    /// the relay path, saying why.
    pub fn server_first(a: SocketAddr) -> Redirect {
        Redirect {
            header: HEADER_RELAY_SERVER_FIRST,
            ..Redirect::new(a)
        }
    }

    /// The value for a frontend that asks for the relay (`hairpin.dev/path:
    /// relay`), with the kernel path on: the relay path, saying why.
    pub fn relay_chosen(a: SocketAddr) -> Redirect {
        Redirect {
            header: HEADER_RELAY_CHOSEN,
            ..Redirect::new(a)
        }
    }

    /// The listener this value rewrites to.
    pub fn socket_addr(&self) -> SocketAddr {
        decode(self.addr, self.port, self.family)
    }

    /// Whether the kernel path's connect programs mark sockets for this frontend
    /// (an in-kernel header) rather than rewrite them to the listener. Any value
    /// but the two versions is the relay: when in doubt, relay.
    pub const fn is_kernel(&self) -> bool {
        self.header == HEADER_V1 || self.header == HEADER_V2
    }
}

/// Indices into [`MAP_COUNTERS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Connects rewritten to a relay listener.
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
    /// Established marked sockets that could not enter [`MAP_SOCKETS`] (full, or a
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
    /// Connects to a kernel-path frontend while [`MAP_SOCKETS`] holds its limit
    /// ([`sockets_limit`]): sent to the relay listener instead.
    KernelFallbackFull = 10,
    /// Sockets that entered [`MAP_SOCKETS`].
    KernelSocketsEntered = 11,
    /// Sockets that left [`MAP_SOCKETS`] (header out, or closed); the map holds the
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
    /// Marked sockets whose peer at the end of the handshake is not the frontend
    /// they were marked for (disconnected with `AF_UNSPEC` and connected elsewhere,
    /// or rewritten by another connect program): no header.
    KernelSkippedElsewhere = 16,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 17] = [
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
    ];
    /// Length of [`MAP_COUNTERS`].
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

/// The pieces of a v1 header's text, as the kernel path's sock_ops program formats
/// them: in words of up to 8 bytes (first byte lowest), without branches where a
/// branch would multiply what the verifier walks. Shared with the host, where the
/// tests hold them to Rust's own formatting.
pub mod text {
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
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, #[repr(C)], every bit pattern valid, explicit padding.
    unsafe impl aya::Pod for super::FrontendKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Redirect {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PendingHeader {}
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layouts_match_the_kernel_side() {
        assert_eq!(size_of::<FrontendKey>(), 20);
        assert_eq!(align_of::<FrontendKey>(), 4);
        assert_eq!(size_of::<Redirect>(), 20);
        assert_eq!(align_of::<Redirect>(), 4);
        assert_eq!(size_of::<PendingHeader>(), HEADER_ROOM + 24);
        assert_eq!(align_of::<PendingHeader>(), 4);
        assert!(HEADER_ROOM.is_power_of_two() && HEADER_ROOM >= 108);
    }

    #[test]
    fn a_kernel_value_keeps_its_listener_for_the_fallback() {
        let l: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        let v = Redirect::kernel(l, HEADER_V2);
        assert_eq!(v.socket_addr(), l);
        assert_eq!(v.header, HEADER_V2);
        assert_eq!(Redirect::new(l).header, HEADER_RELAY);
        assert!(v.is_kernel() && Redirect::kernel(l, HEADER_V1).is_kernel());
        let s = Redirect::server_first(l);
        assert_eq!(s.socket_addr(), l);
        assert!(!s.is_kernel() && !Redirect::new(l).is_kernel());
        let c = Redirect::relay_chosen(l);
        assert_eq!((c.socket_addr(), c.header), (l, HEADER_RELAY_CHOSEN));
        assert!(!c.is_kernel());
        assert!(!Redirect::kernel(l, 7).is_kernel());
    }

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
    fn encoding_round_trips_both_families() {
        for a in [
            "203.0.113.10:443",
            "[2001:db8::10]:80",
            "[::ffff:192.0.2.1]:1",
        ] {
            let a: SocketAddr = a.parse().expect("addr");
            assert_eq!(FrontendKey::new(a).socket_addr(), a);
            assert_eq!(Redirect::new(a).socket_addr(), a);
        }
    }

    #[test]
    fn encoding_is_network_byte_order_like_bpf_sock_addr() {
        let k = FrontendKey::new("203.0.113.10:80".parse().expect("addr"));
        // The kernel's user_ip4 is the address bytes as they sit in memory.
        assert_eq!(k.addr[0].to_ne_bytes(), [203, 0, 113, 10]);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
        assert_eq!(k.family, AF_INET);
        assert_eq!(k.pad, 0);
    }

    #[test]
    fn the_sockets_limit_keeps_a_margin_and_never_reaches_zero() {
        assert_eq!(sockets_limit(MAX_KERNEL_SOCKETS), 61_440);
        assert_eq!(sockets_limit(1), 1);
        assert_eq!(sockets_limit(16), 15);
    }

    /// A v1 TCP6 address as sock_ops writes it: the words of [`text`] laid end to end.
    fn ip6_text(ip: core::net::Ipv6Addr) -> std::string::String {
        use text::*;
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
            let (w, n) = text::dec(u32::from(v));
            assert_eq!(&w.to_le_bytes()[..n as usize], format!("{v}").as_bytes());
            let (w, n) = text::hex(v);
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

    #[test]
    fn counter_indices_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as u32, i as u32, "{}", c.name());
        }
    }
}
