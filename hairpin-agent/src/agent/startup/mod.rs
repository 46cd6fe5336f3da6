//! Startup: flags into typed configs, then the source, the admin server (it
//! answers while the datapath waits for its turn), the datapath and the relays, in
//! the order that changes nothing when a step fails before the programs attach.

mod names;
mod programs;
pub(super) use programs::report_link_order;
mod relay;

use names::{
    link_addresses, listen_addresses, names_scope, publish_listen_addresses, relay_addresses,
    start_names,
};
use programs::{report_datapath, start_datapath};
pub(super) use relay::RelayRetry;
use relay::start_relay;

use std::{net::IpAddr, sync::Arc, time::Duration};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{info, warn};

use super::{
    Agent,
    args::{NoNodeName, RunArgs},
    clients,
    frontends_file::FrontendsFileError,
    limits,
    mode::{self, Configured, EbpfOutcome, Plan},
    reconcile::{Backoff, FAILED_RETRY_FIRST, FAILED_RETRY_MAX, Reconciler},
    source,
};
use crate::{
    datapath::{self, Datapath, DatapathError},
    k8s::{
        self,
        client::ClientError,
        coredns::CorednsMode,
        decide::lb_address::LbAddressPolicy,
        source::{SourceConfig, WriterConfig},
    },
    names::{
        link::LinkError,
        scope::{NameScope, ScopeError},
    },
    relay::{
        RelayConfig,
        listener::{ConnGate, ConnLimits},
    },
    status::{
        AgentState, HEARTBEAT_EVERY, ModeStatus,
        admin::{self, AdminConfig, AdminError, AdminServer, KernelCounters},
        metrics::Metrics,
    },
};

