//! The data-plane matrix's frame: a simulated node whose LBs all lead to one server
//! under test, an agent on its defaults, and the cases (client x LB x variant) with
//! what the server must report for each.
//!
//! Eight LBs on port 80 and up (one port per variant of the server: a listener with
//! its own PROXY settings), IPv4 and IPv6, PROXY v1 and v2, on the default path (the
//! kernel path) or asking for the relay (`path: relay`). Every case is one request from
//! the pod or from a node process; the server's own view of it (its access log, or
//! a response echoing what it saw, as `client=ADDR:PORT dst=ADDR:PORT`) must name the
//! client's true address and the LB address and port the client dialled.

use std::{fmt, net::IpAddr};

use crate::{
    agent::Agent,
    client::{Reply, from_host, from_pod, url},
    node::{INGRESS_IP4, INGRESS_IP6, LbRule, NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, SimNode},
};

/// The node's address towards the LBs (its uplink to the ingress namespace): the
/// source of a host process's socket there, which the kernel path names, and the
/// address kube-proxy's masquerade gives every connection to an LB before it reaches
/// the ingress (`externalTrafficPolicy: Cluster`).
pub const NODE_UPLINK4: &str = "198.51.100.1";
/// The same for IPv6.
pub const NODE_UPLINK6: &str = "2001:db8:2::1";

/// The sources in-cluster connections reach the ingress from, here: the pod network
/// and the node's uplink, where kube-proxy's masquerade puts them. A server's trusted
/// list must hold these for hairpin's headers to count.
pub const CLUSTER_SOURCES: [&str; 4] = [
    "192.0.2.0/24",
    "198.51.100.0/24",
    "2001:db8:1::/64",
    "2001:db8:2::/64",
];

/// The pod network alone: what an operator who trusts "the pods" writes. Connections
/// to an LB reach the ingress from the node's address after kube-proxy's masquerade
/// (`externalTrafficPolicy: Cluster`), so this list drops hairpin's headers too.
pub const POD_SOURCES: [&str; 2] = ["192.0.2.0/24", "2001:db8:1::/64"];

/// A trusted list that leaves the cluster out: only where a cloud LB would connect
/// from (a VPC range), as an operator who trusted the cloud LB alone would write it.
pub const CLOUD_LB_SOURCES: [&str; 1] = ["10.0.0.0/8"];

/// How a frontend's connections reach the ingress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathChoice {
    /// The agent's default (`auto`): the kernel path here.
    Default,
    /// `path: relay`.
    Relay,
}

/// One of the matrix's LBs.
#[derive(Clone, Copy, Debug)]
pub struct MatrixLb {
    /// Its address.
    pub ip: &'static str,
    /// The PROXY version its frontend sends (`v1` or `v2`).
    pub version: &'static str,
    /// The path it asks for.
    pub path: PathChoice,
}

const fn lb(ip: &'static str, version: &'static str, path: PathChoice) -> MatrixLb {
    MatrixLb { ip, version, path }
}

/// The matrix's LBs.
pub const LBS: [MatrixLb; 8] = [
    lb("203.0.113.21", "v1", PathChoice::Default),
    lb("203.0.113.22", "v2", PathChoice::Default),
    lb("203.0.113.23", "v1", PathChoice::Relay),
    lb("203.0.113.24", "v2", PathChoice::Relay),
    lb("2001:db8:ffff::21", "v1", PathChoice::Default),
    lb("2001:db8:ffff::22", "v2", PathChoice::Default),
    lb("2001:db8:ffff::23", "v1", PathChoice::Relay),
    lb("2001:db8:ffff::24", "v2", PathChoice::Relay),
];

/// What a variant's server must report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The client's true address and the LB address and port it dialled.
    TrueClient,
    /// The client's true address; the server reports no destination (Traefik's
    /// access log has none).
    TrueClientOnly,
    /// The address the connection came from (kube-proxy's masquerade: the node's
    /// uplink), not the client's, and, where the server reports one, the ingress pod's
    /// own address as the destination: the server dropped the header without a word.
    PeerInstead,
    /// No answer: the server refused what it was sent.
    Refused,
}

/// A listener of the server under test with its own PROXY settings.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Its name in messages.
    pub name: &'static str,
    /// The LB port that leads to it.
    pub lb_port: u16,
    /// The port it listens on in the ingress namespace.
    pub backend_port: u16,
    /// The PROXY versions whose LBs lead to it.
    pub versions: &'static [&'static str],
    /// What it must report for those.
    pub expect: Expect,
}

/// Who makes the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// A pod process (the pod's namespace and cgroup).
    Pod,
    /// A node process (the node's namespace, a host cgroup).
    Node,
}

