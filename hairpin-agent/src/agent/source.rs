//! Where the desired state comes from: the frontends file, or the cluster.
//!
//! Both deliver a [`Desired`] through a watch channel, shared behind an `Arc`:
//! `None` until the source has synced once, so the agent never applies an empty
//! set it did not mean.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
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
    names::scope::NameScope,
    status::{AgentState, metrics::Metrics},
};

use crate::k8s::desired::{Desired, DesiredRx, ToApply, ToReport};

/// The frontends file now, then on every change; `name` is the source's name in
/// `/status`; its `hosts` are routed within `scope`. A file that does not load now
/// is an error: nothing is attached yet.
pub(crate) fn file(
    path: &Path,
    every: Duration,
    state: AgentState,
    name: String,
    scope: NameScope,
) -> Result<DesiredRx, frontends_file::FrontendsFileError> {
    let initial = load(path, &scope)?;
    let (tx, rx) = watch::channel(Some(Arc::new(initial)));
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

/// The cluster, through [`k8s::source`], which sends its desired state itself once
/// the Service list has synced.
pub(crate) fn kubernetes(
    client: kube::Client,
    cfg: SourceConfig,
    metrics: Metrics,
    state: AgentState,
) -> DesiredRx {
    k8s::source::spawn(client, cfg, metrics, state)
}

/// Reloads the frontends file when its modification time or size changes, and on
/// SIGHUP. A file that fails to load keeps the last good set (fail static).
async fn watch_file(
    path: PathBuf,
    every: Duration,
    tx: watch::Sender<Option<Arc<Desired>>>,
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
                if tx.send(Some(Arc::new(set))).is_err() {
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
        apply: ToApply {
            frontends,
            routes: routes.routes,
        },
        report: ToReport {
            route_skips: routes.skips,
            name_limits: routes.limits,
            ..ToReport::default()
        },
    })
}
