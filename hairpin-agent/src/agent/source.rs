//! Where the desired state comes from: the frontends file, or the cluster.
//!
//! Both deliver a [`Desired`] through a watch channel: `None` until the source has
//! synced once, so the agent never applies an empty set it did not mean.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{error, warn};

use super::frontends_file::{self, FrontendsFile};
use crate::{
    k8s::{self, source::SourceConfig},
    model::Frontends,
    names::{routes::NameRoute, scope::NameScope},
    status::{AgentState, NameLimitsStatus, metrics::Metrics},
};

/// What a source says should exist.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// LoadBalancer frontends to redirect and relay, one per address.
    pub frontends: Frontends,
    /// Hostnames the name relay routes to their own LB (and /etc/hosts points at it).
    pub routes: Vec<NameRoute>,
    /// Hostnames left out (refused by `--names-domains` and its rules, not accepted
    /// by their Gateway, not proxied, conflicts), one sentence each, for `/status`.
    pub route_skips: Vec<String>,
    /// The caps on names, and how many names they withheld by namespace.
    pub name_limits: NameLimitsStatus,
}

/// The receiving end the agent applies from.
pub type DesiredRx = watch::Receiver<Option<Desired>>;

/// The frontends file now, then on every change; `name` is the source's name in
/// `/status`; its `hosts` are routed within `scope`. A file that does not load now
/// is an error: nothing is attached yet.
pub fn file(
    path: &Path,
    every: Duration,
    state: AgentState,
    name: String,
    scope: NameScope,
) -> Result<DesiredRx, frontends_file::FrontendsFileError> {
    let initial = load(path, &scope)?;
    let (tx, rx) = watch::channel(Some(initial));
    tokio::spawn(watch_file(
        path.to_path_buf(),
        every,
        tx,
        state,
        name,
        scope,
    ));
    Ok(rx)
}

/// The cluster, through [`k8s::source`]: decisions go to `/status` as they come,
/// and the desired state once the Service list has synced.
pub fn kubernetes(
    client: kube::Client,
    cfg: SourceConfig,
    metrics: Metrics,
    state: AgentState,
) -> DesiredRx {
    let mut snapshot = k8s::source::spawn(client, cfg, metrics, state.clone());
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let next = {
                let s = snapshot.borrow_and_update();
                let decisions = s.decisions.iter().map(|d| d.to_status()).collect();
                state.update(|st| {
                    st.decisions = decisions;
                    st.cluster_dns = s.cluster_dns.clone();
                });
                s.synced.then(|| Desired {
                    frontends: s.frontends.clone(),
                    routes: s.routes.clone(),
                    route_skips: s.route_skips.iter().map(|k| k.message.clone()).collect(),
                    name_limits: s.name_limits.clone(),
                })
            };
            if next.is_some() {
                tx.send_if_modified(|cur| {
                    let modified = *cur != next;
                    if modified {
                        *cur = next;
                    }
                    modified
                });
            }
            if snapshot.changed().await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Reloads the frontends file when its modification time or size changes, and on
/// SIGHUP. A file that fails to load keeps the last good set (fail static).
async fn watch_file(
    path: PathBuf,
    every: Duration,
    tx: watch::Sender<Option<Desired>>,
    state: AgentState,
    name: String,
    scope: NameScope,
) {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
    };
    let mut last = stamp(&path);
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "SIGHUP reloads disabled");
            None
        }
    };
    let mut tick = tokio::time::interval(every);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        let now = stamp(&path);
        if !forced && now == last {
            continue;
        }
        last = now;
        match load(&path, &scope) {
            Ok(set) => {
                if tx.send(Some(set)).is_err() {
                    return;
                }
            }
            Err(e) => {
                error!(error = %e, "keeping the last good frontends");
                state.source_error(&name, &e.to_string());
            }
        }
    }
}

/// The frontends file, read and parsed once, with the hostnames routed to its LBs
/// within `scope`. Each skip is logged once per load (a load follows an edit).
fn load(path: &Path, scope: &NameScope) -> Result<Desired, frontends_file::FrontendsFileError> {
    let FrontendsFile { frontends, routes } = frontends_file::load(path, scope)?;
    for skip in &routes.skips {
        warn!(reason = ?skip.reason, "hostname left out: {}", skip.message);
    }
    Ok(Desired {
        frontends,
        routes: routes.routes,
        route_skips: routes.skips.into_iter().map(|s| s.message).collect(),
        name_limits: routes.limits,
    })
}
