//! `hairpin-agent coredns-writer`: the CoreDNS writer as its own process, for a small
//! Deployment with its own ServiceAccount, so that the DaemonSet's account (on every
//! node) needs no access to kube-system at all.
//!
//! It watches what the DaemonSet watches (Services, Ingresses, Gateway API kinds),
//! cluster-wide and read-only, and computes the routed hostnames with the same pure
//! code (`k8s::watch`, `names::routes`) from the same decision settings and names
//! scope; it holds its own Lease (so two replicas are safe) and, while it holds it,
//! writes the Corefile rewrites or the import key, at most once per
//! `--coredns-min-write-interval` (changes meanwhile coalesced into one write). The
//! admin server serves `/healthz`, `/readyz` (the watches synced) and `/metrics`
//! on `--admin-address`, and `/status` on `--admin-socket` when given.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use tracing::{info, warn};

use super::SignalError;
use crate::{
    k8s::{
        self,
        client::ClientError,
        coredns::{self, CorednsConfig, CorednsMode, CorednsObjects, task::Timing},
        decide::lb_address::LbAddressPolicy,
        source::CorednsWriterConfig,
    },
    model::{Mode, NodePath},
    names::{
        hostname::Hostname,
        scope::{NameScope, ScopeError},
    },
    status::{
        AgentState, HEARTBEAT_EVERY, ModeStatus,
        admin::{self, AdminConfig, AdminError},
        metrics::Metrics,
    },
};

/// Options of `coredns-writer`. The names and decision settings read the same
/// `HAIRPIN_*` variables as `run`'s: give both the same values, or the writer
/// publishes other names than the agents route.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Writes CoreDNS rewrites for the routed hostnames (Ingress and Gateway API \
names whose LoadBalancer hairpin proxies) to the hairpin Service: `corefile` edits the \
Corefile of --coredns-configmap, `import` owns the `hairpin.override` key of \
--coredns-custom-configmap. Runs as its own Deployment and ServiceAccount, apart from the \
DaemonSet; replicas elect one writer through a Lease. Writes at most once per \
--coredns-min-write-interval; changes meanwhile are folded into that write."
)]
pub struct CorednsWriterArgs {
    /// What to write: `corefile` edits --coredns-configmap's Corefile, `import`
    /// owns the `hairpin.override` key of --coredns-custom-configmap.
    #[arg(long, env = "HAIRPIN_COREDNS", value_enum)]
    pub coredns: CorednsMode,

    /// Which ConfigMaps are written.
    #[command(flatten)]
    pub coredns_objects: CorednsObjects,

    /// The name CoreDNS rewrites the hostnames to: the hairpin ClusterIP Service
    /// over the DaemonSet (internalTrafficPolicy: Local).
    #[arg(
        long,
        env = "HAIRPIN_COREDNS_TARGET",
        default_value = "hairpin.hairpin-system.svc.cluster.local",
        value_parser = coredns::parse_target
    )]
    pub coredns_target: Hostname,

    /// The least time between two writes of the ConfigMap; changes of the names
    /// meanwhile are folded into the next write. 0: every change is written at once.
    #[arg(long, env = "HAIRPIN_COREDNS_MIN_WRITE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub coredns_min_write_interval: Duration,

    /// How often the ConfigMap is re-read and repaired without a change.
    #[arg(long, env = "HAIRPIN_COREDNS_RESYNC", default_value = "30s", value_parser = humantime::parse_duration)]
    pub coredns_resync: Duration,

    /// kubeconfig to use instead of the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "HAIRPIN_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the writer's Lease (downward API `metadata.namespace`).
    #[arg(long, env = "HAIRPIN_NAMESPACE", default_value = "hairpin-system")]
    pub namespace: String,

    /// Name of the Lease that elects the one replica writing CoreDNS (not the
    /// agents' Lease: a separate election).
    #[arg(long, env = "HAIRPIN_LEASE_NAME", default_value = "hairpin-coredns")]
    pub lease_name: String,

    /// How long the Lease holds without renewal (renewed every third of it); a
    /// holder gone this long is replaced.
    #[arg(long, env = "HAIRPIN_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,

    /// This replica's Lease identity and Event reporter (downward API
    /// `metadata.name`). Default: the host name (a pod's is its name).
    #[arg(long, env = "HAIRPIN_IDENTITY")]
    pub identity: Option<String>,

    /// What is proxied and which names are published: the same flags as the
    /// agents' (`run`), so the Corefile holds exactly the names they route.
    #[command(flatten)]
    pub decision: super::args::DecisionArgs,

    /// TCP address of /healthz, /readyz and /metrics (in a pod: 0.0.0.0:PORT, which
    /// the kubelet's probes dial on the pod IP).
    #[arg(long, env = "HAIRPIN_ADMIN_ADDRESS", default_value = "127.0.0.1:9903")]
    pub admin_address: SocketAddr,

    /// Unix socket (mode 0600) serving everything, /status included (for
    /// `kubectl exec ... hairpin-agent status --admin-socket ...`). Unset: none.
    #[arg(long, env = "HAIRPIN_ADMIN_SOCKET")]
    pub admin_socket: Option<PathBuf>,

    /// A further address serving /metrics alone (`IP:PORT`). Unset: none.
    #[arg(long, env = "HAIRPIN_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,
}

