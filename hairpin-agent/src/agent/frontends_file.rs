//! The frontends file, `--frontends FILE`: the source for running without an API
//! server (debugging, the demo, the datapath tests).
//!
//! ```yaml
//! frontends:
//!   - ip: 203.0.113.10        # the LoadBalancer IP (v4 or v6)
//!     ports: [80, 443]        # TCP ports
//!     proxyProtocol: v1       # v1 or v2
//!     name: ingress-nginx     # optional, shown in status and logs
//!     hosts: [shop.example.com, "*.shop.example.com"]  # optional: names on this LB
//!   - ip: 203.0.113.10
//!     ports: [25, 143]
//!     proxyProtocol: v1
//!     firstSpeaker: server    # optional: client (the default) or server
//!   - ip: 203.0.113.11
//!     ports: [443]
//!     proxyProtocol: v2
//!     path: relay             # optional: auto (the default) or relay
//! ```
//!
//! `firstSpeaker: server` marks ports whose server sends the first bytes (SMTP,
//! IMAP, FTP, MySQL): they always take the relay path, also with `--kernel-path on`,
//! since the kernel path writes the header ahead of the client's first write. It
//! applies to every port of its entry; ports of one LB that differ go in two entries.
//!
//! `path: relay` keeps an entry's ports on the relay path, also where the kernel path
//! is on: for a client that hits one of the kernel path's known misses (a blocking
//! send() while still connecting, `sendto(MSG_FASTOPEN)` without CAP_PERFMON). As
//! the Service annotation `hairpin.dev/path: relay`; `auto` leaves the choice to the
//! agent.
//!
//! `hosts` feeds the name relay and the /etc/hosts block, within the same
//! `--names-domains` scope as the cluster's names: a name outside it, or always
//! refused (`localhost`, the cluster domain, ...), is left out with a warning
//! naming the rule, and the rest of the file applies. Each LoadBalancer
//! address belongs to one entry: the same `ip` and port in two places is refused
//! with both named, since the file's author must say which header that address gets.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::{
    k8s::decide::lb_address::builtin_refusal,
    model::{FirstSpeaker, Frontend, Frontends, Origin, PathChoice, ProxyVersion, UnknownWord},
    names::{
        hostname::{Hostname, HostnameError},
        routes::{Claim, NameRoutes, resolve},
        scope::NameScope,
    },
};

/// Errors reading or validating a frontends file.
#[derive(Debug, thiserror::Error)]
pub enum FrontendsFileError {
    /// The file could not be read.
    #[error("failed to read frontends file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not the expected YAML shape.
    #[error("frontends file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's description, with line and column.
        message: String,
    },
    /// One entry is invalid.
    #[error("frontends file {path}: frontends[{index}].{field}: {expected}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Index of the entry in `frontends`.
        index: usize,
        /// The offending field.
        field: &'static str,
        /// What was expected instead.
        expected: String,
    },
    /// Two entries name the same LoadBalancer address.
    #[error(
        "frontends file {path}: frontends[{index}].ports[{port_index}]: {addr} is already listed \
         at {first}; list each ip and port once, with the proxyProtocol it needs"
    )]
    Conflict {
        /// The file.
        path: PathBuf,
        /// Index of the second entry in `frontends`.
        index: usize,
        /// Index of the port in that entry's `ports`.
        port_index: usize,
        /// The address listed twice.
        addr: std::net::SocketAddr,
        /// Where it was listed first, as `frontends[I].ports[J]`.
        first: String,
    },
    /// A name in an entry's `hosts` is not a valid hostname.
    #[error("frontends file {path}: frontends[{index}].hosts[{host_index}]: {source}")]
    InvalidHost {
        /// The file.
        path: PathBuf,
        /// Index of the entry in `frontends`.
        index: usize,
        /// Index of the name in `hosts`.
        host_index: usize,
        /// Why the name was rejected.
        source: HostnameError,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    frontends: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    ip: IpAddr,
    ports: Vec<u16>,
    proxy_protocol: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default, alias = "first_speaker")]
    first_speaker: Option<String>,
    #[serde(default)]
    path: Option<String>,
}

