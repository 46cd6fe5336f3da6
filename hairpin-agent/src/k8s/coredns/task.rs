//! The CoreDNS writer's loop: while this process holds the Lease, keeps CoreDNS's
//! ConfigMap in step with the routed hostnames; re-reads after a 409 and resyncs
//! periodically, so an edit that drops our lines is repaired. A Corefile it cannot
//! edit is logged, put in `/status`, and reported once as a Warning Event on the
//! ConfigMap (reason `CorefileUnrecognized`). Each round first reads the CoreDNS
//! version: wildcard rewrites need 1.8.4 (`answer auto`), so below it, or when it
//! cannot be read, they are held back, logged once and put in `/status`
//! ([`super::version`] says why this rather than writing them without the option).
//!
//! Writes are rate-limited: after a write, the next one waits at least
//! [`Timing::min_write_interval`], and every change of the names meanwhile is folded
//! into that one write (an Ingress that flaps rewrites the ConfigMap, and so makes
//! every CoreDNS reload it, once per interval at most). `/status` shows since when a
//! write waits (`pending_since`), how many changes were folded and how many writes
//! were made; `/metrics` the same as `hairpin_coredns_*`.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::{self as coredns, CorednsConfig, CorednsError, Written, version};
use crate::{
    names::routes::NameRoute,
    status::{AgentState, CorednsStatus, metrics::Metrics, rfc3339},
};

/// Event reason on a ConfigMap whose Corefile has no main server block.
pub const REASON_UNRECOGNIZED: &str = "CorefileUnrecognized";

/// Loop timing.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Retry after a 409 Conflict (re-read at once, nearly).
    pub conflict_retry: Duration,
    /// Resync even without a change: repairs edits by others, retries errors.
    pub resync: Duration,
    /// The least time between two writes of the ConfigMap; changes meanwhile are
    /// coalesced into the next write.
    pub min_write_interval: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            conflict_retry: Duration::from_millis(500),
            resync: Duration::from_secs(30),
            min_write_interval: Duration::from_secs(10),
        }
    }
}

/// Who writes, and where it reports.
#[derive(Clone)]
pub struct Reporting {
    /// The Event reporter's instance (the Lease identity).
    pub instance: String,
    /// `/status`.
    pub state: AgentState,
    /// `/metrics`.
    pub metrics: Metrics,
}

/// When the next round may write: at once, or after the interval since the last
/// write (pure, so the rate limit is unit-tested).
pub(crate) fn write_at(
    last_write: Option<Instant>,
    min_interval: Duration,
    now: Instant,
) -> Option<Instant> {
    last_write.map(|t| t + min_interval).filter(|at| *at > now)
}

