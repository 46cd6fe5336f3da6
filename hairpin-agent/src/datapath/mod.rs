//! The kernel side's edge: the embedded BPF object loaded, its programs linked at the
//! node's cgroup v2 root through bpf_links, and the maps they share with user space.
//! With the kernel path on, sock_ops and sk_msg write the PROXY header on the client's
//! own socket ([`KernelPath`]); otherwise the connect programs redirect to the relay.
//! Pinned, the datapath outlives the agent: the next agent adopts it and swaps its
//! programs in place, and a heartbeat makes an abandoned one inert.
//!
//! The parts, each a type with private fields handed to its one owner, and each file
//! saying in its opening lines what it owns and never touches:
//! - `programs.rs`: the loaded programs (`Programs`: the object, the kernel path's
//!   state, the sk_lookup program); `load.rs` loads them and composes the parts
//!   into [`Datapath`]; `options.rs`, what to load; `events.rs`, their log events;
//! - [`lifecycle`]: the lifecycle as one typed state machine (start, adopt, swap in
//!   place, wait, take over, drain, keep, remove), its pure decisions and the one
//!   executor, which owns the links (`Links`: the attachment, the pinning, the
//!   link order, a hand-over) and reaches the kernel through a seam;
//! - `attach.rs`: the record of what is attached (the links, their kernel ids);
//! - [`order`]: where connect links go among other programs at the cgroup;
//!   [`children`], the root's child cgroups they go to where the kernel cannot order;
//! - [`pin`]: the pin directory (its layout, lock, what is pinned where);
//! - `maps.rs`: the maps (`Maps`: frontends, counters, sockets, capacity) and the
//!   frontends map's one writer; `counters.rs`, the counters read; `adopt.rs`, which
//!   pinned maps may be reused;
//! - `liveness.rs`: the heartbeat and the relays' liveness registry (`Liveness`);
//! - `slots.rs`: the relay's slots (`Slots`: the slots map's writer and reader);
//! - [`splice`]: the relay's kernel splice (its stream verdict and maps);
//! - [`inspect`]: a pinned datapath read without owning it (read-only maps, for
//!   `status` with no agent and `dump`);
//! - `kernel_path.rs`: the kernel path's programs and its per-frontend choice;
//! - [`kernel_objects`], [`cgroup`], `btf.rs`, [`sys`], `error.rs`: kernel objects read
//!   by id, the cgroup2 root, the running kernel's BTF, the raw syscalls aya lacks, and
//!   this boundary's error.
//!
//! This file only indexes: the parts import each other by path. What other crates
//! use (the suites, fuzz targets and tools) is `pub`; the rest is the crate's own.

#![warn(unreachable_pub)]

mod adopt;
mod attach;
mod btf;
pub(crate) mod cgroup;
pub(crate) mod children;
mod counters;
mod error;
mod events;
pub(crate) mod inspect;
pub(crate) mod kernel_objects;
mod kernel_path;
pub(crate) mod lifecycle;
mod liveness;
mod load;
mod maps;
mod options;
pub(crate) mod order;
pub(crate) mod pin;
mod programs;
mod role;
mod slots;
mod splice;
pub(crate) mod sys;

pub use cgroup::find_cgroup2_root;
pub(crate) use cgroup::{is_cgroup2_root, unescape as unescape_mountinfo};
pub(crate) use counters::CountersReader;
pub(crate) use error::DatapathError;
pub use kernel_objects::{
    KernelObjectsError, RunStats, enable_run_time_stats, hairpin_program_run_stats, read_counters,
};
pub(crate) use kernel_path::{KernelPath, drain_kernel_sockets, read_frontend_paths};
pub use liveness::monotonic_ns;
pub(crate) use liveness::{BEAT_EVERY, check_ttl};
pub use load::{Datapath, embedded_object};
pub(crate) use load::{Started, start};
pub(crate) use maps::FrontendsMap;
pub(crate) use options::LoadOptions;
pub(crate) use order::LinkOrderWanted;
pub(crate) use pin::Pin;
pub(crate) use role::Role;
pub(crate) use slots::{SlotAddrs, SlotError, SlotTable};
pub use splice::{Splice, SpliceHeld};
#[cfg(feature = "testing")]
pub use sys::bpf_fd;
pub use sys::{AttachType, link_create};

/// Hands the pin directory `root` over to `uid:gid` as `--pin-owner` does, as the
/// race suite drives it (`tests/tests/pin_handover.rs`): how many entries it
/// changed, or why it refused. Built only with the `testing` feature.
#[cfg(feature = "testing")]
pub fn secure_pin_dir(root: &std::path::Path, uid: u32, gid: u32) -> Result<usize, String> {
    pin::secure(root, pin::PinOwner { uid, gid }).map_err(|e| e.to_string())
}

/// Removes a layout directory (`<dir>/v<N>`) as a layout takeover does, as the race
/// suite drives it: one line per entry removed or refused. Built only with the
/// `testing` feature.
#[cfg(feature = "testing")]
pub fn remove_pin_layout(layout: &std::path::Path) -> Vec<String> {
    pin::remove_layout(layout)
        .iter()
        .map(|r| format!("{r:?}"))
        .collect()
}
