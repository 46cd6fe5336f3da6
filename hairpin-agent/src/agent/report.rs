//! How each frontend stands, in `/status`'s words: live through eBPF, reached only
//! by names through the name relay, or failed and why. Pure: from what the
//! reconciler holds, what was asked for and which name paths are live.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use super::reconcile::{Active, Failed, Hold};
use crate::{
    model::{Frontends, LivePath, Paths},
    names::routes::NameRoute,
    status::{FrontendState, FrontendStatus, RetryPolicy, UnservedFamily},
};

/// How clients reach the name relay: the live name paths and the LB ports names route to.
#[derive(Clone, Debug, Default)]
pub(crate) struct NamePaths {
    /// Live name paths: hosts, CoreDNS.
    pub live: Vec<LivePath>,
    /// The LB addresses at least one routed name leads to.
    pub routed: BTreeSet<SocketAddr>,
    /// The name relay's address, when it listens.
    pub relay: Option<IpAddr>,
}

impl NamePaths {
    /// The paths for `routes` with `live` name paths (empty when the name relay is off).
    pub(crate) fn new(
        live: Vec<LivePath>,
        routes: &[NameRoute],
        relay: Option<IpAddr>,
    ) -> NamePaths {
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
    pub(crate) fn for_frontend(&self, addr: SocketAddr) -> Vec<LivePath> {
        if self.relay.is_some() && self.routed.contains(&addr) {
            self.live.clone()
        } else {
            Vec::new()
        }
    }
}

/// What the reconciler holds after an apply: the frontends live, those that
/// failed, and those it left as they were, and why.
pub(crate) struct Reconciled<'a, A> {
    /// Live now.
    pub active: A,
    /// Could not be made live.
    pub failed: &'a BTreeMap<SocketAddr, Failed>,
    /// Left as they were by the last apply.
    pub held: &'a BTreeMap<SocketAddr, Hold>,
}

/// Every frontend in `desired`, as `/status` lists it.
pub(crate) fn frontend_statuses<'a>(
    rec: Reconciled<'a, impl Iterator<Item = &'a Active>>,
    desired: &Frontends,
    names: &NamePaths,
) -> Vec<FrontendStatus> {
    let Reconciled {
        active,
        failed,
        held,
    } = rec;
    let mut out: Vec<FrontendStatus> = active
        .map(|a| {
            let addr = a.frontend.addr();
            let mut path = vec![a.path];
            path.extend(names.for_frontend(addr));
            FrontendStatus {
                ip: a.frontend.ip,
                port: a.frontend.port,
                version: a.frontend.version,
                source: a.frontend.source.to_string(),
                state: FrontendState::Active,
                listener: a.listener,
                // Why it takes its path, when the kernel path was asked for.
                reason: a.reason(),
                retry: None,
                path: Paths(path),
            }
        })
        .collect();
    let live: BTreeSet<SocketAddr> = out.iter().map(|f| SocketAddr::new(f.ip, f.port)).collect();
    for f in desired.iter().filter(|f| !live.contains(&f.addr())) {
        let by_name = names.for_frontend(f.addr());
        let (state, reason, retry) = match (failed.get(&f.addr()), held.get(&f.addr())) {
            (Some(x), _) => (
                FrontendState::Failed,
                x.error.to_string(),
                Some(if x.error.is_permanent() {
                    RetryPolicy::OnChange
                } else {
                    RetryPolicy::Backoff
                }),
            ),
            // Held: without a datapath the reconciler makes nothing live.
            (None, Some(Hold::NoDatapath)) if !by_name.is_empty() => (
                FrontendState::Fallback,
                "eBPF is not live on this node: clients using its names reach the name relay"
                    .to_string(),
                None,
            ),
            (None, Some(Hold::NoDatapath)) => (
                FrontendState::Failed,
                "eBPF is not live on this node and no name routed to this address is published \
                 through /etc/hosts or CoreDNS: clients take the pre-hairpin path"
                    .to_string(),
                None,
            ),
            // Every apply leaves each frontend live, failed or held; a frontend
            // asked for after the last apply has not been tried yet.
            (None, Some(Hold::Unchanged | Hold::WaitsForChange) | None) => (
                FrontendState::Failed,
                "not tried yet: asked for after the last apply".to_string(),
                None,
            ),
        };
        out.push(FrontendStatus {
            ip: f.ip,
            port: f.port,
            version: f.version,
            source: f.source.to_string(),
            state,
            listener: (state == FrontendState::Fallback)
                .then(|| names.relay.map(|ip| SocketAddr::new(ip, f.port)))
                .flatten(),
            reason: Some(reason),
            retry,
            path: Paths(by_name),
        });
    }
    out
}

