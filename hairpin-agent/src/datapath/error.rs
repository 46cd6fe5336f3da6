//! What can go wrong at the BPF boundary, each error naming the program, map,
//! cgroup or frontend concerned.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

/// Errors at the BPF boundary.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The agent was compiled without the object.
    #[error(
        "this hairpin-agent was built without its eBPF object: run `cargo xtask build` \
         (or `cargo xtask build-ebpf`, then rebuild with HAIRPIN_EBPF_OBJECT set)"
    )]
    NotEmbedded,
    /// The object failed to load (verifier, permissions, kernel support).
    #[error("failed to load the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program or map is missing from the object.
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        /// `program` or `map`.
        kind: &'static str,
        /// Its name.
        name: &'static str,
    },
    /// A program failed to load or attach.
    #[error("failed to {op} {program} (cgroup {cgroup:?}): {source}")]
    Program {
        /// `load` or `attach`.
        op: &'static str,
        /// The program.
        program: &'static str,
        /// The cgroup directory.
        cgroup: PathBuf,
        /// aya's error (boxed: it carries the verifier log).
        source: Box<aya::programs::ProgramError>,
    },
    /// The cgroup directory could not be opened.
    #[error("failed to open cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A map operation failed.
    #[error("failed to {op} {map} entry for {frontend}: {source}")]
    Map {
        /// `insert`, `remove` or `read`.
        op: &'static str,
        /// The map.
        map: &'static str,
        /// The frontend concerned.
        frontend: String,
        /// aya's error (boxed: aya's map errors are large).
        source: Box<aya::maps::MapError>,
    },
    /// The frontends map has no room left (the kernel answered E2BIG).
    #[error(
        "the frontend map is full ({capacity} entries, --max-frontends): {frontend} is not \
         proxied and takes the pre-hairpin path"
    )]
    MapFull {
        /// The frontend that did not fit.
        frontend: SocketAddr,
        /// The map's capacity.
        capacity: u32,
    },
    /// A program was attached without a bpf_link (kernels before 5.7 attach the
    /// legacy way), or the kernel cannot list links to confirm it (before 5.8).
    /// A legacy attachment outlives a killed agent and keeps redirecting to
    /// listeners that are gone, so the eBPF path is refused rather than risked.
    #[error(
        "{program} at cgroup {cgroup:?} is not attached through a bpf_link ({why}): a legacy \
         attachment outlives a killed agent and would keep redirecting to a dead relay, so \
         hairpin does not run its eBPF path on this kernel (5.8 or newer is needed; --mode \
         auto falls back to the name relay)"
    )]
    NotALink {
        /// The program.
        program: &'static str,
        /// The cgroup directory.
        cgroup: PathBuf,
        /// What the kernel said.
        why: String,
    },
    /// A listener of the other family cannot serve a frontend.
    #[error("frontend {frontend} cannot be redirected to listener {listener} of another family")]
    FamilyMismatch {
        /// The frontend.
        frontend: SocketAddr,
        /// The listener.
        listener: SocketAddr,
    },
}

/// A hash map refuses a new key with E2BIG once all its (preallocated) entries are used.
pub(super) fn is_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(aya::sys::SyscallError { io_error, .. })
        if io_error.raw_os_error() == Some(nix::errno::Errno::E2BIG as i32))
}

pub(super) fn map_error(
    op: &'static str,
    map: &'static str,
    frontend: String,
) -> impl FnOnce(aya::maps::MapError) -> DatapathError {
    move |source| DatapathError::Map {
        op,
        map,
        frontend,
        source: Box::new(source),
    }
}

pub(super) fn program_error(
    program: &'static str,
    op: &'static str,
    cgroup: &Path,
) -> impl FnOnce(aya::programs::ProgramError) -> DatapathError {
    let cgroup = cgroup.to_path_buf();
    move |source| DatapathError::Program {
        op,
        program,
        cgroup,
        source: Box::new(source),
    }
}
