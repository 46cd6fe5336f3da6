//! Where `cargo xtask` keeps the tools it installs between runs (Helm's Python
//! SDK, the data planes, actionlint, pinned cargo tools). The suites find those
//! tools there too, so they include this very file (tests/src/helm.rs, by path):
//! the two can never disagree on the place.

use std::path::PathBuf;

/// `$XDG_CACHE_HOME/hairpin`, else `~/.cache/hairpin`, else `/var/cache/hairpin`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("hairpin")
}
