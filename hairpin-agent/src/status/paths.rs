//! The parts of `/status` about which path is live: the mode, the name relay and
//! the CoreDNS writer, and how each frontend is reached. Re-exported by `state`.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use serde::{Deserialize, Serialize};

use crate::{agent::mode::Mode, names::routes::NameRoute};

/// Which paths are live on this node, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModeStatus {
    /// `--mode` as given.
    pub configured: Mode,
    /// The live paths: `ebpf`, `hosts`, `coredns` (empty when none is).
    pub live: Vec<String>,
    /// Why, in one sentence (the attach error when `auto` fell back).
    pub reason: String,
}

/// The name relay and the hosts file it is published in.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NamesStatus {
    /// The address it listens on.
    pub address: Option<IpAddr>,
    /// The link the address was put on (`--names-link`), if any.
    pub link: Option<String>,
    /// What `--names-link` did: `created dummy link`, `added to lo`, `already present`, or the error.
    pub link_note: Option<String>,
    /// Bound listeners.
    pub listeners: Vec<SocketAddr>,
    /// Listeners that could not be bound yet, with the error; retried with backoff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_listeners: Vec<FailedListener>,
    /// The managed hosts file, when the hosts path is live.
    pub hosts_file: Option<PathBuf>,
    /// Hostnames routed.
    pub routes: usize,
}

/// A name relay listener the agent could not bind (the port taken, the address
/// missing), and keeps retrying.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FailedListener {
    /// The address it tries to bind.
    pub address: SocketAddr,
    /// The last bind error.
    pub error: String,
}

/// The CoreDNS writer (cluster-wide; only the Lease holder writes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CorednsStatus {
    /// `corefile` or `import`.
    pub mode: String,
    /// The ConfigMap written, `namespace/name`.
    pub configmap: String,
    /// The name the rewrites point at.
    pub target: String,
    /// Whether this agent holds the Lease, and so writes.
    pub leader: bool,
    /// RFC 3339 time of the last write that changed the ConfigMap.
    pub last_write: Option<String>,
    /// Rewrites in the last text written or found current.
    pub rewrites: usize,
    /// The last error (cleared by the next good round).
    pub last_error: Option<String>,
    /// Warning when node-local-dns is installed (its answers bypass CoreDNS rewrites).
    pub node_local_dns: Option<String>,
}

/// How clients reach the name relay: the live name paths and the LB ports names route to.
#[derive(Clone, Debug, Default)]
pub struct NamePaths {
    /// Live name paths: `hosts`, `coredns`.
    pub live: Vec<String>,
    /// The LB addresses at least one routed name leads to.
    pub routed: BTreeSet<SocketAddr>,
    /// The name relay's address, when it listens.
    pub relay: Option<IpAddr>,
}

impl NamePaths {
    /// The paths for `routes` with `live` name paths (empty when the name relay is off).
    pub fn new(live: Vec<String>, routes: &[NameRoute], relay: Option<IpAddr>) -> NamePaths {
        let routed = routes
            .iter()
            .flat_map(|r| r.ports.iter().map(|p| SocketAddr::new(r.lb, *p)))
            .collect();
        NamePaths {
            live,
            routed,
            relay,
        }
    }

    /// The name paths reaching LB address `addr`, if any.
    pub fn for_frontend(&self, addr: SocketAddr) -> Vec<String> {
        if self.relay.is_some() && self.routed.contains(&addr) {
            self.live.clone()
        } else {
            Vec::new()
        }
    }
}

/// `ebpf,hosts`, or `none` when nothing leads clients to a relay.
pub fn join_paths(paths: &[String]) -> String {
    if paths.is_empty() {
        "none".into()
    } else {
        paths.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::ProxyVersion, names::hostname::Hostname};

    #[test]
    fn frontends_are_reached_by_the_name_paths_of_their_routes() {
        let routes = [NameRoute {
            host: Hostname::parse("a.example.com").expect("name"),
            lb: "203.0.113.10".parse().expect("ip"),
            ports: vec![80],
            version: ProxyVersion::V1,
            source: "test".into(),
        }];
        let p = NamePaths::new(
            vec!["hosts".into()],
            &routes,
            Some("169.254.20.11".parse().expect("ip")),
        );
        assert_eq!(
            p.for_frontend("203.0.113.10:80".parse().expect("a")),
            ["hosts"]
        );
        assert!(
            p.for_frontend("203.0.113.10:81".parse().expect("a"))
                .is_empty()
        );
        assert_eq!(join_paths(&[]), "none");
        assert_eq!(join_paths(&["ebpf".into(), "hosts".into()]), "ebpf,hosts");
        let off = NamePaths::new(vec!["hosts".into()], &routes, None);
        assert!(
            off.for_frontend("203.0.113.10:80".parse().expect("a"))
                .is_empty()
        );
    }
}
