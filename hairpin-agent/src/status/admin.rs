//! The admin server: `/healthz`, `/readyz` and `/metrics` on a TCP address
//! (node-local by default: the DaemonSet is hostNetwork), everything and `/status`
//! on a unix socket (mode 0600: every LoadBalancer, hostname and listener is for
//! root on the node only), and optionally `/metrics` alone on an address of its own
//! for a Prometheus on the node's network. The node CLI reads `/status` from the socket.
//! The TCP listeners cap their connections and time out slow request heads
//! ([`tcp_server`]); they are unprivileged ports that any uid can crowd or bind
//! first, so the DaemonSet probes over the socket (`hairpin-agent health`), and an
//! admin address someone else holds is logged and gone without.

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{info, warn};

use super::{AgentState, RUN_LOOP_STALL, Snapshot, metrics::Metrics, tcp_server};

/// Content type of `/metrics`: prometheus-client renders OpenMetrics text.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where the agent serves its admin socket and the node CLI asks it by default.
pub(crate) const DEFAULT_ADMIN_SOCKET: &str = "/run/hairpin/admin.sock";

/// The admin server's TCP address by default (probes and metrics; no `/status`).
pub(crate) const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:9901";

/// The path of the agent's own account of itself, served on the admin socket only.
pub(crate) const STATUS_PATH: &str = "/status";

/// Where the admin server listens, and what each listener serves.
#[derive(Clone, Debug)]
pub(crate) struct AdminConfig {
    /// TCP address for the probes and metrics (`/healthz`, `/readyz`, `/metrics`),
    /// e.g. 127.0.0.1:9901; `None` to serve no TCP.
    pub address: Option<SocketAddr>,
    /// Unix socket path (mode 0600) serving everything, `/status` included: every
    /// LoadBalancer, hostname and listener is for root on the node only. `None` to
    /// serve no socket.
    pub socket: Option<PathBuf>,
    /// Further TCP addresses serving `/metrics` only, for a Prometheus that scrapes
    /// the node's network; empty (the default) to serve none.
    pub metrics: Vec<SocketAddr>,
}

/// What one listener of the admin server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Routes {
    /// `/healthz`, `/readyz`, `/metrics`: what probes and a local scraper need.
    Probes,
    /// `/metrics` alone.
    Metrics,
    /// Everything, `/status` included.
    All,
}

/// Errors starting the admin server.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The TCP address could not be bound.
    #[error("failed to listen on admin address {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// The unix socket (or its directory) could not be made.
    #[error("failed to {op} admin socket {path}: {source}")]
    Socket {
        /// `create the directory of`, `inspect the directory of`, `chmod the
        /// directory of`, `use the directory of`, `remove stale`, `bind`, `chmod`.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Another process answers on the socket: two agents would fight over it.
    #[error("admin socket {0} is served by another live process: stop it or pass --admin-socket")]
    InUse(PathBuf),
}

/// Reads the programs' counters from the counters map with this kernel id, per
/// `/status` request (they move without the agent noticing). Given by whoever
/// owns the datapath, so this server needs no BPF code of its own.
pub(crate) type KernelCounters =
    Arc<dyn Fn(u32) -> Result<BTreeMap<String, u64>, KernelCountersError> + Send + Sync>;

/// Why [`KernelCounters`] could not read the counters: its owner's own error (the
/// datapath's), boxed so that this server names no BPF type.
pub(crate) type KernelCountersError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Shared {
    state: AgentState,
    metrics: Metrics,
    kernel: Option<KernelCounters>,
}

/// The running admin server; [`AdminServer::shutdown`] stops it and removes the socket.
pub(crate) struct AdminServer {
    stop: CancellationToken,
    tasks: TaskTracker,
    socket: Option<PathBuf>,
    /// The bound TCP address (the real port when 0 was asked).
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "the unit tests reach a server bound on port 0 through it"
        )
    )]
    pub(crate) local_addr: Option<SocketAddr>,
}

/// The `routes` of one listener, over `state` and `metrics`; `kernel` reads the
/// programs' counters.
pub(crate) fn router(
    routes: Routes,
    state: AgentState,
    metrics: Metrics,
    kernel: Option<KernelCounters>,
) -> Router {
    let mut r = Router::new().route("/metrics", get(metrics_text));
    if routes != Routes::Metrics {
        r = r
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz));
    }
    if routes == Routes::All {
        r = r.route(STATUS_PATH, get(status));
    }
    r.with_state(Shared {
        state,
        metrics,
        kernel,
    })
}