/// Why the agent did not start. Everything up to [`StartError::Datapath`] fails
/// before the programs attach.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--node-ip` gave no address.
    #[error("no node IP: pass --node-ip (in a DaemonSet, HAIRPIN_NODE_IPS from status.hostIPs)")]
    NoNodeIp,
    /// `--coredns` with `--mode ebpf`, which runs no name relay.
    #[error("--coredns {0} needs the name relay: --mode ebpf runs none (use --mode both or auto)")]
    CorednsWithoutNameRelay(CorednsMode),
    /// `--coredns` with `--frontends`: CoreDNS follows the Kubernetes source's names.
    #[error("--coredns follows the Kubernetes source's names: it cannot be used with --frontends")]
    CorednsWithFrontendsFile,
    /// A `--listen-address` is an address the node uses for something else.
    #[error(transparent)]
    SlotAddress(#[from] crate::agent::slot_addresses::SlotAddressError),
    /// A signal handler could not be installed.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// `--metrics-address node-ips:PORT` on a node with no private node IP.
    #[error(transparent)]
    MetricsAddress(#[from] crate::status::metrics_address::MetricsAddressError),
    /// `--names-domains` or `--cluster-domain` is invalid.
    #[error(transparent)]
    Scope(#[from] ScopeError),
    /// The frontends file does not load.
    #[error(transparent)]
    FrontendsFile(#[from] FrontendsFileError),
    /// No usable kubeconfig or client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// No node name for the Lease.
    #[error(transparent)]
    NodeName(#[from] NoNodeName),
    /// The relays' listen address cannot be put on `--listen-link`.
    #[error(
        "--listen-link {link}: cannot put the relays' listen address {address} on it                  (needs CAP_NET_ADMIN; --listen-link none uses --listen-address as it is)"
    )]
    ListenLink {
        /// The link.
        link: String,
        /// The address.
        address: IpAddr,
        /// Why.
        source: Box<LinkError>,
    },
    /// The names address cannot be put on `--names-link`.
    #[error("--names-link {link}: cannot put {address} on it")]
    NamesLink {
        /// The link.
        link: String,
        /// The address.
        address: IpAddr,
        /// Why.
        source: Box<LinkError>,
    },
    /// `/proc/self/mountinfo` cannot be read (to find the cgroup v2 root).
    #[error("failed to read /proc/self/mountinfo")]
    Mountinfo(#[source] std::io::Error),
    /// No cgroup v2 hierarchy to attach to.
    #[error(
        "no cgroup v2 hierarchy root is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) \
         or pass --cgroup-path"
    )]
    NoCgroup2,
    /// The programs did not load or attach (with `--mode ebpf` or `both`).
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// The admin server did not start.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// SIGTERM or SIGINT while the agent waited to own the datapath: it stopped
    /// with nothing attached or changed ([`super::run`] exits 0 on it).
    #[error("{signal} while waiting to own the datapath: stopped with nothing attached or changed")]
    Stopped {
        /// `SIGTERM` or `SIGINT`.
        signal: &'static str,
    },
}

/// `e` and its causes, each after a colon: how a reason reads in `status` and logs.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// A signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("failed to handle {signal}")]
pub struct SignalError {
    /// `SIGTERM` or `SIGINT`.
    pub signal: &'static str,
    /// Why.
    pub source: std::io::Error,
}

/// SIGTERM's and SIGINT's handlers.
pub(crate) fn stop_signals() -> Result<(Signal, Signal), SignalError> {
    let handle = |kind, name| {
        signal(kind).map_err(|source| SignalError {
            signal: name,
            source,
        })
    };
    Ok((
        handle(SignalKind::terminate(), "SIGTERM")?,
        handle(SignalKind::interrupt(), "SIGINT")?,
    ))
}

/// This node's first IPv4 and IPv6 address (`--node-ip`), at least one of them.
#[derive(Clone, Copy, Debug)]
struct NodeIps {
    v4: Option<IpAddr>,
    v6: Option<IpAddr>,
}

impl NodeIps {
    fn of(args: &RunArgs) -> Result<NodeIps, StartError> {
        let v4 = args.node_ips.iter().find(|i| i.is_ipv4()).copied();
        let v6 = args.node_ips.iter().find(|i| i.is_ipv6()).copied();
        if v4.is_none() && v6.is_none() {
            return Err(StartError::NoNodeIp);
        }
        Ok(NodeIps { v4, v6 })
    }
}

/// The source, started: what it sends, its name in `/status`, the API client
/// (none with the frontends file), and the names scope (with the API server's
/// names refused).
struct Source {
    desired: crate::k8s::desired::DesiredRx,
    name: String,
    kube: Option<kube::Client>,
    scope: NameScope,
}

impl Agent {
    /// Starts everything in the order the module docs give; fails before anything
    /// is attached when the source, the flags or the admin server are unusable.
    pub(crate) async fn start(args: RunArgs) -> Result<Agent, StartError> {
        check_coredns(&args)?;
        let node = NodeIps::of(&args)?;
        let addresses = relay_addresses(&args);
        // Before anything binds: the sockets found are the node's, not ours.
        crate::agent::slot_addresses::check(
            &addresses,
            &args.node_ips,
            &crate::agent::slot_addresses::bound_sockets(),
        )?;
        let listen = listen_addresses(&addresses);
        limits::raise_nofile_limit();
        let metrics = Metrics::default();
        limits::spawn_trimmer(metrics.clone(), Duration::from_secs(10));
        let state = AgentState::new(args.bypass_mark);
        let mut signals = stop_signals()?;
        // The source fails before anything is attached: a bad file or kubeconfig changes nothing.
        let source = start_source(&args, names_scope(&args)?, &metrics, &state).await?;
        // Before the programs attach: redirects must find their listeners' address.
        publish_listen_addresses(&args, &addresses, &state).await?;
        // Before the datapath, which may wait: the probes answer meanwhile.
        let (admin, own_counters) = start_admin(&args, &state, &metrics).await?;
        let (mut datapath, outcome, cgroup) =
            match start_datapath(&args, &state, &mut signals).await {
                Ok(started) => started,
                Err(e) => {
                    // Its socket file goes too: the next agent finds none stale.
                    admin.shutdown().await;
                    return Err(e);
                }
            };
        // After attach, which may find the kernel path unavailable: the entries the
        // reconciler writes follow the kernel path as it stands.
        let frontends = datapath.as_mut().and_then(Datapath::take_frontends);
        // The names ports are never slots: where the names address is a slot
        // address, the name relay may bind them as they are.
        let slots = datapath
            .as_mut()
            .and_then(|d| d.take_slots(args.names_ports.0.clone()))
            .map(|mut slots| {
                // Room to replace each of a namespace's frontends once within a
                // quarantine: a namespace churning fresh addresses waits for its
                // own retired slots, never takes every other namespace's.
                slots.cap_namespaces(
                    usize::try_from(args.decision.max_frontends_per_namespace)
                        .unwrap_or(usize::MAX)
                        .saturating_mul(2),
                );
                slots
            });
        let plan = decide_paths(&args, &outcome, &state);
        let kernel_path = datapath.as_ref().is_some_and(|d| d.kernel_path().is_on());
        metrics.set_live_paths(&plan.live(), kernel_path);
        let (first_applied, applied) = tokio::sync::oneshot::channel();
        let beating = datapath
            .as_ref()
            .and_then(|d| report_datapath(&args, d, cgroup, &state, &metrics, applied));
        let relay_config = relay_config(&args, &plan, node, source.kube.clone(), &state)
            .await
            .with_splice(splice_config(&args, datapath.as_ref(), &state));
        let names = start_names(
            &args,
            &source.scope,
            &plan,
            listen,
            node,
            &relay_config,
            &metrics,
            &state,
        )
        .await?;
        let mut names = names;
        let (relay, relay_status, relay_retry) = start_relay(
            relay_config,
            datapath.as_mut(),
            names.as_mut(),
            listen,
            &args.names_ports.0,
            &metrics,
        );
        metrics.set_relay_unserved(relay_status.as_ref().map_or(0, |r| r.unserved.len()));
        state.update(|s| s.relay = relay_status.clone());
        serve_own_counters(datapath.as_ref(), &own_counters, &metrics);
        let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Agent {
            state,
            metrics,
            desired: source.desired,
            applied: None,
            source_name: source.name,
            plan,
            reconciler: Reconciler::new(frontends, slots),
            relay,
            relay_status,
            relay_retry,
            datapath,
            names,
            admin: Some(admin),
            drain_timeout: args.drain_timeout,
            signals,
            ready: false,
            retry: Backoff::new(FAILED_RETRY_FIRST, FAILED_RETRY_MAX),
            retry_in: None,
            heartbeat,
            beating,
            first_applied: Some(first_applied),
            kube: source.kube,
            daemonset: args.daemonset.clone(),
            link_addresses: link_addresses(&args, &addresses),
        })
    }
}

