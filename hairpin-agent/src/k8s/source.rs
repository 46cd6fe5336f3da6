//! The Kubernetes source, started from one typed [`SourceConfig`]: the reflectors
//! and the decision ([`super::watch`]), and, when asked for, the Lease that elects
//! the one agent that writes cluster-wide objects, the Events it publishes and the
//! CoreDNS writer it runs.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use super::{
    coredns::{CorednsConfig, task},
    decide::Defaults,
    events, lease,
    watch::{Health, KubeSnapshot},
};
use crate::{
    names::{routes::NameRoute, scope::NameScope},
    status::{AgentState, metrics::Metrics},
};

/// Everything the Kubernetes source needs, validated by the caller.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// Agent-wide decision settings.
    pub defaults: Defaults,
    /// Which hostnames may be published (`--names-domains` and the names always refused).
    pub scope: NameScope,
    /// The name `/status` lists this source under (`kubernetes`).
    pub name: String,
    /// The Lease and what its holder writes; `None` when this agent writes nothing
    /// cluster-wide (no Events, no CoreDNS).
    pub writer: Option<WriterConfig>,
}

/// The one writer of cluster-wide objects, elected by a Lease.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This node's name: the Lease holder identity and the Events' reporter.
    pub node: String,
    /// Publish an Event on each Service whose decision changed, and a Warning on each
    /// Ingress or Gateway route whose hostname was refused.
    pub events: bool,
    /// Keep CoreDNS rewriting the routed names, when set.
    pub coredns: Option<CorednsConfig>,
}

/// Starts the source; the snapshot changes whenever the decision does.
pub fn spawn(
    client: kube::Client,
    cfg: SourceConfig,
    metrics: Metrics,
    state: AgentState,
) -> watch::Receiver<KubeSnapshot> {
    let health_state = state.clone();
    let name = cfg.name.clone();
    let health: Health = Arc::new(move |resource, error| match error {
        Some(e) => health_state.source_error(&name, &format!("{resource}: {e}")),
        None => health_state.source_recovered(&name),
    });
    let source = super::watch::spawn(client.clone(), cfg.defaults, cfg.scope, metrics, health);
    let Some(w) = cfg.writer else {
        return source.snapshot;
    };
    let (leader_tx, leader_rx) = watch::channel(false);
    let lease = lease::LeaseConfig {
        namespace: w.namespace,
        name: w.lease,
        identity: w.node.clone(),
        duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(5),
    };
    tokio::spawn(lease::run(client.clone(), lease, leader_tx));
    if w.events {
        tokio::spawn(events::run(
            client.clone(),
            w.node.clone(),
            source.services.clone(),
            source.snapshot.clone(),
            leader_rx.clone(),
        ));
    }
    if let Some(coredns) = w.coredns {
        tokio::spawn(task::run(
            client,
            coredns,
            w.node,
            routes_of(source.snapshot.clone()),
            leader_rx,
            state,
            task::Timing::default(),
        ));
    }
    source.snapshot
}

/// The routed hostnames of `snapshot`, `None` until it synced: the CoreDNS writer
/// must never take "not listed yet" for "no names".
fn routes_of(
    mut snapshot: watch::Receiver<KubeSnapshot>,
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
