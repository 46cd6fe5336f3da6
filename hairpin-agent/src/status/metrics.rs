//! Prometheus metrics, served on `/metrics` by the admin server.

use std::sync::{Arc, PoisonError, RwLock};

use crate::model::NodePath;

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// Direction of relayed bytes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Direction {
    /// Client to LoadBalancer (after the PROXY header).
    Upstream,
    /// LoadBalancer to client.
    Downstream,
}

/// Why a relayed connection failed, on either side (the `kind` label of
/// `hairpin_relay_upstream_errors_total` and `hairpin_relay_client_errors_total`,
/// lower case). Which side failed is the metric, not the kind.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ConnError {
    /// connect() was refused (RST): nothing listens behind the LB for that port.
    Refused,
    /// connect() did not complete within the connect timeout, or keepalive probes
    /// went unanswered.
    Timeout,
    /// The connection was reset (or the pipe broken) while relaying.
    Reset,
    /// Anything else (unreachable, descriptor limits...).
    Other,
}

impl ConnError {
    /// Every kind, in label order.
    pub(crate) const ALL: [ConnError; 4] = [
        ConnError::Other,
        ConnError::Refused,
        ConnError::Reset,
        ConnError::Timeout,
    ];

    /// The label value and `/status` key.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ConnError::Refused => "refused",
            ConnError::Timeout => "timeout",
            ConnError::Reset => "reset",
            ConnError::Other => "other",
        }
    }
}

impl EncodeLabelValue for ConnError {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.name())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: ConnError,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HowLabel {
    how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabel {
    event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    /// The running kernel's release (`uname -r`).
    kernel: String,
    /// What it gives hairpin (`kernel_path=yes,link_order=no,...`), as
    /// `hairpin_kernel_capability` says one gauge each.
    kernel_capabilities: String,
}

/// The running kernel's release, read once.
fn kernel_release() -> &'static str {
    static RELEASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RELEASE.get_or_init(|| {
        nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default()
    })
}

/// Every path a node can have live, for `hairpin_live_path` (0 for the others, so a
/// path that goes away shows as a change, not as a missing series): the programs
/// (`ebpf`), the kernel path among them (`kernel`), the hosts block, CoreDNS.
const PATHS: [&str; 4] = ["ebpf", "kernel", "hosts", "coredns"];

/// Reads the kernel programs' counters (name, total) when `/metrics` is scraped:
/// they move without the agent noticing.
pub(crate) type KernelCounterReader = Arc<dyn Fn() -> Vec<(String, u64)> + Send + Sync>;

/// Reads the datapath's heartbeat when `/metrics` is scraped: seconds since the
/// beat the kernel programs see (None: never written), and the TTL in seconds.
pub(crate) type HeartbeatReader = Arc<dyn Fn() -> (Option<f64>, f64) + Send + Sync>;

/// Seconds, from 100 µs to about 13 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// Every metric the agent exports. Cloning shares the underlying values.
#[derive(Clone)]
pub struct Metrics {
    connections: Counter,
    active: Gauge,
    bytes: Family<DirectionLabel, Counter>,
    upstream_errors: Family<KindLabel, Counter>,
    client_errors: Family<KindLabel, Counter>,
    frontends: Gauge,
    frontends_failed: Gauge,
    relay_unserved: Gauge,
    names_withheld: Gauge,
    refused_clients: Counter,
    shed: Family<ReasonLabel, Counter>,
    spliced: Family<HowLabel, Counter>,
    spliced_left: Counter,
    spliced_pauses: Counter,
    watch_restarts: Family<ResourceLabel, Counter>,
    decide_seconds: Histogram,
    reconcile_seconds: Histogram,
    hosts_writes: Counter,
    hosts_coalesced: Counter,
    hosts_pending: Gauge,
    coredns_writes: Counter,
    coredns_coalesced: Counter,
    coredns_pending: Gauge,
    kernel: Arc<RwLock<Option<KernelCounterReader>>>,
    heartbeat: Arc<RwLock<Option<HeartbeatReader>>>,
    live_paths: Family<PathLabel, Gauge>,
    capabilities: super::capabilities::KernelCapabilities,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            connections: Counter::default(),
            active: Gauge::default(),
            bytes: Family::default(),
            upstream_errors: Family::default(),
            client_errors: Family::default(),
            frontends: Gauge::default(),
            frontends_failed: Gauge::default(),
            relay_unserved: Gauge::default(),
            names_withheld: Gauge::default(),
            refused_clients: Counter::default(),
            shed: Family::default(),
            spliced: Family::default(),
            spliced_left: Counter::default(),
            spliced_pauses: Counter::default(),
            watch_restarts: Family::default(),
            decide_seconds: duration_histogram(),
            reconcile_seconds: duration_histogram(),
            hosts_writes: Counter::default(),
            hosts_coalesced: Counter::default(),
            hosts_pending: Gauge::default(),
            coredns_writes: Counter::default(),
            coredns_coalesced: Counter::default(),
            coredns_pending: Gauge::default(),
            kernel: Arc::default(),
            heartbeat: Arc::default(),
            live_paths: Family::default(),
            capabilities: Default::default(),
        }
    }
}

