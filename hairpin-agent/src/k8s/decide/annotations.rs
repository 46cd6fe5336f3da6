//! hairpin's own annotations on a Service, parsed and validated.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ServicePort;
use thiserror::Error;

use crate::model::{FirstSpeaker, PathChoice, ProxyVersion};

/// `v1 | v2 | off`: overrides provider annotations and the default for this Service.
pub const PROXY_PROTOCOL: &str = "hairpin.dev/proxy-protocol";
/// Comma-separated Service port numbers or names: only these ports are proxied.
pub const PORTS: &str = "hairpin.dev/ports";
/// Which side speaks first: `client` (the default) or `server` for every port, or
/// `PORT=client|server` entries separated by commas (PORT a number or name, as in
/// [`PORTS`]; ports not listed are `client`). Server-speaks-first ports always take
/// the relay path.
pub(crate) const FIRST_SPEAKER: &str = "hairpin.dev/first-speaker";
/// Which path the Service's frontends take: `auto` (the default: the kernel path
/// where the node runs it and the client speaks first, else the relay) or `relay`
/// for every port, or `PORT=auto|relay` entries separated by commas (as in
/// [`FIRST_SPEAKER`]; ports not listed are `auto`). `relay` is for a workload that
/// hits one of the kernel path's known misses.
pub(crate) const PATH: &str = "hairpin.dev/path";

/// Most bytes of an annotation value (or one of its entries) quoted in a message:
/// the Event that carries it holds 1 KiB, and what was expected must still fit.
pub(crate) const EXCERPT_MAX: usize = 64;
/// Most bytes of the Service's port list quoted in a message.
const KNOWN_PORTS_MAX: usize = 256;

/// `value` cut to `max` bytes on a character boundary, with `...` when cut, for
/// quoting in a message.
pub(crate) fn excerpt(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_string();
    }
    let mut cut = max;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &value[..cut])
}

/// An invalid hairpin annotation. The Service is skipped until it is fixed; other Services
/// are unaffected. Each message names the Service, the annotation and what was expected.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AnnotationError {
    /// `hairpin.dev/proxy-protocol` is not one of the accepted values.
    #[error("service {service}: annotation {PROXY_PROTOCOL} is {value:?}; expected v1, v2 or off")]
    ProxyProtocol {
        /// `namespace/name`.
        service: String,
        /// The value found (its first 64 bytes when longer).
        value: String,
    },
    /// `hairpin.dev/ports` has an empty entry (`80,,443`, or an empty value).
    #[error(
        "service {service}: annotation {PORTS} is {value:?}; expected comma-separated port numbers or names, with no empty entries"
    )]
    EmptyPortEntry {
        /// `namespace/name`.
        service: String,
        /// The value (its first 64 bytes when longer).
        value: String,
    },
    /// A `hairpin.dev/ports` entry matches no port of the Service.
    #[error(
        "service {service}: annotation {PORTS} lists {entry:?}, which is not a port number or name in spec.ports (the Service has {known})"
    )]
    UnknownPort {
        /// `namespace/name`.
        service: String,
        /// The entry that matched nothing (its first 64 bytes when longer).
        entry: String,
        /// The Service's ports, `80/http, 443/https`.
        known: String,
    },
    /// `hairpin.dev/first-speaker` is not `client`, `server` or `PORT=client|server`
    /// entries naming TCP ports of the Service.
    #[error(
        "service {service}: annotation {FIRST_SPEAKER} is {value:?}; expected client, server, or \
         PORT=client|server entries separated by commas, PORT a TCP port number or name in \
         spec.ports (the Service has {known}){detail}"
    )]
    FirstSpeaker {
        /// `namespace/name`.
        service: String,
        /// The value (its first 64 bytes when longer).
        value: String,
        /// The Service's TCP ports, `80/http, 25/smtp`.
        known: String,
        /// What was wrong with one entry, `: "x" is ...`, or empty.
        detail: String,
    },
    /// `hairpin.dev/path` is not `auto`, `relay` or `PORT=auto|relay` entries naming
    /// TCP ports of the Service.
    #[error(
        "service {service}: annotation {PATH} is {value:?}; expected auto, relay, or \
         PORT=auto|relay entries separated by commas, PORT a TCP port number or name in \
         spec.ports (the Service has {known}){detail}"
    )]
    Path {
        /// `namespace/name`.
        service: String,
        /// The value (its first 64 bytes when longer).
        value: String,
        /// The Service's TCP ports, `80/http, 443/https`.
        known: String,
        /// What was wrong with one entry, `: "x" is ...`, or empty.
        detail: String,
    },
    /// A `hairpin.dev/ports` entry names a UDP or SCTP port.
    #[error(
        "service {service}: annotation {PORTS} lists {entry:?}, a {protocol} port; hairpin proxies TCP ports only"
    )]
    NotTcpPort {
        /// `namespace/name`.
        service: String,
        /// The entry.
        entry: String,
        /// `UDP` or `SCTP`.
        protocol: String,
    },
}

