//! The version the agent reports (`/status`, `hairpin_build_info`): the binary's own.
//!
//! The binary decides it (its crate version, or the `HAIRPIN_BUILD_VERSION` it was
//! built with: `cargo xtask image --agent-version`) and sets it here once at start,
//! so that a build with another version string recompiles the binary's one small
//! crate and not this library. Users of the library that set nothing (the suites,
//! the tools) report the crate version.

use std::sync::OnceLock;

static BUILD_VERSION: OnceLock<&'static str> = OnceLock::new();

/// Sets the version this process reports, before anything reads it; a later call
/// changes nothing (the first reader has already published the first value).
pub fn set_build_version(version: &'static str) {
    let _ = BUILD_VERSION.set(version);
}

/// The version this process reports: the one set, else the crate's.
pub(crate) fn build_version() -> &'static str {
    BUILD_VERSION
        .get()
        .copied()
        .unwrap_or(env!("CARGO_PKG_VERSION"))
}