impl Metrics {
    /// The paths live on this node (`mode.live` in `/status`), and whether the
    /// kernel path is on among the programs: 1 for each, 0 for the others.
    pub(crate) fn set_live_paths(&self, live: &[NodePath], kernel_path: bool) {
        for p in PATHS {
            let on = if p == "kernel" {
                kernel_path && live.contains(&NodePath::Programs)
            } else {
                live.iter().any(|l| l.as_str() == p)
            };
            let g = self.live_paths.get_or_create(&PathLabel { path: p });
            g.set(i64::from(on));
        }
    }

    /// Whether the kernel gives hairpin `capability` (`hairpin_kernel_capability`).
    pub(crate) fn set_kernel_capability(
        &self,
        capability: super::capabilities::KernelCapability,
        on: bool,
    ) {
        self.capabilities.set(capability, on);
    }

    /// Whether another program runs before hairpin's at the connect hook `hook`
    /// (`hairpin_connect_hook_behind`).
    pub fn set_connect_hook_behind(&self, hook: &'static str, behind: bool) {
        self.capabilities.set_behind(hook, behind);
    }

    /// A connection was accepted by a relay listener.
    pub(crate) fn connection_opened(&self) {
        self.connections.inc();
        self.active.inc();
    }

    /// A relayed connection ended.
    pub(crate) fn connection_closed(&self) {
        self.active.dec();
    }

    /// Relayed connections that have ended, since start.
    pub(crate) fn connections_closed(&self) -> u64 {
        self.connections
            .get()
            .saturating_sub(u64::try_from(self.active.get()).unwrap_or(0))
    }

    /// Connections currently being relayed.
    pub fn active_connections(&self) -> i64 {
        self.active.get()
    }

    /// Adds relayed bytes.
    pub fn bytes(&self, direction: Direction, n: u64) {
        self.bytes
            .get_or_create(&DirectionLabel { direction })
            .inc_by(n);
    }