/// One request of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The caller.
    pub client: Client,
    /// The LB dialled.
    pub lb: MatrixLb,
    /// The listener behind it.
    pub variant: Variant,
    /// Numbers the case: its request path is `/case-N`.
    pub n: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "case {} ({}): {:?} -> {}:{} ({}, {:?} path)",
            self.n,
            self.variant.name,
            self.client,
            self.lb.ip,
            self.variant.lb_port,
            self.lb.version,
            self.lb.path
        )
    }
}

impl Case {
    /// Whether the LB is IPv6.
    pub fn v6(&self) -> bool {
        self.lb.ip.contains(':')
    }

    /// The request path that tells this case apart in a server's log.
    pub fn tag(&self) -> String {
        format!("/case-{}", self.n)
    }

    /// The address the header must name: the pod's; for a node process, its
    /// socket's own address on the kernel path, the agent's `--node-ip` on the relay.
    pub fn true_client(&self) -> &'static str {
        match (self.client, self.lb.path, self.v6()) {
            (Client::Pod, _, false) => POD_IP4,
            (Client::Pod, _, true) => POD_IP6,
            (Client::Node, PathChoice::Default, false) => NODE_UPLINK4,
            (Client::Node, PathChoice::Default, true) => NODE_UPLINK6,
            (Client::Node, PathChoice::Relay, false) => NODE_IP4,
            (Client::Node, PathChoice::Relay, true) => NODE_IP6,
        }
    }

    /// Where the connection reaches the ingress from (kube-proxy's masquerade).
    pub fn peer(&self) -> &'static str {
        if self.v6() {
            NODE_UPLINK6
        } else {
            NODE_UPLINK4
        }
    }

    /// Makes the request; what curl got.
    pub fn request(&self, node: &SimNode) -> Reply {
        let url = url(self.lb.ip, self.variant.lb_port, &self.tag());
        match self.client {
            Client::Pod => from_pod(node, &url),
            Client::Node => from_host(node, &url),
        }
    }
}

/// Every case of `variants`: each client, and each LB of a version the variant takes.
pub fn cases(variants: &[Variant]) -> Vec<Case> {
    let mut out = Vec::new();
    for variant in variants {
        for lb in LBS.iter().filter(|l| variant.versions.contains(&l.version)) {
            for client in [Client::Pod, Client::Node] {
                out.push(Case {
                    client,
                    lb: *lb,
                    variant: *variant,
                    n: out.len(),
                });
            }
        }
    }
    out
}

/// A node whose LBs lead to `variants`: every LB's `lb_port` of each variant to that
/// variant's listener on the ingress pod.
pub fn node(variants: &[Variant]) -> SimNode {
    let mut rules = Vec::new();
    for lb in LBS {
        for v in variants {
            rules.push(LbRule {
                lb_ip: lb.ip,
                lb_port: v.lb_port,
                backend_port: v.backend_port,
                name: v.name,
            });
        }
    }
    SimNode::with_lbs(&rules)
}

/// The agent's frontends file for `variants`: every LB some variant takes, with the
/// variants' LB ports, its version, and `path: relay` where it asks for it.
pub fn frontends(variants: &[Variant]) -> String {
    let mut s = String::from("frontends:\n");
    for lb in LBS {
        let ports: Vec<String> = variants
            .iter()
            .filter(|v| v.versions.contains(&lb.version))
            .map(|v| v.lb_port.to_string())
            .collect();
        if ports.is_empty() {
            continue;
        }
        s.push_str(&format!(
            "- ip: \"{}\"\n  ports: [{}]\n  proxyProtocol: {}\n",
            lb.ip,
            ports.join(", "),
            lb.version
        ));
        if lb.path == PathChoice::Relay {
            s.push_str("  path: relay\n");
        }
    }
    s
}

/// The agent on its defaults (the kernel path where it can run; the suites' harness
/// keeps the relay unless told) with [`frontends`] of `variants`.
pub fn agent(node: &SimNode, variants: &[Variant]) -> Agent {
    Agent::start_with_frontends_yaml(node, &frontends(variants), &["--kernel-path", "auto"])
}

/// The ingress pod's address of `case`'s family (for direct, headerless probes).
pub fn ingress_ip(v6: bool) -> &'static str {
    if v6 { INGRESS_IP6 } else { INGRESS_IP4 }
}

/// An address as a server prints it: `IP:PORT` or `[IP]:PORT`, an IPv4-mapped IPv6
/// address as the IPv4 one.
fn split_addr(text: &str) -> Option<(IpAddr, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = host.parse().ok()?;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    Some((ip, port.parse().ok()?))
}

