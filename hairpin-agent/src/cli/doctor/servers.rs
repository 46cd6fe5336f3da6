//! `doctor`'s look at the servers behind the proxied LoadBalancers: a lenient server
//! (one that answers with a PROXY header and without one) drops a header from a peer
//! outside its trusted list without a word, so hairpin's header can be lost there
//! with no error anywhere. Each active frontend is probed directly, past hairpin (the
//! bypass mark), once without a header and once with one, as `check` does.
//!
//! The probes carry the bypass mark, so they go wherever an address points, past
//! every program of hairpin's. The frontends come from the agent's `/status` (over
//! its root-only socket), and the refusal table of LoadBalancer addresses is applied
//! again here before any probe: an address it refuses (loopback, link-local, a
//! metadata endpoint, this node's own addresses) is never dialled, whatever lists it.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use super::{Check, Status};
use crate::{
    cli::{
        check::{HeaderHandling, LENIENT_WARNING, header_handling},
        probe::{self, Probe, ProbeResult},
    },
    status::{FrontendState, Snapshot},
};

/// At most this many frontends are probed (two connections each), so a node with
/// thousands of LoadBalancers is not swept by one `doctor`.
pub(crate) const MAX_PROBED: usize = 16;
/// Each probe's connect and read timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A frontend's two direct probes: without a header, then with one.
pub(crate) type Probes = (ProbeResult, ProbeResult);

/// The active frontends to probe, in the agent's order, at most [`MAX_PROBED`]; and
/// how many more there were. Those the refusal table refuses are never probed
/// ([`refused`]).
pub(crate) fn targets(s: &Snapshot) -> (Vec<SocketAddr>, usize) {
    let local = local_addresses();
    let all: Vec<SocketAddr> = s
        .frontends
        .iter()
        .filter(|f| f.state == FrontendState::Active)
        .map(|f| SocketAddr::new(f.ip, f.port))
        .filter(|a| refused(a.ip(), &local).is_none())
        .collect();
    let more = all.len().saturating_sub(MAX_PROBED);
    (all.into_iter().take(MAX_PROBED).collect(), more)
}

/// Why `ip` is never probed: the refusal table's built-in classes and platform
/// endpoints (`k8s/decide/lb_address.rs`), or one of this node's own addresses
/// (`local`).
pub(crate) fn refused(ip: IpAddr, local: &[IpAddr]) -> Option<String> {
    if let Some(class) = crate::k8s::decide::lb_address::builtin_refusal(ip) {
        return Some(format!("{ip} is {class}"));
    }
    let ip = ip.to_canonical();
    local
        .iter()
        .any(|l| l.to_canonical() == ip)
        .then(|| format!("{ip} is an address of this node"))
}