    /// Counts an upstream failure.
    pub fn upstream_error(&self, kind: ConnError) {
        self.upstream_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Counts a relayed connection that ended with an error on the client's side
    /// (the client reset it, or keepalive found it gone).
    pub fn client_error(&self, kind: ConnError) {
        self.client_errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// Sets how many hostnames the caps on names withhold now (`--max-names`,
    /// `--max-names-per-namespace`).
    pub(crate) fn set_names_withheld(&self, withheld: usize) {
        self.names_withheld.set(withheld as i64);
    }

    /// Sets the number of frontends proxied and failed.
    pub(crate) fn set_frontends(&self, proxied: usize, failed: usize) {
        self.frontends.set(proxied as i64);
        self.frontends_failed.set(failed as i64);
    }

    /// Sets how many families the relay of frontends does not serve (a listener
    /// that could not bind, no sk_lookup program).
    pub(crate) fn set_relay_unserved(&self, families: usize) {
        self.relay_unserved.set(families as i64);
    }

    /// Counts a connection reset because its peer is outside the client policy.
    pub(crate) fn refused_client(&self) {
        self.refused_clients.inc();
    }

    /// Counts a connection reset at accept because a connection cap was reached
    /// (`reason` `total` or `per_source`) or its relay slot names no frontend
    /// (`no_slot`).
    pub fn shed(&self, reason: &'static str) {
        self.shed.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts `ways` of a relayed connection spliced by `how` (`kernel`, `pipe`).
    pub(crate) fn spliced(&self, how: &'static str, ways: u64) {
        if ways > 0 {
            self.spliced.get_or_create(&HowLabel { how }).inc_by(ways);
        }
    }

    /// Counts, for kernel-spliced ways, the bytes the relay carried itself (past
    /// the kernel's credit) and the pauses for a reader slower than its writer.
    pub(crate) fn spliced_left(&self, bytes: u64, pauses: u64) {
        if bytes > 0 {
            self.spliced_left.inc_by(bytes);
        }
        if pauses > 0 {
            self.spliced_pauses.inc_by(pauses);
        }
    }

    /// Counts a failed watch of `resource` (it restarts with backoff).
    pub fn watch_restart(&self, resource: &'static str) {
        self.watch_restarts
            .get_or_create(&ResourceLabel { resource })
            .inc();
    }

    /// Records how long deciding the desired frontends took.
    pub(crate) fn observe_decide(&self, d: std::time::Duration) {
        self.decide_seconds.observe(d.as_secs_f64());
    }

    /// Records how long applying a desired state took.
    pub(crate) fn observe_reconcile(&self, d: std::time::Duration) {
        self.reconcile_seconds.observe(d.as_secs_f64());
    }

    /// Counts a write that changed the hosts file.
    pub(crate) fn hosts_written(&self) {
        self.hosts_writes.inc();
    }

    /// Counts a desired hosts block replaced by a newer one before it was written.
    pub(crate) fn hosts_coalesced(&self) {
        self.hosts_coalesced.inc();
    }

    /// Whether a hosts block waits for `--hosts-min-interval`.
    pub(crate) fn set_hosts_pending(&self, pending: bool) {
        self.hosts_pending.set(i64::from(pending));
    }

    /// Writes that changed the hosts file and blocks coalesced, since start.
    #[cfg(test)]
    pub(crate) fn hosts_counts(&self) -> (u64, u64) {
        (self.hosts_writes.get(), self.hosts_coalesced.get())
    }

    /// Counts a write (update or create) of CoreDNS's ConfigMap.
    pub(crate) fn coredns_written(&self) {
        self.coredns_writes.inc();
    }

    /// Counts a change of the routed names folded into a CoreDNS write that was
    /// already waiting for the minimum interval between writes.
    pub(crate) fn coredns_coalesced(&self) {
        self.coredns_coalesced.inc();
    }

    /// Whether a CoreDNS write waits for the minimum interval between writes.
    pub(crate) fn set_coredns_pending(&self, pending: bool) {
        self.coredns_pending.set(i64::from(pending));
    }

    /// Exports the kernel programs' counters, read by `read` at each scrape, as
    /// `hairpin_kernel_events_total{event=NAME}`.
    pub fn set_kernel_counters(&self, read: KernelCounterReader) {
        *self.kernel.write().unwrap_or_else(PoisonError::into_inner) = Some(read);
    }

    /// Exports the datapath's heartbeat, read by `read` at each scrape, as
    /// `hairpin_datapath_heartbeat_age_seconds` and `hairpin_datapath_ttl_seconds`.
    pub fn set_datapath_heartbeat(&self, read: HeartbeatReader) {
        *self
            .heartbeat
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(read);
    }

    /// The datapath's heartbeat now (age and TTL in seconds), when one is exported.
    pub(crate) fn datapath_heartbeat(&self) -> Option<(Option<f64>, f64)> {
        let read = self
            .heartbeat
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        Some(read())
    }

    /// The relay's counters now, for `/status`.
    pub fn relay_counters(&self) -> crate::status::RelayCounters {
        let bytes = |direction| {
            self.bytes
                .get_or_create(&DirectionLabel { direction })
                .get()
        };
        crate::status::RelayCounters {
            connections: self.connections.get(),
            active_connections: self.active.get(),
            bytes_upstream: bytes(Direction::Upstream),
            bytes_downstream: bytes(Direction::Downstream),
            upstream_errors: ConnError::ALL
                .into_iter()
                .map(|kind| {
                    let n = self
                        .upstream_errors
                        .get_or_create(&KindLabel { kind })
                        .get();
                    (kind.name().to_string(), n)
                })
                .collect(),
            client_errors: ConnError::ALL
                .into_iter()
                .filter_map(|kind| {
                    let n = self.client_errors.get(&KindLabel { kind })?.get();
                    Some((kind.name().to_string(), n))
                })
                .collect(),
            shed: ["total", "per_source"]
                .into_iter()
                .filter_map(|reason| {
                    let n = self.shed.get(&ReasonLabel { reason })?.get();
                    Some((reason.to_string(), n))
                })
                .collect(),
            spliced_ways: ["kernel", "pipe"]
                .into_iter()
                .filter_map(|how| {
                    let n = self.spliced.get(&HowLabel { how })?.get();
                    Some((how.to_string(), n))
                })
                .collect(),
            spliced_left_bytes: self.spliced_left.get(),
            spliced_pauses: self.spliced_pauses.get(),
        }
    }

    /// Renders the OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut registry = Registry::with_prefix("hairpin");
        // In this order: the exposition lists the metrics as they are registered.
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: super::build_version(),
                kernel: kernel_release().to_string(),
                kernel_capabilities: self.capabilities.summary(),
            })
            .set(1);
        registry.register(
            "build_info",
            "1, labelled with the version of the hairpin-agent binary serving it, the node's \
             kernel release and what that kernel gives hairpin (kernel_capabilities: \
             name=yes|no for each capability of hairpin_kernel_capability)",
            build,
        );
        registry.register(
            "live_path",
            "1 for each path live on this node (ebpf: the relay path's redirect, kernel: the \
             kernel path, hosts: the /etc/hosts block, coredns: CoreDNS rewrites), 0 otherwise; \
             none before the paths are decided",
            self.live_paths.clone(),
        );
        self.capabilities.register(&mut registry);
        self.register_relay_traffic(&mut registry);
        self.register_proxied(&mut registry);
        self.register_refused(&mut registry);
        self.register_control_loop(&mut registry);
        self.register_writers(&mut registry);
        self.register_kernel_events(&mut registry);
        self.register_heartbeat(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &registry).expect("encoding metrics into a String");
        out
    }

