//! Which hostnames route to which proxied LoadBalancer: the map behind the name relay
//! and the /etc/hosts block.
//!
//! Each host is tied to the LB of the object that names it (an Ingress's
//! `status.loadBalancer`, a Gateway's `status.addresses`), never "all hosts to one
//! LB" (hairpin-proxy issue 17: with two ingress controllers, half the names broke).
//! Pure: objects in, routes and reasons out. The object readers, which turn
//! objects into [`Claim`]s, are in [`super::ingress`] and [`super::gateway`].

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::networking::v1::Ingress;
use kube::api::DynamicObject;

pub use super::claims::NameSkipReason;
pub(crate) use super::claims::{Claim, NameSkip, ObjectId};
use super::{
    caps, gateway::gateway_claims, hostname::Hostname, ingress::ingress_claims, scope::NameScope,
};
use crate::{
    model::{Frontends, ProxyVersion},
    status::NameLimitsStatus,
};

/// One hostname routed to one proxied LoadBalancer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NameRoute {
    /// The name clients use (exact or `*.example.com`).
    pub host: Hostname,
    /// The LoadBalancer IP the name's object is published on.
    pub lb: IpAddr,
    /// The proxied TCP ports of that LB with this header version, sorted.
    pub ports: Vec<u16>,
    /// The PROXY header the ingress behind the LB expects.
    pub version: ProxyVersion,
    /// The object that named the host: `Ingress ns/name`, `HTTPRoute ns/name`, ...
    pub source: String,
}

/// The routes, plus everything left out, for `status` and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameRoutes {
    /// Sorted by host, then LB.
    pub routes: Vec<NameRoute>,
    /// Hosts left out, each with its reason.
    pub skips: Vec<NameSkip>,
    /// The caps on names (the scope's), and how many names they withheld.
    pub limits: NameLimitsStatus,
}

/// Ties each claim to its own LB's proxied frontends and settles conflicts.
///
/// First every claim goes through `scope`: a host outside `--names-domains`, or
/// always refused (the cluster domain, `localhost`, ...), never reaches a route, so
/// it can neither be published nor win a conflict. Claims are taken oldest object first (then by source name, so every node agrees).
/// Then the scope's caps ([`caps`]) withhold the names past
/// `--max-names-per-namespace` in their namespace and past `--max-names` in all,
/// each a [`NameSkipReason::Capped`]; a withheld name cannot win a conflict either.
/// A host claimed again on the same LB IPs merges (two Ingresses splitting one host
/// by path on one controller is ordinary); claimed on different LBs by another
/// object, the older keeps it and the newer gets a [`NameSkipReason::Conflict`].
pub(crate) fn resolve(claims: Vec<Claim>, frontends: &Frontends, scope: &NameScope) -> NameRoutes {
    let mut out = NameRoutes::default();
    let claims = in_scope_oldest_first(claims, scope, &mut out.skips);
    let viable = on_proxied_lbs(claims, frontends, &mut out.skips);
    // The caps, before conflicts: a withheld name cannot keep a name from the
    // namespace that would publish it.
    let name_caps = scope.caps();
    let withheld = caps::withhold(
        viable.iter().map(|(c, _)| {
            (
                caps::namespace_of(c.object.as_ref()),
                &c.host,
                c.created.as_ref(),
            )
        }),
        name_caps,
    );
    out.limits = withheld.report(name_caps);
    out.routes = settle(viable, &withheld, name_caps, &mut out.skips);
    out
}

/// The LBs a claim's host is proxied on, each with its ports by PROXY version.
type ProxiedLbs = BTreeSet<(IpAddr, BTreeMap<ProxyVersion, Vec<u16>>)>;

