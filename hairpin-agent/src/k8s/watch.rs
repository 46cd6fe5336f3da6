//! The Kubernetes source: reflectors on Services and Ingresses (and Gateway API
//! objects when their CRDs exist) feeding the pure decision in `decide_all`, and
//! one on Nodes (cut down to their addresses, pod networks and names) whose
//! addresses are never LoadBalancer addresses and whose names are never published.
//!
//! Fail static: the reflector stores keep the last listed state through watch
//! errors, 410 Gone re-lists and API outages (the store is only replaced when a new
//! list completes), so an API server that goes away never empties the frontends.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    networking::v1::Ingress,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, reflector},
        watcher,
    },
};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use super::{
    api_names::{self, CertNamesRx},
    decide::{
        Defaults, IgnoredClaim, SkipReason, cluster_dns::cluster_dns, decide_all,
        decision::Outcome, nodes::ClusterNodes,
    },
    desired::{Desired, DesiredRx, ToApply, ToReport},
};
use crate::{
    names::{
        routes::{NameSkip, NameSkipReason, name_routes},
        scope::{NameScope, ScopeRule},
    },
    status::metrics::Metrics,
};

/// Handles to the running source.
pub struct KubeSource {
    /// What the cluster says should exist: `None` until the Service list synced,
    /// then a new value whenever the decision's output changes.
    pub desired: DesiredRx,
    /// The Service cache (for Events: object references).
    pub services: Store<Service>,
    /// The Ingress cache (for the name fallbacks).
    pub ingresses: Store<Ingress>,
}

