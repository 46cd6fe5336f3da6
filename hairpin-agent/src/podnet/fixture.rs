//! The text form of a node's links and routes that the CNI fixtures are written in
//! (`hairpin-agent/tests/fixtures/cni/*.routes`), read by the unit tests and by the
//! privileged test that builds each shape in a network namespace. Close to `ip`'s
//! own output, so a fixture can be checked against a real node's `ip -d link` and
//! `ip route`:
//!
//! ```text
//! # comment
//! link cali1f2e3d4c5b6 veth                 # name, kind, then `addr CIDR`, `master NAME`
//! link eth0 device addr 192.0.2.21/24
//! route 10.244.12.7/32 dev cali1f2e3d4c5b6 scope link
//! route blackhole 10.244.12.0/26 proto bird
//! route 10.244.7.0/26 via 192.0.2.22 dev tunl0 proto bird onlink
//! pod 10.244.12.7 cali1f2e3d4c5b6           # a pod on this node, behind that link
//! off-node 10.244.7.9                       # a peer that is not
//! ```
//! A route's `default` is `0.0.0.0/0` (`::/0` when its gateway is IPv6); `table N`
//! moves it out of the main table; other `ip route` words are read and ignored.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{HostLink, HostRoute, MAIN_TABLE};

/// A parsed fixture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fixture {
    /// The node's links.
    pub links: Vec<HostLink>,
    /// Its routes.
    pub routes: Vec<HostRoute>,
    /// Pods on this node, each with the link it sits behind: must be found.
    pub pods: Vec<(IpAddr, String)>,
    /// Peers off the node: must not be.
    pub off_node: Vec<IpAddr>,
    /// Bridge ports: (link, its bridge), from `master NAME`.
    pub masters: Vec<(String, String)>,
    /// Each route's words as written after `route`, for `ip route replace`.
    pub route_words: Vec<Vec<String>>,
}

/// A line the fixture reader could not read.
#[derive(Debug, thiserror::Error)]
#[error("fixture line {line}: {why}: {text:?}")]
pub struct FixtureError {
    /// 1-based line number.
    pub line: usize,
    /// What was expected.
    pub why: String,
    /// The line.
    pub text: String,
}

/// Reads a fixture.
pub fn parse(text: &str) -> Result<Fixture, FixtureError> {
    let mut f = Fixture::default();
    for (i, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let err = |why: &str| FixtureError {
            line: i + 1,
            why: why.into(),
            text: raw.into(),
        };
        let words: Vec<&str> = content.split_whitespace().collect();
        match words.as_slice() {
            ["link", name, kind, rest @ ..] => {
                let mut addresses = Vec::new();
                let mut it = rest.iter();
                while let Some(w) = it.next() {
                    match (*w, it.next()) {
                        ("addr", Some(a)) => {
                            addresses.push(a.parse().map_err(|_| err("expected addr CIDR"))?)
                        }
                        ("master", Some(m)) => f.masters.push(((*name).into(), (*m).into())),
                        _ => {
                            return Err(err(
                                "expected `addr CIDR` or `master NAME` after the link's kind",
                            ));
                        }
                    }
                }
                f.links.push(HostLink {
                    name: (*name).into(),
                    kind: (*kind != "device").then(|| (*kind).into()),
                    addresses,
                });
            }
            ["route", rest @ ..] => {
                f.routes.push(route(rest, err)?);
                f.route_words
                    .push(rest.iter().map(|w| (*w).to_string()).collect());
            }
            ["pod", ip, link] => f.pods.push((
                ip.parse().map_err(|_| err("expected a pod address"))?,
                (*link).into(),
            )),
            ["off-node", ip] => f
                .off_node
                .push(ip.parse().map_err(|_| err("expected an address"))?),
            _ => return Err(err("expected link, route, pod or off-node")),
        }
    }
    Ok(f)
}

/// The route `words` (after `route`) name; `err` makes the line's error.
fn route(words: &[&str], err: impl Fn(&str) -> FixtureError) -> Result<HostRoute, FixtureError> {
    let (unicast, words) = match words {
        [
            "blackhole" | "unreachable" | "prohibit" | "local",
            rest @ ..,
        ] => (false, rest),
        _ => (true, words),
    };
    let Some((dst, mut rest)) = words.split_first() else {
        return Err(err("expected a destination"));
    };
    let (mut dev, mut via, mut table) = (None, None, MAIN_TABLE);
    while let Some((w, tail)) = rest.split_first() {
        let value = tail.first().copied();
        rest = tail;
        match (*w, value) {
            ("dev", Some(v)) => dev = Some(v.to_string()),
            ("via", Some(v)) => {
                via = Some(
                    v.parse::<IpAddr>()
                        .map_err(|_| err("expected via ADDRESS"))?,
                )
            }
            ("table", Some(v)) => table = v.parse().map_err(|_| err("expected table NUMBER"))?,
            ("proto" | "scope" | "src" | "metric" | "mtu", Some(_)) => {}
            ("onlink", _) => continue,
            _ => return Err(err(&format!("unexpected word {w:?}"))),
        }
        rest = &rest[1..];
    }
    let dst: IpNet = match *dst {
        "default" if via.is_some_and(|v| v.is_ipv6()) => "::/0".parse().map_err(|_| err("::/0"))?,
        "default" => "0.0.0.0/0".parse().map_err(|_| err("0.0.0.0/0"))?,
        d if d.contains('/') => d.parse().map_err(|_| err("expected a destination CIDR"))?,
        d => IpNet::from(
            d.parse::<IpAddr>()
                .map_err(|_| err("expected a destination"))?,
        ),
    };
    Ok(HostRoute {
        dst,
        dev,
        via,
        unicast,
        table,
    })
}
