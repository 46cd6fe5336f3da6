//! The ELF names the agent's loader and the programs agree on (programs, maps and
//! the globals the loader sets before load), the default of the bypass mark, and
//! the version of the layout pinned under them. A pinned datapath is adopted by
//! these names: renaming one is a layout change ([`PIN_LAYOUT`]).

// ---- Programs

/// ELF name of the cgroup/connect4 program.
pub const PROG_CONNECT4: &str = "hairpin_connect4";
/// ELF name of the cgroup/connect6 program.
pub const PROG_CONNECT6: &str = "hairpin_connect6";
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
/// ELF name of the sock_ops program: puts established marked sockets in
/// [`MAP_SOCKETS`] and takes them out once their header went out.
pub const PROG_SOCK_OPS: &str = "hairpin_sockops";
/// ELF name of the sk_msg program on [`MAP_SOCKETS`]: writes the header ahead of a
/// marked socket's first bytes.
pub const PROG_SK_MSG: &str = "hairpin_sk_msg";
/// ELF name of the sk_lookup program, attached to the agent's network namespace by
/// the agent itself (it goes with the process): hands a connection aimed at a relay
/// slot to the listener [`MAP_SLOTS`] names for it.
pub const PROG_SK_LOOKUP: &str = "hairpin_sk_lookup";
/// ELF name of the cgroup/setsockopt program of the kernel path: records in
/// [`MAP_FASTOPEN`] that a socket set TCP_FASTOPEN_CONNECT, so that the connect
/// programs send it to the relay. It never changes or refuses an option.
pub const PROG_SETSOCKOPT: &str = "hairpin_setsockopt";
/// ELF name of the relay's stream-verdict program (`sk_skb`), attached to
/// [`MAP_SPLICE`]: sends the bytes a relayed socket receives out of its peer, so
/// that after the header a relayed connection's bytes never cross user space.
pub const PROG_SPLICE: &str = "hairpin_splice";

// ---- Maps

/// ELF name of the frontend map: [`FrontendKey`](crate::FrontendKey) -> [`Redirect`](crate::Redirect).
pub const MAP_FRONTENDS: &str = "HAIRPIN_FRONTENDS";
/// ELF name of the per-CPU counter array, indexed by [`Counter`](crate::Counter).
pub const MAP_COUNTERS: &str = "HAIRPIN_COUNTERS";
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
/// ELF name of the relay's liveness map: a SOCKMAP of the relays' listening sockets
/// ([`RELAY_LISTENERS`](crate::RELAY_LISTENERS) of them: the relay's per family, the
/// name relay's per names port). The connect programs send a connect to a slot only
/// while its listener is in this map with the bypass mark on a privileged port, and
/// `hairpin_sk_lookup` hands connections only to such a listener; the kernel takes a
/// closed listener out at once, so a dead agent's relay is never a target.
pub const MAP_RELAYS: &str = "HAIRPIN_RELAYS";
/// ELF name of the relay's slots: [`SlotKey`](crate::SlotKey) ->
/// [`Slot`](crate::Slot), which frontend each slot serves (and which have retired,
/// until their quarantine ends). The connect programs rewrite to a slot only when it
/// names the very frontend dialled; the relay reads it at accept.
pub const MAP_SLOTS: &str = "HAIRPIN_SLOTS";
/// ELF name of the SOCKHASH (socket cookie -> socket) holding established sockets
/// whose header is not written yet.
pub const MAP_SOCKETS: &str = "HAIRPIN_SOCKETS";
/// ELF name of the one-slot array holding how many sockets are in [`MAP_SOCKETS`]
/// now (added to and taken from atomically), which the connect programs compare
/// with [`GLOBAL_SOCKETS_LIMIT`].
pub const MAP_SOCKETS_FILL: &str = "HAIRPIN_FILL";
/// ELF name of the socket-local storage holding each marked socket's [`PendingHeader`](crate::PendingHeader).
pub const MAP_PENDING: &str = "HAIRPIN_PENDING";
/// ELF name of the socket-local storage marking sockets that set
/// TCP_FASTOPEN_CONNECT (a nonzero value; setting it to 0 clears the mark).
pub const MAP_FASTOPEN: &str = "HAIRPIN_FASTOPEN";
/// ELF name of the SOCKHASH (socket cookie -> that socket) of the relay's spliced
/// sockets, with [`PROG_SPLICE`] attached as its stream verdict: a socket's received
/// bytes run the program only once the socket is here. Never pinned: it belongs to
/// the running agent, as its relayed connections do.
pub const MAP_SPLICE: &str = "HAIRPIN_SPLICE";
/// ELF name of the SOCKHASH (socket cookie -> the socket's peer) the splice program
/// redirects through: an accepted client's cookie names its upstream, the upstream's
/// names the client. No program is attached to it, so a socket is in it (and a
/// valid redirect target) before its peer's bytes can reach it. Never pinned.
pub const MAP_SPLICE_PEERS: &str = "HAIRPIN_PEERS";
/// ELF name of the socket storage of what the agent grants each spliced socket
/// ([`SpliceCredit`](crate::SpliceCredit)); never pinned.
pub const MAP_SPLICE_CREDIT: &str = "HAIRPIN_CREDIT";
/// ELF name of the socket storage of what the splice program did with each spliced
/// socket's bytes ([`SpliceSeen`](crate::SpliceSeen)); never pinned.
pub const MAP_SPLICE_SEEN: &str = "HAIRPIN_SPLICED";
/// ELF name of the ring buffer on which the splice program asks the agent to
/// refill a socket's credit (one socket cookie per request); never pinned.
pub const MAP_SPLICE_REFILL: &str = "HAIRPIN_REFILL";