/// The name `/status` lists the writer's watches under.
const SOURCE: &str = "kubernetes";

/// Why the writer did not start.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// `--coredns off`.
    #[error("coredns-writer --coredns off writes nothing: pass corefile or import")]
    Off,
    /// Neither `--identity` nor a host name.
    #[error("no --identity and no host name: {0}")]
    NoIdentity(nix::errno::Errno),
    /// `--names-domains` or `--cluster-domain` is invalid.
    #[error(transparent)]
    Scope(#[from] ScopeError),
    /// No usable kubeconfig or client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A signal handler could not be installed.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// The admin server did not start.
    #[error(transparent)]
    Admin(#[from] AdminError),
}

/// Runs the writer until SIGTERM or SIGINT.
pub async fn run(args: CorednsWriterArgs) -> Result<(), WriterError> {
    let coredns = writer_config(&args)?;
    let identity = match &args.identity {
        Some(i) => i.clone(),
        None => nix::unistd::gethostname()
            .map_err(WriterError::NoIdentity)?
            .to_string_lossy()
            .into_owned(),
    };
    let mut scope = NameScope::new(&args.decision.names_domains, &args.decision.cluster_domain)?
        .with_caps(args.decision.name_limits.limits());
    let config = k8s::client::config(args.kubeconfig.as_deref()).await?;
    scope = k8s::api_names::refuse(scope, &config, &args.decision.api_server_names);
    let cert_names = k8s::api_names::read_cert_names(config.clone());
    let client = k8s::client::from_config(config)?;
    if scope.domains().is_empty() {
        warn!("--names-domains is empty: no hostname is published in CoreDNS");
    } else {
        info!(domains = ?scope.domains(), "hostnames are published under these domains only");
    }
    let mut signals = super::startup::stop_signals()?;
    let metrics = Metrics::default();
    metrics.set_live_paths(&[NodePath::Coredns], false);
    let state = AgentState::new(0);
    state.update(|s| {
        s.mode = Some(ModeStatus {
            // No programs and no relays here: readiness waits for the watches only.
            configured: Mode::Fallback,
            live: vec![NodePath::Coredns],
            reason: "coredns-writer: writes CoreDNS rewrites while it holds the Lease; \
                     no programs, no relays"
                .into(),
            ebpf_failure: None,
        })
    });
    state.register_source(SOURCE);
    let cfg = CorednsWriterConfig {
        decide: k8s::watch::Decide {
            defaults: k8s::Defaults {
                proxy_protocol: args.decision.default_proxy_protocol.0,
                addresses: LbAddressPolicy {
                    reserved: args
                        .decision
                        .reserved_cidrs
                        .iter()
                        .map(|n| (*n, "in --reserved-cidrs".to_string()))
                        .collect(),
                    allowed: args.decision.lb_cidrs.clone(),
                    nat64: args.decision.nat64_prefixes.clone(),
                    ..LbAddressPolicy::default()
                },
                // The agents' --max-frontends is theirs (it sizes their kernel map); the
                // writer assumes its default.
                frontend_caps: k8s::decide::service::FrontendCaps {
                    per_namespace: args.decision.max_frontends_per_namespace as usize,
                    ..Default::default()
                },
            },
            scope,
            cert_names,
        },
        name: SOURCE.into(),
        namespace: args.namespace.clone(),
        lease: args.lease_name.clone(),
        identity: identity.clone(),
        lease_duration: args.lease_duration,
        coredns,
        timing: Timing {
            resync: args.coredns_resync,
            min_write_interval: args.coredns_min_write_interval,
            ..Timing::default()
        },
    };
    let mut desired =
        k8s::source::spawn_coredns_writer(client, cfg, metrics.clone(), state.clone());
    let admin = admin::start(
        &AdminConfig {
            address: Some(args.admin_address),
            socket: args.admin_socket.clone(),
            metrics: args.metrics_address.into_iter().collect(),
        },
        state.clone(),
        metrics,
        None,
    )
    .await?;
    info!(%identity, lease = %format!("{}/{}", args.namespace, args.lease_name),
        mode = %args.coredns, "coredns-writer started");
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        state.beat();
        if desired.borrow_and_update().is_some() {
            state.source_synced(SOURCE);
        }
        tokio::select! {
            _ = signals.0.recv() => { info!("SIGTERM"); break }
            _ = signals.1.recv() => { info!("SIGINT"); break }
            changed = desired.changed() => if changed.is_err() { break },
            _ = heartbeat.tick() => {}
        }
    }
    admin.shutdown().await;
    info!("coredns-writer stopped");
    Ok(())
}

/// What is written; refuses `--coredns off` (a writer that writes nothing).
fn writer_config(args: &CorednsWriterArgs) -> Result<CorednsConfig, WriterError> {
    if args.coredns == CorednsMode::Off {
        return Err(WriterError::Off);
    }
    Ok(CorednsConfig {
        mode: args.coredns,
        configmap: args.coredns_objects.configmap.clone(),
        custom: args.coredns_objects.custom_configmap.clone(),
        target: args.coredns_target.clone(),
    })
}