/// Binds both listeners and serves them until [`AdminServer::shutdown`].
pub(crate) async fn start(
    cfg: &AdminConfig,
    state: AgentState,
    metrics: Metrics,
    kernel: Option<KernelCounters>,
) -> Result<AdminServer, AdminError> {
    let app = |routes| router(routes, state.clone(), metrics.clone(), kernel.clone());
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let mut local_addr = None;
    let listeners = (cfg.address.iter().map(|a| (*a, Routes::Probes)))
        .chain(cfg.metrics.iter().map(|a| (*a, Routes::Metrics)));
    for (address, routes) in listeners {
        let l = match TcpListener::bind(address).await {
            Ok(l) => l,
            // Any uid can bind an unprivileged port first (say while the agent
            // restarts). With the socket serving the probes (the DaemonSet's exec
            // probes) that must not keep the agent from starting: it runs on without.
            Err(source) if routes == Routes::Probes && cfg.socket.is_some() => {
                warn!(
                    %address, error = %source,
                    "admin address not bound: /healthz, /readyz and /metrics are served on the admin socket only"
                );
                continue;
            }
            Err(source) => return Err(AdminError::Listen { address, source }),
        };
        let bound = l.local_addr().ok();
        if routes == Routes::Probes {
            local_addr = bound;
        }
        // Capped, with a header timeout: an open port (status/tcp_server.rs).
        tasks.spawn(tcp_server::serve(
            l,
            app(routes),
            tcp_server::Limits::default(),
            stop.clone(),
        ));
        info!(address = ?bound, ?routes, "admin server listening");
    }
    if let Some(path) = &cfg.socket {
        let l = bind_socket(path)?;
        let (app, stop) = (app(Routes::All), stop.clone());
        tasks.spawn(async move {
            let served = axum::serve(l, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
            if let Err(e) = served {
                warn!(error = %e, "admin server (unix) stopped");
            }
        });
        info!(socket = %path.display(), "admin server listening");
    }
    tasks.close();
    Ok(AdminServer {
        stop,
        tasks,
        socket: cfg.socket.clone(),
        local_addr,
    })
}

impl AdminServer {
    /// Stops serving and removes the socket file.
    pub(crate) async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.wait().await;
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn bind_socket(path: &Path) -> Result<UnixListener, AdminError> {
    let err = |op| {
        let path = path.to_path_buf();
        move |source| AdminError::Socket { op, path, source }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err("create the directory of"))?;
        // Whoever may write the directory may swap the socket for their own between
        // the agent's bind and a CLI's connect (or a probe's): only its owner. One of
        // this process's own (an emptyDir is made 0777) is tightened; another's
        // is refused.
        use std::os::unix::fs::MetadataExt;
        let mut meta = std::fs::metadata(dir).map_err(err("inspect the directory of"))?;
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 && meta.uid() == nix::unistd::geteuid().as_raw() {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7755))
                .map_err(err("chmod the directory of"))?;
            meta = std::fs::metadata(dir).map_err(err("inspect the directory of"))?;
        }
        if meta.permissions().mode() & 0o022 != 0 {
            return Err(AdminError::Socket {
                op: "use the directory of",
                path: path.to_path_buf(),
                source: io::Error::other(format!(
                    "{} is writable by group or others (mode {:o}): make it 0755 or tighter",
                    dir.display(),
                    meta.permissions().mode() & 0o7777
                )),
            });
        }
    }
    if path.exists() {
        // A socket file left by a crashed agent refuses connections: remove it. One
        // that answers belongs to a live agent, whose CLI users we must not hijack.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(AdminError::InUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(err("remove stale"))?;
    }
    let l = UnixListener::bind(path).map_err(err("bind"))?;
    // /status names every frontend and listener: root only.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err("chmod"))?;
    Ok(l)
}

