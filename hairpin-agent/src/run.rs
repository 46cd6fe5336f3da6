//! `hairpin-agent run`: the DaemonSet's main loop.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, bail};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{error, info, warn};

use crate::{
    ebpf::{self, Datapath},
    frontends::Frontend,
    metrics::Metrics,
    reconcile::{ListenAddresses, Reconciler},
    relay::{Relay, RelayConfig},
    static_source,
};

/// Options of `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// YAML file of frontends to proxy (LB IP, ports, proxyProtocol). Reloaded when it
    /// changes and on SIGHUP; a broken edit keeps the last good set.
    #[arg(long, env = "HAIRPIN_FRONTENDS")]
    pub frontends: PathBuf,

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
}

fn parse_mark(s: &str) -> Result<u32, String> {
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
    let initial = static_source::load(&args.frontends)?;

    let metrics = Metrics::default();
    let relay = Relay::new(
        RelayConfig {
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
            buffer_size: 64 * 1024,
        },
        metrics.clone(),
    );
    let mut datapath = Datapath::load(object, args.bypass_mark)?;
    datapath.attach(&cgroup)?;
    let mut rec = Reconciler::new(relay, datapath, listen);
    rec.apply(&initial);
    metrics.set_frontends(rec.active().count());
    info!(
        cgroup = %cgroup.display(),
        frontends = rec.active().count(),
        failed = rec.failed().len(),
        "agent ready"
    );

    let (tx, mut rx) = watch::channel(initial);
    tokio::spawn(watch_file(args.frontends.clone(), args.frontends_poll, tx));
    let mut term = signal(SignalKind::terminate()).context("failed to handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("failed to handle SIGINT")?;
    loop {
        tokio::select! {
            _ = term.recv() => { info!("SIGTERM"); break }
            _ = int.recv() => { info!("SIGINT"); break }
            changed = rx.changed() => {
                if changed.is_err() { break }
                let desired = rx.borrow_and_update().clone();
                let started = std::time::Instant::now();
                rec.apply(&desired);
                metrics.set_frontends(rec.active().count());
                // How long a change takes to apply at scale: `cargo xtask bench` reads this.
                info!(
                    frontends = rec.active().count(),
                    failed = rec.failed().len(),
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "reconcile finished"
                );
            }
        }
    }

    // Stop redirecting first, so no new connection depends on this process...
    rec.datapath.detach();
    let counters: Vec<String> = rec
        .datapath
        .counters()
        .into_iter()
        .map(|(c, n)| format!("{}={n}", c.name()))
        .collect();
    info!(counters = %counters.join(" "), "kernel counters");
    info!("redirects removed");
    // ...then let the connections already relayed finish, within a bound.
    let left = rec.relay.drain(args.drain_timeout).await;
    info!(left, "agent stopped");
    Ok(())
}

/// Reloads the frontends file when its modification time or size changes, and on
/// SIGHUP. A file that fails to parse keeps the last good set (fail static).
async fn watch_file(path: PathBuf, every: Duration, tx: watch::Sender<BTreeSet<Frontend>>) {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
    };
    let mut last = stamp(&path);
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "SIGHUP reloads disabled");
            None
        }
    };
    let mut tick = tokio::time::interval(every);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        let now = stamp(&path);
        if !forced && now == last {
            continue;
        }
        last = now;
        match static_source::load(&path) {
            Ok(set) => {
                if tx.send(set).is_err() {
                    return;
                }
            }
            Err(e) => error!(error = %e, "keeping the last good frontends"),
        }
    }
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
