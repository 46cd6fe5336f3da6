//! Where the desired state comes from: the frontends file, or the cluster.
//!
//! Both deliver a [`Desired`] through a watch channel: `None` until the source has
//! synced once, so the agent never applies an empty set it did not mean.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::Result;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{error, warn};

use crate::{
    agent::args::RunArgs,
    agent::frontends_file as static_source,
    k8s::{self, coredns::CorednsConfig},
    model::Frontend,
    names::routes::NameRoute,
    status::metrics::Metrics,
    status::{self, AgentState},
};

/// What a source says should exist.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// LoadBalancer frontends to redirect and relay.
    pub frontends: BTreeSet<Frontend>,
    /// Hostnames the name relay routes to their own LB (and /etc/hosts points at it).
    pub routes: Vec<NameRoute>,
}

/// The receiving end the main loop applies from.
pub type DesiredRx = watch::Receiver<Option<Desired>>;

/// The static source: the file now, then on every change.
pub fn file_source(
    path: &Path,
    every: Duration,
    state: AgentState,
    name: String,
) -> Result<DesiredRx> {
    let initial = load_file(path)?;
    let (tx, rx) = watch::channel(Some(initial));
    tokio::spawn(watch_file(path.to_path_buf(), every, tx, state, name));
    Ok(rx)
}

/// The Kubernetes source: reflectors and the decision, the Lease, Events and the
/// CoreDNS writer (`coredns`, when on). One Lease elects the one agent that writes
/// both cluster-wide objects.
pub fn kubernetes_source(
    client: kube::Client,
    args: &RunArgs,
    metrics: Metrics,
    state: AgentState,
    name: String,
    coredns: Option<CorednsConfig>,
) -> Result<DesiredRx> {
    let defaults = k8s::Defaults {
        proxy_protocol: args.default_proxy_protocol.0,
    };
    let health_state = state.clone();
    let health: k8s::watch::Health = Arc::new(move |resource, error| match error {
        Some(e) => health_state.source_error(&name, &format!("{resource}: {e}")),
        None => health_state.source_recovered(&name),
    });
    let source = k8s::watch::spawn(client.clone(), defaults, metrics, health);
    if args.events || coredns.is_some() {
        let node = args.node_name()?;
        let (leader_tx, leader_rx) = watch::channel(false);
        let lease = k8s::lease::LeaseConfig {
            namespace: args.namespace.clone(),
            name: args.lease_name.clone(),
            identity: node.clone(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        };
        tokio::spawn(k8s::lease::run(client.clone(), lease, leader_tx));
        if args.events {
            tokio::spawn(k8s::events::run(
                client.clone(),
                node.clone(),
                source.services.clone(),
                source.snapshot.clone(),
                leader_rx.clone(),
            ));
        }
        if let Some(cfg) = coredns {
            tokio::spawn(k8s::coredns::task::run(
                client,
                cfg,
                node,
                routes_of(source.snapshot.clone()),
                leader_rx,
                state.clone(),
                k8s::coredns::task::Timing::default(),
            ));
        }
    }
    let (tx, rx) = watch::channel(None);
    let mut snapshot = source.snapshot;
    tokio::spawn(async move {
        loop {
            let next = {
                let s = snapshot.borrow_and_update();
                let decisions = s.decisions.iter().map(status_decision).collect();
                state.update(|st| {
                    st.decisions = decisions;
                    st.cluster_dns = s.cluster_dns.clone();
                });
                s.synced.then(|| Desired {
                    frontends: s.frontends.clone(),
                    routes: s.routes.clone(),
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
    Ok(rx)
}

/// The routed hostnames of `snapshot`, `None` until it synced: the CoreDNS writer
/// must never take "not listed yet" for "no names".
fn routes_of(
    mut snapshot: watch::Receiver<k8s::watch::KubeSnapshot>,
) -> watch::Receiver<Option<Vec<NameRoute>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let next = {
                let s = snapshot.borrow_and_update();
                s.synced.then(|| s.routes.clone())
            };
            tx.send_if_modified(|cur| {
                let modified = *cur != next;
                if modified {
                    *cur = next;
                }
                modified
            });
            if snapshot.changed().await.is_err() || tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// A Kubernetes decision in `/status`'s shape.
fn status_decision(d: &k8s::watch::DecisionView) -> status::Decision {
    let kind = if d.reason == "Proxied" {
        "proxied"
    } else if d.reason == "InvalidAnnotation" {
        "invalid"
    } else {
        "skipped"
    };
    status::Decision {
        object: d.object.clone(),
        state: kind.into(),
        reason: d.reason.clone(),
        message: d.message.clone(),
    }
}

/// Reloads the frontends file when its modification time or size changes, and on
/// SIGHUP. A file that fails to parse keeps the last good set (fail static).
async fn watch_file(
    path: PathBuf,
    every: Duration,
    tx: watch::Sender<Option<Desired>>,
    state: AgentState,
    name: String,
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
        match load_file(&path) {
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

/// The frontends file, with the hostnames routed to its LBs.
fn load_file(path: &Path) -> Result<Desired, static_source::StaticSourceError> {
    let frontends = static_source::load(path)?;
    let names = static_source::load_routes(path)?;
    for skip in &names.skips {
        warn!(reason = ?skip.reason, "{}", skip.message);
    }
    Ok(Desired {
        frontends,
        routes: names.routes,
    })
}
