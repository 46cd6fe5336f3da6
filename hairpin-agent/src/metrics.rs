//! Prometheus metrics, served on `/metrics` by the admin server.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
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

/// Why an upstream connection failed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum UpstreamError {
    /// connect() was refused (RST): nothing listens behind the LB for that port.
    Refused,
    /// connect() did not complete within the connect timeout.
    Timeout,
    /// The connection was reset while relaying.
    Reset,
    /// Anything else (unreachable, descriptor limits...).
    Other,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: UpstreamError,
}

/// Every metric the agent exports. Cloning shares the underlying values.
#[derive(Clone, Default)]
pub struct Metrics {
    connections: Counter,
    active: Gauge,
    bytes: Family<DirectionLabel, Counter>,
    upstream_errors: Family<KindLabel, Counter>,
    frontends: Gauge,
}

impl Metrics {
    /// A connection was accepted by a relay listener.
    pub fn connection_opened(&self) {
        self.connections.inc();
        self.active.inc();
    }

    /// A relayed connection ended.
    pub fn connection_closed(&self) {
        self.active.dec();
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
    pub fn upstream_error(&self, kind: UpstreamError) {
        self.upstream_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Sets the number of frontends being proxied.
    pub fn set_frontends(&self, n: usize) {
        self.frontends.set(n as i64);
    }

    /// The relay's counters now, for `/status`.
    pub fn relay_counters(&self) -> crate::state::RelayCounters {
        let bytes = |direction| {
            self.bytes
                .get_or_create(&DirectionLabel { direction })
                .get()
        };
        let kinds = [
            (UpstreamError::Refused, "refused"),
            (UpstreamError::Timeout, "timeout"),
            (UpstreamError::Reset, "reset"),
            (UpstreamError::Other, "other"),
        ];
        crate::state::RelayCounters {
            connections: self.connections.get(),
            active_connections: self.active.get(),
            bytes_upstream: bytes(Direction::Upstream),
            bytes_downstream: bytes(Direction::Downstream),
            upstream_errors: kinds
                .into_iter()
                .map(|(kind, name)| {
                    let n = self
                        .upstream_errors
                        .get_or_create(&KindLabel { kind })
                        .get();
                    (name.to_string(), n)
                })
                .collect(),
        }
    }

    /// Renders the OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut registry = Registry::with_prefix("hairpin");
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
            "frontends_proxied",
            "Frontends with a live listener and redirect",
            self.frontends.clone(),
        );
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &registry).expect("encoding metrics into a String");
        out
    }
}
