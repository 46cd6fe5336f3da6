//! Startup: flags into typed configs, then the source, the datapath, the relays
//! and the admin server, in the order that changes nothing when a step fails
//! before the programs attach.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{info, warn};

use super::{
    Agent,
    args::{
        DEFAULT_LISTEN_V4, DEFAULT_LISTEN_V6, LinkOrderMode, NamesRedirect, NoNodeName, RunArgs,
    },
    clients,
    frontends_file::FrontendsFileError,
    limits,
    mode::{self, Configured, EbpfOutcome, Plan},
    reconcile::{Backoff, FAILED_RETRY_FIRST, FAILED_RETRY_MAX, ListenAddresses, Reconciler},
    source,
};
use crate::{
    datapath::{
        self, Datapath, DatapathError, KernelPath, LoadOptions,
        lifecycle::{self, Started, Wait},
    },
    k8s::{
        self,
        client::ClientError,
        coredns::CorednsMode,
        decide::lb_address::LbAddressPolicy,
        source::{SourceConfig, WriterConfig},
    },
    names::{
        link::{self as names_link, LinkError},
        relay::{NameRouting, NameRoutingConfig, Redirect, ServiceListener},
        scope::{NameScope, ScopeError, ScopeRule},
    },
    relay::{
        Relay, RelayConfig,
        listener::{ConnGate, ConnLimits},
    },
    status::{
        AgentState, AttachmentStatus, HEARTBEAT_EVERY, KernelPathState, KernelPathStatus,
        LifecycleStatus, ListenStatus, ModeStatus, NamesStatus,
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
    /// A signal handler could not be installed.
    #[error(transparent)]
    Signal(#[from] SignalError),
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
    desired: source::DesiredRx,
    name: String,
    kube: Option<kube::Client>,
    scope: NameScope,
}

impl Agent {
    /// Starts everything in the order the module docs give; fails before anything
    /// is attached when the source, the flags or the admin server are unusable.
    pub async fn start(args: RunArgs) -> Result<Agent, StartError> {
        check_coredns(&args)?;
        let node = NodeIps::of(&args)?;
        let listen = listen_addresses(&args, node.v4, node.v6);
        limits::raise_nofile_limit();
        let metrics = Metrics::default();
        limits::spawn_trimmer(metrics.clone(), Duration::from_secs(10));
        let state = AgentState::new(args.bypass_mark);
        let signals = stop_signals()?;
        // The source fails before anything is attached: a bad file or kubeconfig changes nothing.
        let source = start_source(&args, names_scope(&args)?, &metrics, &state).await?;
        // Before the programs attach: redirects must find their listeners' address.
        publish_listen_addresses(&args, listen, &state).await?;
        let (mut datapath, outcome, cgroup) = start_datapath(&args).await?;
        // After attach, which may find the kernel path unavailable: the entries the
        // reconciler writes follow the kernel path as it stands.
        let frontends = datapath.as_mut().and_then(Datapath::take_frontends);
        let plan = decide_paths(&args, &outcome, &state);
        metrics.set_live_paths(&plan.live());
        let beating = datapath
            .as_ref()
            .and_then(|d| report_datapath(&args, d, cgroup, &state, &metrics));
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
        let relay = start_relay(relay_config, datapath.as_ref(), names.as_mut(), &metrics);
        let admin = start_admin(&args, datapath.as_ref(), &state, &metrics).await?;
        let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Agent {
            state,
            metrics,
            desired: source.desired,
            applied: None,
            source_name: source.name,
            plan,
            reconciler: Reconciler::new(frontends, relay, listen),
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
            kube: source.kube,
            daemonset: args.daemonset.clone(),
            link_addresses: link_addresses(&args, listen),
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

/// Puts the listen addresses on their link and lists them in `/status`.
async fn publish_listen_addresses(
    args: &RunArgs,
    listen: ListenAddresses,
    state: &AgentState,
) -> Result<(), StartError> {
    let note = listen_on_link(args, listen).await?;
    state.update(|s| {
        s.listen = Some(ListenStatus {
            addresses: [listen.v4, listen.v6].into_iter().flatten().collect(),
            link: args.listen_link().map(str::to_string),
            note,
        })
    });
    Ok(())
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
        })
    });
    plan
}

/// Reports the attached datapath (`/status`, metrics), releases the pins earlier
/// releases left, and starts its heartbeat: the dead-man switch, beaten every
/// second while this agent runs; the connect programs stop acting once no agent
/// has beaten within the TTL. The heartbeat task's handle.
fn report_datapath(
    args: &RunArgs,
    d: &Datapath,
    cgroup: Option<PathBuf>,
    state: &AgentState,
    metrics: &Metrics,
) -> Option<tokio::task::AbortHandle> {
    if let Some(cgroup) = cgroup {
        state.set_attachment(Some(AttachmentStatus {
            cgroup,
            ids: d.kernel_ids(),
        }));
    }
    report_kernel_path(args, d, state, metrics);
    report_link_order(d, state);
    release_inherited_pins(args);
    let beating = tokio::spawn(d.heartbeat().beat_every(HEARTBEAT_EVERY)).abort_handle();
    let hb = d.heartbeat();
    metrics.set_datapath_heartbeat(Arc::new(move || {
        (hb.age().map(|a| a.as_secs_f64()), hb.ttl().as_secs_f64())
    }));
    Some(beating)
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
            .map(|s| Arc::new(s) as Arc<dyn crate::relay::carry::KernelSplice>),
        None => Err("no eBPF datapath on this node".to_string()),
    };
    let (cfg, status) =
        crate::relay::carry::resolve(args.relay_splice, args.relay_splice_after, kernel);
    info!(configured = %status.configured, splicer = %status.splicer, reason = status.reason.as_deref().unwrap_or(""), "relay splice");
    state.update(|s| s.relay_splice = Some(status));
    cfg
}

