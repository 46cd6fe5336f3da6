//! `hairpin-agent check <host|ip>[:port]`: does a request from inside the cluster to
//! this name work, and if not, why? Resolves it as the node and (optionally) as a pod
//! would, probes each address without and with a PROXY header, and says whether
//! kube-proxy short-circuits it and whether hairpin covers it.

use std::{
    net::{IpAddr, SocketAddr, ToSocketAddrs},
    time::Duration,
};

use super::{
    AdminArgs, CliError, OutputFormat, colour_stdout,
    kube_proxy::{KubeProxy, ShortCircuit},
    print_json, print_text,
    probe::{self, Probe},
};
use crate::{
    model::LivePath,
    status::{FrontendState, FrontendStatus, KernelPathState, Snapshot},
};

mod report;
mod target;
#[cfg(test)]
mod tests;

pub(crate) use report::{
    AddressReport, CheckReport, Coverage, HeaderBy, HeaderHandling, LENIENT_WARNING, Resolution,
    header_handling,
};
pub(crate) use target::{BadTarget, Target, parse_target};

/// Options of `check`.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Answers \"why does my in-cluster request to my own hostname fail?\" for one \
target. Resolves it as the node does (getaddrinfo) and as a pod does (an A/AAAA query to \
--dns-server, or else to the cluster DNS Service the running agent found). For each address \
it makes three connections: as an in-cluster client would now (through hairpin's redirect when one exists), directly to the LoadBalancer \
address without a PROXY header, and directly with a PROXY v1 header - the two direct ones \
carry the agent's bypass mark so hairpin's programs leave them alone. Each sends an HTTP \
GET / (or a TLS ClientHello with --tls or port 443). It then says whether kube-proxy \
short-circuits the address (iptables, nftables or IPVS rules on this node), whether the \
running agent proxies it, and through which path: the kernel path (the kernel writes the \
header on the client's own socket) or the relay listener, and why (the server speaks first, \
the kernel path is off or unavailable). When the server answers both direct probes alike it is \
lenient (Traefik's trustedIPs, Caddy's proxy_protocol allow, Envoy's \
allow_requests_without_proxy_protocol): check says so and warns that such a server drops a header \
from a peer outside its trusted list without a word, so the symptom there is a wrong client \
address, not an error.",
    after_help = "Exit status: 0 works for in-cluster clients (directly or through hairpin); \
1 broken: the server needs the PROXY header and in-cluster connections do not get one (a \
lenient server answers without one: 0, with the warning); \
5 could not check (the name did not resolve, nothing answered at all); 2 usage.\n\n\
Examples:\n  hairpin-agent check 203.0.113.10\n  hairpin-agent check registry.example.com:443\n  \
hairpin-agent check ingress.example.com --tls --dns-server 10.96.0.10 --output json"
)]
pub struct CheckArgs {
    /// What to check: `host`, `ip`, `host:port`, `ip:port` or `[ipv6]:port`. The port
    /// defaults to 443 with --tls, else 80.
    pub(crate) target: String,

    /// Probe with a TLS handshake instead of HTTP (implied by port 443).
    #[arg(long, env = "HAIRPIN_CHECK_TLS")]
    pub(crate) tls: bool,

    /// Resolve the name as a pod would, with a plain A/AAAA query to this DNS server
    /// (the kube-dns Service IP, e.g. 10.96.0.10). Default: the cluster DNS Service
    /// the running agent found (kube-dns, rke2-coredns...).
    #[arg(long, env = "HAIRPIN_DNS_SERVER")]
    pub(crate) dns_server: Option<IpAddr>,

    /// The agent's bypass mark, set on the direct probes so hairpin does not redirect them.
    #[arg(long, env = "HAIRPIN_BYPASS_MARK", default_value = crate::agent::args::DEFAULT_BYPASS_MARK_ARG, value_parser = crate::agent::args::parse_mark)]
    pub(crate) bypass_mark: u32,

    /// Timeout of each connect and each reply.
    #[arg(long, env = "HAIRPIN_CHECK_TIMEOUT", default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,

    /// Where the agent's admin server is.
    #[command(flatten)]
    pub(crate) admin: AdminArgs,

    /// Output format.
    #[arg(long, short, env = "HAIRPIN_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) output: OutputFormat,
}

