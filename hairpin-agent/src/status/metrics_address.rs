//! Where `/metrics` alone is served for a Prometheus that scrapes the node's
//! network (`--metrics-address`).
//!
//! The DaemonSet runs in the host network namespace, so `0.0.0.0:9902` listens on
//! every address of the node, its public one included: any peer on the Internet
//! could read which LoadBalancers the cluster proxies and how busy they are. The
//! chart's default is therefore `node-ips:9902`: the node IPs the kubelet reports
//! (`status.hostIPs`, passed as `--node-ip`) that are in a private range, which is
//! where an in-cluster Prometheus reaches a hostNetwork pod (its pod IP is the
//! node's first InternalIP). A node whose every IP is public gets an error at start
//! rather than a listener on the Internet; an operator who wants that anyway names
//! the address.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

/// The word that stands for "the node's private node IPs".
const NODE_IPS: &str = "node-ips";

/// `--metrics-address`: a socket address, or `node-ips:PORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAddress {
    /// Exactly this address (e.g. `10.0.0.5:9902`, `[fd00::5]:9902`, `0.0.0.0:9902`).
    Socket(SocketAddr),
    /// The port on every private node IP (`node-ips:9902`).
    NodeIps(u16),
}

/// Why `--metrics-address` could not be parsed or resolved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetricsAddressError {
    /// Neither `IP:PORT` nor `node-ips:PORT`.
    #[error(
        "--metrics-address {given:?}: expected IP:PORT (e.g. 10.0.0.5:9902, [fd00::5]:9902) or node-ips:PORT"
    )]
    Syntax {
        /// What was given.
        given: String,
    },
    /// `node-ips:PORT` on a node none of whose IPs is private.
    #[error(
        "--metrics-address node-ips:{port}: none of the node IPs ({}) is in a private range, and /metrics is not served on a public address; name the address to listen on (e.g. 0.0.0.0:{port}, with the port firewalled from outside the cluster)",
        list(.node_ips)
    )]
    NoPrivateNodeIp {
        /// The port asked for.
        port: u16,
        /// The node IPs, all public.
        node_ips: Vec<IpAddr>,
    },
}

fn list(ips: &[IpAddr]) -> String {
    if ips.is_empty() {
        return "none given".into();
    }
    ips.iter()
        .map(|ip| ip.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for MetricsAddress {
    type Err = MetricsAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || MetricsAddressError::Syntax { given: s.into() };
        if let Some(port) = s.strip_prefix(NODE_IPS).and_then(|r| r.strip_prefix(':')) {
            return port.parse().map(Self::NodeIps).map_err(|_| syntax());
        }
        s.parse().map(Self::Socket).map_err(|_| syntax())
    }
}

impl fmt::Display for MetricsAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Socket(a) => a.fmt(f),
            Self::NodeIps(port) => write!(f, "{NODE_IPS}:{port}"),
        }
    }
}

impl MetricsAddress {
    /// The addresses to listen on, given the node's IPs.
    pub fn resolve(self, node_ips: &[IpAddr]) -> Result<Vec<SocketAddr>, MetricsAddressError> {
        match self {
            Self::Socket(a) => Ok(vec![a]),
            Self::NodeIps(port) => {
                let mut out: Vec<SocketAddr> = node_ips
                    .iter()
                    .filter(|ip| is_private(**ip))
                    .map(|ip| SocketAddr::new(*ip, port))
                    .collect();
                out.dedup();
                if out.is_empty() {
                    return Err(MetricsAddressError::NoPrivateNodeIp {
                        port,
                        node_ips: node_ips.to_vec(),
                    });
                }
                Ok(out)
            }
        }
    }
}

/// Whether `ip` is in a range the Internet does not route to a node: RFC 1918,
/// the shared address space (RFC 6598, which some providers use for their VPCs),
/// IPv6 unique-local addresses (RFC 4193). Loopback and link-local are not node
/// IPs a scraper on another node could reach, so they do not count.
fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_private() || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => (v6.segments()[0] & 0xfe00) == 0xfc00,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn parses_both_forms_and_refuses_others_naming_the_flag() {
        assert_eq!("node-ips:9902".parse(), Ok(MetricsAddress::NodeIps(9902)));
        assert_eq!(
            "[fd00::5]:9902".parse(),
            Ok(MetricsAddress::Socket("[fd00::5]:9902".parse().unwrap()))
        );
        for bad in [
            "node-ips",
            "node-ips:x",
            "9902",
            "localhost:9902",
            "node-ips:70000",
        ] {
            let err = bad.parse::<MetricsAddress>().unwrap_err();
            assert!(err.to_string().starts_with("--metrics-address"), "{err}");
        }
        assert_eq!(MetricsAddress::NodeIps(9902).to_string(), "node-ips:9902");
    }

    #[test]
    fn node_ips_keeps_the_private_ones_only() {
        let got = MetricsAddress::NodeIps(9902)
            .resolve(&ips(&[
                "203.0.113.7",
                "10.114.0.3",
                "100.64.1.2",
                "2001:db8::7",
                "fd00::3",
            ]))
            .unwrap();
        let want: Vec<SocketAddr> = ["10.114.0.3:9902", "100.64.1.2:9902", "[fd00::3]:9902"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_node_with_only_public_ips_is_refused_with_them_named() {
        let err = MetricsAddress::NodeIps(9902)
            .resolve(&ips(&["203.0.113.7", "100.128.0.1"]))
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("203.0.113.7, 100.128.0.1"), "{text}");
        assert!(text.contains("0.0.0.0:9902"), "{text}");
    }

    #[test]
    fn an_explicit_address_is_taken_as_given() {
        let a: SocketAddr = "0.0.0.0:9902".parse().unwrap();
        assert_eq!(
            MetricsAddress::Socket(a).resolve(&ips(&["203.0.113.7"])),
            Ok(vec![a])
        );
    }
}
