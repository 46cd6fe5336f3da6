//! Kubernetes Events, written by the Lease holder only so a cluster of N nodes does
//! not write N copies: one on each Service whose decision changed, a Warning on
//! each Ingress or Gateway route whose hostname was refused (naming the rule), and
//! a Warning on each Node whose claim about itself was passed over.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::{
    Client, Resource,
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::{ObjectRef, Store},
    },
};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::{
    decide::{Decision, IgnoredClaim},
    desired::DesiredRx,
};
use crate::{
    model::ServiceName,
    names::routes::{NameSkip, ObjectId},
};

/// Publishes an Event for every LoadBalancer Service whose decision (reason or
/// message) differs from the last one this agent published, and one Warning per
/// refused hostname (object and message) not yet published, while it leads.
pub async fn run(
    client: Client,
    node: String,
    services: Store<Service>,
    mut desired: DesiredRx,
    mut leader: watch::Receiver<bool>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "hairpin-agent".into(),
            instance: Some(node),
        },
    );
    let mut published: BTreeMap<ServiceName, ServiceEvent> = BTreeMap::new();
    let mut names_published: BTreeSet<(ObjectId, String)> = BTreeSet::new();
    let mut claims_published: BTreeSet<IgnoredClaim> = BTreeSet::new();
    loop {
        if *leader.borrow_and_update() {
            let now = desired.borrow_and_update().clone();
            if let Some(now) = now {
                publish_decisions(&recorder, &services, &now.report.decisions, &mut published)
                    .await;
                publish_names(&recorder, &now.report.route_skips, &mut names_published).await;
                publish_node_claims(
                    &recorder,
                    &now.report.ignored_node_claims,
                    &mut claims_published,
                )
                .await;
            }
        } else {
            // A new leader republishes what it sees; forget what we sent.
            published.clear();
            names_published.clear();
            claims_published.clear();
        }
        tokio::select! {
            r = desired.changed() => if r.is_err() { return },
            r = leader.changed() => if r.is_err() { return },
        }
    }
}

/// One Service's Event as last published: a decision whose Event would read the
/// same is not published again.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ServiceEvent {
    warning: bool,
    reason: &'static str,
    note: String,
}

impl ServiceEvent {
    fn of(d: &Decision) -> ServiceEvent {
        ServiceEvent {
            warning: d.is_warning(),
            reason: d.reason(),
            note: d.summary(),
        }
    }
}

/// Publishes an Event for each decision whose Event differs from the one last
/// published for its Service.
async fn publish_decisions(
    recorder: &Recorder,
    services: &Store<Service>,
    decisions: &[Decision],
    published: &mut BTreeMap<ServiceName, ServiceEvent>,
) {
    for d in decisions {
        let event = ServiceEvent::of(d);
        if published.get(&d.service) == Some(&event) {
            continue;
        }
        match publish(recorder, services, &d.service, &event).await {
            Ok(()) => {
                published.insert(d.service.clone(), event);
            }
            Err(e) => warn!(object = %format_args!("Service {}", d.service), error = %e,
                "failed to publish Event"),
        }
    }
}

/// Publishes one Warning per refused hostname not yet published.
async fn publish_names(
    recorder: &Recorder,
    skips: &[NameSkip],
    published: &mut BTreeSet<(ObjectId, String)>,
) {
    let wanted = name_warnings(skips);
    // A refusal that went away may come back: publish it again then.
    published.retain(|k| wanted.iter().any(|w| w.key() == *k));
    for w in wanted {
        if published.contains(&w.key()) {
            continue;
        }
        match recorder.publish(&w.event(), &w.reference()).await {
            Ok(()) => {
                published.insert(w.key());
            }
            Err(e) => {
                warn!(object = %w.object.name, error = %e, "failed to publish Event")
            }
        }
    }
}

/// Publishes one Warning on the Node for each of its claims passed over, once
/// (again after it went away and came back).
async fn publish_node_claims(
    recorder: &Recorder,
    ignored: &[IgnoredClaim],
    published: &mut BTreeSet<IgnoredClaim>,
) {
    published.retain(|c| ignored.contains(c));
    for c in ignored {
        if published.contains(c) {
            continue;
        }
        let (event, reference) = node_claim_event(c);
        match recorder.publish(&event, &reference).await {
            Ok(()) => {
                published.insert(c.clone());
            }
            Err(e) => warn!(object = %format_args!("Node {}", c.node), error = %e,
                "failed to publish Event"),
        }
    }
}