/// Called with a resource's watch error, or `None` when it delivers again.
pub(crate) type Health = Arc<dyn Fn(&'static str, Option<String>) + Send + Sync>;

/// The Gateway API caches, filled in as discovery finds each kind served.
#[derive(Clone, Default)]
struct GatewayStores(Arc<std::sync::Mutex<Vec<KindStore>>>);

/// One Gateway API kind's cache, by its plural resource name.
type KindStore = (&'static str, Store<DynamicObject>);

impl GatewayStores {
    fn add(&self, kind: &'static str, store: Store<DynamicObject>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((kind, store));
    }

    /// Gateways, and the routes (HTTPRoute, GRPCRoute, TLSRoute) that attach to them.
    fn objects(&self) -> (Vec<Arc<DynamicObject>>, Vec<Arc<DynamicObject>>) {
        let stores = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (mut gateways, mut routes) = (Vec::new(), Vec::new());
        for (kind, store) in stores.iter() {
            let into = if *kind == "gateways" {
                &mut gateways
            } else {
                &mut routes
            };
            into.extend(store.state());
        }
        (gateways, routes)
    }
}

/// Gateway API kinds watched when the CRDs are installed, each at the first of its
/// versions the API server serves: TLSRoute is served as v1 alone from Gateway API
/// v1.5 (v1alpha2 stays in the CRD with `served: false`), as v1alpha2 before;
/// GRPCRoute as v1 from v1.1 (its v1alpha2 is no longer served in the standard
/// channel).
const GATEWAY_KINDS: [(&str, &str); 6] = [
    ("v1", "Gateway"),
    ("v1", "HTTPRoute"),
    ("v1", "GRPCRoute"),
    ("v1", "TLSRoute"),
    ("v1alpha3", "TLSRoute"),
    ("v1alpha2", "TLSRoute"),
];

/// Starts the reflectors and the decision loop; hostnames are routed within
/// `decide.scope` once `decide.cert_names` knows the API server's certificate names
/// (none before).
pub fn spawn(client: Client, decide: Decide, metrics: Metrics, health: Health) -> KubeSource {
    let changed = Arc::new(Notify::new());
    let (services, svc_writer) = reflector::store::<Service>();
    let svc_stream = reflector(
        svc_writer,
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(slim),
    );
    tokio::spawn(drive(
        "services",
        svc_stream,
        changed.clone(),
        metrics.clone(),
        health.clone(),
    ));

    let (ingresses, ing_writer) = reflector::store::<Ingress>();
    let ing_stream = reflector(
        ing_writer,
        watcher(
            Api::<Ingress>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(slim),
    );
    tokio::spawn(drive(
        "ingresses",
        ing_stream,
        changed.clone(),
        metrics.clone(),
        health.clone(),
    ));

    // Every Node's addresses and names, refused as LB addresses and as names.
    let (nodes, node_writer) = reflector::store::<Node>();
    let node_stream = reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(super::decide::nodes::slim),
    );
    tokio::spawn(drive(
        "nodes",
        node_stream,
        changed.clone(),
        metrics.clone(),
        health.clone(),
    ));

    let gateway_stores = GatewayStores::default();
    tokio::spawn(watch_gateway_api(
        client,
        gateway_stores.clone(),
        changed.clone(),
        metrics.clone(),
        health,
    ));

    let (tx, desired) = watch::channel(None);
    tokio::spawn(decide_loop(
        Caches {
            services: services.clone(),
            ingresses: ingresses.clone(),
            nodes,
            gateway_api: gateway_stores,
        },
        decide,
        changed,
        tx,
        metrics,
    ));
    KubeSource {
        desired,
        services,
        ingresses,
    }
}

/// Polls one reflector stream forever. Errors are logged and counted; the stream
/// retries with backoff by itself and the store keeps its last state meanwhile.
async fn drive<K, S>(
    resource: &'static str,
    stream: S,
    changed: Arc<Notify>,
    metrics: Metrics,
    health: Health,
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut failing = false;
    while let Some(item) = stream.next().await {
        if item.is_ok() && failing {
            failing = false;
            health(resource, None);
        }
        match item {
            Ok(watcher::Event::InitDone) => {
                debug!(resource, "list complete");
                changed.notify_one();
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(_) => changed.notify_one(),
            Err(e) => {
                failing = true;
                health(resource, Some(e.to_string()));
                metrics.watch_restart(resource);
                warn!(resource, error = %e, "watch failed; retrying with backoff, last known state kept");
            }
        }
    }
}

/// How often the kinds not served yet are looked for again, at most: the Gateway
/// API CRDs are often installed after hairpin. Doubling from 1 s up to this: one
/// discovery request per node every few minutes while a kind stays absent.
const GATEWAY_REDISCOVERY_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// Gateway API CRDs are optional: watch their kinds only when the API group
/// answers, and look again for the ones not served until each is watched.
async fn watch_gateway_api(
    client: Client,
    stores: GatewayStores,
    changed: Arc<Notify>,
    metrics: Metrics,
    health: Health,
) {
    let mut watched: Vec<&str> = Vec::new();
    let mut pause = std::time::Duration::from_secs(1);
    let all = |w: &Vec<&str>| GATEWAY_KINDS.iter().all(|(_, k)| w.contains(k));
    let mut first = true;
    while !all(&watched) {
        if !first {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(GATEWAY_REDISCOVERY_MAX);
        }
        for (i, (version, kind)) in GATEWAY_KINDS.iter().copied().enumerate() {
            if watched.contains(&kind) {
                continue;
            }
            let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", version, kind);
            let resource = match kube::discovery::pinned_kind(&client, &gvk).await {
                Ok((ar, _caps)) => ar,
                Err(e) => {
                    let later = GATEWAY_KINDS[i + 1..].iter().any(|(_, k)| *k == kind);
                    if later || !first {
                        debug!(kind, version, error = %e, "Gateway API version not served");
                    } else {
                        info!(kind, version, error = %e, "Gateway API kind not served; looking again later");
                    }
                    continue;
                }
            };
            watched.push(kind);
            info!(kind, version, "watching Gateway API kind");
            let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
            let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
            stores.add(kind_name(&resource), writer.as_reader());
            let stream = reflector(
                writer,
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .modify(slim),
            );
            tokio::spawn(drive(
                kind_name(&resource),
                stream,
                changed.clone(),
                metrics.clone(),
                health.clone(),
            ));
        }
        first = false;
    }
}

/// Drops what every node would otherwise cache for no use: `managedFields` and
/// kubectl's last-applied copy of the whole object (often larger than the rest).
/// Nothing hairpin decides reads either.
fn slim<K: ResourceExt>(o: &mut K) {
    o.managed_fields_mut().clear();
    o.annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
}

fn kind_name(ar: &ApiResource) -> &'static str {
    match ar.kind.as_str() {
        "Gateway" => "gateways",
        "HTTPRoute" => "httproutes",
        "GRPCRoute" => "grpcroutes",
        _ => "tlsroutes",
    }
}

/// How long the decision waits for the first Node list.
const NODES_WAIT: Duration = Duration::from_secs(10);

/// What the decision needs besides the caches: the same for the DaemonSet's source
/// and the CoreDNS writer's, so both publish the same names.
#[derive(Clone, Debug)]
pub struct Decide {
    /// Agent-wide decision settings.
    pub defaults: Defaults,
    /// Which hostnames may be published (`--names-domains` and the names always refused).
    pub scope: NameScope,
    /// The API server's certificate names, read in the background
    /// ([`super::api_names::read_cert_names`]); no name is published until known.
    pub cert_names: CertNamesRx,
}

/// The caches the decision reads.
struct Caches {
    services: Store<Service>,
    ingresses: Store<Ingress>,
    nodes: Store<Node>,
    gateway_api: GatewayStores,
}

/// Decides again after every change the reflectors report (a burst coalesced into
/// one round), from the Service list's first sync on, and sends the result when it
/// differs from the last one.
async fn decide_loop(
    caches: Caches,
    mut decide: Decide,
    changed: Arc<Notify>,
    tx: watch::Sender<Option<Arc<Desired>>>,
    metrics: Metrics,
) {
    if !wait_for_lists(&caches, &decide.scope).await {
        return;
    }
    let mut logged = SkipLog::default();
    let mut claims_logged = BTreeSet::new();
    let mut cert_open = true;
    loop {
        let started = std::time::Instant::now();
        let desired = decide_round(&caches, &decide, &mut logged);
        log_ignored_claims(&desired.report.ignored_node_claims, &mut claims_logged);
        metrics.observe_decide(started.elapsed());
        tx.send_if_modified(|cur| {
            let modified = cur.as_deref() != Some(&desired);
            if modified {
                *cur = Some(Arc::new(desired));
            }
            modified
        });
        tokio::select! {
            () = changed.notified() => {}
            // The certificate names arrived (or their reader is done): decide again,
            // once; a closed channel is not waited on again.
            r = decide.cert_names.changed(), if cert_open => cert_open = r.is_ok(),
        }
        // Coalesce a burst (a re-list applies many objects) into one decision.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits for the Service list (false when its store went away) and, bounded, for
/// the Node list.
async fn wait_for_lists(caches: &Caches, scope: &NameScope) -> bool {
    if caches.services.wait_until_ready().await.is_err() {
        return false;
    }
    info!("Service cache synced");
    // Bounded: a Node list that is refused (RBAC of an older release) must not hold
    // the frontends back; its error is in the source's health meanwhile.
    if tokio::time::timeout(NODES_WAIT, caches.nodes.wait_until_ready())
        .await
        .is_err()
    {
        warn!(
            "the Node list has not arrived within {NODES_WAIT:?}: other nodes' addresses and \
             names are refused once it does"
        );
    }
    if scope.domains().is_empty() {
        warn!(
            "--names-domains is empty: no Ingress or Gateway hostname is published \
             (/etc/hosts, CoreDNS); list the domains names may be published under"
        );
    }
    true
}

/// One decision over the caches as they are: the frontends, the names routed to
/// them, and every LoadBalancer Service's decision.
fn decide_round(caches: &Caches, decide: &Decide, logged: &mut SkipLog) -> Desired {
    let all = caches.services.state();
    let cluster_nodes = ClusterNodes::from_nodes(caches.nodes.state().iter().map(|n| n.as_ref()));
    let round_defaults = Defaults {
        addresses: cluster_nodes.refuse_addresses(&decide.defaults.addresses),
        ..decide.defaults.clone()
    };
    let round_scope = cluster_nodes.refuse_names(&api_names::apply(
        &decide.scope,
        &decide.cert_names.borrow(),
    ));
    let decided = decide_all(all.iter().map(|s| s.as_ref()), &round_defaults);
    let (gateways, routes) = caches.gateway_api.objects();
    let names = name_routes(
        caches.ingresses.state().iter().map(|i| i.as_ref()),
        gateways.iter().map(|o| o.as_ref()),
        routes.iter().map(|o| o.as_ref()),
        &decided.frontends,
        &round_scope,
    );
    logged.log_new(&names.skips);
    Desired {
        apply: ToApply {
            frontends: decided.frontends,
            routes: names.routes,
        },
        report: ToReport {
            route_skips: names.skips,
            name_limits: names.limits,
            decisions: decided
                .decisions
                .into_iter()
                .filter(|d| !matches!(d.outcome, Outcome::Skipped(SkipReason::NotLoadBalancer)))
                .collect(),
            cluster_dns: cluster_dns(all.iter().map(|s| s.as_ref())),
            ignored_node_claims: cluster_nodes.ignored,
        },
    }
}

/// Logs each Node claim passed over once, when it first appears (again only after
/// it went away).
fn log_ignored_claims(now: &[IgnoredClaim], logged: &mut BTreeSet<IgnoredClaim>) {
    for c in now.iter().filter(|c| !logged.contains(*c)) {
        warn!(node = %c.node, claim = %c.claim, "Node claim passed over: {}", c.reason);
    }
    *logged = now.iter().cloned().collect();
}

/// The skips logged last round: each skip is logged once, when it first appears
/// (again only after it went away), not on every decision round.
#[derive(Default)]
struct SkipLog(BTreeSet<String>);

impl SkipLog {
    /// Logs the skips not logged last round; returns how many it logged.
    fn log_new(&mut self, skips: &[NameSkip]) -> usize {
        let mut now = BTreeSet::new();
        let mut logged = 0;
        for skip in skips {
            if !now.insert(skip.message.clone()) || self.0.contains(&skip.message) {
                continue;
            }
            logged += 1;
            match skip.reason {
                // Said once at startup (and by the certificate reader while it
                // retries); every hostname would repeat it.
                NameSkipReason::Refused(ScopeRule::NoDomains | ScopeRule::ApiServerPending) => {
                    debug!(reason = ?skip.reason, "hostname left out: {}", skip.message);
                }
                NameSkipReason::NoLoadBalancerIp | NameSkipReason::NotProxied => {
                    info!(reason = ?skip.reason, "hostname left out: {}", skip.message);
                }
                _ => warn!(reason = ?skip.reason, "hostname left out: {}", skip.message),
            }
        }
        self.0 = now;
        logged
    }
}

#[cfg(test)]
mod skip_log_tests {
    use super::*;

    #[test]
    fn each_skip_is_logged_once_until_it_goes_away() {
        let skip = |m: &str| NameSkip {
            reason: NameSkipReason::Refused(ScopeRule::Localhost),
            message: m.into(),
            object: None,
        };
        let mut log = SkipLog::default();
        assert_eq!(log.log_new(&[skip("a"), skip("a"), skip("b")]), 2);
        // The next decision rounds say the same: nothing new is logged.
        assert_eq!(log.log_new(&[skip("a"), skip("b")]), 0);
        assert_eq!(log.log_new(&[skip("b"), skip("c")]), 1);
        // `a` went away and came back: logged again.
        assert_eq!(log.log_new(&[skip("a"), skip("b"), skip("c")]), 1);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    #[test]
    fn cached_objects_keep_what_decisions_read_and_drop_the_rest() {
        let mut svc = Service::default();
        svc.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default(); 3]);
        svc.metadata.annotations = Some(
            [
                (
                    "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                    "{...the whole object...}".to_string(),
                ),
                (
                    "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol".to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
        );
        slim(&mut svc);
        assert_eq!(svc.metadata.managed_fields, Some(vec![]));
        let left: Vec<&String> = svc.annotations().keys().collect();
        assert_eq!(
            left,
            ["service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol"]
        );
    }
}
