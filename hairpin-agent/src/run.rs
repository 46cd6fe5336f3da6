//! `hairpin-agent run`: the DaemonSet's main loop.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use crate::{
    admin::{self, AdminConfig},
    ebpf::{self, Datapath},
    frontends::ProxyVersion,
    metrics::Metrics,
    name_relay::{NameRouting, NameRoutingConfig},
    reconcile::{ListenAddresses, Reconciler},
    relay::{Relay, RelayConfig},
    sources,
    state::{AgentState, AttachmentStatus},
};

/// Options of `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// YAML file of frontends to proxy (LB IP, ports, proxyProtocol), instead of
    /// watching the cluster: for debugging and running without an API server.
    /// Reloaded when it changes and on SIGHUP; a broken edit keeps the last good set.
    #[arg(long, env = "HAIRPIN_FRONTENDS")]
    pub frontends: Option<PathBuf>,

    /// kubeconfig to use instead of the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "HAIRPIN_KUBECONFIG", conflicts_with = "frontends")]
    pub kubeconfig: Option<PathBuf>,

    /// PROXY version for LoadBalancer Services that neither our annotation
    /// (hairpin.dev/proxy-protocol) nor a known provider annotation decides.
    #[arg(long, env = "HAIRPIN_DEFAULT_PROXY_PROTOCOL", default_value = "off", value_parser = parse_default_version)]
    pub default_proxy_protocol: DefaultVersion,

    /// This node's name (downward API `spec.nodeName`): the Lease identity and the
    /// Event reporter instance. Default: the host name.
    #[arg(long, env = "HAIRPIN_NODE_NAME")]
    pub node_name: Option<String>,

    /// Namespace of the agent's own objects (its Lease); downward API `metadata.namespace`.
    #[arg(long, env = "HAIRPIN_NAMESPACE", default_value = "hairpin-system")]
    pub namespace: String,

    /// Name of the Lease that elects the one agent writing cluster-wide objects (Events).
    #[arg(long, env = "HAIRPIN_LEASE_NAME", default_value = "hairpin-agent")]
    pub lease_name: String,

    /// Publish a Kubernetes Event on each Service whose decision changes (by the Lease holder).
    #[arg(long, env = "HAIRPIN_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,

    /// cgroup v2 directory to attach at. Default: the root of the node's cgroup v2
    /// hierarchy, found in /proc/self/mountinfo.
    #[arg(long, env = "HAIRPIN_CGROUP_PATH")]
    pub cgroup_path: Option<PathBuf>,

    /// The node's IPs (comma-separated, one per family): the PROXY source for host
    /// processes. In a DaemonSet, from the downward API `status.hostIPs`.
    #[arg(long = "node-ip", env = "HAIRPIN_NODE_IPS", value_delimiter = ',')]
    pub node_ips: Vec<IpAddr>,

    /// Addresses the relay listeners bind (one per family), reachable from pods and
    /// the host. Default: the node IPs.
    #[arg(
        long = "listen-address",
        env = "HAIRPIN_LISTEN_ADDRESSES",
        value_delimiter = ','
    )]
    pub listen_addresses: Vec<IpAddr>,

    /// SO_MARK on the relay's upstream sockets; the programs skip sockets carrying it.
    #[arg(long, env = "HAIRPIN_BYPASS_MARK", default_value = "0x68", value_parser = parse_mark)]
    pub bypass_mark: u32,

    /// Upstream connect timeout; the client is reset when it expires.
    #[arg(long, env = "HAIRPIN_CONNECT_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// How long SIGTERM waits for open connections after redirects are removed.
    #[arg(long, env = "HAIRPIN_DRAIN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// How often the frontends file is checked for changes.
    #[arg(long, env = "HAIRPIN_FRONTENDS_POLL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub frontends_poll: Duration,

    /// TCP address of the admin server (/healthz, /readyz, /metrics, /status).
    /// Node-local: the DaemonSet runs in the host network namespace.
    #[arg(long, env = "HAIRPIN_ADMIN_ADDRESS", default_value = "127.0.0.1:9901")]
    pub admin_address: SocketAddr,

    /// Unix socket of the admin server (mode 0600), which `hairpin-agent status` and
    /// the other node subcommands read first. Its directory is created; a stale
    /// socket left by a dead agent is replaced.
    #[arg(
        long,
        env = "HAIRPIN_ADMIN_SOCKET",
        default_value = "/run/hairpin/admin.sock"
    )]
    pub admin_socket: PathBuf,

    /// Address the name relay listens on and /etc/hosts points names at. Default:
    /// the first listen address (else the first node IP).
    #[arg(long, env = "HAIRPIN_NAMES_ADDRESS")]
    pub names_address: Option<IpAddr>,

    /// Ports the name relay listens on (comma-separated); each connection is routed
    /// by TLS SNI or HTTP Host. Empty turns name routing off.
    #[arg(
        long,
        env = "HAIRPIN_NAMES_PORTS",
        value_delimiter = ',',
        default_value = "80,443"
    )]
    pub names_ports: Vec<u16>,

    /// Hosts file whose managed block points the proxied names at the name relay
    /// (in a DaemonSet, a hostPath mount of the node's /etc/hosts). Unset: not managed.
    #[arg(long, env = "HAIRPIN_HOSTS_FILE")]
    pub hosts_file: Option<PathBuf>,
}

/// `off`, `v1` or `v2`.
#[derive(Clone, Copy, Debug)]
pub struct DefaultVersion(pub Option<ProxyVersion>);

fn parse_default_version(s: &str) -> Result<DefaultVersion, String> {
    match s {
        "off" | "none" => Ok(DefaultVersion(None)),
        other => other.parse().map(|v| DefaultVersion(Some(v))),
    }
}