/// Starts the source `args` name (the frontends file, else the cluster) and says
/// in the log and `/status` what it publishes names under.
async fn start_source(
    args: &RunArgs,
    scope: NameScope,
    metrics: &Metrics,
    state: &AgentState,
) -> Result<Source, StartError> {
    let source = match &args.frontends {
        Some(path) => {
            let name = format!("file {}", path.display());
            let desired = source::file(
                path,
                args.frontends_poll,
                state.clone(),
                name.clone(),
                scope.clone(),
            )?;
            Source {
                desired,
                name,
                kube: None,
                scope,
            }
        }
        None => {
            let config = k8s::client::config(args.kubeconfig.as_deref()).await?;
            let scope = k8s::api_names::refuse(scope, &config, &args.decision.api_server_names);
            let cert_names = k8s::api_names::read_cert_names(config.clone());
            let client = k8s::client::from_config(config)?;
            let cfg = source_config(args, scope.clone(), cert_names)?;
            let name = cfg.name.clone();
            let desired = source::kubernetes(client.clone(), cfg, metrics.clone(), state.clone());
            Source {
                desired,
                name,
                kube: Some(client),
                scope,
            }
        }
    };
    if source.scope.domains().is_empty() {
        warn!("--names-domains is empty: no hostname is published (/etc/hosts, CoreDNS)");
    } else {
        info!(domains = ?source.scope.domains(), "hostnames are published under these domains only");
    }
    state.register_source(&source.name);
    Ok(source)
}