/// The relay of frontends; where a datapath runs, each of its listeners and the
/// name relay's registers in the liveness map as it binds, since the connect
/// programs send to a listener only while it is there.
fn start_relay(
    config: RelayConfig,
    datapath: Option<&Datapath>,
    names: Option<&mut NameRouting>,
    metrics: &Metrics,
) -> Relay {
    let mut relay = Relay::new(config, metrics.clone());
    if let Some(d) = datapath {
        let liveness = d.relay_liveness();
        let hook: crate::relay::ListenHook =
            Arc::new(move |addr, fd| liveness.register(addr, fd).map_err(Into::into));
        relay.on_listen(hook.clone());
        if let Some(n) = names {
            n.on_listen(hook);
        }
    }
    relay
}

/// The admin server, up before the first sync: /healthz answers and /readyz says
/// what it waits for. The kernel counters are read through the agent's own map
/// descriptor where it can (opening the map by id, as `dump` does, needs
/// CAP_SYS_ADMIN, which the DaemonSet does not grant), else by id.
async fn start_admin(
    args: &RunArgs,
    datapath: Option<&Datapath>,
    state: &AgentState,
    metrics: &Metrics,
) -> Result<AdminServer, StartError> {
    let reader = datapath.and_then(|d| match d.counters_reader() {
        Ok(r) => Some(Arc::new(r)),
        Err(e) => {
            warn!(error = %e, "the kernel counters cannot be read through the agent's own map descriptor");
            None
        }
    });
    let own = reader.clone();
    let kernel: KernelCounters = Arc::new(move |id| match &own {
        Some(r) => Ok(r
            .read()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect()),
        None => datapath::kernel_objects::read_counters(id)
            .map(|c| c.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
            .map_err(Into::into),
    });
    if let Some(r) = reader {
        metrics.set_kernel_counters(Arc::new(move || {
            r.read()
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect()
        }));
    }
    let admin = admin::start(
        &AdminConfig {
            address: Some(args.admin_address),
            socket: Some(args.admin_socket.clone()),
            metrics: args.metrics_address,
        },
        state.clone(),
        metrics.clone(),
        Some(kernel),
    )
    .await?;
    Ok(admin)
}

/// Which names may be published: `--names-domains` and `--cluster-domain`, validated
/// once, refusing this node's names too (the API server's is added with the client).
fn names_scope(args: &RunArgs) -> Result<NameScope, StartError> {
    let mut scope = NameScope::new(&args.decision.names_domains, &args.decision.cluster_domain)?
        .with_caps(args.decision.name_limits.limits());
    if let Ok(node) = args.node_name() {
        scope = scope.refuse_own(&node, ScopeRule::NodeName, "this node's name");
    }
    if let Ok(host) = nix::unistd::gethostname() {
        scope = scope.refuse_own(
            &host.to_string_lossy(),
            ScopeRule::NodeName,
            "this node's host name",
        );
    }
    Ok(scope)
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
        defaults: k8s::Defaults {
            proxy_protocol: args.decision.default_proxy_protocol.0,
            addresses: lb_addresses(args),
            frontend_caps: k8s::decide::desired::FrontendCaps {
                per_namespace: args.decision.max_frontends_per_namespace as usize,
                total: args.max_frontends as usize,
            },
        },
        scope,
        cert_names,
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

/// Loads and attaches the programs as `--mode` allows. `auto` turns a failure into
/// [`EbpfOutcome::Failed`] with a warning; `ebpf` and `both` stop on it. While
/// another agent owns the pin directory, or a live datapath of another pin layout
/// is in it, this waits (not ready, and `status` says why): the running datapath
/// is neither broken nor silently taken over (see [`lifecycle`]). The log says why
/// every 30 s.
async fn start_datapath(
    args: &RunArgs,
) -> Result<(Option<Datapath>, EbpfOutcome, Option<PathBuf>), StartError> {
    if !args.mode.tries_ebpf() {
        info!("--mode fallback: no programs loaded");
        return Ok((None, EbpfOutcome::NotTried, None));
    }
    let mut said: Option<std::time::Instant> = None;
    let attached = loop {
        match attach(args) {
            Ok(Attached::Waiting(wait)) => {
                if said.is_none_or(|t| t.elapsed() >= DATAPATH_WAIT_LOG) {
                    warn!(reason = %wait, "waiting to own the datapath");
                    said = Some(std::time::Instant::now());
                }
                tokio::time::sleep(DATAPATH_WAIT_RETRY).await;
            }
            Ok(Attached::Ready(datapath, cgroup)) => break Ok((datapath, cgroup)),
            Err(e) => break Err(e),
        }
    };
    match attached {
        Ok((datapath, cgroup)) => {
            info!(cgroup = %cgroup.display(), "programs attached");
            Ok((Some(datapath), EbpfOutcome::Attached, Some(cgroup)))
        }
        Err(e) if args.mode.requires_ebpf() => Err(e),
        Err(e) => {
            let reason = chain(&e);
            warn!(%reason, "eBPF could not be used on this node: falling back to the name relay (/etc/hosts, CoreDNS)");
            Ok((None, EbpfOutcome::Failed(reason), None))
        }
    }
}

/// How often a waiting agent tries again to own the datapath, and says so.
const DATAPATH_WAIT_RETRY: Duration = Duration::from_secs(1);
const DATAPATH_WAIT_LOG: Duration = Duration::from_secs(30);

/// What one attempt to own the datapath came to.
// A Datapath is large and a Wait small, but this is returned once per attempt.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per start attempt, never stored in bulk"
)]
enum Attached {
    /// Loaded and attached at the cgroup.
    Ready(Datapath, PathBuf),
    /// The lifecycle waits (see [`Wait`]): nothing was changed.
    Waiting(Wait),
}

