//! Deciding for every Service at once: one deduplicated, sorted set of frontends, with
//! conflicts between Services resolved the same way on every node, and the frontend
//! caps applied as the name caps are ([`FrontendCaps`]): a tenant's Service with a
//! thousand ports cannot crowd out another namespace's LoadBalancers.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use k8s_openapi::{api::core::v1::Service, apimachinery::pkg::apis::meta::v1::Time};

use crate::model::{FirstSpeaker, Frontend, Frontends, PathChoice, ProxyVersion, ServiceName};

use super::{
    decision::{Decision, Outcome, Skip, SkipReason},
    service::{Defaults, FrontendCaps, decide},
};

/// Two Services claim the same (IP, port) with different PROXY versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The LB IP.
    pub ip: IpAddr,
    /// The TCP port.
    pub port: u16,
    /// The Service that keeps the frontend.
    pub winner: ServiceName,
    /// The version the winner asked for, which is used.
    pub winner_version: ProxyVersion,
    /// The Service that lost it.
    pub loser: ServiceName,
    /// The version the loser asked for.
    pub loser_version: ProxyVersion,
}

/// What should exist cluster-wide, plus every Service's decision for `status` and Events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    /// One frontend per (IP, port).
    pub frontends: Frontends,
    /// Every Service's decision, sorted by `namespace/name`.
    pub decisions: Vec<Decision>,
    /// Conflicts found, in the order they were resolved.
    pub conflicts: Vec<Conflict>,
}

/// Merges the path choices of two Services asking for one (IP, port) with the same
/// version into `owner` (the older claim, which the map keeps): server speaks first
/// if either says so, the relay if either asks for it, since the relay path serves
/// both and the kernel path does not. Returns what the younger Service is told when
/// the two differed.
fn merge_paths(
    owner: &mut Frontend,
    younger: &Frontend,
    older: &ServiceName,
    younger_name: &ServiceName,
) -> Option<String> {
    let (mut merged_speaker, mut merged_path) = (owner.first_speaker, owner.path);
    if younger.first_speaker == FirstSpeaker::Server {
        merged_speaker = FirstSpeaker::Server;
    }
    if younger.path == PathChoice::Relay {
        merged_path = PathChoice::Relay;
    }
    if (younger.first_speaker, younger.path) == (owner.first_speaker, owner.path) {
        return None;
    }
    let note = format!(
        "{}:{} is also claimed by service {older} (older) with first speaker {} and path {}; \
         service {younger_name} asks for first speaker {} and path {}: both get first speaker \
         {merged_speaker} and path {merged_path}, which serve either",
        younger.ip,
        younger.port,
        owner.first_speaker,
        owner.path,
        younger.first_speaker,
        younger.path,
    );
    owner.first_speaker = merged_speaker;
    owner.path = merged_path;
    Some(note)
}

/// Withholds the frontends past `caps` ([`FrontendCaps`]): an address goes when
/// every claim of it is withheld, and each withheld claim is a skip and a warning
/// on its Service's decision (a Warning Event), naming the cap.
fn apply_caps(
    claimed: &mut Frontends,
    decisions: &mut [Decision],
    claims: &[(String, SocketAddr, Option<&Time>)],
    caps: FrontendCaps,
) {
    let withheld = crate::names::caps::withhold(
        claims.iter().map(|(ns, addr, t)| (ns.as_str(), addr, *t)),
        crate::names::caps::NameCaps {
            per_namespace: caps.per_namespace,
            total: caps.total,
        },
    );
    if withheld.names.is_empty() {
        return;
    }
    // An address shared by Services of several namespaces stays while one keeps it.
    let kept: std::collections::BTreeSet<SocketAddr> = claims
        .iter()
        .filter(|(ns, addr, _)| withheld.rule(ns, addr).is_none())
        .map(|(_, addr, _)| *addr)
        .collect();
    for (_, addr) in withheld.names.keys() {
        if !kept.contains(addr) {
            claimed.remove(addr);
        }
    }
    for d in decisions.iter_mut() {
        let ns = d.service.namespace.clone();
        let (capped, kept): (Vec<Frontend>, Vec<Frontend>) = std::mem::take(&mut d.frontends)
            .into_iter()
            .partition(|f| withheld.rule(&ns, &f.addr()).is_some());
        d.frontends = kept;
        for f in capped {
            let message = match withheld.rule(&ns, &f.addr()) {
                Some(crate::names::caps::CapRule::Namespace) => format!(
                    "{} withheld: namespace {ns} already has {} older frontends, the most \
                     --max-frontends-per-namespace allows",
                    f.addr(),
                    caps.per_namespace
                ),
                _ => format!(
                    "{} withheld: {} frontends in all, the most --max-frontends allows, are \
                     shared round robin between namespaces; namespace {ns} keeps {} of them",
                    f.addr(),
                    caps.total,
                    withheld.kept.get(&ns).copied().unwrap_or(0)
                ),
            };
            d.skips.push(Skip {
                reason: SkipReason::FrontendCap,
                message,
            });
        }
        if d.frontends.is_empty() && d.outcome == Outcome::Proxied {
            d.outcome = Outcome::Skipped(SkipReason::FrontendCap);
        }
    }
}