/// What `hairpin.dev/proxy-protocol` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OurSetting {
    /// Proxy with this version.
    On(ProxyVersion),
    /// Do not proxy, whatever the provider annotations say.
    Off,
}

/// Parses `hairpin.dev/proxy-protocol`; `None` when absent.
pub(crate) fn proxy_protocol(
    service: &str,
    value: Option<&str>,
) -> Result<Option<OurSetting>, AnnotationError> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "v1" => Ok(Some(OurSetting::On(ProxyVersion::V1))),
        "v2" => Ok(Some(OurSetting::On(ProxyVersion::V2))),
        "off" => Ok(Some(OurSetting::Off)),
        _ => Err(AnnotationError::ProxyProtocol {
            service: service.to_string(),
            value: excerpt(value, EXCERPT_MAX),
        }),
    }
}

/// What a per-port annotation (`hairpin.dev/first-speaker`, `hairpin.dev/path`) says,
/// port by port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PerPort<T> {
    /// Every port not listed in `ports`.
    pub all: T,
    /// Ports listed one by one.
    pub ports: BTreeMap<i32, T>,
}

impl<T: Copy> PerPort<T> {
    /// The setting for Service port `port`.
    pub(crate) fn for_port(&self, port: i32) -> T {
        self.ports.get(&port).copied().unwrap_or(self.all)
    }
}

/// What `hairpin.dev/first-speaker` says, port by port.
pub(crate) type FirstSpeakers = PerPort<FirstSpeaker>;

/// What `hairpin.dev/path` says, port by port.
pub(crate) type Paths = PerPort<PathChoice>;

/// Parses `hairpin.dev/first-speaker` against the Service's ports; absent is every
/// port `client`.
pub(crate) fn first_speaker(
    service: &str,
    value: Option<&str>,
    spec_ports: &[ServicePort],
) -> Result<FirstSpeakers, AnnotationError> {
    per_port(value, spec_ports, ["client", "server"]).map_err(|(value, known, detail)| {
        AnnotationError::FirstSpeaker {
            service: service.to_string(),
            value,
            known,
            detail,
        }
    })
}

/// Parses `hairpin.dev/path` against the Service's ports; absent is every port `auto`.
pub(crate) fn path(
    service: &str,
    value: Option<&str>,
    spec_ports: &[ServicePort],
) -> Result<Paths, AnnotationError> {
    per_port(value, spec_ports, ["auto", "relay"]).map_err(|(value, known, detail)| {
        AnnotationError::Path {
            service: service.to_string(),
            value,
            known,
            detail,
        }
    })
}

/// Parses a per-port annotation whose two words are `words`: one word for every
/// port, or `PORT=word` entries separated by commas, PORT a TCP port number or name
/// of the Service; absent is every port `T::default()`. An error is (the value, the
/// Service's TCP ports, what was wrong with one entry), excerpted for a message.
fn per_port<T>(
    value: Option<&str>,
    spec_ports: &[ServicePort],
    words: [&str; 2],
) -> Result<PerPort<T>, (String, String, String)>
where
    T: std::str::FromStr + Default + Copy,
{
    let Some(value) = value else {
        return Ok(PerPort::default());
    };
    let error = |detail: String| {
        let known: Vec<String> = spec_ports
            .iter()
            .filter(|p| protocol(p) == "TCP")
            .map(|p| match &p.name {
                Some(name) => format!("{}/{name}", p.port),
                None => p.port.to_string(),
            })
            .collect();
        let known = if known.is_empty() {
            "no TCP ports".to_string()
        } else {
            excerpt(&known.join(", "), KNOWN_PORTS_MAX)
        };
        (excerpt(value, EXCERPT_MAX), known, detail)
    };
    if let Ok(all) = value.parse::<T>() {
        return Ok(PerPort {
            all,
            ports: BTreeMap::new(),
        });
    }
    let [a, b] = words;
    let mut out = PerPort::default();
    for entry in value.split(',').map(str::trim) {
        let Some((port, word)) = entry.split_once('=') else {
            return Err(error(format!(
                ": {:?} is not PORT={a}|{b}",
                excerpt(entry, EXCERPT_MAX)
            )));
        };
        let (port, word) = (port.trim(), word.trim());
        let setting: T = word.parse().map_err(|_| {
            error(format!(
                ": {:?} is neither {a} nor {b}",
                excerpt(word, EXCERPT_MAX)
            ))
        })?;
        let number: Option<i32> = port.parse().ok();
        let found = spec_ports.iter().find(|p| {
            protocol(p) == "TCP"
                && match number {
                    Some(n) => p.port == n,
                    None => p.name.as_deref() == Some(port),
                }
        });
        let Some(found) = found else {
            return Err(error(format!(
                ": {:?} is not a TCP port of the Service",
                excerpt(port, EXCERPT_MAX)
            )));
        };
        out.ports.insert(found.port, setting);
    }
    Ok(out)
}