/// The claims `scope` lets through, oldest object first (then by source and field,
/// so every node agrees); each refused one is a skip.
fn in_scope_oldest_first(
    claims: Vec<Claim>,
    scope: &NameScope,
    skips: &mut Vec<NameSkip>,
) -> Vec<Claim> {
    let mut claims: Vec<Claim> = claims
        .into_iter()
        .filter(|c| match scope.check(&c.host) {
            Ok(()) => true,
            Err(refusal) => {
                skips.push(NameSkip {
                    reason: NameSkipReason::Refused(refusal.rule),
                    message: format!("{}: {}: {}", c.source, c.field, refusal.message),
                    object: c.object.clone(),
                });
                false
            }
        })
        .collect();
    claims.sort_by(|a, b| {
        (a.created.is_none(), &a.created, &a.source, &a.field).cmp(&(
            b.created.is_none(),
            &b.created,
            &b.source,
            &b.field,
        ))
    });
    claims
}

/// Each claim with the LBs of its own that are proxied frontends; a claim with no
/// LB, or an LB that is not proxied, is a skip (and counts under no cap).
fn on_proxied_lbs(
    claims: Vec<Claim>,
    frontends: &Frontends,
    skips: &mut Vec<NameSkip>,
) -> Vec<(Claim, ProxiedLbs)> {
    let mut viable = Vec::with_capacity(claims.len());
    for claim in claims {
        let at = format!("{}: {}", claim.source, claim.field);
        if claim.lbs.is_empty() {
            skips.push(NameSkip {
                reason: NameSkipReason::NoLoadBalancerIp,
                message: format!(
                    "{at}: host {} has no loadbalancer ip in the object's status",
                    claim.host
                ),
                object: claim.object.clone(),
            });
            continue;
        }
        let mut proxied = BTreeSet::new();
        for lb in &claim.lbs {
            let per_version = ports_by_version(*lb, frontends);
            if per_version.is_empty() {
                skips.push(NameSkip {
                    reason: NameSkipReason::NotProxied,
                    message: format!(
                        "{at}: host {} is on loadbalancer {lb}, which is not a proxied frontend",
                        claim.host
                    ),
                    object: claim.object.clone(),
                });
                continue;
            }
            proxied.insert((*lb, per_version));
        }
        if !proxied.is_empty() {
            viable.push((claim, proxied));
        }
    }
    viable
}

/// The routes of the claims the caps do not withhold (each withheld one a skip),
/// a host going to its oldest claimant where claims on different LBs conflict
/// (each loser a skip). Sorted by host, then LB.
fn settle(
    viable: Vec<(Claim, ProxiedLbs)>,
    withheld: &caps::Withheld,
    name_caps: caps::NameCaps,
    skips: &mut Vec<NameSkip>,
) -> Vec<NameRoute> {
    // host -> (winning source, its LB IPs)
    let mut owners: BTreeMap<Hostname, (String, BTreeSet<IpAddr>)> = BTreeMap::new();
    let mut routes: BTreeSet<NameRoute> = BTreeSet::new();
    for (claim, proxied) in viable {
        let at = format!("{}: {}", claim.source, claim.field);
        let namespace = caps::namespace_of(claim.object.as_ref());
        if let Some(rule) = withheld.rule(namespace, &claim.host) {
            skips.push(NameSkip {
                reason: NameSkipReason::Capped(rule),
                message: format!(
                    "{at}: {}",
                    withheld.message(rule, namespace, &claim.host, name_caps)
                ),
                object: claim.object.clone(),
            });
            continue;
        }
        let lbs: BTreeSet<IpAddr> = proxied.iter().map(|(lb, _)| *lb).collect();
        match owners.get_mut(&claim.host) {
            Some((owner, owned)) if *owner != claim.source && *owned != lbs => {
                let (owned, owner) = (join(owned), owner.clone());
                skips.push(NameSkip {
                    reason: NameSkipReason::Conflict,
                    message: format!(
                        "{at}: host {} is claimed on loadbalancer {} by {owner}, which is older; \
                         {} asks for {} and loses it",
                        claim.host,
                        owned,
                        claim.source,
                        join(&lbs)
                    ),
                    object: claim.object.clone(),
                });
                continue;
            }
            // The same object naming the host on more LBs (dual-stack, two parents) adds them.
            Some((owner, owned)) if *owner == claim.source => owned.extend(lbs),
            Some(_) => {}
            None => {
                owners.insert(claim.host.clone(), (claim.source.clone(), lbs));
            }
        }
        let owner = owners
            .get(&claim.host)
            .map_or_else(|| claim.source.clone(), |(o, _)| o.clone());
        for (lb, per_version) in proxied {
            for (version, ports) in per_version {
                routes.insert(NameRoute {
                    host: claim.host.clone(),
                    lb,
                    ports,
                    version,
                    source: owner.clone(),
                });
            }
        }
    }
    routes.into_iter().collect()
}