/// Parses a mark in hex (`0x68`) or decimal, refusing 0 (every unmarked socket has it).
pub fn parse_mark(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("expected a mark such as 0x68 or 104: {e}"))?;
    if v == 0 {
        return Err("the bypass mark must not be 0: every unmarked socket has mark 0".into());
    }
    Ok(v)
}

/// The relays' client policy. Until `--allowed-clients` is wired (with a default
/// from the node's pod CIDRs), every peer is accepted: said loudly at startup.
fn hairpin_clients(_args: &RunArgs) -> crate::clients::ClientPolicy {
    let policy = crate::clients::ClientPolicy::default();
    tracing::warn!(allowed = %policy, "relay client policy: any peer that reaches a listener is served");
    policy
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> Result<()> {
    let object = ebpf::embedded_object().ok_or(ebpf::DatapathError::NotEmbedded)?;
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
    let cgroup = match &args.cgroup_path {
        Some(p) => p.clone(),
        None => {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
                .context("failed to read /proc/self/mountinfo")?;
            ebpf::find_cgroup2_root(&mountinfo).context(
                "no cgroup v2 hierarchy root is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) \
                 or pass --cgroup-path",
            )?
        }
    };
    let metrics = Metrics::default();
    let state = AgentState::new(args.bypass_mark);
    // Sources fail before anything is attached: a bad file or kubeconfig changes nothing.
    let (mut desired, source_name) = match &args.frontends {
        Some(path) => {
            let name = format!("file {}", path.display());
            (
                sources::file_source(path, args.frontends_poll, state.clone(), name.clone())?,
                name,
            )
        }
        None => {
            let name = "kubernetes".to_string();
            let rx =
                sources::kubernetes_source(&args, metrics.clone(), state.clone(), name.clone())
                    .await?;
            (rx, name)
        }
    };
    state.register_source(&source_name);

    let relay_config = RelayConfig {
        bypass_mark: Some(args.bypass_mark),
        connect_timeout: args.connect_timeout,
        node_ipv4: node_v4.and_then(|i| match i {
            IpAddr::V4(v) => Some(v),
            IpAddr::V6(_) => None,
        }),
        node_ipv6: node_v6.and_then(|i| match i {
            IpAddr::V6(v) => Some(v),
            IpAddr::V4(_) => None,
        }),
        clients: hairpin_clients(&args),
        buffer_size: 64 * 1024,
    };
    let relay = Relay::new(relay_config.clone(), metrics.clone());
    // The name relay (fallback for names and for nodes without eBPF) listens only
    // once a route exists, so an agent without names never takes ports 80/443.
    let names_address = args.names_address.or(listen.v4).or(listen.v6);
    let mut names = match names_address {
        Some(address) if !args.names_ports.is_empty() => Some(NameRouting::new(
            NameRoutingConfig {
                address,
                ports: args.names_ports.clone(),
                hosts_file: args.hosts_file.clone(),
                peek_timeout: Duration::from_secs(5),
            },
            relay_config,
            metrics.clone(),
        )),
        _ => None,
    };
    let mut datapath = Datapath::load(object, args.bypass_mark)?;
    datapath.attach(&cgroup)?;
    info!(cgroup = %cgroup.display(), "programs attached");
    let mut rec = Reconciler::new(relay, datapath, listen);
    state.set_attachment(Some(AttachmentStatus {
        cgroup: cgroup.clone(),
        ids: rec.datapath.kernel_ids(),
    }));
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
    loop {
        // Apply what the source says now (None until it first synced).
        let next = desired.borrow_and_update().clone();
        if let Some(next) = next {
            let started = Instant::now();
            rec.apply(&next.frontends);
            if let Some(n) = names.as_mut() {
                n.update(&next.routes);
            }
            let took = started.elapsed();
            metrics.observe_reconcile(took);
            metrics.set_frontends(rec.active().count(), rec.failed().len());
            state.record_apply(&rec, &next.frontends, took);
            state.source_synced(&source_name);
            // How long a change takes to apply at scale: `cargo xtask bench` reads this.
            info!(
                frontends = rec.active().count(),
                failed = rec.failed().len(),
                routes = next.routes.len(),
                elapsed_ms = took.as_secs_f64() * 1e3,
                "reconcile finished"
            );
            if !ready {
                ready = true;
                info!(
                    cgroup = %cgroup.display(),
                    frontends = rec.active().count(),
                    failed = rec.failed().len(),
                    "agent ready"
                );
            }
        }
        tokio::select! {
            _ = term.recv() => { info!("SIGTERM"); break }
            _ = int.recv() => { info!("SIGINT"); break }
            changed = desired.changed() => if changed.is_err() { break },
        }
    }

    // Stop redirecting first, so no new connection depends on this process...
    rec.datapath.detach();
    state.set_attachment(None);
    let counters: Vec<String> = rec
        .datapath
        .counters()
        .into_iter()
        .map(|(c, n)| format!("{}={n}", c.name()))
        .collect();
    info!(counters = %counters.join(" "), "kernel counters");
    info!("redirects removed");
    // ...then let the connections already relayed finish, within a bound. The name
    // relay drains alongside; its hosts-file block stays for the next agent
    // (`hairpin-agent cleanup` removes it).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_parse_in_hex_and_decimal_and_zero_is_refused() {
        assert_eq!(parse_mark("0x68"), Ok(0x68));
        assert_eq!(parse_mark("104"), Ok(104));
        assert!(parse_mark("0").is_err());
        assert!(parse_mark("0xzz").is_err());
    }
}
