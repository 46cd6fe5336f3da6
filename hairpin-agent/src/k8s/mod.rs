//! The Kubernetes side: which LoadBalancer frontends need a PROXY header and which
//! hostnames lead to them, decided from API objects by pure functions ([`mod@decide`]),
//! and the thin edges that feed and report those decisions — the watches, the
//! Lease, Events, the Node read and the CoreDNS ConfigMap writer — all started by
//! [`source`] from one typed config — and the one read on SIGTERM, the agent's own
//! DaemonSet ([`owner`]), that tells an uninstall from a restart.
//!
//! May not touch the datapath or the relays; what it decides reaches them through
//! the agent.

pub(crate) mod api_names;
pub(crate) mod client;
pub(crate) mod coredns;
pub(crate) mod decide;
pub(crate) mod desired;
pub(crate) mod events;
pub(crate) mod lease;
pub(crate) mod node;
pub(crate) mod owner;
pub(crate) mod source;
pub(crate) mod watch;

pub use api_names::{
    ApiNamesError, CertNames, apply as apply_cert_names, cert_names, known as known_cert_names,
    read_cert_names, refuse as refuse_api_server_names,
};
pub use coredns::{
    CorednsConfig, CorednsMode, CorednsObjects, ObjectName, rewrites as coredns_rewrites,
    task::{
        REASON_UNRECOGNIZED as COREDNS_REASON_UNRECOGNIZED, Reporting as CorednsReporting,
        Timing as CorednsTiming, run as run_corefile_writer,
    },
};
pub use decide::{
    annotations::{
        PORTS as PORTS_ANNOTATION, PROXY_PROTOCOL as PROXY_PROTOCOL_ANNOTATION,
        protocol as port_protocol,
    },
    decision::{Outcome, Rule, SkipReason},
    desired::{DesiredState, decide_all},
    lb_address::{LbAddressPolicy, builtin_refusal},
    providers::{PROVIDER_ANNOTATIONS, ValueRule},
    service::{Defaults, FrontendCaps, decide, service_key},
};
pub use desired::{Desired, DesiredRx};
pub use events::run as publish_events;
pub use lease::{LeaseConfig, run as run_lease};
pub use owner::{
    OwnerError, OwnerState, Teardown, daemonset_state, daemonset_state_within, on_sigterm,
};
pub use watch::{Decide, KubeSource, spawn as watch_cluster};
