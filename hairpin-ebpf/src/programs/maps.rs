//! The maps and the globals the loader sets: the programs' side of the ABI with the
//! agent. Names, types, key and value layouts and sizes are `hairpin_ebpf`'s (its
//! `MAP_*` and `GLOBAL_*` names, `PIN_LAYOUT`): a running node's pinned maps are
//! adopted by name by a new build, so nothing here changes without bumping
//! `PIN_LAYOUT`. Nothing else in the programs declares a map or a global the loader
//! writes.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::SkStorage,
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, SockHash, SockMap},
};
use hairpin_ebpf::{
    Counter, DEFAULT_BYPASS_MARK, DEFAULT_MESH_PORTS, FrontendKey, MAX_FRONTENDS,
    MAX_KERNEL_SOCKETS, MAX_SPLICE_SOCKETS, MESH_NETNS_ENTRIES, MESH_PORTS, PendingHeader,
    RELAY_LISTENERS, Redirect, SLOT_ADDRS, SPLICE_REFILL_BYTES, Slot, SlotKey, SpliceCredit,
    SpliceSeen, mesh_ports_be,
};

#[map(name = "HAIRPIN_FRONTENDS")]
pub(super) static HAIRPIN_FRONTENDS: HashMap<FrontendKey, Redirect> =
    HashMap::with_max_entries(MAX_FRONTENDS, 0);

#[map(name = "HAIRPIN_COUNTERS")]
pub(super) static HAIRPIN_COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// The dead-man switch: the agent's last heartbeat and the TTL (see
/// [`hairpin_ebpf::MAP_HEARTBEAT`]). Read by the connect programs only.
#[map(name = "HAIRPIN_HEARTBEAT")]
pub(super) static HAIRPIN_HEARTBEAT: Array<u64> = Array::with_max_entries(2, 0);

/// The relays' listening sockets by index: a connect goes to a slot only while the
/// listener it names is here (see [`hairpin_ebpf::MAP_RELAYS`]).
#[map(name = "HAIRPIN_RELAYS")]
pub(super) static HAIRPIN_RELAYS: SockMap = SockMap::with_max_entries(RELAY_LISTENERS, 0);

/// Which frontend each relay slot serves (see [`hairpin_ebpf::MAP_SLOTS`]). Filled
/// by the agent as frontends come and go, so not preallocated; the loader sizes it.
#[map(name = "HAIRPIN_SLOTS")]
pub(super) static HAIRPIN_SLOTS: HashMap<SlotKey, Slot> =
    HashMap::with_max_entries(2 * MAX_FRONTENDS, BPF_F_NO_PREALLOC);

/// The relay's IPv4 slot addresses, network byte order (0: none); the loader sets
/// them from the listen addresses. The only IPv4 addresses a connect is rewritten to.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_SLOT_ADDRS4: [u32; SLOT_ADDRS] = [0; SLOT_ADDRS];

/// The relay's IPv6 slot addresses (address words, network byte order; all 0: none).
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_SLOT_ADDRS6: [[u32; 4]; SLOT_ADDRS] = [[0; 4]; SLOT_ADDRS];

/// Established sockets of the kernel path whose header is not out yet, by socket
/// cookie; [`hairpin_sk_msg`](super::sk_msg::hairpin_sk_msg) runs on their writes. The loader sizes it.
#[map(name = "HAIRPIN_SOCKETS")]
pub(super) static HAIRPIN_SOCKETS: SockHash<u64> =
    SockHash::with_max_entries(MAX_KERNEL_SOCKETS, 0);

/// The relay's spliced sockets by their own cookie, with
/// [`hairpin_splice`](super::sk_skb::hairpin_splice) as their stream verdict (see
/// [`hairpin_ebpf::MAP_SPLICE`]). The loader sizes it; never pinned.
#[map(name = "HAIRPIN_SPLICE")]
pub(super) static HAIRPIN_SPLICE: SockHash<u64> = SockHash::with_max_entries(MAX_SPLICE_SOCKETS, 0);

/// Each spliced socket's peer by the socket's own cookie: where the splice program
/// sends what the socket receives (see [`hairpin_ebpf::MAP_SPLICE_PEERS`]). The
/// loader sizes it; never pinned.
#[map(name = "HAIRPIN_PEERS")]
pub(super) static HAIRPIN_PEERS: SockHash<u64> = SockHash::with_max_entries(MAX_SPLICE_SOCKETS, 0);

/// What the agent grants each spliced socket, by its cookie (see
/// [`hairpin_ebpf::SpliceCredit`]). (Socket storage would free itself with the
/// socket, but a stream verdict may not call `bpf_sk_storage_get`.) The loader
/// sizes it; never pinned.
#[map(name = "HAIRPIN_CREDIT")]
pub(super) static HAIRPIN_CREDIT: HashMap<u64, SpliceCredit> =
    HashMap::with_max_entries(MAX_SPLICE_SOCKETS, 0);

/// What the splice program did with each spliced socket's bytes, by its cookie
/// (see [`hairpin_ebpf::SpliceSeen`]). The loader sizes it; never pinned.
#[map(name = "HAIRPIN_SPLICED")]
pub(super) static HAIRPIN_SPLICED: HashMap<u64, SpliceSeen> =
    HashMap::with_max_entries(MAX_SPLICE_SOCKETS, 0);

