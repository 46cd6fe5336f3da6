//! The kernel side's edge: the embedded BPF object loaded, its programs linked at the
//! node's cgroup v2 root through bpf_links, and the maps they share with user space.
//! With the kernel path on, sock_ops and sk_msg write the PROXY header on the client's
//! own socket ([`KernelPath`]); otherwise the connect programs redirect to the relay.
//! Pinned, the datapath outlives the agent: the next agent adopts it and swaps its
//! programs in place, and a heartbeat makes an abandoned one inert.
//!
//! The rooms, each saying in its opening lines what it owns and never touches:
//! - `load.rs`: the object and its load (globals, map sizes, kernel path or relay path);
//! - [`lifecycle`]: the lifecycle as one typed state machine (start, adopt, swap in
//!   place, wait, take over, drain, keep, remove), its pure decisions and the one
//!   executor that links, swaps and detaches;
//! - `attach.rs`: what is attached (the links' record, their kernel ids);
//! - [`pin`]: the pin directory (its layout, lock, what is pinned where);
//! - `maps.rs`: which maps are shared, and the one writer of each;
//! - `liveness.rs`: the heartbeat and the relays' liveness registry;
//! - `splice.rs`: the relay's kernel splice (its stream verdict and maps);
//! - [`inspect`]: a pinned datapath read without owning it (read-only maps, for
//!   `status` with no agent and `dump`);
//! - `slots.rs`: the relay's slots (the slots map's writer and reader, the sk_lookup
//!   link that hands a slot's connections to its listener);
//! - `kernel_path.rs`: the kernel path's programs and its per-frontend choice;
//! - [`kernel_objects`], [`cgroup`], `btf.rs`, `sys.rs`, `error.rs`: kernel objects read
//!   by id, the cgroup2 root, the running kernel's BTF, the raw syscalls aya lacks, and
//!   this boundary's error.

mod adopt;
mod attach;
mod btf;
pub mod cgroup;
mod error;
pub mod inspect;
pub mod kernel_objects;
mod kernel_path;
pub mod lifecycle;
mod liveness;
mod load;
mod maps;
pub mod order;
pub mod pin;
mod slots;
pub mod splice;
pub mod sys;

pub use attach::{Adoption, Attachment};
pub use cgroup::find_cgroup2_root;
pub use error::{DatapathError, Denial, classify_denial};
pub use kernel_path::{
    Fill, KernelPath, describe as describe_value, drain_kernel_sockets, read_frontend_paths,
};
pub use liveness::{
    BEAT_EVERY, DEFAULT_TTL, Heartbeat, HeartbeatState, MIN_TTL_BEATS, RelayLiveness, TtlTooShort,
    check_ttl, heartbeat_state, monotonic_ns,
};
pub use load::{Datapath, LoadOptions, Mptcp, embedded_object};
pub use maps::{CountersReader, FrontendsMap};
pub use pin::{Pin, PinDir, Role};
pub use slots::{SlotAddrs, SlotError, SlotOwner, SlotTable, SlotsReader};
