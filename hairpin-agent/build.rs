//! Embeds the BPF object built by `cargo xtask build-ebpf`, when it exists.
//!
//! Without it the agent still builds (so `cargo check`, clippy and the unit tests
//! work anywhere), but `run` refuses to start and names the command to run.

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hairpin_ebpf_embedded)");
    println!("cargo::rerun-if-env-changed=HAIRPIN_EBPF_OBJECT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let object = env::var_os("HAIRPIN_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/bpf/bpfel-unknown-none/release/hairpin-ebpf"));
    println!("cargo::rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo")).join("hairpin-ebpf.o");
    if object.is_file() {
        fs::copy(&object, &out).expect("copy the BPF object into OUT_DIR");
        println!("cargo::rustc-cfg=hairpin_ebpf_embedded");
    } else {
        let _ = fs::remove_file(&out);
        println!(
            "cargo::warning=no eBPF object at {}: this agent will refuse `run`; \
             build with `cargo xtask build`",
            object.display()
        );
    }
}
