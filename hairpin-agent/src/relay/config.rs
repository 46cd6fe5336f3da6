//! The relays' settings, validated once at startup and shared by both relays.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use tokio_util::task::TaskTracker;

use super::{
    carry::SpliceConfig,
    client_policy::ClientPolicy,
    listener::{Admission, ConnGate},
};
use crate::status::metrics::Metrics;

/// Relay settings, validated once at startup.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// SO_MARK put on upstream sockets so the connect programs skip them; `None`
    /// when no program is attached (fallback-only nodes), since setting a mark needs
    /// CAP_NET_ADMIN and serves nothing there.
    pub bypass_mark: Option<u32>,
    /// How long an upstream connect may take before the client is closed.
    pub connect_timeout: Duration,
    /// The node's IPv4 address: the PROXY source for IPv4 host processes.
    pub node_ipv4: Option<Ipv4Addr>,
    /// The node's IPv6 address: the PROXY source for IPv6 host processes.
    pub node_ipv6: Option<Ipv6Addr>,
    /// Which peers may use the relays (this node and its pods).
    pub clients: ClientPolicy,
    /// The connection caps, shared by every listener of both relays.
    pub gate: ConnGate,
    /// Size of each direction's copy buffer.
    pub buffer_size: usize,
    /// TCP keepalive on both sides of every relayed connection: idle time before the
    /// first probe (`None`: off). A peer that vanished without a FIN or RST (a pod
    /// whose network namespace went away) is dropped after [`super::KEEPALIVE_PROBES`]
    /// unanswered probes instead of holding two sockets and its buffers forever.
    pub keepalive: Option<Duration>,
    /// How each way's bytes move once it has carried enough (see [`super::carry`]).
    pub splice: SpliceConfig,
}

impl RelayConfig {
    /// The same, with `splice`.
    pub(crate) fn with_splice(self, splice: SpliceConfig) -> RelayConfig {
        RelayConfig { splice, ..self }
    }

    /// What a listener of either relay checks its accepted connections against,
    /// counting in `metrics` and running them on `connections`.
    pub(crate) fn admission(&self, metrics: &Metrics, connections: &TaskTracker) -> Admission {
        Admission {
            clients: self.clients.clone(),
            gate: self.gate.clone(),
            metrics: metrics.clone(),
            connections: connections.clone(),
        }
    }
}
