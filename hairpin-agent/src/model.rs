//! The frontends hairpin proxies: which LoadBalancer (IP, TCP port) pairs need a
//! PROXY header, and which version.

use std::{fmt, net::IpAddr, str::FromStr};

use serde::{Deserialize, Serialize};

/// PROXY protocol version an ingress expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyVersion {
    /// The human-readable text header (`PROXY TCP4 ...\r\n`).
    V1,
    /// The binary header.
    V2,
}

impl fmt::Display for ProxyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyVersion::V1 => "v1",
            ProxyVersion::V2 => "v2",
        })
    }
}

impl FromStr for ProxyVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "v1" | "1" => Ok(ProxyVersion::V1),
            "v2" | "2" => Ok(ProxyVersion::V2),
            other => Err(format!("expected v1 or v2, got {other:?}")),
        }
    }
}

/// One proxied frontend: connects to `ip:port` get a PROXY `version` header.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frontend {
    /// The LoadBalancer's external IP.
    pub ip: IpAddr,
    /// The TCP port on that IP.
    pub port: u16,
    /// The header version the ingress behind it expects.
    pub version: ProxyVersion,
    /// What asked for it, for `status` and logs: `Service ns/name`, `file PATH`.
    pub source: String,
}
