//! Where `cargo xtask` keeps the tools it installs between runs (Helm's Python
//! SDK, the data planes, actionlint, pinned cargo tools). `cargo xtask test` hands
//! the suites each tool's path; a plain `cargo test` looks in the same place
//! (tests/src/helm.rs `cache_dir`).

use std::path::PathBuf;

/// `$XDG_CACHE_HOME/hairpin`, else `~/.cache/hairpin`, else `/var/cache/hairpin`.
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("hairpin")
}