/// Says whether in-cluster requests to the target work, and why not; returns the
/// exit code.
pub fn check_target(args: &CheckArgs) -> Result<i32, CliError> {
    let target = parse_target(&args.target, args.tls)?;
    let agent = args.admin.status();
    let dns = pod_dns_server(args.dns_server, agent.as_ref().ok());
    let resolution = resolve(&target, dns, args.timeout);
    let kp = KubeProxy::observe();
    let mut addresses = Vec::new();
    for ip in resolution.addresses() {
        let addr = SocketAddr::new(ip, target.port);
        let probe = |header, mark| {
            probe::send(&Probe {
                addr,
                host: target.host.clone(),
                tls: target.tls,
                header,
                mark,
                timeout: args.timeout,
            })
        };
        let in_cluster = probe(false, None);
        let direct = probe(false, Some(args.bypass_mark));
        let direct_with_header = probe(true, Some(args.bypass_mark));
        let coverage = coverage(agent.as_ref().ok(), addr);
        let kube_proxy: Vec<ShortCircuit> =
            kp.matching(ip, target.port).into_iter().cloned().collect();
        addresses.push(AddressReport::new(
            addr,
            kube_proxy,
            coverage,
            in_cluster,
            direct,
            direct_with_header,
        ));
    }
    let report = CheckReport::new(
        target,
        resolution,
        agent.err().map(|e| e.to_string()),
        kp,
        addresses,
    );
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text => print_text(&report.render(colour_stdout()))?,
    }
    Ok(report.exit_code)
}

/// The DNS server to resolve as a pod through: `--dns-server`, else the cluster
/// DNS Service the agent found (its first IP), with where it came from.
fn pod_dns_server(
    flag: Option<IpAddr>,
    agent: Option<&Snapshot>,
) -> Option<(IpAddr, &'static str)> {
    match flag {
        Some(ip) => Some((ip, "--dns-server")),
        None => agent
            .and_then(|s| s.cluster_dns.first().copied())
            .map(|ip| (ip, "the cluster DNS Service, from the agent")),
    }
}

fn resolve(t: &Target, dns: Option<(IpAddr, &'static str)>, timeout: Duration) -> Resolution {
    if let Ok(ip) = t.host.parse::<IpAddr>() {
        return Resolution::literal(ip);
    }
    let node = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map(|a| a.map(|s| s.ip()).collect::<Vec<_>>());
    let pod = dns.map(|(server, from)| {
        let server = SocketAddr::new(server, 53);
        (server, from, super::dns::lookup(server, &t.host, timeout))
    });
    Resolution::from_lookups(node, pod)
}

/// Whether the agent's /status proxies `addr`.
fn coverage(agent: Option<&Snapshot>, addr: SocketAddr) -> Coverage {
    let Some(s) = agent else {
        return Coverage::Unknown;
    };
    match s
        .frontends
        .iter()
        .find(|f| f.ip == addr.ip() && f.port == addr.port())
    {
        Some(f) if f.state == FrontendState::Active => {
            let (header_by, why) = header_path(s, f);
            Coverage::Active {
                listener: f.listener,
                version: f.version.to_string(),
                path: f.path.clone(),
                header_by,
                why,
            }
        }
        Some(f) => Coverage::Failed {
            reason: f.reason.clone().unwrap_or_default(),
        },
        None => Coverage::NotCovered,
    }
}

/// Who writes the header of an in-cluster connection to the active frontend `f`,
/// and why: the frontend's path and reason (`kernel: ...`, `relay: ...`) as the
/// agent decided them, with the kernel path's state for a frontend the agent gave
/// no reason for.
fn header_path(s: &Snapshot, f: &FrontendStatus) -> (HeaderBy, String) {
    let reason = f.reason.as_deref().unwrap_or("");
    if f.path.0.contains(&LivePath::Kernel) {
        let why = reason.strip_prefix("kernel: ").unwrap_or(reason);
        let why = if why.is_empty() {
            "the client speaks first"
        } else {
            why
        };
        return (HeaderBy::Kernel, why.to_string());
    }
    let why = match s
        .kernel_path
        .as_ref()
        .map(|k| (k.state, k.reason.as_deref()))
    {
        Some((KernelPathState::Unavailable, why)) => format!(
            "the kernel path is unavailable on this node: {}",
            why.unwrap_or("no reason given")
        ),
        // The agent names the cause on the frontend (the server speaks first).
        _ if reason.starts_with("relay: ") => reason["relay: ".len()..].to_string(),
        Some((KernelPathState::On, _)) => "the kernel path does not take it".to_string(),
        Some((KernelPathState::Off, _)) | None => "the kernel path is off".to_string(),
    };
    (HeaderBy::Relay, why)
}