/// ELF name of the LRU hash that remembers, per network namespace and family
/// ([`mesh_netns_key`](crate::mesh_netns_key)), that the mesh probes found no
/// capture listener there ([`MESH_NETNS_NONE`](crate::MESH_NETNS_NONE)), so that a
/// kernel-path connect skips them, or that one started listening since
/// ([`MESH_NETNS_LISTENS`](crate::MESH_NETNS_LISTENS), written by sock_ops at
/// `BPF_SOCK_OPS_TCP_LISTEN_CB`). Read and written only while
/// [`GLOBAL_MESH_CACHE`] is on. Never pinned: each load starts empty, so no entry
/// outlives the sock_ops program that kept it up to date.
pub const MAP_MESH_NETNS: &str = "HAIRPIN_MESH_NS";

// ---- Globals the loader sets

/// ELF name of the global holding the bypass mark, set by the loader.
pub const GLOBAL_BYPASS_MARK: &str = "HAIRPIN_BYPASS_MARK";
/// Default SO_MARK the relay puts on its upstream sockets so the programs skip them.
///
/// Chosen outside the bits the field already claims on packet marks: kube-proxy's
/// 0x4000 (masquerade) and 0x8000 (drop), Cilium's 0x0F00 magic nibble and
/// Calico's default 0xffff0000 mask.
pub const DEFAULT_BYPASS_MARK: u32 = 0x68;
/// ELF name of the global holding how many sockets [`MAP_SOCKETS`] may hold before
/// the connect programs send new connects to the relay instead: its capacity less a
/// margin for sockets still connecting (see [`sockets_limit`](crate::sockets_limit)). Set by the loader.
pub const GLOBAL_SOCKETS_LIMIT: &str = "HAIRPIN_SOCKETS_LIMIT";
/// ELF name of the global holding the relay's IPv4 slot addresses
/// ([`SLOT_ADDRS`](crate::SLOT_ADDRS) words, network byte order, 0: none), set by the
/// loader from the listen addresses: the only addresses the connect programs rewrite
/// a connect to, and the only ones `hairpin_sk_lookup` acts on.
pub const GLOBAL_SLOT_ADDRS4: &str = "HAIRPIN_SLOT_ADDRS4";
/// ELF name of the global holding the relay's IPv6 slot addresses (address words,
/// network byte order, all 0: none).
pub const GLOBAL_SLOT_ADDRS6: &str = "HAIRPIN_SLOT_ADDRS6";
/// ELF name of the global holding the node's IPv4 address (network byte order), the
/// header's source for a socket whose own address is loopback or the LB address itself.
pub const GLOBAL_NODE_IP4: &str = "HAIRPIN_NODE_IP4";
/// ELF name of the global holding the node's IPv6 address words (network byte order).
pub const GLOBAL_NODE_IP6: &str = "HAIRPIN_NODE_IP6";
/// ELF name of the global holding the byte offset of `fastopen_req` in the running
/// kernel's `struct tcp_sock` (0: unknown), set by the loader from its BTF.
pub const GLOBAL_FASTOPEN_REQ_OFF: &str = "HAIRPIN_FASTOPEN_REQ_OFF";
/// ELF name of the global holding the byte offset in `struct tcp_sock` of the byte
/// holding the `fastopen_connect` bit (0: unknown).
pub const GLOBAL_FASTOPEN_CONNECT_OFF: &str = "HAIRPIN_FASTOPEN_CONNECT_OFF";
/// ELF name of the global holding the `fastopen_connect` bit as a mask of that byte
/// (0: unknown).
pub const GLOBAL_FASTOPEN_CONNECT_MASK: &str = "HAIRPIN_FASTOPEN_CONNECT_MASK";

/// ELF name of the global holding the outbound capture ports of mesh proxies
/// ([`MESH_PORTS`](crate::MESH_PORTS) slots, network byte order, 0 for a slot not in
/// use): a connect to a kernel-path frontend from a network namespace where a TCP
/// socket listens on loopback at one of them goes to the relay (see
/// [`Counter::KernelFallbackMesh`](crate::Counter::KernelFallbackMesh)). The object's
/// own value is [`DEFAULT_MESH_PORTS`](crate::DEFAULT_MESH_PORTS); the loader may set it.
pub const GLOBAL_MESH_PORTS: &str = "HAIRPIN_MESH_PORTS";

/// ELF name of the global that turns on [`MAP_MESH_NETNS`] (1; 0: every
/// kernel-path connect probes): set by the loader only where sock_ops sees every
/// listen(2) on the node, that is attached at the root of the cgroup v2 hierarchy
/// (`--mesh-listener-cache`). A listener opened by a process outside the attached
/// cgroup runs no sock_ops program of hairpin's, and would leave a cached "no
/// listener" standing.
pub const GLOBAL_MESH_CACHE: &str = "HAIRPIN_MESH_CACHE";

// ---- The pinned layout

/// Version of the layout of everything pinned under the agent's bpf pin directory:
/// the maps' types, key and value layouts, the counters' indices and what the
/// programs expect of each other. The pins live under `v<LAYOUT>`, so an agent of
/// another layout never reuses a map it would misread; bump it with any such change.
/// 2: relay slots (the frontends map's value names a slot, not a listener;
/// `HAIRPIN_RELAYS` a SOCKMAP of listeners by index; `HAIRPIN_SLOTS`).
pub const PIN_LAYOUT: u32 = 2;