/// Finds the cgroup, and starts the datapath as the lifecycle decides: loaded and
/// attached, or waiting.
fn attach(args: &RunArgs) -> Result<Attached, StartError> {
    let object = datapath::embedded_object().ok_or(DatapathError::NotEmbedded)?;
    let cgroup = match &args.cgroup_path {
        Some(p) => p.clone(),
        None => {
            let mountinfo =
                std::fs::read_to_string("/proc/self/mountinfo").map_err(StartError::Mountinfo)?;
            datapath::find_cgroup2_root(&mountinfo).ok_or(StartError::NoCgroup2)?
        }
    };
    match lifecycle::start(object, &load_options(args))? {
        Started::Waiting(wait) => Ok(Attached::Waiting(wait)),
        Started::Loaded { mut datapath, go } => {
            info!(start = %go, "datapath loaded");
            datapath.attach(&cgroup)?;
            Ok(Attached::Ready(datapath, cgroup))
        }
    }
}

/// The name relay, when the plan runs one and ports are configured. It listens
/// only once a route exists, so an agent without names never takes ports 80/443.
#[expect(
    clippy::too_many_arguments,
    reason = "startup wiring: each is one already-validated piece"
)]
async fn start_names(
    args: &RunArgs,
    scope: &NameScope,
    plan: &Plan,
    listen: ListenAddresses,
    node: NodeIps,
    relay: &RelayConfig,
    metrics: &Metrics,
    state: &AgentState,
) -> Result<Option<NameRouting>, StartError> {
    let Some(address) = args.names_address.or(listen.v4).or(listen.v6) else {
        return Ok(None);
    };
    if !plan.name_relay || (args.names_ports.0.is_empty() && args.names_service_ports.0.is_empty())
    {
        return Ok(None);
    }
    let link_note = names_on_link(args, address).await?;
    let hosts_file = args.hosts_file.clone().filter(|_| plan.hosts);
    state.update(|s| {
        s.names = Some(NamesStatus {
            address: Some(address),
            link: args.names_link.clone(),
            link_note,
            hosts_file: hosts_file.clone(),
            domains: scope.domains().to_vec(),
            scope: scope.describe(),
            ..NamesStatus::default()
        })
    });
    Ok(Some(NameRouting::new(
        NameRoutingConfig {
            address,
            ports: args.names_ports.0.clone(),
            redirect: match (args.names_redirect, plan.ebpf) {
                (NamesRedirect::Off, _) => Redirect::Bound,
                (NamesRedirect::Auto, true) => Redirect::ConnectPrograms,
                (NamesRedirect::Auto, false) => Redirect::Netfilter,
            },
            service_listeners: service_listeners(args, node.v4, node.v6),
            hosts_file,
            hosts_min_interval: args.decision.name_limits.hosts_min_interval,
            report_to: Some(state.clone()),
            peek_timeout: Duration::from_secs(5),
        },
        relay.clone(),
        metrics.clone(),
    )))
}