    /// The relays' connections, bytes and errors.
    fn register_relay_traffic(&self, registry: &mut Registry) {
        registry.register(
            "relay_connections",
            "Connections accepted by relay listeners",
            self.connections.clone(),
        );
        registry.register(
            "relay_active_connections",
            "Connections being relayed now",
            self.active.clone(),
        );
        registry.register("relay_bytes", "Bytes relayed", self.bytes.clone());
        registry.register(
            "relay_upstream_errors",
            "Upstream connection failures by kind",
            self.upstream_errors.clone(),
        );
        registry.register(
            "relay_client_errors",
            "Relayed connections ended by an error on the client's side, by kind (reset; timeout: keepalive found the client gone)",
            self.client_errors.clone(),
        );
    }

    /// The frontends proxied or failed, and the names the caps withhold.
    fn register_proxied(&self, registry: &mut Registry) {
        registry.register(
            "frontends_proxied",
            "Frontends with a live listener and redirect",
            self.frontends.clone(),
        );
        registry.register(
            "frontends_failed",
            "Frontends that could not be made live (left on the pre-hairpin path)",
            self.frontends_failed.clone(),
        );
        registry.register(
            "relay_listeners_unserved",
            "Address families the relay of frontends does not serve (its listener could not \
             bind, or no sk_lookup program): their relayed frontends go as before hairpin",
            self.relay_unserved.clone(),
        );
        registry.register(
            "names_withheld",
            "Hostnames the caps on names withhold now (--max-names, --max-names-per-namespace): \
             not published in /etc/hosts or CoreDNS, with a Warning Event on their objects",
            self.names_withheld.clone(),
        );
    }