/// The routes for every object at once: Ingresses, Gateways and their routes, tied to
/// `frontends` (what the Service decision proxies), within `scope`. Conflicts are
/// settled across kinds.
pub(crate) fn name_routes<'a>(
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateways: impl IntoIterator<Item = &'a DynamicObject>,
    routes: impl IntoIterator<Item = &'a DynamicObject>,
    frontends: &Frontends,
    scope: &NameScope,
) -> NameRoutes {
    let mut claims = Vec::new();
    let mut skips = Vec::new();
    for ingress in ingresses {
        let (c, s) = ingress_claims(ingress);
        claims.extend(c);
        skips.extend(s);
    }
    let (c, s) = gateway_claims(gateways, routes);
    claims.extend(c);
    skips.extend(s);
    let mut out = resolve(claims, frontends, scope);
    skips.append(&mut out.skips);
    out.skips = skips;
    out
}

fn join(ips: &BTreeSet<IpAddr>) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The proxied ports of `lb`, grouped by header version.
fn ports_by_version(lb: IpAddr, frontends: &Frontends) -> BTreeMap<ProxyVersion, Vec<u16>> {
    let mut out: BTreeMap<ProxyVersion, Vec<u16>> = BTreeMap::new();
    // In port order and one per port: the set owns each address once.
    for f in frontends.on_ip(lb) {
        out.entry(f.version).or_default().push(f.port);
    }
    out
}

/// Routes indexed for the relay: exact names first, then `*.parent` wildcards
/// matching exactly one more label.
#[derive(Clone, Debug, Default)]
pub(crate) struct RouteTable {
    by_host: BTreeMap<String, Vec<NameRoute>>,
}

impl RouteTable {
    /// Indexes `routes`; for a host on several LBs the lowest address is tried first.
    pub(crate) fn new(routes: &[NameRoute]) -> RouteTable {
        let mut by_host: BTreeMap<String, Vec<NameRoute>> = BTreeMap::new();
        for r in routes {
            by_host
                .entry(r.host.as_str().to_owned())
                .or_default()
                .push(r.clone());
        }
        for list in by_host.values_mut() {
            list.sort();
        }
        RouteTable { by_host }
    }

    /// Whether there are no routes.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_host.is_empty()
    }

    /// The route for a client's `name` (from SNI or Host) on `port`: the exact name,
    /// else the wildcard of its parent. A name that is not a valid hostname, or is
    /// itself a wildcard, matches nothing.
    pub(crate) fn lookup(&self, name: &str, port: u16) -> Option<&NameRoute> {
        let host = Hostname::parse(name).ok().filter(|h| !h.is_wildcard())?;
        fn on_port(list: &[NameRoute], port: u16) -> Option<&NameRoute> {
            list.iter().find(|r| r.ports.contains(&port))
        }
        if let Some(route) = self
            .by_host
            .get(host.as_str())
            .and_then(|l| on_port(l, port))
        {
            return Some(route);
        }
        let (_, parent) = host.as_str().split_once('.')?;
        self.by_host
            .get(&format!("*.{parent}"))
            .and_then(|l| on_port(l, port))
    }
}

#[cfg(test)]
mod tests;
