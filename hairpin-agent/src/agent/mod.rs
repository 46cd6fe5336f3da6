//! `hairpin-agent run`: the DaemonSet's main loop.
//!
//! Startup order: sources first (a bad file or kubeconfig changes nothing), then the
//! datapath as `--mode` allows, then the name relay as the resulting [`mode::Plan`]
//! says, then the admin server; then apply every change until SIGTERM.

pub mod args;
pub mod frontends_file;
pub mod limits;
pub mod mode;
pub mod reconcile;
pub mod source;

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{debug, info, warn};

use crate::{
    datapath::{self, Datapath},
    k8s,
    k8s::coredns::{CorednsConfig, CorednsMode},
    names::link as names_link,
    names::relay::{NameRouting, NameRoutingConfig, ServiceListener},
    relay::clients::ClientPolicy,
    relay::{Relay, RelayConfig},
    status::admin::{self, AdminConfig},
    status::metrics::Metrics,
    status::{
        AgentState, AttachmentStatus, ClientsStatus, HEARTBEAT_EVERY, ModeStatus, NamePaths,
        NamesStatus,
    },
};
use args::RunArgs;
use mode::{Configured, EbpfOutcome};
use reconcile::{Backoff, FAILED_RETRY_FIRST, FAILED_RETRY_MAX, ListenAddresses, Reconciler};

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> Result<()> {
    let coredns = coredns_config(&args)?;
    let node_v4 = args.node_ips.iter().find(|i| i.is_ipv4()).copied();
    let node_v6 = args.node_ips.iter().find(|i| i.is_ipv6()).copied();
    if node_v4.is_none() && node_v6.is_none() {
        bail!("no node IP: pass --node-ip (in a DaemonSet, HAIRPIN_NODE_IPS from status.hostIPs)");
    }
    let listen = if args.listen_addresses.is_empty() {
        ListenAddresses {
            v4: node_v4,
            v6: node_v6,
        }
    } else {
        ListenAddresses {
            v4: args.listen_addresses.iter().find(|i| i.is_ipv4()).copied(),
            v6: args.listen_addresses.iter().find(|i| i.is_ipv6()).copied(),
        }
    };
    limits::raise_nofile_limit();
    let metrics = Metrics::default();
    limits::spawn_trimmer(metrics.clone(), Duration::from_secs(10));
    let state = AgentState::new(args.bypass_mark);
    // Sources fail before anything is attached: a bad file or kubeconfig changes nothing.
    let mut kube = None;
    let (mut desired, source_name) = match &args.frontends {
        Some(path) => {
            let name = format!("file {}", path.display());
            (
                source::file_source(path, args.frontends_poll, state.clone(), name.clone())?,
                name,
            )
        }
        None => {
            let name = "kubernetes".to_string();
            let client = k8s::client::client(args.kubeconfig.as_deref()).await?;
            kube = Some(client.clone());
            let rx = source::kubernetes_source(
                client,
                &args,
                metrics.clone(),
                state.clone(),
                name.clone(),
                coredns,
            )?;
            (rx, name)
        }
    };
    state.register_source(&source_name);

    let (datapath, outcome, cgroup) = start_datapath(&args)?;
    let plan = mode::plan(
        args.mode,
        &outcome,
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

    let relay_config = RelayConfig {
        // Without programs nothing skips marked sockets, and setting a mark needs
        // CAP_NET_ADMIN: leave it off.
        bypass_mark: plan.ebpf.then_some(args.bypass_mark),
        connect_timeout: args.connect_timeout,
        node_ipv4: node_v4.and_then(|i| match i {
            IpAddr::V4(v) => Some(v),
            IpAddr::V6(_) => None,
        }),
        node_ipv6: node_v6.and_then(|i| match i {
            IpAddr::V6(v) => Some(v),
            IpAddr::V4(_) => None,
        }),
        clients: client_policy(&args, kube, &state).await,
        buffer_size: 64 * 1024,
        keepalive: (!args.relay_keepalive.is_zero()).then_some(args.relay_keepalive),
    };
    let relay = Relay::new(relay_config.clone(), metrics.clone());
    // The name relay listens only once a route exists, so an agent without names
    // never takes ports 80/443.
    let names_address = args.names_address.or(listen.v4).or(listen.v6);
    let mut names = match names_address {
        Some(address)
            if plan.name_relay
                && !(args.names_ports.0.is_empty() && args.names_service_ports.0.is_empty()) =>
        {
            let link_note = names_on_link(&args, address).await?;
            state.update(|s| {
                s.names = Some(NamesStatus {
                    address: Some(address),
                    link: args.names_link.clone(),
                    link_note,
                    hosts_file: args.hosts_file.clone().filter(|_| plan.hosts),
                    ..NamesStatus::default()
                })
            });
            Some(NameRouting::new(
                NameRoutingConfig {
                    address,
                    ports: args.names_ports.0.clone(),
                    service_listeners: service_listeners(&args, node_v4, node_v6),
                    hosts_file: args.hosts_file.clone().filter(|_| plan.hosts),
                    peek_timeout: Duration::from_secs(5),
                },
                relay_config,
                metrics.clone(),
            ))
        }
        _ => None,
    };
    let name_paths: Vec<String> = plan.live().into_iter().filter(|p| p != "ebpf").collect();
    let mut rec = Reconciler::new(relay, datapath, listen);
    if let (Some(d), Some(cgroup)) = (rec.datapath.as_ref(), cgroup.as_ref()) {
        state.set_attachment(Some(AttachmentStatus {
            cgroup: cgroup.clone(),
            ids: d.kernel_ids(),
        }));
    }
    // Up before the first sync: /healthz answers and /readyz says what it waits for.
    let admin = admin::start(
        &AdminConfig {
            address: Some(args.admin_address),
            socket: Some(args.admin_socket.clone()),
        },
        state.clone(),
        metrics.clone(),
    )
    .await?;

    let mut term = signal(SignalKind::terminate()).context("failed to handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("failed to handle SIGINT")?;
    let mut ready = false;
    let mut retry = Backoff::new(FAILED_RETRY_FIRST, FAILED_RETRY_MAX);
    let mut retry_in: Option<Duration> = None;
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Apply what the source says now (None until it first synced).
        let next = desired.borrow_and_update().clone();
        if let Some(next) = next {
            let started = Instant::now();
            rec.apply(&next.frontends);
            let mut relay_ip = None;
            let mut failed_listeners = 0;
            if let Some(n) = names.as_mut() {
                n.update(&next.routes);
                let listeners = n.listeners();
                let failed = n.failed_listeners();
                failed_listeners = failed.len();
                relay_ip = listeners.first().map(|a| a.ip());
                state.update(|s| {
                    if let Some(st) = s.names.as_mut() {
                        st.listeners = listeners;
                        st.failed_listeners = failed;
                        st.routes = next.routes.len();
                    }
                });
            }
            let took = started.elapsed();
            metrics.observe_reconcile(took);
            metrics.set_frontends(rec.active().count(), rec.failed().len());
            let paths = NamePaths::new(name_paths.clone(), &next.routes, relay_ip);
            state.record_apply(&rec, &next.frontends, &paths, took);
            state.source_synced(&source_name);
            // How long a change takes to apply at scale: `cargo xtask bench` reads this.
            info!(
                frontends = rec.active().count(),
                failed = rec.failed().len(),
                routes = next.routes.len(),
                elapsed_ms = took.as_secs_f64() * 1e3,
                "reconcile finished"
            );
            // A frontend that failed (no free listener port, a full map) and a name
            // relay listener that could not bind are retried on their own, with
            // backoff, instead of waiting for the next change.
            retry_in = if rec.failed().is_empty() && failed_listeners == 0 {
                retry.reset();
                None
            } else {
                let d = retry.next_delay();
                debug!(
                    failed = rec.failed().len(),
                    failed_listeners,
                    retry_in = ?d,
                    "failed frontends and listeners will be retried"
                );
                Some(d)
            };
            if !ready {
                ready = true;
                info!(
                    live = ?plan.live(),
                    frontends = rec.active().count(),
                    failed = rec.failed().len(),
                    "agent ready"
                );
            }
        }
        let retry_timer = async {
            match retry_in {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(retry_timer);
        // Wait for a change, beating while idle so /healthz can tell a stuck loop.
        let stop = loop {
            state.beat();
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM"); break true }
                _ = int.recv() => { info!("SIGINT"); break true }
                changed = desired.changed() => {
                    if changed.is_err() { break true }
                    retry.reset();
                    break false;
                }
                () = &mut retry_timer => {
                    debug!("retrying failed frontends and listeners");
                    break false;
                }
                _ = heartbeat.tick() => {}
            }
        };
        if stop {
            break;
        }
    }

    // Stop redirecting first, so no new connection depends on this process...
    if let Some(d) = rec.datapath.as_mut() {
        d.detach();
        state.set_attachment(None);
        let counters: Vec<String> = d
            .counters()
            .into_iter()
            .map(|(c, n)| format!("{}={n}", c.name()))
            .collect();
        info!(counters = %counters.join(" "), "kernel counters");
        info!("redirects removed");
    }
    // ...then let the connections already relayed finish, within a bound. The name
    // relay drains alongside; its hosts-file block and link address stay for the
    // next agent (`hairpin-agent cleanup` removes them).
    let names_drain = async {
        if let Some(n) = names.as_mut() {
            n.drain(args.drain_timeout).await;
        }
    };
    let (left, ()) = tokio::join!(rec.relay.drain(args.drain_timeout), names_drain);
    admin.shutdown().await;
    info!(left, "agent stopped");
    Ok(())
}

/// The CoreDNS writer's settings, or `None` when it is off; refuses combinations
/// that cannot work.
fn coredns_config(args: &RunArgs) -> Result<Option<CorednsConfig>> {
    if args.coredns == CorednsMode::Off {
        return Ok(None);
    }
    if !args.mode.allows_names() {
        bail!(
            "--coredns {} needs the name relay: --mode ebpf runs none (use --mode both or auto)",
            args.coredns
        );
    }
    if args.frontends.is_some() {
        bail!("--coredns writes through the Kubernetes API: it cannot be used with --frontends");
    }
    Ok(Some(CorednsConfig {
        mode: args.coredns,
        configmap: args.coredns_objects.configmap.clone(),
        custom: args.coredns_objects.custom_configmap.clone(),
        target: args.coredns_target.clone(),
    }))
}

/// Loads and attaches the programs as `--mode` allows. `auto` turns a failure into
/// [`EbpfOutcome::Failed`] with a warning; `ebpf` and `both` stop on it.
fn start_datapath(args: &RunArgs) -> Result<(Option<Datapath>, EbpfOutcome, Option<PathBuf>)> {
    if !args.mode.tries_ebpf() {
        info!("--mode fallback: no programs loaded");
        return Ok((None, EbpfOutcome::NotTried, None));
    }
    match attach(args) {
        Ok((datapath, cgroup)) => {
            info!(cgroup = %cgroup.display(), "programs attached");
            Ok((Some(datapath), EbpfOutcome::Attached, Some(cgroup)))
        }
        Err(e) if args.mode.requires_ebpf() => Err(e),
        Err(e) => {
            let reason = format!("{e:#}");
            warn!(%reason, "eBPF could not be used on this node: falling back to the name relay (/etc/hosts, CoreDNS)");
            Ok((None, EbpfOutcome::Failed(reason), None))
        }
    }
}

fn attach(args: &RunArgs) -> Result<(Datapath, PathBuf)> {
    let object = datapath::embedded_object().ok_or(datapath::DatapathError::NotEmbedded)?;
    let cgroup = match &args.cgroup_path {
        Some(p) => p.clone(),
        None => {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
                .context("failed to read /proc/self/mountinfo")?;
            datapath::find_cgroup2_root(&mountinfo).context(
                "no cgroup v2 hierarchy root is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) \
                 or pass --cgroup-path",
            )?
        }
    };
    let mut datapath = Datapath::load_with_capacity(object, args.bypass_mark, args.max_frontends)?;
    datapath.attach(&cgroup)?;
    Ok((datapath, cgroup))
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

/// Puts the names address on `--names-link` when set; returns what was done.
async fn names_on_link(args: &RunArgs, address: IpAddr) -> Result<Option<String>> {
    let Some(link) = &args.names_link else {
        return Ok(None);
    };
    let outcome = names_link::ensure(link, address)
        .await
        .with_context(|| format!("--names-link {link}: cannot put {address} on it"))?;
    let note = outcome.note(address);
    info!(link = outcome.link(), %address, "{note}");
    Ok(Some(note))
}

/// The relays' client policy: `--allowed-clients`, else this node's pod CIDRs from its
/// Node object; plus this node's own addresses and loopback (host processes). Open,
/// and said loudly (log, `status`, `doctor`), when neither gives a network: a wrong
/// guess would refuse this node's own pods.
async fn client_policy(
    args: &RunArgs,
    kube: Option<kube::Client>,
    state: &AgentState,
) -> ClientPolicy {
    let (mut nets, source) = if !args.allowed_clients.is_empty() {
        (
            args.allowed_clients.clone(),
            "--allowed-clients".to_string(),
        )
    } else {
        match node_pod_cidrs(args, kube).await {
            Ok((node, cidrs)) if !cidrs.is_empty() => (cidrs, format!("Node {node} spec.podCIDRs")),
            Ok((node, _)) => {
                let why = format!(
                    "Node {node} has no spec.podCIDRs (the CNI allocates pod addresses itself, as \
                     Calico and Cilium's cluster-pool IPAM do): set --allowed-clients to the pod CIDR"
                );
                return open_policy(state, why);
            }
            Err(why) => return open_policy(state, why),
        }
    };
    let own = args
        .node_ips
        .iter()
        .chain(&args.listen_addresses)
        .chain(args.names_address.iter());
    nets.extend(own.copied().map(ipnet::IpNet::from));
    nets.extend(
        ["127.0.0.0/8", "::1/128"]
            .iter()
            .filter_map(|n| n.parse::<ipnet::IpNet>().ok()),
    );
    let policy = ClientPolicy::new(nets);
    info!(allowed = %policy, from = %source, "relay client policy");
    state.update(|s| {
        s.clients = Some(ClientsStatus {
            allowed: policy.to_string(),
            source: format!("{source}, this node's addresses and loopback"),
        })
    });
    policy
}

/// This node's name and pod CIDRs, or why they cannot be had.
async fn node_pod_cidrs(
    args: &RunArgs,
    kube: Option<kube::Client>,
) -> Result<(String, Vec<ipnet::IpNet>), String> {
    let Some(client) = kube else {
        return Err("no --allowed-clients, and the frontends file gives no pod CIDRs".into());
    };
    let node = args.node_name().map_err(|e| format!("{e:#}"))?;
    // Bounded: an API server that does not answer must not hold up the datapath.
    match tokio::time::timeout(Duration::from_secs(10), k8s::node::pod_cidrs(client, &node)).await {
        Ok(Ok(cidrs)) => Ok((node, cidrs)),
        Ok(Err(e)) => Err(format!("no --allowed-clients, and {e}")),
        Err(_) => Err(format!(
            "no --allowed-clients, and Node {node} could not be read within 10 s"
        )),
    }
}

fn open_policy(state: &AgentState, why: String) -> ClientPolicy {
    warn!(reason = %why, "relays serve any peer that reaches their listeners");
    state.update(|s| {
        s.clients = Some(ClientsStatus {
            allowed: "any".into(),
            source: why,
        })
    });
    ClientPolicy::default()
}
