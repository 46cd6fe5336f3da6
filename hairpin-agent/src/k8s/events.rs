//! Kubernetes Events on Services whose decision changed, written by the Lease
//! holder only so a cluster of N nodes does not write N copies.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube::{
    Client, Resource,
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::{ObjectRef, Store},
    },
};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::watch::{DecisionView, KubeSnapshot};

/// Publishes an Event for every LoadBalancer Service whose decision (reason or
/// message) differs from the last one this agent published, while it leads.
pub async fn run(
    client: Client,
    node: String,
    services: Store<Service>,
    mut snapshot: watch::Receiver<KubeSnapshot>,
    mut leader: watch::Receiver<bool>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "hairpin-agent".into(),
            instance: Some(node),
        },
    );
    let mut published: BTreeMap<String, DecisionView> = BTreeMap::new();
    loop {
        if *leader.borrow_and_update() {
            let decisions = snapshot.borrow_and_update().decisions.clone();
            for d in decisions {
                if published.get(&d.object) == Some(&d) {
                    continue;
                }
                match publish(&recorder, &services, &d).await {
                    Ok(()) => {
                        published.insert(d.object.clone(), d);
                    }
                    Err(e) => warn!(object = %d.object, error = %e, "failed to publish Event"),
                }
            }
        } else {
            // A new leader republishes what it sees; forget what we sent.
            published.clear();
        }
        tokio::select! {
            r = snapshot.changed() => if r.is_err() { return },
            r = leader.changed() => if r.is_err() { return },
        }
    }
}

async fn publish(
    recorder: &Recorder,
    services: &Store<Service>,
    d: &DecisionView,
) -> Result<(), kube::Error> {
    let Some((ns, name)) = d.object.trim_start_matches("Service ").split_once('/') else {
        return Ok(());
    };
    let Some(svc) = services.get(&ObjectRef::new(name).within(ns)) else {
        debug!(object = %d.object, "Service gone before its Event");
        return Ok(());
    };
    let event = Event {
        type_: if d.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: d.reason.clone(),
        note: Some(d.message.clone()),
        action: "Decide".into(),
        secondary: None,
    };
    recorder.publish(&event, &svc.object_ref(&())).await
}
