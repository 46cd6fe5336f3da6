//! The Kubernetes source, started from one typed config: the reflectors and the
//! decision ([`super::watch`]), and
//!
//! - for the DaemonSet ([`spawn`], [`SourceConfig`]), when asked for, the Lease that
//!   elects the one agent that publishes Events;
//! - for `hairpin-agent coredns-writer` ([`spawn_coredns_writer`],
//!   [`CorednsWriterConfig`]), its own Lease and the CoreDNS loop its holder runs.
//!
//! The DaemonSet never writes CoreDNS: its ServiceAccount has no access to
//! kube-system, so root on one node cannot rewrite every pod's DNS.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use super::{
    coredns::{CorednsConfig, task},
    events, lease,
    watch::{Decide, Health},
};
use crate::{
    names::routes::NameRoute,
    status::{AgentState, metrics::Metrics},
};

use super::desired::DesiredRx;

/// Everything the Kubernetes source needs, validated by the caller.
#[derive(Clone, Debug)]
pub(crate) struct SourceConfig {
    /// What the decision goes by.
    pub decide: Decide,
    /// The name `/status` lists this source under (`kubernetes`).
    pub name: String,
    /// The Lease and what its holder writes; `None` when this agent writes nothing
    /// cluster-wide (no Events).
    pub writer: Option<WriterConfig>,
}

/// The one agent that publishes Events (one on each Service whose decision changed,
/// a Warning on each Ingress or Gateway route whose hostname was refused), elected
/// by a Lease. Absent when `--events` is off.
#[derive(Clone, Debug)]
pub(crate) struct WriterConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This node's name: the Lease holder identity and the Events' reporter.
    pub node: String,
}

/// The CoreDNS writer's source: the same watches and decision as the DaemonSet's,
/// its own Lease, and the CoreDNS loop.
#[derive(Clone, Debug)]
pub(crate) struct CorednsWriterConfig {
    /// What the decision goes by: the same as the DaemonSet's, so the names are the
    /// same.
    pub decide: Decide,
    /// The name `/status` lists this source under.
    pub name: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name (not the agents' one: a different election).
    pub lease: String,
    /// This replica's identity (its pod name): the Lease holder and Event reporter.
    pub identity: String,
    /// How long the Lease holds without renewal; renewed every third of it.
    pub lease_duration: Duration,
    /// What is written.
    pub coredns: CorednsConfig,
    /// Resync, conflict retry, and the least time between two writes.
    pub timing: task::Timing,
}

/// How long the agents' Lease (the Events writer's election) holds without renewal.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// Runs for the Lease `namespace/name` as `identity`, renewing every third of
/// `duration`; the receiver says whether this process holds it.
fn elect(
    client: &kube::Client,
    namespace: String,
    name: String,
    identity: String,
    duration: Duration,
) -> watch::Receiver<bool> {
    let (leader_tx, leader_rx) = watch::channel(false);
    let lease = lease::LeaseConfig {
        namespace,
        name,
        identity,
        duration,
        renew_every: duration / 3,
    };
    tokio::spawn(lease::run(client.clone(), lease, leader_tx));
    leader_rx
}

/// Reports a watch's failures and recoveries on the source `name` in `state`.
fn source_health(state: AgentState, name: String) -> Health {
    Arc::new(move |resource, error| match error {
        Some(e) => state.source_error(&name, &format!("{resource}: {e}")),
        None => state.source_recovered(&name),
    })
}

/// Starts the source; it sends what should exist whenever the decision changes.
pub(crate) fn spawn(
    client: kube::Client,
    cfg: SourceConfig,
    metrics: Metrics,
    state: AgentState,
) -> DesiredRx {
    let health = source_health(state.clone(), cfg.name.clone());
    let source = super::watch::spawn(client.clone(), cfg.decide, metrics, health);
    let Some(w) = cfg.writer else {
        return source.desired;
    };
    let leader_rx = elect(
        &client,
        w.namespace,
        w.lease,
        w.node.clone(),
        LEASE_DURATION,
    );
    tokio::spawn(events::run(
        client,
        w.node,
        source.services.clone(),
        source.desired.clone(),
        leader_rx,
    ));
    source.desired
}

/// Starts the CoreDNS writer's source: the watches, its Lease and, while it holds
/// the Lease, the CoreDNS loop. What it sends says when the watches synced.
pub(crate) fn spawn_coredns_writer(
    client: kube::Client,
    cfg: CorednsWriterConfig,
    metrics: Metrics,
    state: AgentState,
) -> DesiredRx {
    let health = source_health(state.clone(), cfg.name.clone());
    let source = super::watch::spawn(client.clone(), cfg.decide, metrics.clone(), health);
    let leader_rx = elect(
        &client,
        cfg.namespace,
        cfg.lease,
        cfg.identity.clone(),
        cfg.lease_duration,
    );
    tokio::spawn(task::run(
        client,
        cfg.coredns,
        task::Reporting {
            instance: cfg.identity,
            state,
            metrics,
        },
        routes_of(source.desired.clone()),
        leader_rx,
        cfg.timing,
    ));
    source.desired
}

/// The routed hostnames of `desired`, `None` until it synced: the CoreDNS writer
/// must never take "not listed yet" for "no names".
fn routes_of(mut desired: DesiredRx) -> watch::Receiver<Option<Vec<NameRoute>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let next = desired
                .borrow_and_update()
                .as_ref()
                .map(|d| d.apply.routes.clone());
            tx.send_if_modified(|cur| {
                let modified = *cur != next;
                if modified {
                    *cur = next;
                }
                modified
            });
            if desired.changed().await.is_err() || tx.is_closed() {
                return;
            }
        }
    });
    rx
}