/// This network namespace's own addresses; none when they cannot be listed.
fn local_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|a| {
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// The active frontends the refusal table refuses, each with why.
fn refused_frontends(s: &Snapshot) -> Vec<String> {
    let local = local_addresses();
    s.frontends
        .iter()
        .filter(|f| f.state == FrontendState::Active)
        .filter_map(|f| refused(f.ip, &local).map(|why| format!("{}:{} ({why})", f.ip, f.port)))
        .collect()
}

/// Probes `addr` directly (past hairpin, with `mark`) without and with a header.
/// HTTP, except on 443 and 8443 where a TLS handshake is what a server answers.
pub(crate) fn probe_direct(addr: SocketAddr, mark: u32) -> Probes {
    let send = |header| {
        probe::send(&Probe {
            addr,
            host: addr.ip().to_string(),
            tls: matches!(addr.port(), 443 | 8443),
            header,
            mark: Some(mark),
            timeout: PROBE_TIMEOUT,
        })
    };
    (send(false), send(true))
}

/// Probes the agent's active frontends directly (at most [`MAX_PROBED`], in
/// parallel) and warns of every lenient server among them.
pub(crate) fn lenient_servers(agent: Option<&Snapshot>, mark: u32) -> Check {
    let (targets, more) = agent.map(targets).unwrap_or_default();
    let probed: Vec<_> = std::thread::scope(|scope| {
        let running: Vec<_> = targets
            .iter()
            .map(|&addr| scope.spawn(move || (addr, probe_direct(addr, mark))))
            .collect();
        running.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut check = lenient_check(agent, &probed, more);
    let refused = agent.map(refused_frontends).unwrap_or_default();
    if !refused.is_empty() {
        check.detail.push_str(&format!(
            "; not probed, refused as LoadBalancer addresses: {}",
            refused.join(", ")
        ));
        if check.status != Status::Warn {
            check.status = Status::Warn;
        }
    }
    check
}

/// The `lenient_servers` check from each probed frontend's answers: warns naming
/// every lenient one; ok when none is; skipped without the agent or frontends.
pub(crate) fn lenient_check(
    agent: Option<&Snapshot>,
    probed: &[(SocketAddr, Probes)],
    more: usize,
) -> Check {
    let name = "lenient_servers";
    if agent.is_none() {
        return Check::new(
            name,
            Status::Skip,
            "needs the running agent (its frontends)",
        );
    }
    if probed.is_empty() {
        return Check::new(name, Status::Skip, "no active frontend to probe");
    }
    let lenient: Vec<String> = probed
        .iter()
        .filter(|(_, (without, with))| header_handling(without, with) == HeaderHandling::Lenient)
        .map(|(addr, _)| addr.to_string())
        .collect();
    let beyond = if more > 0 {
        format!(" ({more} more not probed: `hairpin-agent check LB:PORT` probes one)")
    } else {
        String::new()
    };
    if lenient.is_empty() {
        return Check::new(
            name,
            Status::Ok,
            format!(
                "{} frontends probed directly: none answers without a header{beyond}",
                probed.len()
            ),
        );
    }
    Check::new(
        name,
        Status::Warn,
        format!("lenient: {}{beyond}: {LENIENT_WARNING}", lenient.join(", ")),
    )
    .fix(
        "put the nodes' and the pods' networks in each lenient server's trusted list \
         (Traefik proxyProtocol.trustedIPs, Caddy proxy_protocol allow, Envoy's listener \
         filter), or make it require the header",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::probe::Outcome;

    fn answered(line: &str) -> ProbeResult {
        ProbeResult {
            outcome: Outcome::Answered,
            detail: line.to_string(),
        }
    }

    fn reset() -> ProbeResult {
        ProbeResult {
            outcome: Outcome::NoAnswer,
            detail: "connection reset by peer".to_string(),
        }
    }

    /// A strict server and a lenient one: only the lenient one is named; no
    /// frontend, or no agent, is a skip, not an ok.
    /// A status listing loopback, a metadata endpoint and this node's own address
    /// as active frontends: none is a target (the probes carry the bypass mark).
    #[test]
    fn the_refusal_table_is_applied_before_any_probe() {
        use crate::{
            model::{Paths, ProxyVersion},
            status::FrontendStatus,
        };
        let mut s = Snapshot::default();
        for (ip, port) in [
            ("127.0.0.1", 10250),
            ("169.254.169.254", 80),
            ("::ffff:127.0.0.1", 22),
            ("64:ff9b::a9fe:a9fe", 80),
            ("203.0.113.10", 443),
        ] {
            s.frontends.push(FrontendStatus {
                ip: ip.parse().unwrap(),
                port,
                version: ProxyVersion::V1,
                source: String::new(),
                state: FrontendState::Active,
                listener: None,
                reason: None,
                retry: None,
                path: Paths(Vec::new()),
            });
        }
        let (t, more) = targets(&s);
        assert_eq!(t, vec!["203.0.113.10:443".parse::<SocketAddr>().unwrap()]);
        assert_eq!(more, 0);
        let local = ["10.0.0.5".parse().unwrap()];
        assert!(refused("10.0.0.5".parse().unwrap(), &local).is_some());
        assert!(refused("203.0.113.10".parse().unwrap(), &local).is_none());
        let refused = refused_frontends(&s);
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert!(refused[1].contains("169.254.169.254:80"), "{refused:?}");
    }

    #[test]
    fn only_the_lenient_servers_are_named() {
        let strict: SocketAddr = "203.0.113.10:80".parse().unwrap();
        let loose: SocketAddr = "203.0.113.10:81".parse().unwrap();
        let s = Snapshot::default();
        let probed = vec![
            (strict, (reset(), answered("HTTP/1.1 200 OK"))),
            (
                loose,
                (answered("HTTP/1.1 200 OK"), answered("HTTP/1.1 200 OK")),
            ),
        ];
        let c = lenient_check(Some(&s), &probed, 0);
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("203.0.113.10:81"), "{c:?}");
        assert!(!c.detail.contains("203.0.113.10:80"), "{c:?}");
        assert!(c.fix.is_some());
        let c = lenient_check(Some(&s), &probed[..1], 3);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("3 more not probed"), "{c:?}");
        assert_eq!(lenient_check(Some(&s), &[], 0).status, Status::Skip);
        assert_eq!(lenient_check(None, &probed, 0).status, Status::Skip);
    }
}