/// The name relay's listeners for the `hairpin` Service: every node IP at each
/// target port (a hostNetwork pod's endpoints are the node's IPs).
fn service_listeners(
    args: &RunArgs,
    node_v4: Option<IpAddr>,
    node_v6: Option<IpAddr>,
) -> Vec<ServiceListener> {
    let mut out = Vec::new();
    for ip in [node_v4, node_v6].into_iter().flatten() {
        for &(routes_as, listen) in &args.names_service_ports.0 {
            out.push(ServiceListener {
                bind: SocketAddr::new(ip, listen),
                routes_as,
            });
        }
    }
    out
}

/// Where the relays listen: `--listen-address`, else the node-local defaults for
/// each family this node has an IP of.
fn listen_addresses(
    args: &RunArgs,
    node_v4: Option<IpAddr>,
    node_v6: Option<IpAddr>,
) -> ListenAddresses {
    if args.listen_addresses.is_empty() {
        return ListenAddresses {
            v4: node_v4.map(|_| IpAddr::V4(DEFAULT_LISTEN_V4)),
            v6: node_v6.map(|_| IpAddr::V6(DEFAULT_LISTEN_V6)),
        };
    }
    ListenAddresses {
        v4: args.listen_addresses.iter().find(|i| i.is_ipv4()).copied(),
        v6: args.listen_addresses.iter().find(|i| i.is_ipv6()).copied(),
    }
}

/// Puts the listen addresses on the listen link (see `--listen-link`); returns
/// what was done, one line per address.
async fn listen_on_link(
    args: &RunArgs,
    listen: ListenAddresses,
) -> Result<Option<String>, StartError> {
    let Some(link) = args.listen_link() else {
        return Ok(None);
    };
    let mut notes = Vec::new();
    for address in [listen.v4, listen.v6].into_iter().flatten() {
        let outcome =
            names_link::ensure(link, address)
                .await
                .map_err(|source| StartError::ListenLink {
                    link: link.to_string(),
                    address,
                    source: Box::new(source),
                })?;
        let note = outcome.note(address);
        info!(link = outcome.link(), %address, "{note}");
        notes.push(note);
    }
    Ok(Some(notes.join("; ")))
}

/// The addresses the agent puts on links: the relays' listen addresses on
/// `--listen-link`, and the names address on `--names-link`.
fn link_addresses(args: &RunArgs, listen: ListenAddresses) -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    if let Some(link) = args.listen_link() {
        out.extend(
            [listen.v4, listen.v6]
                .into_iter()
                .flatten()
                .map(|a| (link.to_string(), a)),
        );
    }
    if let (Some(link), Some(address)) = (&args.names_link, args.names_address) {
        out.push((link.clone(), address));
    }
    out
}

/// Puts the names address on `--names-link` when set; returns what was done.
async fn names_on_link(args: &RunArgs, address: IpAddr) -> Result<Option<String>, StartError> {
    let Some(link) = &args.names_link else {
        return Ok(None);
    };
    let outcome =
        names_link::ensure(link, address)
            .await
            .map_err(|source| StartError::NamesLink {
                link: link.clone(),
                address,
                source: Box::new(source),
            })?;
    let note = outcome.note(address);
    info!(link = outcome.link(), %address, "{note}");
    Ok(Some(note))
}

