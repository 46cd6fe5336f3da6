//! hairpin's kernel programs: the cgroup connect programs, and the kernel path's
//! sock_ops, sk_msg and setsockopt programs (`programs/`, one file per hook).
//!
//! A connect aimed at a proxied LoadBalancer frontend is rewritten to that
//! frontend's node-local relay listener; anything else is left untouched. Every
//! path returns 1 (allow): hairpin never rejects a connect, so a bug or a full map
//! degrades to the pre-hairpin behaviour instead of breaking traffic.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// The BPF target has no compare-and-swap, so core's atomic types offer no fetch_add
// there; the intrinsic lowers to the BPF atomic add instruction. The programs build
// with the pinned nightly only.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "core_intrinsics for the BPF atomic add")
)]

#[cfg(target_arch = "bpf")]
mod programs;

/// On the host this crate only provides its library; the programs build for
/// `bpfel-unknown-none` through `cargo xtask build-ebpf`.
#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("hairpin-ebpf builds for bpfel-unknown-none: run `cargo xtask build-ebpf`");
    std::process::exit(2);
}
