//! The admin server: `/healthz`, `/readyz`, `/metrics` and `/status`, on a TCP address
//! (node-local: the DaemonSet is hostNetwork) and on a unix socket (mode 0600, so only
//! root on the node reads `/status`). The node CLI talks to either.

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

use super::{AgentState, RUN_LOOP_STALL, Snapshot, metrics::Metrics};

/// Content type of `/metrics`: prometheus-client renders OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where the admin server listens.
#[derive(Clone, Debug)]
pub struct AdminConfig {
    /// TCP address, e.g. 127.0.0.1:9901; `None` to serve no TCP.
    pub address: Option<SocketAddr>,
    /// Unix socket path; `None` to serve no socket.
    pub socket: Option<PathBuf>,
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
        /// `create the directory of`, `remove stale`, `bind`, `chmod`.
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
pub type KernelCounters = Arc<dyn Fn(u32) -> Result<BTreeMap<String, u64>, String> + Send + Sync>;

#[derive(Clone)]
struct Shared {
    state: AgentState,
    metrics: Metrics,
    kernel: Option<KernelCounters>,
}

/// The running admin server; [`AdminServer::shutdown`] stops it and removes the socket.
pub struct AdminServer {
    stop: CancellationToken,
    tasks: TaskTracker,
    socket: Option<PathBuf>,
    /// The bound TCP address (the real port when 0 was asked).
    pub local_addr: Option<SocketAddr>,
}

/// The routes, over `state` and `metrics`; `kernel` reads the programs' counters.
pub fn router(state: AgentState, metrics: Metrics, kernel: Option<KernelCounters>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/status", get(status))
        .with_state(Shared {
            state,
            metrics,
            kernel,
        })
}

/// Binds both listeners and serves them until [`AdminServer::shutdown`].
pub async fn start(
    cfg: &AdminConfig,
    state: AgentState,
    metrics: Metrics,
    kernel: Option<KernelCounters>,
) -> Result<AdminServer, AdminError> {
    let app = router(state, metrics, kernel);
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let mut local_addr = None;
    if let Some(address) = cfg.address {
        let l = TcpListener::bind(address)
            .await
            .map_err(|source| AdminError::Listen { address, source })?;
        local_addr = l.local_addr().ok();
        let (app, stop) = (app.clone(), stop.clone());
        tasks.spawn(async move {
            let served = axum::serve(l, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
            if let Err(e) = served {
                warn!(error = %e, "admin server (tcp) stopped");
            }
        });
        info!(address = ?local_addr, "admin server listening");
    }
    if let Some(path) = &cfg.socket {
        let l = bind_socket(path)?;
        let (app, stop) = (app.clone(), stop.clone());
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
    pub async fn shutdown(self) {
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
