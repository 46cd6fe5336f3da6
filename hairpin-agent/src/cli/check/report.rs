//! What `check` found, as JSON and as text, and the verdict rules.

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use super::target::Target;
use crate::cli::{
    dns::DnsError,
    kube_proxy::{KubeProxy, Mode, ShortCircuit},
    probe::{Outcome, ProbeResult},
    table::{Cell, Table, Tone, paint},
};
use crate::model::Paths;

/// How the name resolved.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Resolution {
    /// As the node resolves it (getaddrinfo: /etc/hosts, then its DNS).
    pub node: Vec<IpAddr>,
    /// Why the node could not.
    pub node_error: Option<String>,
    /// The DNS server asked as a pod would, if any.
    pub pod_dns_server: Option<SocketAddr>,
    /// Where that server came from: `--dns-server`, or the agent's cluster DNS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_dns_from: Option<&'static str>,
    /// What it answered.
    pub pod: Vec<IpAddr>,
    /// Why it could not, or why it was skipped.
    pub pod_note: Option<String>,
}

/// A pod-style lookup: the server asked, where it came from, and its answer.
pub(crate) type PodLookup = (SocketAddr, &'static str, Result<Vec<IpAddr>, DnsError>);

impl Resolution {
    /// An IP literal: nothing to resolve.
    pub(crate) fn literal(ip: IpAddr) -> Resolution {
        Resolution {
            node: vec![ip],
            pod: vec![ip],
            pod_note: Some("an IP address: no lookup".into()),
            ..Resolution::default()
        }
    }

    /// From the node's lookup and the optional pod-style one.
    pub(crate) fn from_lookups(
        node: std::io::Result<Vec<IpAddr>>,
        pod: Option<PodLookup>,
    ) -> Resolution {
        let mut r = Resolution::default();
        match node {
            Ok(ips) => r.node = ips,
            Err(e) => r.node_error = Some(e.to_string()),
        }
        match pod {
            Some((server, from, answer)) => {
                r.pod_dns_server = Some(server);
                r.pod_dns_from = Some(from);
                match answer {
                    Ok(ips) => r.pod = ips,
                    Err(e) => r.pod_note = Some(e.to_string()),
                }
            }
            None => {
                r.pod_note = Some(
                    "skipped: the agent knows no cluster DNS Service; pass --dns-server \
                     (the kube-dns IP) to resolve as a pod"
                        .into(),
                )
            }
        }
        r
    }

    /// Every address found, node's first, without duplicates.
    pub(crate) fn addresses(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for ip in self.node.iter().chain(&self.pod) {
            if !out.contains(ip) {
                out.push(*ip);
            }
        }
        out
    }
}

/// Whether the running agent proxies an address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Coverage {
    /// A listener and redirect are live.
    Active {
        /// The relay listener.
        listener: Option<SocketAddr>,
        /// The PROXY version it writes.
        version: String,
        /// How clients reach it (`ebpf`, `kernel`).
        path: Paths,
        /// Who writes the header of an in-cluster connection to it: the kernel, on
        /// the client's own socket, or the relay listener.
        header_by: HeaderBy,
        /// Why it takes that path (the client speaks first; the server speaks first;
        /// the kernel path is off or unavailable, and why).
        why: String,
    },
    /// The agent tried and failed.
    Failed {
        /// Why.
        reason: String,
    },
    /// The agent does not proxy it.
    NotCovered,
    /// The agent did not answer.
    Unknown,
}

/// Who writes the PROXY header of an in-cluster connection to a covered address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HeaderBy {
    /// The kernel path: the kernel writes it on the client's own socket, ahead of
    /// its first bytes (a socket it cannot take goes to the relay listener).
    Kernel,
    /// The relay listener the connect is redirected to writes it at accept.
    Relay,
}

/// The verdict for an address, or for the whole target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// In-cluster clients get an answer.
    Works,
    /// The server wants the header and in-cluster clients do not send one.
    Broken,
    /// Nothing answered: no conclusion.
    Unknown,
}

impl Verdict {
    /// The process exit code for it (`cli::Exit`: 2 is clap's usage error).
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Verdict::Works => crate::cli::Exit::Ok,
            Verdict::Broken => crate::cli::Exit::Broken,
            Verdict::Unknown => crate::cli::Exit::Unknown,
        }
        .code()
    }
}