/// What the datapath loads: `--max-frontends`, `--bypass-mark`, and the kernel path
/// unless `--kernel-path off` (its header names the node for host sockets as the relay does).
fn load_options(args: &RunArgs) -> LoadOptions {
    LoadOptions {
        bypass_mark: args.bypass_mark,
        max_frontends: args.max_frontends,
        kernel_path: args.kernel_path.loads(),
        max_kernel_sockets: args.kernel_path_sockets,
        node_ipv4: args.node_ips.iter().find_map(|ip| match ip {
            IpAddr::V4(v) => Some(*v),
            IpAddr::V6(_) => None,
        }),
        node_ipv6: args.node_ips.iter().find_map(|ip| match ip {
            IpAddr::V6(v) => Some(*v),
            IpAddr::V4(_) => None,
        }),
        pin_dir: args.pin_dir().map(PathBuf::from),
        pin_layout: args.pin_layout,
        ttl: args.datapath_ttl,
        // Two sockets per relayed connection, each way spliced at most once.
        splice_sockets: u32::try_from(args.max_connections.saturating_mul(2))
            .unwrap_or(u32::MAX)
            .clamp(2, 1 << 20),
        link_first: args.link_order == LinkOrderMode::First,
        mesh_ports: args.mesh_capture_ports.slots(),
    }
}

/// Watches the sockets maps earlier releases pinned one per agent in
/// `--bpf-pin-dir` (their sockets still get their header from them) and removes
/// each pin once its map is empty.
fn release_inherited_pins(args: &RunArgs) {
    let Some(dir) = args.pin_dir().filter(|d| d.is_dir()) else {
        return;
    };
    let (maps, failed) = datapath::pin::inherited(dir);
    for (path, why) in failed {
        warn!(pin = %path.display(), error = %why, "an earlier agent's pinned sockets map cannot be opened: left in place");
    }
    if !maps.is_empty() {
        tokio::spawn(datapath::pin::release_when_empty(
            maps,
            std::time::Duration::from_secs(2),
        ));
    }
}

/// Says in `status` where the connect programs run among the other connect programs
/// at the cgroup, and warns when another runs before them (a socket load balancer
/// there hides the LB address from them).
fn report_link_order(d: &Datapath, state: &AgentState) {
    let Some(order) = d.link_order_status() else {
        return;
    };
    info!(order = %order.ordering, "connect links");
    for hook in order.blocked() {
        let front: Vec<String> = hook.in_front.iter().map(ToString::to_string).collect();
        warn!(
            hook = %hook.hook,
            in_front = %front.join(", "),
            remedy = order.remedy(),
            "another connect program runs before hairpin's: a socket load balancer there rewrites the LB address before hairpin sees it"
        );
    }
    if let Some(e) = &order.error {
        warn!(error = %e, "the order of the connect programs is not known");
    }
    state.update(|s| s.link_order = Some(order));
}

/// Says in `status` and the log how the kernel path stands, and exports the
/// programs' counters on `/metrics`.
fn report_kernel_path(args: &RunArgs, d: &Datapath, state: &AgentState, metrics: &Metrics) {
    let (kernel_state, reason) = match d.kernel_path() {
        KernelPath::On => (KernelPathState::On, None),
        KernelPath::Off => (KernelPathState::Off, None),
        KernelPath::Unavailable(why) => (KernelPathState::Unavailable, Some(why.clone())),
    };
    info!(configured = %args.kernel_path, state = %d.kernel_path(), "kernel path");
    let ids = d.kernel_ids();
    state.update(|s| {
        s.kernel_path = Some(KernelPathStatus {
            configured: args.kernel_path,
            state: kernel_state,
            reason,
            sockets_map_id: d
                .kernel_path()
                .is_on()
                .then(|| d.sockets_map_id())
                .flatten(),
            sockets_capacity: d.kernel_path().is_on().then_some(args.kernel_path_sockets),
            sockets_map_pin: d.sockets_pin().map(|p| p.display().to_string()),
            sockets_map_pin_error: match d.pin() {
                datapath::Pin::Failed(why) => Some(why.clone()),
                _ => None,
            },
            mptcp_detection: Some(d.mptcp()),
        })
    });
    state.update(|s| {
        s.lifecycle = Some(LifecycleStatus {
            pin_dir: match d.pin() {
                datapath::Pin::Pinned(p) => Some(p.display().to_string()),
                _ => None,
            },
            pin_error: match d.pin() {
                datapath::Pin::Failed(why) => Some(why.clone()),
                _ => None,
            },
            layout: args.pin_layout,
            ttl_seconds: args.datapath_ttl.as_secs(),
            heartbeat_age_seconds: None,
            adopted: d
                .attachment()
                .map(|a| {
                    a.adopted
                        .iter()
                        .map(|(hook, how)| (hook.to_string(), how.to_string()))
                        .collect()
                })
                .unwrap_or_default(),
        })
    });
    // Until the agent's own reader replaces it (see `Agent::start`): by id.
    if let Some(id) = ids.counters_map_id {
        metrics.set_kernel_counters(Arc::new(move || {
            datapath::kernel_objects::read_counters(id)
                .map(|c| c.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
                .unwrap_or_default()
        }));
    }
}