    /// The connections the relays refuse: peers outside the policy, and past the caps.
    fn register_refused(&self, registry: &mut Registry) {
        registry.register(
            "relay_refused_clients",
            "Connections reset because the peer is outside --allowed-clients",
            self.refused_clients.clone(),
        );
        registry.register(
            "relay_shed",
            "Connections reset at accept because a cap was reached (--max-connections total, \
             --max-connections-per-source), or because no frontend holds the relay slot they \
             came to (no_slot)",
            self.shed.clone(),
        );
        registry.register(
            "relay_spliced_ways",
            "Ways of relayed connections (client to LB, LB to client) whose bytes were spliced, by what spliced them (kernel: the stream verdict; pipe: splice(2))",
            self.spliced.clone(),
        );
        registry.register(
            "relay_spliced_left_bytes",
            "Bytes of kernel-spliced ways that the relay carried itself: those the kernel left with their source past its credit, for a reader slower than its writer",
            self.spliced_left.clone(),
        );
        registry.register(
            "relay_spliced_pauses",
            "Times the kernel stopped taking a spliced way's bytes until its reader caught up (a reader slower than its writer)",
            self.spliced_pauses.clone(),
        );
    }

    /// The watches' restarts and the time to decide and to reconcile.
    fn register_control_loop(&self, registry: &mut Registry) {
        registry.register(
            "watch_restarts",
            "Kubernetes watch failures by resource (each retried with backoff)",
            self.watch_restarts.clone(),
        );
        registry.register(
            "decide_duration_seconds",
            "Time to decide the desired frontends from the cluster's objects",
            self.decide_seconds.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time to apply a desired state to listeners and maps",
            self.reconcile_seconds.clone(),
        );
    }

    /// The hosts file's and CoreDNS's writes, coalesced changes and pending writes.
    fn register_writers(&self, registry: &mut Registry) {
        registry.register(
            "hosts_writes",
            "Writes that changed the hosts file's managed block (at most one per --hosts-min-interval)",
            self.hosts_writes.clone(),
        );
        registry.register(
            "hosts_coalesced_changes",
            "Desired hosts blocks replaced by a newer one before they were written",
            self.hosts_coalesced.clone(),
        );
        registry.register(
            "hosts_write_pending",
            "1 while a hosts block waits for --hosts-min-interval",
            self.hosts_pending.clone(),
        );
        registry.register(
            "coredns_writes",
            "Writes (update or create) of CoreDNS's ConfigMap by this process",
            self.coredns_writes.clone(),
        );
        registry.register(
            "coredns_coalesced_changes",
            "Changes of the routed names folded into a CoreDNS write already waiting for the minimum interval between writes",
            self.coredns_coalesced.clone(),
        );
        registry.register(
            "coredns_write_pending",
            "1 while a CoreDNS write waits for the minimum interval between writes",
            self.coredns_pending.clone(),
        );
    }

    /// The eBPF programs' counters, read now, where there is a reader.
    fn register_kernel_events(&self, registry: &mut Registry) {
        let kernel = self
            .kernel
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(read) = kernel {
            let events: Family<EventLabel, Counter> = Family::default();
            for (event, n) in read() {
                events.get_or_create(&EventLabel { event }).inc_by(n);
            }
            registry.register(
                "kernel_events",
                "The eBPF programs' counters by event: redirected, skipped_bypass_mark, and the \
                 kernel path's kernel_marked, kernel_headers_written, kernel_fallback_relay and \
                 kernel_missed_* (a connection left without its header)",
                events,
            );
        }
    }

    /// The datapath heartbeat's age and TTL, where there is a datapath.
    fn register_heartbeat(&self, registry: &mut Registry) {
        if let Some((age, ttl)) = self.datapath_heartbeat() {
            if let Some(age) = age {
                let g: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
                g.set(age);
                registry.register(
                    "datapath_heartbeat_age_seconds",
                    "Seconds since the heartbeat the kernel's connect programs see was written \
                     (the agent writes it every second); past hairpin_datapath_ttl_seconds they \
                     leave traffic alone",
                    g,
                );
            }
            let g: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
            g.set(ttl);
            registry.register(
                "datapath_ttl_seconds",
                "How long after the last heartbeat the connect programs still act (--datapath-ttl)",
                g,
            );
        }
    }
}

#[cfg(test)]
mod tests;