/// The rules: the in-cluster probe answering is what matters; failing that, the
/// header probe answering means the header is what is missing.
pub(crate) fn verdict(in_cluster: &ProbeResult, direct_with_header: &ProbeResult) -> Verdict {
    if in_cluster.answered() {
        Verdict::Works
    } else if direct_with_header.answered() {
        Verdict::Broken
    } else {
        Verdict::Unknown
    }
}

/// How the server takes the PROXY header, from the two direct probes (both bypass
/// hairpin: one without a header, one with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HeaderHandling {
    /// It answers only when a header comes first.
    Required,
    /// It answers the same with a header and without one. Traefik
    /// (`proxyProtocol.trustedIPs`), Caddy (`proxy_protocol` with `allow`) and Envoy
    /// (`allow_requests_without_proxy_protocol`) do: such a server drops a header
    /// from a peer outside its trusted list without a word.
    Lenient,
    /// It answers without a header and refuses one (an HTTP 400 for the header read
    /// as a request line, or no TLS handshake): it speaks no PROXY protocol.
    NotSpoken,
    /// Neither probe answered.
    Unknown,
}

/// The rules: which direct probes answered, and for HTTP whether they got the same
/// status (a server that speaks no PROXY protocol reads the header as a bad request
/// line and answers 400; a lenient one consumes it and answers the request as it
/// would have without). A TLS handshake completes after a header only where the
/// server took it.
pub(crate) fn header_handling(
    direct: &ProbeResult,
    direct_with_header: &ProbeResult,
) -> HeaderHandling {
    match (direct.answered(), direct_with_header.answered()) {
        (false, true) => HeaderHandling::Required,
        (true, false) => HeaderHandling::NotSpoken,
        (false, false) => HeaderHandling::Unknown,
        (true, true) => match (http_status(direct), http_status(direct_with_header)) {
            (Some(a), Some(b)) if a == b && b != 400 => HeaderHandling::Lenient,
            (None, None) => HeaderHandling::Lenient,
            _ => HeaderHandling::NotSpoken,
        },
    }
}

/// The status code of a probe's HTTP status line (`HTTP/1.1 200 OK`), if it got one.
fn http_status(p: &ProbeResult) -> Option<u16> {
    let mut words = p.detail.split_whitespace();
    let version = words.next()?;
    if !version.starts_with("HTTP/") {
        return None;
    }
    words.next()?.parse().ok()
}

/// The warning for a lenient server: why the symptom there is a wrong client
/// address rather than an error, and what its trusted list must hold.
pub(crate) const LENIENT_WARNING: &str = "the server is lenient: it answers with a PROXY header and \
    without one, as Traefik (proxyProtocol.trustedIPs), Caddy (proxy_protocol allow) and Envoy \
    (allow_requests_without_proxy_protocol) do. Such a server drops a header from a peer outside \
    its trusted list without a word and serves the request as that peer's, so the symptom is a \
    wrong client address, not an error: its trusted list must hold the addresses in-cluster \
    connections reach it from (the nodes' and the pods' networks; after kube-proxy's masquerade, \
    the node's address)";

/// Probes of one address.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Probes {
    /// Unmarked, no header: what an in-cluster client gets now.
    pub in_cluster: ProbeResult,
    /// Marked, no header: the LB path without hairpin.
    pub direct: ProbeResult,
    /// Marked, PROXY v1 header first: what the cloud LB would send.
    pub direct_with_header: ProbeResult,
}