/// What a server reported for one request: `client=ADDR:PORT` and, when it reports
/// one, `dst=ADDR:PORT`, anywhere in `text`.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    /// The client it saw.
    pub client: (IpAddr, u16),
    /// The destination it saw, if it reports one.
    pub dst: Option<(IpAddr, u16)>,
}

impl Seen {
    /// Reads `client=` and `dst=` from `text`.
    pub fn parse(text: &str) -> Option<Seen> {
        let field = |name: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(|v| v.trim_matches(|c| c == '"' || c == ','))
        };
        Some(Seen {
            client: split_addr(field("client=")?)?,
            dst: field("dst=").and_then(split_addr),
        })
    }
}

/// Checks what the server reported for `case` (`view`: its text for the case, given
/// curl's reply) against the variant's expectation; a description of the mismatch.
pub fn check(case: &Case, reply: &Reply, view: &str) -> Result<(), String> {
    let ip = |s: &str| s.parse::<IpAddr>().expect("a literal address");
    let fail = |why: &str| {
        Err(format!(
            "{case}: {why}\n  reply: {reply:?}\n  server: {view}"
        ))
    };
    if case.variant.expect == Expect::Refused {
        return if reply.ok() && reply.body.contains("client=") {
            fail("answered, but should have refused")
        } else {
            Ok(())
        };
    }
    if !reply.ok() {
        return fail("the request failed");
    }
    let Some(seen) = Seen::parse(view) else {
        return fail("the server reported no client");
    };
    let (want_client, want_dst) = match case.variant.expect {
        // The connection as it reached the ingress: from the peer, to the ingress
        // pod's own address (a node process's kernel-path socket is its uplink
        // address either way: only the destination tells there).
        Expect::PeerInstead => (
            ip(case.peer()),
            Some((ip(ingress_ip(case.v6())), case.variant.backend_port)),
        ),
        Expect::TrueClientOnly => (ip(case.true_client()), None),
        _ => (
            ip(case.true_client()),
            Some((ip(case.lb.ip), case.variant.lb_port)),
        ),
    };
    if seen.client.0 != want_client {
        return fail(&format!(
            "client {} instead of {want_client}",
            seen.client.0
        ));
    }
    match (want_dst, seen.dst) {
        (Some(want), Some(dst)) if dst != want => {
            fail(&format!("destination {dst:?} instead of {want:?}"))
        }
        // A server that reports destinations must report this one.
        (Some(want), None) if case.variant.expect != Expect::PeerInstead => {
            fail(&format!("no destination reported, {want:?} expected"))
        }
        _ => Ok(()),
    }
}

/// Runs every case in `cases` in turn against the one server, reading its view of
/// each with `view(case, reply)`; fails once, listing every case that went wrong.
pub fn run(node: &SimNode, agent: &Agent, cases: &[Case], view: impl Fn(&Case, &Reply) -> String) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let reply = case.request(node);
            check(case, &reply, &view(case, &reply)).err()
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}\nagent:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n"),
        agent.log()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_reads_every_spelling_of_an_address() {
        let s = Seen::parse("client=[2001:db8:1::10]:4000 dst=[2001:db8:ffff::21]:80").unwrap();
        assert_eq!(s.client, ("2001:db8:1::10".parse().unwrap(), 4000));
        assert_eq!(s.dst, Some(("2001:db8:ffff::21".parse().unwrap(), 80)));
        let s = Seen::parse("x client=2001:db8:1::10:4000 dst=203.0.113.21:80\n").unwrap();
        assert_eq!(s.client.0, "2001:db8:1::10".parse::<IpAddr>().unwrap());
        let s = Seen::parse("client=::ffff:192.0.2.10:5,").unwrap();
        assert_eq!(s.client, ("192.0.2.10".parse().unwrap(), 5));
        assert_eq!(s.dst, None);
        assert_eq!(Seen::parse("plain remote=1.2.3.4"), None);
    }

    #[test]
    fn cases_cover_each_client_and_each_lb_of_the_variants_versions() {
        let v = |versions| Variant {
            name: "x",
            lb_port: 80,
            backend_port: 9000,
            versions,
            expect: Expect::TrueClient,
        };
        assert_eq!(cases(&[v(&["v1", "v2"])]).len(), 16);
        assert_eq!(cases(&[v(&["v1"])]).len(), 8);
        let yaml = frontends(&[v(&["v1"])]);
        assert_eq!(yaml.matches("- ip:").count(), 4, "{yaml}");
        assert_eq!(yaml.matches("path: relay").count(), 2, "{yaml}");
    }
}
