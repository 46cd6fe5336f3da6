//! One writer for cluster-wide objects: a coordination.k8s.io/v1 Lease.
//!
//! The DaemonSet's agents elect the one that writes Events (`hairpin-agent`); the
//! `coredns-writer` replicas elect the one that writes CoreDNS (`hairpin-coredns`).
//! Every write carries the Lease's resourceVersion, so two candidates racing for an
//! expired Lease cannot both win: the loser gets 409 Conflict.
//!
//! Expiry is judged on two clocks: the holder's own `renewTime` plus its
//! `leaseDurationSeconds`, and, as client-go's leader election does, this process's
//! own observation: a Lease whose resourceVersion has not changed for longer than
//! our own duration is expired whatever its times say. So a Lease created by another
//! account (RBAC cannot limit `create` by name) with a renew time in the future or a
//! duration of years cannot keep the rightful candidates out for more than one
//! duration.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{Api, Client, api::PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

/// Lease settings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease (the agent's own).
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This agent's identity (its node name).
    pub identity: String,
    /// How long a Lease holds without renewal.
    pub duration: Duration,
    /// How often the holder renews and others check.
    pub renew_every: Duration,
}

/// What one look at the Lease decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Create it: there is none.
    Create,
    /// We hold it: renew.
    Renew,
    /// Someone else's expired: take it over.
    TakeOver,
    /// Someone else holds it.
    Follow(String),
}

/// Decides what to do with `lease` (pure, so the expiry rules are unit-tested).
pub(crate) fn step(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Step {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return if lease.is_some() {
            Step::TakeOver
        } else {
            Step::Create
        };
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Step::Renew,
        None | Some("") => Step::TakeOver,
        Some(holder) => {
            let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            let expired = spec
                .renew_time
                .as_ref()
                .or(spec.acquire_time.as_ref())
                .is_none_or(|t| t.0 + SignedDuration::from_secs(secs) < now);
            if expired {
                Step::TakeOver
            } else {
                Step::Follow(holder.to_string())
            }
        }
    }
}

/// `step` seen from this process: a Lease held by someone else that has not changed
/// (same resourceVersion) for longer than `duration` is taken over, whatever its
/// own times claim.
pub(crate) fn step_observed(step: Step, unchanged_for: Duration, duration: Duration) -> Step {
    match step {
        Step::Follow(_) if unchanged_for > duration => Step::TakeOver,
        other => other,
    }
}

/// The resourceVersion last seen, and since when (this process's clock).
#[derive(Debug, Default)]
struct Observed(Option<(String, Instant)>);

impl Observed {
    /// How long `rv` has been the Lease's resourceVersion, as far as we have seen.
    fn unchanged_for(&mut self, rv: Option<&str>, now: Instant) -> Duration {
        let rv = rv.unwrap_or_default();
        match &self.0 {
            Some((seen, since)) if seen == rv => now.saturating_duration_since(*since),
            _ => {
                self.0 = Some((rv.to_string(), now));
                Duration::ZERO
            }
        }
    }
}

/// Runs the election forever, publishing whether this process holds the Lease.
pub async fn run(client: Client, cfg: LeaseConfig, leader: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut tick = tokio::time::interval(cfg.renew_every);
    let mut observed = Observed::default();
    loop {
        tick.tick().await;
        let held = match attempt(&api, &cfg, &mut observed).await {
            Ok(held) => held,
            Err(e) => {
                warn!(lease = %cfg.name, error = %e, "lease update failed");
                // Without a successful renewal we cannot know we still hold it.
                false
            }
        };
        if leader.send_replace(held) != held {
            info!(lease = %cfg.name, identity = %cfg.identity, held, "leadership changed");
        }
    }
}

async fn attempt(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(&cfg.name).await?;
    let now = Timestamp::now();
    let rv = current
        .as_ref()
        .and_then(|l| l.metadata.resource_version.as_deref());
    let unchanged_for = observed.unchanged_for(rv, Instant::now());
    let claimed = step(current.as_ref(), &cfg.identity, now);
    let step = step_observed(claimed.clone(), unchanged_for, cfg.duration);
    if let (Step::Follow(holder), Step::TakeOver) = (&claimed, &step) {
        warn!(lease = %cfg.name, %holder, unchanged_secs = unchanged_for.as_secs(),
            "the Lease's holder has not renewed it while we watched, whatever its times say: taking it over");
    }
    let stamp = Some(MicroTime(now));
    let result = match (step, current) {
        (Step::Follow(_), _) => return Ok(false),
        (Step::Create, _) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(cfg.duration.as_secs() as i32),
                    acquire_time: stamp.clone(),
                    renew_time: stamp,
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        (step, Some(mut lease)) => {
            // `lease` carries its resourceVersion: replace fails with 409 if anyone wrote since.
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if step == Step::TakeOver {
                spec.holder_identity = Some(cfg.identity.clone());
                spec.acquire_time = stamp.clone();
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.lease_duration_seconds = Some(cfg.duration.as_secs() as i32);
            spec.renew_time = stamp;
            api.replace(&cfg.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        (_, None) => return Ok(false),
    };
    match result {
        Ok(()) => Ok(true),
        // Someone else wrote first (409) or created it first: follow for now.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: Timestamp, secs: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(secs),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn expiry_rules() {
        let now = Timestamp::from_second(1_000_000).expect("timestamp");
        let ago = |s| now - SignedDuration::from_secs(s);
        assert_eq!(step(None, "a", now), Step::Create);
        assert_eq!(step(Some(&lease("a", ago(100), 15)), "a", now), Step::Renew);
        assert_eq!(
            step(Some(&lease("b", ago(5), 15)), "a", now),
            Step::Follow("b".into())
        );
        assert_eq!(
            step(Some(&lease("b", ago(16), 15)), "a", now),
            Step::TakeOver
        );
        assert_eq!(step(Some(&lease("", ago(1), 15)), "a", now), Step::TakeOver);
    }

    #[test]
    fn a_lease_nobody_renews_is_taken_over_whatever_its_times_claim() {
        let now = Timestamp::from_second(1_000_000).expect("timestamp");
        // Created by another account with a renew time a year ahead and a duration of years.
        let forged = lease(
            "mallory",
            now + SignedDuration::from_hours(24 * 365),
            i32::MAX,
        );
        let claimed = step(Some(&forged), "writer-0", now);
        assert_eq!(claimed, Step::Follow("mallory".into()));
        let ours = Duration::from_secs(15);
        assert_eq!(
            step_observed(claimed.clone(), Duration::from_secs(10), ours),
            claimed,
            "not yet: it may still be renewed"
        );
        assert_eq!(
            step_observed(claimed, Duration::from_secs(16), ours),
            Step::TakeOver
        );
        // Our own Lease is renewed, never taken over from ourselves.
        assert_eq!(
            step_observed(Step::Renew, Duration::from_secs(100), ours),
            Step::Renew
        );
    }

    #[test]
    fn a_changing_resource_version_restarts_the_observation() {
        let t0 = Instant::now();
        let mut o = Observed::default();
        assert_eq!(o.unchanged_for(Some("1"), t0), Duration::ZERO);
        assert_eq!(
            o.unchanged_for(Some("1"), t0 + Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        assert_eq!(
            o.unchanged_for(Some("2"), t0 + Duration::from_secs(9)),
            Duration::ZERO
        );
        assert_eq!(
            o.unchanged_for(Some("2"), t0 + Duration::from_secs(12)),
            Duration::from_secs(3)
        );
    }
}