/// Everything about one resolved address.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct AddressReport {
    /// The address probed.
    pub address: SocketAddr,
    /// kube-proxy rules sending it straight to the backends.
    pub kube_proxy: Vec<ShortCircuit>,
    /// Whether hairpin proxies it.
    pub hairpin: Coverage,
    /// The three probes.
    pub probes: Probes,
    /// How the server takes the header, from the direct probes.
    pub header_handling: HeaderHandling,
    /// The verdict.
    pub verdict: Verdict,
    /// The verdict in a sentence.
    pub explanation: String,
    /// What the verdict does not say: a lenient server's silent drop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl AddressReport {
    /// Builds the report and its verdict.
    pub(crate) fn new(
        address: SocketAddr,
        kube_proxy: Vec<ShortCircuit>,
        hairpin: Coverage,
        in_cluster: ProbeResult,
        direct: ProbeResult,
        direct_with_header: ProbeResult,
    ) -> AddressReport {
        let verdict = verdict(&in_cluster, &direct_with_header);
        let handling = header_handling(&direct, &direct_with_header);
        let lenient = handling == HeaderHandling::Lenient;
        let covered = matches!(hairpin, Coverage::Active { .. });
        let explanation = match verdict {
            Verdict::Works if !covered && lenient => "answers, but names the wrong client: \
                the server takes the PROXY header and serves requests without one too, so \
                in-cluster clients, which send none, reach it as the address kube-proxy gives \
                them (the node's, after its masquerade); hairpin does not cover this address"
                .into(),
            Verdict::Works if covered && !direct.answered() => {
                "works through hairpin: the server needs the PROXY header and hairpin adds it".into()
            }
            Verdict::Works if covered => "works (hairpin proxies it)".into(),
            Verdict::Works => "works directly: no PROXY header needed".into(),
            Verdict::Broken if covered => {
                "broken: hairpin proxies it but the in-cluster path fails; see the agent's log and upstream errors".into()
            }
            Verdict::Broken => match &hairpin {
                Coverage::Unknown => "broken: the server needs the PROXY header and no hairpin agent answers on this node".into(),
                Coverage::Failed { reason } => format!("broken: the server needs the PROXY header and hairpin failed to proxy it: {reason}"),
                _ => "broken: the server needs the PROXY header and hairpin does not cover this address (add it to the frontends, or check the Service's annotations)".into(),
            },
            Verdict::Unknown => format!("could not check: nothing answered ({})", in_cluster.detail),
        };
        AddressReport {
            address,
            kube_proxy,
            hairpin,
            probes: Probes {
                in_cluster,
                direct,
                direct_with_header,
            },
            header_handling: handling,
            verdict,
            explanation,
            warning: lenient.then(|| LENIENT_WARNING.to_string()),
        }
    }
}

/// The JSON document `check --output json` prints.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CheckReport {
    /// What was checked.
    pub target: Target,
    /// How it resolved.
    pub resolution: Resolution,
    /// True when the agent's /status answered.
    pub agent_reachable: bool,
    /// Why it did not.
    pub agent_error: Option<String>,
    /// kube-proxy modes found on the node.
    pub kube_proxy_modes: Vec<Mode>,
    /// Caveats reading kube-proxy's rules.
    pub kube_proxy_notes: Vec<String>,
    /// Each address.
    pub addresses: Vec<AddressReport>,
    /// Overall: broken if any address is, else works if any does, else unknown.
    pub verdict: Verdict,
    /// The process exit code.
    pub exit_code: i32,
}

impl CheckReport {
    /// Assembles the report and the overall verdict.
    pub(crate) fn new(
        target: Target,
        resolution: Resolution,
        agent_error: Option<String>,
        kp: KubeProxy,
        addresses: Vec<AddressReport>,
    ) -> CheckReport {
        let any = |v| addresses.iter().any(|a| a.verdict == v);
        let verdict = if any(Verdict::Broken) {
            Verdict::Broken
        } else if any(Verdict::Works) {
            Verdict::Works
        } else {
            Verdict::Unknown
        };
        CheckReport {
            target,
            resolution,
            agent_reachable: agent_error.is_none(),
            agent_error,
            kube_proxy_modes: kp.modes,
            kube_proxy_notes: kp.notes,
            addresses,
            verdict,
            exit_code: verdict.exit_code(),
        }
    }

    /// The human rendering.
    pub(crate) fn render(&self, colour: bool) -> String {
        let t = &self.target;
        let mut out = format!(
            "check {}:{} ({})\n",
            t.host,
            t.port,
            if t.tls { "tls" } else { "http" }
        );
        render_resolution(&mut out, &self.resolution);
        out.push_str(&format!(
            "  agent          {}\n",
            match &self.agent_error {
                None => "reachable".to_string(),
                Some(e) => paint(e, Tone::Warn, colour),
            }
        ));
        for a in &self.addresses {
            render_address(&mut out, a, colour);
        }
        if self.addresses.is_empty() {
            out.push_str("\nno address to probe\n");
        }
        out
    }
}