/// Lists the frontends on the relay path of a family the relay does not serve
/// (`unserved`) as failed, with why and what to do: their connects go as before
/// hairpin, though their slot and map entry are in place. How many.
pub(crate) fn mark_unserved(statuses: &mut [FrontendStatus], unserved: &[UnservedFamily]) -> usize {
    let mut marked = 0;
    for f in statuses.iter_mut() {
        if f.state != FrontendState::Active || f.path.0.first() != Some(&LivePath::Relay) {
            continue;
        }
        let Some(u) = unserved.iter().find(|u| u.covers(f.ip)) else {
            continue;
        };
        f.state = FrontendState::Failed;
        f.reason = Some(format!("{}; {}", u.describe(), u.fix));
        // Its retry is the listener's (the agent's backoff, which the fix names),
        // not the frontend's own: none is shown.
        f.retry = None;
        marked += 1;
    }
    marked
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        model::{Frontend, ProxyVersion},
        names::hostname::Hostname,
    };

    fn routes() -> [NameRoute; 1] {
        [NameRoute {
            host: Hostname::parse("a.example.com").expect("name"),
            lb: "203.0.113.10".parse().expect("ip"),
            ports: vec![80],
            version: ProxyVersion::V1,
            source: "test".into(),
        }]
    }

    #[test]
    fn frontends_are_reached_by_the_name_paths_of_their_routes() {
        let p = NamePaths::new(
            vec![LivePath::Hosts],
            &routes(),
            Some("169.254.20.11".parse().expect("ip")),
        );
        assert_eq!(
            p.for_frontend("203.0.113.10:80".parse().expect("a")),
            [LivePath::Hosts]
        );
        assert!(
            p.for_frontend("203.0.113.10:81".parse().expect("a"))
                .is_empty()
        );
        let off = NamePaths::new(vec![LivePath::Hosts], &routes(), None);
        assert!(
            off.for_frontend("203.0.113.10:80".parse().expect("a"))
                .is_empty()
        );
    }

    fn fe(addr: &str) -> Frontend {
        let a: SocketAddr = addr.parse().expect("addr");
        Frontend {
            ip: a.ip(),
            port: a.port(),
            version: ProxyVersion::V2,
            source: crate::model::Origin::File {
                path: std::path::Path::new("test").into(),
                entry: None,
            },
            first_speaker: Default::default(),
            path: Default::default(),
        }
    }

    #[test]
    fn each_frontend_is_listed_once_with_its_state_path_and_retry() {
        let desired = {
            let mut s = Frontends::new();
            for a in [
                "203.0.113.10:80",
                "203.0.113.11:80",
                "203.0.113.12:80",
                "203.0.113.13:80",
            ] {
                s.insert(fe(a)).expect("free");
            }
            s
        };
        let active = [
            Active::for_test(fe("203.0.113.10:80"), "192.0.2.1:40001", LivePath::Relay),
            Active::for_test(fe("203.0.113.13:80"), "192.0.2.1:40002", LivePath::Kernel),
        ];
        let failed = BTreeMap::from([
            (
                "203.0.113.11:80".parse().expect("a"),
                Failed {
                    frontend: fe("203.0.113.11:80"),
                    error: crate::agent::reconcile::tests::map_full(),
                },
            ),
            (
                "203.0.113.12:80".parse().expect("a"),
                Failed {
                    frontend: fe("203.0.113.12:80"),
                    error: crate::agent::reconcile::tests::no_slot(),
                },
            ),
        ]);
        let names = NamePaths::new(
            vec![LivePath::Hosts],
            &routes(),
            Some("169.254.20.11".parse().expect("ip")),
        );
        let held = BTreeMap::from([
            ("203.0.113.10:80".parse().expect("a"), Hold::Unchanged),
            ("203.0.113.13:80".parse().expect("a"), Hold::Unchanged),
        ]);
        let rec = Reconciled {
            active: active.iter(),
            failed: &failed,
            held: &held,
        };
        let got: Vec<String> = frontend_statuses(rec, &desired, &names)
            .iter()
            .map(|f| {
                format!(
                    "{}:{} {:?} {} {:?} {:?}",
                    f.ip, f.port, f.state, f.path, f.retry, f.reason
                )
            })
            .collect();
        let full = crate::agent::reconcile::tests::map_full().to_string();
        let no_slot = crate::agent::reconcile::tests::no_slot().to_string();
        assert_eq!(
            got,
            [
                "203.0.113.10:80 Active ebpf,hosts None None".to_string(),
                "203.0.113.13:80 Active kernel None None".to_string(),
                format!("203.0.113.11:80 Failed none Some(OnChange) Some({full:?})"),
                format!("203.0.113.12:80 Failed none Some(Backoff) Some({no_slot:?})"),
            ]
        );
    }

    #[test]
    fn frontends_held_for_want_of_a_datapath_say_whether_names_reach_the_relay() {
        let desired = {
            let mut s = Frontends::new();
            for a in ["203.0.113.10:80", "203.0.113.11:80"] {
                s.insert(fe(a)).expect("free");
            }
            s
        };
        let held: BTreeMap<SocketAddr, Hold> = desired
            .iter()
            .map(|f| (f.addr(), Hold::NoDatapath))
            .collect();
        let names = NamePaths::new(
            vec![LivePath::Hosts],
            &routes(),
            Some("169.254.20.11".parse().expect("ip")),
        );
        let rec = Reconciled {
            active: [].iter(),
            failed: &BTreeMap::new(),
            held: &held,
        };
        let got: Vec<String> = frontend_statuses(rec, &desired, &names)
            .iter()
            .map(|f| {
                format!(
                    "{}:{} {:?} {} {:?}",
                    f.ip, f.port, f.state, f.path, f.listener
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                "203.0.113.10:80 Fallback hosts Some(169.254.20.11:80)",
                "203.0.113.11:80 Failed none None",
            ]
        );
    }
}