/// Alive: this handler ran (the runtime schedules tasks) and the run loop has
/// beaten within [`RUN_LOOP_STALL`]; otherwise 503 with how long it has been
/// silent, so the kubelet restarts an agent stuck in an apply or a deadlock.
async fn healthz(State(s): State<Shared>) -> Response {
    match stalled(&s.state) {
        None => "ok\n".into_response(),
        Some(silent) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("run loop stalled: silent for {} s\n", silent.as_secs()),
        )
            .into_response(),
    }
}

/// The run loop's silence, when over [`RUN_LOOP_STALL`].
fn stalled(state: &AgentState) -> Option<std::time::Duration> {
    state.run_loop_stalled(Instant::now(), RUN_LOOP_STALL)
}

/// The snapshot with what is read per request: the run loop's liveness.
fn live_snapshot(state: &AgentState) -> Snapshot {
    let mut snap = state.snapshot();
    snap.run_loop_stalled_secs = stalled(state).map(|d| d.as_secs());
    snap
}

async fn readyz(State(s): State<Shared>) -> Response {
    match live_snapshot(&s.state).not_ready_reason() {
        None => Json(serde_json::json!({ "ready": true })).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "ready": false, "reason": reason })),
        )
            .into_response(),
    }
}

async fn metrics_text(State(s): State<Shared>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], s.metrics.render()).into_response()
}

async fn status(State(s): State<Shared>) -> Response {
    let mut snap = live_snapshot(&s.state);
    // Read per request: the kernel's counters move without the agent noticing.
    let id = snap.attachment.as_ref().and_then(|a| a.ids.counters_map_id);
    if let (Some(id), Some(read)) = (id, &s.kernel) {
        match read(id) {
            Ok(c) => snap.counters.kernel = c,
            Err(e) => warn!(error = %e, "could not read kernel counters"),
        }
    }
    snap.counters.relay = s.metrics.relay_counters();
    Json(snap).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET path` over `stream`; the status code.
    async fn get<S>(mut stream: S, path: &str) -> u16
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("read");
        reply
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status line")
    }

    async fn code(address: SocketAddr, path: &str) -> u16 {
        get(
            tokio::net::TcpStream::connect(address)
                .await
                .expect("connect"),
            path,
        )
        .await
    }

    async fn socket_code(socket: &Path, path: &str) -> u16 {
        get(
            tokio::net::UnixStream::connect(socket)
                .await
                .expect("connect"),
            path,
        )
        .await
    }

    /// The socket's directory is writable by no one but its owner: one of this
    /// process's own made 0777 (an emptyDir) is tightened to 0755 before the bind.
    #[tokio::test]
    async fn a_socket_directory_others_may_write_is_tightened_before_the_bind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run");
        std::fs::create_dir(&run).expect("dir");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let socket = run.join("admin.sock");
        let server = start(
            &AdminConfig {
                address: None,
                socket: Some(socket.clone()),
                metrics: Vec::new(),
            },
            AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK),
            Metrics::default(),
            None,
        )
        .await
        .expect("admin server");
        let mode = std::fs::metadata(&run).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        assert_eq!(socket_code(&socket, "/healthz").await, 200);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn status_is_served_on_the_socket_only_and_metrics_alone_on_its_own_address() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("admin.sock");
        let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        // The metrics address: bind one to learn a free port, then give it back.
        let metrics_address = std::net::TcpListener::bind(any)
            .and_then(|l| l.local_addr())
            .expect("free port");
        let server = start(
            &AdminConfig {
                address: Some(any),
                socket: Some(socket.clone()),
                metrics: vec![metrics_address],
            },
            AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK),
            Metrics::default(),
            None,
        )
        .await
        .expect("admin server");
        let probes = server.local_addr.expect("tcp address");
        assert_eq!(code(probes, "/metrics").await, 200);
        assert_eq!(code(probes, "/healthz").await, 200);
        assert_eq!(code(probes, "/readyz").await, 503, "nothing synced yet");
        assert_eq!(code(probes, "/status").await, 404, "not on the network");
        assert_eq!(code(metrics_address, "/metrics").await, 200);
        for path in ["/status", "/healthz", "/readyz"] {
            assert_eq!(code(metrics_address, path).await, 404, "{path}");
        }
        assert_eq!(socket_code(&socket, "/status").await, 200);
        assert_eq!(socket_code(&socket, "/metrics").await, 200);
        server.shutdown().await;
        assert!(!socket.exists(), "the socket is removed at shutdown");
    }
}