/// How the node, and a pod, resolve the target.
fn render_resolution(out: &mut String, r: &Resolution) {
    let list = |ips: &[IpAddr]| {
        let v: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.join(", ")
        }
    };
    out.push_str(&format!(
        "  node resolves  {}\n",
        r.node_error.clone().unwrap_or_else(|| list(&r.node))
    ));
    let pod = match (&r.pod_dns_server, &r.pod_note) {
        (Some(s), None) => format!(
            "{} (asked {s}{})",
            list(&r.pod),
            r.pod_dns_from.map(|f| format!(", {f}")).unwrap_or_default()
        ),
        (_, Some(note)) => note.clone(),
        (None, None) => list(&r.pod),
    };
    out.push_str(&format!("  pod resolves   {pod}\n"));
}

/// One address: what kube-proxy and hairpin do with it, the probes and the verdict.
fn render_address(out: &mut String, a: &AddressReport, colour: bool) {
    out.push_str(&format!("\n{}\n", a.address));
    let kp = if a.kube_proxy.is_empty() {
        "does not short-circuit it (traffic leaves the node towards the LB)".to_string()
    } else {
        let rules: Vec<String> = a
            .kube_proxy
            .iter()
            .map(|r| format!("{}: {}", r.mode.name(), r.rule))
            .collect();
        format!("short-circuits it to the backends ({})", rules.join("; "))
    };
    out.push_str(&format!("  kube-proxy  {kp}\n"));
    out.push_str(&format!("  hairpin     {}\n", coverage(&a.hairpin)));
    out.push_str(&probe_table(&a.probes).render(2, colour));
    let tone = match a.verdict {
        Verdict::Works => Tone::Good,
        Verdict::Broken => Tone::Bad,
        Verdict::Unknown => Tone::Warn,
    };
    out.push_str(&format!(
        "  verdict     {}\n",
        paint(&a.explanation, tone, colour)
    ));
    if let Some(w) = &a.warning {
        out.push_str(&format!("  warning     {}\n", paint(w, Tone::Warn, colour)));
    }
}

/// What hairpin does for an address, in words.
fn coverage(c: &Coverage) -> String {
    match c {
        Coverage::Active {
            listener,
            version,
            path,
            header_by: HeaderBy::Kernel,
            why,
        } => format!(
            "covers it ({path}): kernel path: the kernel writes PROXY {version} on the \
                 client's socket ({why}; a socket it cannot take goes to the relay at {})",
            listener
                .map(|l| l.to_string())
                .unwrap_or_else(|| "?".into())
        ),
        Coverage::Active {
            listener,
            version,
            path,
            header_by: HeaderBy::Relay,
            why,
        } => format!(
            "covers it ({path}): relay at {} writes PROXY {version}: {why}",
            listener
                .map(|l| l.to_string())
                .unwrap_or_else(|| "?".into())
        ),
        Coverage::Failed { reason } => format!("failed to cover it: {reason}"),
        Coverage::NotCovered => "does not cover it".into(),
        Coverage::Unknown => "unknown (agent not reachable)".into(),
    }
}

/// The three probes of an address, one row each.
fn probe_table(p: &Probes) -> Table {
    let mut table = Table::new(&["PROBE", "HOW", "RESULT"]);
    let cell = |r: &ProbeResult| {
        let tone = if r.answered() { Tone::Good } else { Tone::Bad };
        let word = match r.outcome {
            Outcome::Answered => "answered",
            Outcome::NoAnswer => "no answer",
            Outcome::ConnectFailed => "connect failed",
        };
        Cell::toned(format!("{word}: {}", r.detail), tone)
    };
    table.row(vec![
        "in-cluster".into(),
        "as clients connect now".into(),
        cell(&p.in_cluster),
    ]);
    table.row(vec![
        "direct".into(),
        "bypass mark, no header".into(),
        cell(&p.direct),
    ]);
    table.row(vec![
        "direct+header".into(),
        "bypass mark, PROXY v1".into(),
        cell(&p.direct_with_header),
    ]);
    table
}