/// The Warning on a Node whose claim is passed over, and its reference.
pub(crate) fn node_claim_event(c: &IgnoredClaim) -> (Event, ObjectReference) {
    let event = Event {
        type_: EventType::Warning,
        reason: "NodeClaimIgnored".into(),
        note: Some(truncate(
            &format!("Node {}: {}: {}", c.node, c.claim, c.reason),
            1024,
        )),
        action: "Decide".into(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(c.node.clone()),
        ..ObjectReference::default()
    };
    (event, reference)
}

async fn publish(
    recorder: &Recorder,
    services: &Store<Service>,
    service: &ServiceName,
    e: &ServiceEvent,
) -> Result<(), kube::Error> {
    let Some(svc) = services.get(&ObjectRef::new(&service.name).within(&service.namespace)) else {
        debug!(object = %format_args!("Service {service}"), "Service gone before its Event");
        return Ok(());
    };
    let event = Event {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.into(),
        note: Some(e.note.clone()),
        action: "Decide".into(),
        secondary: None,
    };
    recorder.publish(&event, &svc.object_ref(&())).await
}

/// A Warning Event on the object whose hostname was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NameWarning {
    /// The object at fault.
    pub object: ObjectId,
    /// CamelCase reason naming the rule (`HostnameRefusedClusterDomain`, ...).
    pub reason: &'static str,
    /// The skip's sentence: object, field, rule and what was expected.
    pub note: String,
}

impl NameWarning {
    fn key(&self) -> (ObjectId, String) {
        (self.object.clone(), self.note.clone())
    }

    /// The Event itself.
    pub(crate) fn event(&self) -> Event {
        Event {
            type_: EventType::Warning,
            reason: self.reason.into(),
            // Events' notes are capped at 1 KiB by the API server.
            note: Some(truncate(&self.note, 1024)),
            action: "PublishHostname".into(),
            secondary: None,
        }
    }

    /// The Event's `regarding` reference.
    pub(crate) fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.object.api_version.clone()),
            kind: Some(self.object.kind.clone()),
            namespace: Some(self.object.namespace.clone()),
            name: Some(self.object.name.clone()),
            uid: self.object.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

/// The Warnings `skips` call for: those on a Kubernetes object whose reason is a
/// refusal (not "no LB yet" nor "--names-domains is empty"), one per object and
/// sentence, in order.
pub(crate) fn name_warnings(skips: &[NameSkip]) -> Vec<NameWarning> {
    let mut out: Vec<NameWarning> = Vec::new();
    for s in skips {
        let (Some(object), Some(reason)) = (&s.object, s.reason.warning_rule()) else {
            continue;
        };
        let w = NameWarning {
            object: object.clone(),
            reason,
            note: s.message.clone(),
        };
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{routes::NameSkipReason, scope::ScopeRule};

    fn ingress(name: &str) -> ObjectId {
        ObjectId {
            api_version: "networking.k8s.io/v1".into(),
            kind: "Ingress".into(),
            namespace: "tenant-a".into(),
            name: name.into(),
            uid: Some("0f0e0000-0000-4000-8000-000000000001".into()),
        }
    }

    #[test]
    fn refusals_on_objects_become_warnings_naming_the_rule_and_ordinary_states_do_not() {
        let skip = |reason, message: &str, object: Option<ObjectId>| NameSkip {
            reason,
            message: message.into(),
            object,
        };
        let refused = "Ingress tenant-a/hijack: spec.rules[0].host: host api.tenant-b.svc.cluster.local \
                       refused (rule cluster-domain): ...";
        let skips = [
            skip(
                NameSkipReason::Refused(ScopeRule::ClusterDomain),
                refused,
                Some(ingress("hijack")),
            ),
            // The same sentence twice (two rounds merged) is one Event.
            skip(
                NameSkipReason::Refused(ScopeRule::ClusterDomain),
                refused,
                Some(ingress("hijack")),
            ),
            skip(
                NameSkipReason::Refused(ScopeRule::NoDomains),
                "empty list",
                Some(ingress("a")),
            ),
            skip(
                NameSkipReason::NoLoadBalancerIp,
                "pending",
                Some(ingress("b")),
            ),
            // The frontends file has no object to put an Event on.
            skip(NameSkipReason::Refused(ScopeRule::Localhost), "file", None),
            skip(
                NameSkipReason::RouteNotAccepted,
                "not accepted",
                Some(ingress("c")),
            ),
        ];
        let got = name_warnings(&skips);
        let reasons: Vec<(&str, &str)> = got
            .iter()
            .map(|w| (w.object.name.as_str(), w.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                ("hijack", "HostnameRefusedClusterDomain"),
                ("c", "RouteNotAcceptedByGateway")
            ]
        );
        let event = got[0].event();
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(event.note.as_deref(), Some(refused));
        let r = got[0].reference();
        assert_eq!(
            (r.kind.as_deref(), r.namespace.as_deref(), r.name.as_deref()),
            (Some("Ingress"), Some("tenant-a"), Some("hijack"))
        );
        assert_eq!(r.api_version.as_deref(), Some("networking.k8s.io/v1"));
        assert!(r.uid.is_some());
    }

    #[test]
    fn long_notes_are_cut_at_a_char_boundary() {
        let long = "é".repeat(1000);
        let cut = truncate(&long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with("..."), "{}", cut.len());
        assert_eq!(truncate("short", 1024), "short");
    }
}
