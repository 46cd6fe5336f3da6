//! Types and names shared by hairpin's kernel programs and the agent.
//!
//! Everything a map holds is `#[repr(C)]` and laid out identically on both sides
//! of the BPF map boundary; the sizes are asserted in each module's tests so a
//! change on one side cannot silently misread the other. The items are re-exported
//! here, so both sides name them `hairpin_ebpf::X`:
//!
//! - [`names`]: the ELF names of the programs, maps and loader-set globals, and
//!   [`PIN_LAYOUT`], the version of what is pinned under them.
//! - [`frontend`]: the frontend map's key and value and their address encoding.
//! - [`kernel_path`]: a marked socket's pending header and the sockets map's sizing.
//! - [`counter`]: the counters' indices and names.
//! - [`splice`]: the relay's splice: its maps' sizing and its flow control's records.
//! - [`text`]: the pieces of a v1 header's text, as the kernel formats them.
#![no_std]

pub mod counter;
pub mod frontend;
pub mod kernel_path;
pub mod names;
pub mod splice;
pub mod text;

pub use counter::Counter;
pub use frontend::*;
pub use kernel_path::*;
pub use names::*;
pub use splice::*;

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, #[repr(C)], every bit pattern valid, explicit padding.
    unsafe impl aya::Pod for super::FrontendKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Redirect {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PendingHeader {}
    // SAFETY: as above (three u64, no padding).
    unsafe impl aya::Pod for super::SpliceCredit {}
    // SAFETY: as above (three u64, no padding).
    unsafe impl aya::Pod for super::SpliceSeen {}
}