fn source_of(path: &std::sync::Arc<Path>, name: Option<&str>) -> Origin {
    Origin::File {
        path: path.clone(),
        entry: name.map(Into::into),
    }
}

/// What one version of the file says: the frontends, and the names routed to them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FrontendsFile {
    /// One frontend per LoadBalancer address.
    pub frontends: Frontends,
    /// The `hosts` names, each routed to its own entry's LB.
    pub routes: NameRoutes,
}

/// Reads `path` once and parses it, routing its `hosts` within `scope`.
pub(crate) fn load(path: &Path, scope: &NameScope) -> Result<FrontendsFile, FrontendsFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FrontendsFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(path, &text, scope)
}

/// Parses the YAML `text` of the file at `path` (named in errors): frontends and
/// routes from one parse, so both always come from the same version of the file.
/// `hosts` names outside `scope` are skips in the routes, not errors.
pub(crate) fn parse_file(
    path: &Path,
    text: &str,
    scope: &NameScope,
) -> Result<FrontendsFile, FrontendsFileError> {
    let file: File = yaml_serde::from_str(text).map_err(|e| FrontendsFileError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let invalid = |index, field, expected: &str| FrontendsFileError::Invalid {
        path: path.to_path_buf(),
        index,
        field,
        expected: expected.to_string(),
    };
    let mut frontends = Frontends::new();
    let shared: std::sync::Arc<Path> = path.into();
    // Where each address was first listed, for the conflict error.
    let mut listed = std::collections::BTreeMap::new();
    for (index, e) in file.frontends.iter().enumerate() {
        let version: ProxyVersion = e
            .proxy_protocol
            .parse()
            .map_err(|e: UnknownWord| invalid(index, "proxyProtocol", &e.to_string()))?;
        let first_speaker: FirstSpeaker = match &e.first_speaker {
            None => FirstSpeaker::Client,
            Some(v) => v
                .parse()
                .map_err(|e: UnknownWord| invalid(index, "firstSpeaker", &e.to_string()))?,
        };
        let path_choice: PathChoice = match &e.path {
            None => PathChoice::Auto,
            Some(v) => v
                .parse()
                .map_err(|e: UnknownWord| invalid(index, "path", &e.to_string()))?,
        };
        if let Some(class) = builtin_refusal(e.ip) {
            return Err(invalid(
                index,
                "ip",
                &format!("a LoadBalancer address, got {} ({class})", e.ip),
            ));
        }
        if e.ports.is_empty() {
            return Err(invalid(index, "ports", "at least one TCP port"));
        }
        if e.ports.contains(&0) {
            return Err(invalid(index, "ports", "TCP ports from 1 to 65535, got 0"));
        }
        let source = source_of(&shared, e.name.as_deref());
        for (port_index, &port) in e.ports.iter().enumerate() {
            let frontend = Frontend {
                ip: e.ip,
                port,
                version,
                source: source.clone(),
                first_speaker,
                path: path_choice,
            };
            let addr = frontend.addr();
            if frontends.insert(frontend).is_err() {
                return Err(FrontendsFileError::Conflict {
                    path: path.to_path_buf(),
                    index,
                    port_index,
                    addr,
                    first: listed.get(&addr).cloned().unwrap_or_default(),
                });
            }
            listed.insert(addr, format!("frontends[{index}].ports[{port_index}]"));
        }
    }
    let mut claims = Vec::new();
    for (index, e) in file.frontends.iter().enumerate() {
        for (host_index, value) in e.hosts.iter().enumerate() {
            let host =
                Hostname::parse(value).map_err(|source| FrontendsFileError::InvalidHost {
                    path: path.to_path_buf(),
                    index,
                    host_index,
                    source,
                })?;
            claims.push(Claim {
                created: None,
                source: source_of(&shared, e.name.as_deref()).to_string(),
                object: None,
                field: format!("frontends[{index}].hosts[{host_index}]"),
                host,
                lbs: vec![e.ip],
            });
        }
    }
    let routes = resolve(claims, &frontends, scope);
    Ok(FrontendsFile { frontends, routes })
}

/// The frontends of the YAML `text` of the file at `path` (its `hosts` are still
/// validated as names).
pub fn parse(path: &Path, text: &str) -> Result<Frontends, FrontendsFileError> {
    parse_file(path, text, &NameScope::none()).map(|f| f.frontends)
}

/// The name routes the entries' `hosts` lists ask for within `scope`, each on its
/// own entry's LB, ports and version.
pub fn parse_routes(
    path: &Path,
    text: &str,
    scope: &NameScope,
) -> Result<NameRoutes, FrontendsFileError> {
    parse_file(path, text, scope).map(|f| f.routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Frontends, FrontendsFileError> {
        parse(Path::new("f.yaml"), text)
    }

    /// The message `text` is refused with (`why` names what is wrong with it).
    fn refusal(text: &str, why: &str) -> String {
        p(text).expect_err(why).to_string()
    }

    /// `text`'s frontends, each as `ADDRESS:PORT` and what `field` reads on it.
    fn listed(text: &str, field: impl Fn(&Frontend) -> String) -> Vec<String> {
        p(text)
            .expect("valid")
            .iter()
            .map(|f| format!("{} {}", f.addr(), field(f)))
            .collect()
    }

    fn example_com() -> NameScope {
        NameScope::new(&["example.com"], "cluster.local").expect("scope")
    }

    #[test]
    fn parses_both_families_and_versions() {
        let got = p(
            "frontends:\n- ip: 203.0.113.10\n  ports: [80, 443]\n  proxyProtocol: v1\n\
                     - ip: 2001:db8::10\n  ports: [80]\n  proxyProtocol: v2\n  name: lb6\n",
        )
        .expect("valid");
        assert_eq!(got.len(), 3);
        let v6 = got.iter().find(|f| f.ip.is_ipv6()).expect("v6 entry");
        assert_eq!(v6.version, ProxyVersion::V2);
        assert_eq!(v6.source.to_string(), "file f.yaml (lb6)");
    }

    #[test]
    fn errors_name_the_entry_and_field() {
        let err = refusal(
            "frontends:\n- ip: 203.0.113.10\n  ports: [80]\n  proxyProtocol: v3\n",
            "v3 is invalid",
        );
        assert_eq!(
            err,
            "frontends file f.yaml: frontends[0].proxyProtocol: expected v1 or v2, got \"v3\""
        );
        let err = refusal(
            "frontends:\n- ip: 127.0.0.1\n  ports: [80]\n  proxyProtocol: v1\n",
            "loopback is invalid",
        );
        assert!(err.contains("frontends[0].ip"), "{err}");
        let err = refusal(
            "frontends:\n- ip: 203.0.113.1\n  ports: []\n  proxyProtocol: v1\n",
            "no ports",
        );
        assert!(err.contains("frontends[0].ports: at least one"), "{err}");
    }

    #[test]
    fn first_speaker_and_path_are_per_entry_with_a_default_and_a_bad_value_is_named() {
        // Each field: its default, a value, the default in another case, a bad value
        // (only the agent picks the kernel path: one cannot ask for it) and what the
        // refusal says is expected.
        type Field = (&'static str, [&'static str; 3], &'static str, &'static str);
        type Read = fn(&Frontend) -> String;
        let fields: [(Field, Read); 2] = [
            (
                (
                    "firstSpeaker",
                    ["client", "server", "Client"],
                    "smtp",
                    "client or server",
                ),
                |f| f.first_speaker.to_string(),
            ),
            (
                ("path", ["auto", "relay", "Auto"], "kernel", "auto or relay"),
                |f| f.path.to_string(),
            ),
        ];
        for ((field, [default, set, other_case], bad, expected), read) in fields {
            let entries = format!(
                "frontends:\n- ip: 203.0.113.10\n  ports: [80, 443]\n  proxyProtocol: v1\n\
                 - ip: 203.0.113.10\n  ports: [25]\n  proxyProtocol: v1\n  {field}: {set}\n\
                 - ip: 203.0.113.11\n  ports: [80]\n  proxyProtocol: v2\n  {field}: {other_case}\n"
            );
            assert_eq!(
                listed(&entries, read),
                [
                    format!("203.0.113.10:25 {set}"),
                    format!("203.0.113.10:80 {default}"),
                    format!("203.0.113.10:443 {default}"),
                    format!("203.0.113.11:80 {default}"),
                ],
                "{field}"
            );
            let err = refusal(
                &format!(
                    "frontends:\n- ip: 203.0.113.10\n  ports: [80]\n  proxyProtocol: v1\n\
                     - ip: 203.0.113.11\n  ports: [443]\n  proxyProtocol: v1\n  {field}: {bad}\n"
                ),
                bad,
            );
            assert_eq!(
                err,
                format!(
                    "frontends file f.yaml: frontends[1].{field}: expected {expected}, got \"{bad}\""
                )
            );
        }
        // The snake_case spelling is read too.
        let got = p(
            "frontends:\n- ip: 203.0.113.10\n  ports: [25]\n  proxyProtocol: v1\n  first_speaker: server\n",
        )
        .expect("valid");
        assert!(got.iter().all(|f| f.first_speaker == FirstSpeaker::Server));
        let err = refusal(
            "frontends:\n- ip: 203.0.113.10\n  ports: [80]\n  proxyProtocol: v1\n  path: [relay]\n",
            "a list is not a path",
        );
        assert!(err.starts_with("frontends file f.yaml: "), "{err}");
    }

    #[test]
    fn unknown_fields_and_bad_addresses_are_rejected() {
        let err = refusal(
            "frontends:\n- ip: 203.0.113.1\n  port: [80]\n  proxyProtocol: v1\n",
            "typo",
        );
        assert!(err.contains("unknown field `port`"), "{err}");
        assert!(
            p("frontends:\n- ip: 203.0.113.300\n  ports: [80]\n  proxyProtocol: v1\n").is_err()
        );
    }

    #[test]
    fn the_same_address_twice_is_refused_naming_both_entries() {
        let err = refusal(
            "frontends:\n- ip: 203.0.113.10\n  ports: [80, 443]\n  proxyProtocol: v1\n\
                     - ip: 203.0.113.10\n  ports: [443]\n  proxyProtocol: v2\n",
            "443 twice",
        );
        assert_eq!(
            err,
            "frontends file f.yaml: frontends[1].ports[0]: 203.0.113.10:443 is already listed at \
             frontends[0].ports[1]; list each ip and port once, with the proxyProtocol it needs"
        );
        let err = refusal(
            "frontends:\n- ip: 2001:db8::10\n  ports: [80, 80]\n  proxyProtocol: v1\n",
            "80 twice in one entry",
        );
        assert!(
            err.contains("frontends[0].ports[1]: [2001:db8::10]:80 is already listed at frontends[0].ports[0]"),
            "{err}"
        );
    }

    #[test]
    fn hosts_become_routes_on_their_own_entry_and_bad_names_are_named() {
        let text = "frontends:\n- ip: 203.0.113.10\n  ports: [80, 443]\n  proxyProtocol: v1\n  \
                    hosts: [a.example.com, \"*.a.example.com\"]\n\
                    - ip: 203.0.113.11\n  ports: [80]\n  proxyProtocol: v2\n  name: hap\n  hosts: [B.example.com]\n";
        let routes = parse_routes(Path::new("f.yaml"), text, &example_com()).expect("valid");
        let got: Vec<String> = routes
            .routes
            .iter()
            .map(|r| {
                format!(
                    "{} {} {:?} {} {}",
                    r.host, r.lb, r.ports, r.version, r.source
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                "*.a.example.com 203.0.113.10 [80, 443] v1 file f.yaml",
                "a.example.com 203.0.113.10 [80, 443] v1 file f.yaml",
                "b.example.com 203.0.113.11 [80] v2 file f.yaml (hap)",
            ]
        );
        assert_eq!(p(text).expect("frontends still parse").len(), 3);
        let err = parse_routes(
            Path::new("f.yaml"),
            "frontends:\n- ip: 203.0.113.10\n  ports: [80]\n  proxyProtocol: v1\n  hosts: [ok.io, \"a b\"]\n",
            &example_com(),
        )
        .expect_err("bad host")
        .to_string();
        assert!(
            err.starts_with("frontends file f.yaml: frontends[0].hosts[1]: hostname \"a b\""),
            "{err}"
        );
    }

    #[test]
    fn hosts_outside_the_scope_are_left_out_naming_the_rule_and_the_rest_applies() {
        // The names the issue saw written into /etc/hosts, beside one that is fine.
        let text = "frontends:\n- ip: 203.0.113.10\n  ports: [80]\n  proxyProtocol: v1\n  name: lb\n  \
                    hosts: [localhost, kubernetes.default.svc.cluster.local, metadata.google.internal, \
                    registry-1.docker.io, \"*.com\", intranet, shop.example.com]\n";
        let routes = parse_routes(Path::new("f.yaml"), text, &example_com()).expect("valid");
        let hosts: Vec<&str> = routes.routes.iter().map(|r| r.host.as_str()).collect();
        assert_eq!(hosts, ["shop.example.com"]);
        let skips: Vec<String> = routes.skips.iter().map(|s| s.message.clone()).collect();
        assert_eq!(
            skips,
            [
                "file f.yaml (lb): frontends[0].hosts[0]: host localhost refused (rule localhost): \
                 loopback names must keep resolving to this machine; expected a name that is not localhost",
                "file f.yaml (lb): frontends[0].hosts[1]: host kubernetes.default.svc.cluster.local \
                 refused (rule cluster-domain): names in the cluster domain cluster.local belong to \
                 Services and Pods; expected a name outside cluster.local",
                "file f.yaml (lb): frontends[0].hosts[2]: host metadata.google.internal refused \
                 (rule metadata-endpoint): cloud metadata endpoints and cloud-internal zones \
                 (nodes' own names) are never redirected; expected a name that is not a metadata endpoint",
                "file f.yaml (lb): frontends[0].hosts[3]: host registry-1.docker.io refused (rule \
                 outside-domains): it is not under a domain listed in --names-domains; expected a \
                 name under example.com",
                "file f.yaml (lb): frontends[0].hosts[4]: host *.com refused (rule public-suffix): \
                 it is a wildcard directly under the public suffix com; expected a name under a \
                 registrable domain (example.com, not com)",
                "file f.yaml (lb): frontends[0].hosts[5]: host intranet refused (rule single-label): \
                 single-label names are resolved through search domains; expected a name with at \
                 least two labels (app.example.com)",
            ]
        );
        assert!(routes.skips.iter().all(|s| s.object.is_none()));
        // The default scope publishes nothing, and the frontends still apply.
        let none = parse_file(Path::new("f.yaml"), text, &NameScope::none()).expect("valid");
        assert!(none.routes.routes.is_empty());
        assert_eq!(none.frontends.len(), 1);
        assert!(none.routes.skips.iter().any(|s| s.message.contains(
            "host shop.example.com refused (rule no-domains): --names-domains is empty"
        )));
    }

    /// Issue 22: a file naming any platform endpoint of the table (in any spelling)
    /// beside a real LB is refused, the refusal naming the endpoint and its source:
    /// nothing of it is redirected.
    #[test]
    fn a_platform_endpoint_in_the_file_is_refused_by_name() {
        use crate::k8s::decide::lb_address::PLATFORM_ENDPOINTS;
        let spellings = PLATFORM_ENDPOINTS
            .iter()
            .map(|(ip, what, source)| (ip.to_string(), *what, *source))
            .chain([(
                "64:ff9b::a9fe:a9fe".to_string(),
                "instance metadata",
                "docs.aws.amazon.com",
            )]);
        for (ip, what, source) in spellings {
            let text = format!(
                "frontends:\n- ip: 203.0.113.10\n  ports: [443]\n  proxyProtocol: v1\n\
                 - ip: \"{ip}\"\n  ports: [80]\n  proxyProtocol: v1\n"
            );
            let e = parse(Path::new("f.yaml"), &text)
                .expect_err(&ip)
                .to_string();
            assert!(
                e.contains("frontends[1].ip") && e.contains(what) && e.contains(source),
                "{ip}: {e}"
            );
        }
    }
}