/// Which paths are live, from `--mode`, how the programs fared and what is
/// configured; logged and listed in `/status`.
fn decide_paths(args: &RunArgs, outcome: &EbpfOutcome, state: &AgentState) -> Plan {
    let plan = mode::plan(
        args.mode,
        outcome,
        Configured {
            hosts_file: args.hosts_file.is_some(),
            coredns: args.coredns != CorednsMode::Off,
        },
    );
    info!(mode = %args.mode, live = ?plan.live(), reason = %plan.reason, "paths decided");
    state.update(|s| {
        s.mode = Some(ModeStatus {
            configured: args.mode,
            live: plan.live(),
            reason: plan.reason.clone(),
            ebpf_failure: match outcome {
                EbpfOutcome::Failed(_, kind) => Some(*kind),
                EbpfOutcome::NotTried | EbpfOutcome::Attached => None,
            },
        })
    });
    plan
}

/// What both relays share: the bypass mark (only where programs skip marked
/// sockets), the node's addresses, the clients allowed and the connection caps.
async fn relay_config(
    args: &RunArgs,
    plan: &Plan,
    node: NodeIps,
    kube: Option<kube::Client>,
    state: &AgentState,
) -> RelayConfig {
    RelayConfig {
        // Without programs nothing skips marked sockets, and setting a mark needs
        // CAP_NET_ADMIN: leave it off.
        bypass_mark: plan.ebpf.then_some(args.bypass_mark),
        connect_timeout: args.connect_timeout,
        node_ipv4: node.v4.and_then(|i| match i {
            IpAddr::V4(v) => Some(v),
            IpAddr::V6(_) => None,
        }),
        node_ipv6: node.v6.and_then(|i| match i {
            IpAddr::V6(v) => Some(v),
            IpAddr::V4(_) => None,
        }),
        clients: clients::policy(args, kube, state).await,
        gate: ConnGate::new(ConnLimits {
            total: args.max_connections,
            per_source: args.max_connections_per_source,
        }),
        buffer_size: 64 * 1024,
        keepalive: (!args.relay_keepalive.is_zero()).then_some(args.relay_keepalive),
        splice: crate::relay::carry::SpliceConfig::copy(),
    }
}

/// How relayed ways are spliced: `--relay-splice` against what the datapath offers
/// (said in `/status` as `relay_splice`).
fn splice_config(
    args: &RunArgs,
    datapath: Option<&Datapath>,
    state: &AgentState,
) -> crate::relay::carry::SpliceConfig {
    let kernel = match datapath {
        Some(d) => d
            .splice()
            .map(|s| Arc::new(s) as Arc<dyn crate::relay::carry::KernelSplice>)
            .map_err(|why| crate::relay::carry::NoKernelSplice::Unavailable(why)),
        None => Err(crate::relay::carry::NoKernelSplice::NoDatapath),
    };
    let (cfg, status) =
        crate::relay::carry::resolve(args.relay_splice, args.relay_splice_after, kernel);
    info!(configured = %status.configured, splicer = %status.splicer, reason = status.reason.as_deref().unwrap_or(""), "relay splice");
    state.update(|s| s.relay_splice = Some(status));
    cfg
}