/// Decides for every Service and merges the frontends.
///
/// Two Services may share an LB IP (MetalLB `allow-shared-ip`, or one LB fronting several
/// Services). The same (IP, port) with the same version is merged; with different versions the
/// oldest Service (creationTimestamp, then `namespace/name`) wins on every node alike, and the
/// loser's decision records the conflict as a skip and a warning.
pub fn decide_all<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    defaults: &Defaults,
) -> DesiredState {
    let services: Vec<&'a Service> = services.into_iter().collect();
    // A cluster IP is never a LoadBalancer's: ours to refuse for every Service.
    let mut defaults = defaults.clone();
    for s in &services {
        let ips = s
            .spec
            .as_ref()
            .and_then(|spec| spec.cluster_ips.as_deref())
            .unwrap_or(&[]);
        for ip in ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()) {
            defaults
                .addresses
                .cluster_ips
                .entry(ip)
                .or_insert_with(|| super::service::service_key(s));
        }
    }
    let defaults = &defaults;
    let mut ordered: Vec<(Option<&'a Time>, Option<&'a str>, Decision)> = services
        .into_iter()
        .map(|s| {
            let meta = &s.metadata;
            (
                meta.creation_timestamp.as_ref(),
                meta.uid.as_deref(),
                decide(s, defaults),
            )
        })
        .collect();
    // Services without a timestamp (not from an API server) sort after all that have one; the
    // uid breaks the last tie so that input order never matters.
    ordered.sort_by(|(ta, ua, a), (tb, ub, b)| {
        (ta.is_none(), ta, &a.service, ua).cmp(&(tb.is_none(), tb, &b.service, ub))
    });

    let mut claimed = Frontends::new();
    // Who claimed each address first: the winner a conflict names.
    let mut owners: BTreeMap<SocketAddr, ServiceName> = BTreeMap::new();
    let mut conflicts = Vec::new();
    let mut decisions = Vec::with_capacity(ordered.len());
    // (namespace, address, creationTimestamp) of every frontend a Service keeps.
    let mut claims: Vec<(String, SocketAddr, Option<&'a Time>)> = Vec::new();
    for (created, _, mut decision) in ordered {
        let mut kept = Vec::with_capacity(decision.frontends.len());
        for frontend in std::mem::take(&mut decision.frontends) {
            let owner = match claimed.insert(frontend.clone()) {
                Ok(()) => {
                    owners.insert(frontend.addr(), decision.service.clone());
                    kept.push(frontend);
                    continue;
                }
                Err(owner) => owner,
            };
            let winner = owners
                .get(&frontend.addr())
                .cloned()
                .unwrap_or_else(|| decision.service.clone());
            if owner.version == frontend.version {
                // The same header either way; where the two ask for different paths,
                // the one that works for both wins (when in doubt, relay), said on
                // the younger Service's decision rather than dropped.
                if let Some(note) = merge_paths(owner, &frontend, &winner, &decision.service) {
                    decision.warnings.push(note);
                }
                kept.push(frontend);
                continue;
            }
            let message = format!(
                "{}:{} is claimed by service {winner} with PROXY {}, which is older; service {} asks for {} and loses it",
                frontend.ip, frontend.port, owner.version, decision.service, frontend.version
            );
            conflicts.push(Conflict {
                ip: frontend.ip,
                port: frontend.port,
                winner,
                winner_version: owner.version,
                loser: decision.service.clone(),
                loser_version: frontend.version,
            });
            decision.warnings.push(message.clone());
            decision.skips.push(Skip {
                reason: SkipReason::Conflict,
                message,
            });
        }
        claims.extend(
            kept.iter()
                .map(|f| (decision.service.namespace.clone(), f.addr(), created)),
        );
        decision.frontends = kept;
        if decision.frontends.is_empty() && decision.outcome == Outcome::Proxied {
            decision.outcome = Outcome::Skipped(SkipReason::Conflict);
        }
        decisions.push(decision);
    }
    apply_caps(
        &mut claimed,
        &mut decisions,
        &claims,
        defaults.frontend_caps,
    );
    decisions.sort_by(|a, b| a.service.cmp(&b.service));
    DesiredState {
        frontends: claimed,
        decisions,
        conflicts,
    }
}