/// Refill requests: the cookie of a spliced socket whose credit runs low.
#[map(name = "HAIRPIN_REFILL")]
pub(super) static HAIRPIN_REFILL: RingBuf = RingBuf::with_byte_size(SPLICE_REFILL_BYTES, 0);

/// How many sockets [`HAIRPIN_SOCKETS`] holds now: added to at each insert, taken
/// from when a socket leaves (header out, or closed), atomically.
#[map(name = "HAIRPIN_FILL")]
pub(super) static HAIRPIN_FILL: Array<u64> = Array::with_max_entries(1, 0);

/// [`HAIRPIN_FILL`] at which connects go to the relay; the loader overrides it.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_SOCKETS_LIMIT: u32 = hairpin_ebpf::sockets_limit(MAX_KERNEL_SOCKETS);

/// What a marked socket's header needs, on the socket itself: freed with it.
#[btf_map(name = "HAIRPIN_PENDING")]
pub(super) static HAIRPIN_PENDING: SkStorage<PendingHeader> = SkStorage::new();

/// Sockets that set TCP_FASTOPEN_CONNECT (to nonzero), marked by
/// [`hairpin_setsockopt`](super::setsockopt::hairpin_setsockopt); the connect programs relay them. A map of its own rather
/// than a state of [`HAIRPIN_PENDING`]: every socket that asks for Fast Open gets
/// it, whatever it connects to, and 4 bytes are all it needs where a
/// [`PendingHeader`] is 152; and sock_ops, sk_msg and the drain read the presence
/// of a [`PendingHeader`] as "marked for the kernel path", which stays true only
/// of sockets the connect programs marked.
#[btf_map(name = "HAIRPIN_FASTOPEN")]
pub(super) static HAIRPIN_FASTOPEN: SkStorage<u32> = SkStorage::new();

/// Byte offset of `fastopen_req` in the running kernel's `struct tcp_sock` (0:
/// unknown); the loader sets it from the kernel's BTF.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_FASTOPEN_REQ_OFF: u32 = 0;

/// Byte offset in `struct tcp_sock` of the byte holding `fastopen_connect` (0: unknown).
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_FASTOPEN_CONNECT_OFF: u32 = 0;

/// The `fastopen_connect` bit as a mask of that byte (0: unknown).
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_FASTOPEN_CONNECT_MASK: u32 = 0;

/// The outbound capture ports of mesh proxies (network byte order; 0: a slot not
/// in use): a kernel-path connect from a network namespace with a listener on
/// loopback at one of them goes to the relay (see [`hairpin_ebpf::GLOBAL_MESH_PORTS`]).
/// The loader may override them.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_MESH_PORTS: [u16; MESH_PORTS] = mesh_ports_be(DEFAULT_MESH_PORTS);

/// Whether the connect programs may trust [`HAIRPIN_MESH_NS`] (1) or probe on every
/// kernel-path hit (0); the loader sets it (see [`hairpin_ebpf::GLOBAL_MESH_CACHE`]).
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_MESH_CACHE: u32 = 0;

/// Per network namespace and family, what the mesh probes found (see
/// [`hairpin_ebpf::MAP_MESH_NETNS`]). Never pinned.
#[map(name = "HAIRPIN_MESH_NS")]
pub(super) static HAIRPIN_MESH_NS: LruHashMap<u64, u32> =
    LruHashMap::with_max_entries(MESH_NETNS_ENTRIES, 0);

/// Mark on the relay's own upstream sockets; the loader overrides it.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_BYPASS_MARK: u32 = DEFAULT_BYPASS_MARK;

/// The node's IPv4 address, network byte order (0: none); the loader overrides it.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_NODE_IP4: u32 = 0;

/// The node's IPv6 address words, network byte order (all 0: none); the loader overrides it.
#[unsafe(no_mangle)]
pub(super) static HAIRPIN_NODE_IP6: [u32; 4] = [0; 4];

/// [`HAIRPIN_RELAYS`] as the raw map pointer the helpers take (a lookup there
/// returns a referenced socket, which aya's typed map does not model).
#[inline(always)]
pub(super) fn relays_map() -> *mut c_void {
    (&raw const HAIRPIN_RELAYS).cast_mut().cast()
}

/// [`HAIRPIN_SOCKETS`] as the raw map pointer the helpers take.
#[inline(always)]
pub(super) fn sockets_map() -> *mut c_void {
    (&raw const HAIRPIN_SOCKETS).cast_mut().cast()
}

/// [`HAIRPIN_FASTOPEN`] as the raw map pointer the helpers take.
#[inline(always)]
pub(super) fn fastopen_map() -> *mut c_void {
    (&raw const HAIRPIN_FASTOPEN).cast_mut().cast()
}

/// [`HAIRPIN_PENDING`] as the raw map pointer the helpers take.
#[inline(always)]
pub(super) fn pending_map() -> *mut c_void {
    (&raw const HAIRPIN_PENDING).cast_mut().cast()
}