/// Starts the admin server before the datapath, so that it answers from the first
/// second: `/healthz` live, `/readyz` not ready with the reason while the agent
/// waits to own the datapath. `/status` reads the kernel counters through the
/// datapath's own descriptor once [`serve_own_counters`] has set it; by id before.
async fn start_admin(
    args: &RunArgs,
    state: &AgentState,
    metrics: &Metrics,
) -> Result<(AdminServer, OwnCounters), StartError> {
    let own = OwnCounters::default();
    let reader = own.clone();
    let kernel: KernelCounters = Arc::new(move |id| match reader.get() {
        Some(r) => Ok(r
            .read()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect()),
        None => datapath::kernel_objects::read_counters(id)
            .map(|c| c.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
            .map_err(Into::into),
    });
    let admin = admin::start(
        &AdminConfig {
            address: Some(args.admin_address),
            socket: Some(args.admin_socket.clone()),
            metrics: args
                .metrics_address
                .map(|m| m.resolve(&args.node_ips))
                .transpose()?
                .unwrap_or_default(),
        },
        state.clone(),
        metrics.clone(),
        Some(kernel),
    )
    .await?;
    Ok((admin, own))
}

/// The datapath's own counters reader, once it is loaded: set once, read by the
/// admin server's `/status`.
type OwnCounters = Arc<std::sync::OnceLock<datapath::CountersReader>>;

/// Serves the kernel counters through the datapath's own map descriptor (no
/// CAP_SYS_ADMIN needed to open it by id): `/status` and `/metrics`.
fn serve_own_counters(datapath: Option<&Datapath>, own: &OwnCounters, metrics: &Metrics) {
    let Some(d) = datapath else {
        return;
    };
    match d.counters_reader() {
        Ok(r) => {
            let _ = own.set(r);
            let own = own.clone();
            metrics.set_kernel_counters(Arc::new(move || {
                own.get()
                    .map(|r| {
                        r.read()
                            .into_iter()
                            .map(|(n, v)| (n.to_string(), v))
                            .collect()
                    })
                    .unwrap_or_default()
            }));
        }
        Err(e) => {
            warn!(error = %e, "the kernel counters cannot be read through the agent's own map descriptor");
        }
    }
}

/// The Kubernetes source's settings: a Lease and its writer only when something
/// cluster-wide is written (Events, CoreDNS).
fn source_config(
    args: &RunArgs,
    scope: NameScope,
    cert_names: k8s::api_names::CertNamesRx,
) -> Result<SourceConfig, StartError> {
    // The Lease only elects who publishes Events: CoreDNS is written by its own
    // Deployment (`hairpin-agent coredns-writer`).
    let writer = if args.events {
        Some(WriterConfig {
            namespace: args.namespace.clone(),
            lease: args.lease_name.clone(),
            node: args.node_name()?,
        })
    } else {
        None
    };
    Ok(SourceConfig {
        decide: k8s::watch::Decide {
            defaults: k8s::Defaults {
                proxy_protocol: args.decision.default_proxy_protocol.0,
                addresses: lb_addresses(args),
                frontend_caps: k8s::decide::service::FrontendCaps {
                    per_namespace: args.decision.max_frontends_per_namespace as usize,
                    total: args.max_frontends as usize,
                },
            },
            scope,
            cert_names,
        },
        name: "kubernetes".into(),
        writer,
    })
}

/// Which LoadBalancer addresses may be redirected: never this node's own, nor the
/// operator's reserved networks; only `--lb-cidrs` when given.
fn lb_addresses(args: &RunArgs) -> LbAddressPolicy {
    let own = args
        .node_ips
        .iter()
        .chain(&args.listen_addresses)
        .chain(args.names_address.iter())
        .map(|ip| {
            (
                ipnet::IpNet::from(*ip),
                "an address of this node".to_string(),
            )
        });
    let listed = args
        .decision
        .reserved_cidrs
        .iter()
        .map(|n| (*n, "in --reserved-cidrs".to_string()));
    LbAddressPolicy {
        reserved: own.chain(listed).collect(),
        allowed: args.decision.lb_cidrs.clone(),
        nat64: args.decision.nat64_prefixes.clone(),
        ..LbAddressPolicy::default()
    }
}

/// Refuses `--coredns` combinations that cannot work: CoreDNS sends pods to the
/// name relay, which `--mode ebpf` does not run, and the rewrites follow the
/// Kubernetes source's names.
fn check_coredns(args: &RunArgs) -> Result<(), StartError> {
    if args.coredns == CorednsMode::Off {
        return Ok(());
    }
    if !args.mode.allows_names() {
        return Err(StartError::CorednsWithoutNameRelay(args.coredns));
    }
    if args.frontends.is_some() {
        return Err(StartError::CorednsWithFrontendsFile);
    }
    Ok(())
}