/// Runs forever. `routes` is `None` until the source has synced (so an empty set at
/// startup never removes lines it did not mean to); `leader` says whether to write.
pub async fn run(
    client: Client,
    cfg: CorednsConfig,
    report: Reporting,
    mut routes: watch::Receiver<Option<Vec<NameRoute>>>,
    mut leader: watch::Receiver<bool>,
    timing: Timing,
) {
    let mut w = Writer::start(client, cfg, report, timing).await;
    loop {
        let is_leader = *leader.borrow_and_update();
        let current = routes.borrow_and_update().clone();
        let waiting = is_leader && current.is_some();
        let deferred =
            write_at(w.last_write, timing.min_write_interval, Instant::now()).filter(|_| waiting);
        let wait = match (deferred, is_leader, current) {
            (Some(at), _, _) => w.defer(at),
            (None, true, Some(current)) => w.write(&current).await,
            (None, _, _) => w.idle(is_leader),
        };
        w.show_pending();
        tokio::select! {
            r = routes.changed() => {
                if r.is_err() { return }
                w.fold_change();
            }
            r = leader.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The loop's state between rounds, and where it reports.
struct Writer {
    client: Client,
    cfg: CorednsConfig,
    recorder: Recorder,
    state: AgentState,
    metrics: Metrics,
    timing: Timing,
    /// The CorefileUnrecognized message last published as an Event.
    reported: Option<String>,
    /// Why wildcard rewrites are held back, as last said.
    held_back: Option<String>,
    last_write: Option<Instant>,
    /// Since when a change waits for the interval (wall clock, for `/status`).
    pending: Option<SystemTime>,
}

impl Writer {
    /// Says in the log and `/status` what is written where, and whether
    /// NodeLocal DNSCache answers before CoreDNS.
    async fn start(
        client: Client,
        cfg: CorednsConfig,
        report: Reporting,
        timing: Timing,
    ) -> Writer {
        let Reporting {
            instance,
            state,
            metrics,
        } = report;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "hairpin-agent".into(),
                instance: Some(instance),
            },
        );
        let warning = coredns::node_local_dns(&client).await;
        if let Some(w) = &warning {
            warn!("{w}");
        }
        state.update(|s| {
            s.coredns = Some(CorednsStatus {
                mode: cfg.mode.to_string(),
                configmap: cfg.written().to_string(),
                target: cfg.target.to_string(),
                node_local_dns: warning,
                ..CorednsStatus::default()
            })
        });
        Writer {
            client,
            cfg,
            recorder,
            state,
            metrics,
            timing,
            reported: None,
            held_back: None,
            last_write: None,
            pending: None,
        }
    }

    /// Rate-limited: this round waits until `at`; changes meanwhile fold into it.
    fn defer(&mut self, at: Instant) -> Duration {
        if self.pending.is_none() {
            self.pending = Some(SystemTime::now());
            debug!(configmap = %self.cfg.written(), in_ms = at.saturating_duration_since(Instant::now()).as_millis() as u64,
                "CoreDNS write waits for the minimum interval between writes");
        }
        at.saturating_duration_since(Instant::now())
    }

    /// Writes the rewrites for `current` as this CoreDNS version can take them;
    /// how long until the next round.
    async fn write(&mut self, current: &[NameRoute]) -> Duration {
        self.pending = None;
        let mut wait = self.timing.resync;
        let found = coredns::coredns_version(&self.client, &self.cfg.configmap).await;
        let (rewrites, held) =
            version::usable(coredns::rewrites(current, &self.cfg.target), &found);
        self.say_held_back(held);
        let result = coredns::sync(&self.client, &self.cfg, &rewrites).await;
        match &result {
            Ok(Written::Unchanged) => {}
            Ok(w) => {
                self.last_write = Some(Instant::now());
                self.metrics.coredns_written();
                info!(configmap = %self.cfg.written(), rewrites = rewrites.len(), written = ?w, "CoreDNS rewrites written")
            }
            Err(CorednsError::Conflict(_)) => {
                warn!(configmap = %self.cfg.written(), "CoreDNS ConfigMap changed under us (409): re-reading");
                wait = self.timing.conflict_retry;
            }
            Err(e) => error!(error = %e, "CoreDNS not written"),
        }
        // Status first: whoever sees the Event finds the error in `/status` too.
        record(&self.state, true, &result, rewrites.len());
        self.report_unrecognized(&result).await;
        wait
    }

    /// Logs and shows why wildcard rewrites are held back, when that changed.
    fn say_held_back(&mut self, held: Option<String>) {
        if held == self.held_back {
            return;
        }
        if let Some(w) = &held {
            warn!("{w}");
        }
        self.held_back = held;
        let shown = self.held_back.clone();
        self.state.update(|s| {
            if let Some(c) = s.coredns.as_mut() {
                c.held_back = shown;
            }
        });
    }

    /// Publishes a Corefile it cannot edit as a Warning Event, once per message.
    async fn report_unrecognized(&mut self, result: &Result<Written, CorednsError>) {
        if let Err(e @ CorednsError::Unrecognized { .. }) = result {
            let message = e.to_string();
            if self.reported.as_ref() != Some(&message) {
                if let Err(err) = publish(&self.client, &self.recorder, &self.cfg, &message).await {
                    warn!(error = %err, "failed to publish the CorefileUnrecognized Event");
                } else {
                    self.reported = Some(message);
                }
            }
        } else if result.is_ok() {
            self.reported = None;
        }
    }

    /// Not leading (or not synced): nothing waits to be written by us.
    fn idle(&mut self, is_leader: bool) -> Duration {
        self.pending = None;
        self.state.update(|s| {
            if let Some(c) = s.coredns.as_mut() {
                c.leader = is_leader;
            }
        });
        if !is_leader {
            // A new leader reports afresh.
            self.reported = None;
        }
        self.timing.resync
    }

    /// Shows since when a write waits, if one does.
    fn show_pending(&self) {
        self.metrics.set_coredns_pending(self.pending.is_some());
        let shown = self.pending.map(rfc3339);
        self.state.update(|s| {
            if let Some(c) = s.coredns.as_mut() {
                c.pending_since = shown;
            }
        });
    }

    /// Counts a change of the names that folds into the write waiting.
    fn fold_change(&self) {
        if self.pending.is_some() {
            self.metrics.coredns_coalesced();
            self.state.update(|s| {
                if let Some(c) = s.coredns.as_mut() {
                    c.coalesced += 1;
                }
            });
        }
    }
}

fn record(state: &AgentState, leader: bool, result: &Result<Written, CorednsError>, n: usize) {
    state.update(|s| {
        let Some(c) = s.coredns.as_mut() else {
            return;
        };
        c.leader = leader;
        match result {
            Ok(w) => {
                c.last_error = None;
                c.rewrites = n;
                if *w != Written::Unchanged {
                    c.last_write = Some(rfc3339(SystemTime::now()));
                    c.writes += 1;
                }
            }
            Err(e) => c.last_error = Some(e.to_string()),
        }
    });
}

async fn publish(
    client: &Client,
    recorder: &Recorder,
    cfg: &CorednsConfig,
    message: &str,
) -> Result<(), kube::Error> {
    let o = &cfg.configmap;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &o.namespace)
        .get(&o.name)
        .await?;
    let event = Event {
        type_: EventType::Warning,
        reason: REASON_UNRECOGNIZED.into(),
        note: Some(message.to_string()),
        action: "RewriteNames".into(),
        secondary: None,
    };
    recorder.publish(&event, &cm.object_ref(&())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_waits_for_the_interval_since_the_last_write_only() {
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        assert_eq!(write_at(None, every, t0), None, "never wrote: at once");
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(write_at(Some(t0), every, at(3)), Some(at(10)));
        assert_eq!(write_at(Some(t0), every, at(10)), None);
        assert_eq!(write_at(Some(t0), every, at(11)), None);
        assert_eq!(write_at(Some(t0), Duration::ZERO, t0), None, "0: no limit");
    }
}