/// A port's protocol, `TCP` when absent (the API server's default).
pub fn protocol(port: &ServicePort) -> &str {
    port.protocol.as_deref().unwrap_or("TCP")
}

/// Parses `hairpin.dev/ports` against the Service's ports into the set of selected TCP port
/// numbers; `None` when absent (every TCP port).
pub(crate) fn ports(
    service: &str,
    value: Option<&str>,
    spec_ports: &[ServicePort],
) -> Result<Option<BTreeSet<i32>>, AnnotationError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let mut selected = BTreeSet::new();
    for entry in value.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(AnnotationError::EmptyPortEntry {
                service: service.to_string(),
                value: excerpt(value, EXCERPT_MAX),
            });
        }
        // A name may look like anything but a number is always a number: port names must
        // contain a letter (IANA_SVC_NAME), so "80" can never be a name.
        let number: Option<i32> = entry.parse().ok();
        let found = spec_ports.iter().find(|p| match number {
            Some(n) => p.port == n,
            None => p.name.as_deref() == Some(entry),
        });
        let Some(port) = found else {
            let known: Vec<String> = spec_ports
                .iter()
                .map(|p| match &p.name {
                    Some(name) => format!("{}/{name}", p.port),
                    None => p.port.to_string(),
                })
                .collect();
            return Err(AnnotationError::UnknownPort {
                service: service.to_string(),
                entry: excerpt(entry, EXCERPT_MAX),
                known: if known.is_empty() {
                    "no ports".to_string()
                } else {
                    excerpt(&known.join(", "), KNOWN_PORTS_MAX)
                },
            });
        };
        // A number may match both a TCP and a UDP port (DNS on 53); prefer the TCP one.
        let tcp = spec_ports.iter().find(|p| {
            p.port == port.port && protocol(p) == "TCP" && (number.is_some() || p.name == port.name)
        });
        match tcp {
            Some(p) => {
                selected.insert(p.port);
            }
            None => {
                return Err(AnnotationError::NotTcpPort {
                    service: service.to_string(),
                    entry: excerpt(entry, EXCERPT_MAX),
                    protocol: excerpt(protocol(port), EXCERPT_MAX),
                });
            }
        }
    }
    Ok(Some(selected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, number: i32, protocol: Option<&str>) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port: number,
            protocol: protocol.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn proxy_protocol_values() {
        assert_eq!(proxy_protocol("a/b", None), Ok(None));
        assert_eq!(
            proxy_protocol("a/b", Some(" V2 ")),
            Ok(Some(OurSetting::On(ProxyVersion::V2)))
        );
        assert_eq!(
            proxy_protocol("a/b", Some("off")),
            Ok(Some(OurSetting::Off))
        );
        assert!(proxy_protocol("a/b", Some("true")).is_err());
    }

    #[test]
    fn first_speaker_for_every_port_or_port_by_port() {
        let spec = [
            port("http", 80, None),
            port("smtp", 25, Some("TCP")),
            port("imap", 143, None),
            port("dns", 53, Some("UDP")),
        ];
        let absent = first_speaker("a/b", None, &spec).expect("valid");
        assert_eq!(absent.for_port(25), FirstSpeaker::Client);
        let all = first_speaker("a/b", Some(" Server"), &spec).expect("valid");
        assert_eq!(all.for_port(80), FirstSpeaker::Server);
        assert_eq!(all.for_port(25), FirstSpeaker::Server);
        let some = first_speaker("a/b", Some("smtp=server, 143 = server,80=client"), &spec)
            .expect("valid");
        assert_eq!(some.for_port(25), FirstSpeaker::Server);
        assert_eq!(some.for_port(143), FirstSpeaker::Server);
        assert_eq!(some.for_port(80), FirstSpeaker::Client);
        assert_eq!(some.for_port(8080), FirstSpeaker::Client);
        let err = first_speaker("a/b", Some("smtp"), &spec).expect_err("no speaker");
        assert_eq!(
            err.to_string(),
            "service a/b: annotation hairpin.dev/first-speaker is \"smtp\"; expected client, \
             server, or PORT=client|server entries separated by commas, PORT a TCP port number or \
             name in spec.ports (the Service has 80/http, 25/smtp, 143/imap): \"smtp\" is not \
             PORT=client|server"
        );
        let err = first_speaker("a/b", Some("dns=server"), &spec).expect_err("udp");
        assert!(
            err.to_string()
                .ends_with(": \"dns\" is not a TCP port of the Service"),
            "{err}"
        );
        let err = first_speaker("a/b", Some("25=banner"), &spec).expect_err("bad speaker");
        assert!(
            err.to_string()
                .ends_with(": \"banner\" is neither client nor server"),
            "{err}"
        );
        assert!(first_speaker("a/b", Some("25=server,"), &spec).is_err());
    }

    #[test]
    fn path_for_every_port_or_port_by_port_and_a_bad_value_names_what_was_expected() {
        let spec = [
            port("http", 80, None),
            port("https", 443, Some("TCP")),
            port("dns", 53, Some("UDP")),
        ];
        let absent = path("a/b", None, &spec).expect("valid");
        assert_eq!(absent.for_port(443), PathChoice::Auto);
        let all = path("a/b", Some(" Relay"), &spec).expect("valid");
        assert_eq!(all.for_port(80), PathChoice::Relay);
        assert_eq!(all.for_port(443), PathChoice::Relay);
        let some = path("a/b", Some("https=relay, 80 = auto"), &spec).expect("valid");
        assert_eq!(some.for_port(443), PathChoice::Relay);
        assert_eq!(some.for_port(80), PathChoice::Auto);
        assert_eq!(some.for_port(8443), PathChoice::Auto);
        let err = path("a/b", Some("kernel"), &spec).expect_err("no such path");
        assert_eq!(
            err.to_string(),
            "service a/b: annotation hairpin.dev/path is \"kernel\"; expected auto, relay, or \
             PORT=auto|relay entries separated by commas, PORT a TCP port number or name in \
             spec.ports (the Service has 80/http, 443/https): \"kernel\" is not PORT=auto|relay"
        );
        let err = path("a/b", Some("443=off"), &spec).expect_err("bad word");
        assert!(
            err.to_string()
                .ends_with(": \"off\" is neither auto nor relay"),
            "{err}"
        );
        let err = path("a/b", Some("dns=relay"), &spec).expect_err("udp");
        assert!(
            err.to_string()
                .ends_with(": \"dns\" is not a TCP port of the Service"),
            "{err}"
        );
        assert!(matches!(
            path("a/b", Some("443=relay,"), &spec),
            Err(AnnotationError::Path { .. })
        ));
        // A value far past the Event's room is quoted in part.
        let long = format!("443={}", "r".repeat(500));
        let err = path("a/b", Some(&long), &spec).expect_err("long");
        assert!(err.to_string().len() < 600, "{err}");
    }

    #[test]
    fn ports_by_number_or_name_prefer_tcp_and_reject_the_rest() {
        let spec = [
            port("dns-tcp", 53, None),
            port("dns", 53, Some("UDP")),
            port("https", 443, Some("TCP")),
            port("q", 853, Some("UDP")),
        ];
        let got = ports("a/b", Some("53, https"), &spec).expect("valid");
        assert_eq!(got, Some([53, 443].into_iter().collect()));
        let err = ports("a/b", Some("q"), &spec).expect_err("udp");
        assert_eq!(
            err.to_string(),
            "service a/b: annotation hairpin.dev/ports lists \"q\", a UDP port; hairpin proxies TCP ports only"
        );
        assert!(matches!(
            ports("a/b", Some("443,"), &spec),
            Err(AnnotationError::EmptyPortEntry { .. })
        ));
        assert!(matches!(
            ports("a/b", Some("70000"), &spec),
            Err(AnnotationError::UnknownPort { .. })
        ));
    }
}
