//! hairpin's own annotations on a Service, parsed and validated.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ServicePort;
use thiserror::Error;

use crate::model::ProxyVersion;

/// `v1 | v2 | off`: overrides provider annotations and the default for this Service.
pub const PROXY_PROTOCOL: &str = "hairpin.dev/proxy-protocol";
/// Comma-separated Service port numbers or names: only these ports are proxied.
pub const PORTS: &str = "hairpin.dev/ports";

/// Most bytes of an annotation value (or one of its entries) quoted in a message:
/// the Event that carries it holds 1 KiB, and what was expected must still fit.
pub const EXCERPT_MAX: usize = 64;
/// Most bytes of the Service's port list quoted in a message.
const KNOWN_PORTS_MAX: usize = 256;

/// `value` cut to `max` bytes on a character boundary, with `...` when cut, for
/// quoting in a message.
pub fn excerpt(value: &str, max: usize) -> String {
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
pub enum OurSetting {
    /// Proxy with this version.
    On(ProxyVersion),
    /// Do not proxy, whatever the provider annotations say.
    Off,
}

/// Parses `hairpin.dev/proxy-protocol`; `None` when absent.
pub fn proxy_protocol(
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

/// A port's protocol, `TCP` when absent (the API server's default).
pub fn protocol(port: &ServicePort) -> &str {
    port.protocol.as_deref().unwrap_or("TCP")
}

/// Parses `hairpin.dev/ports` against the Service's ports into the set of selected TCP port
/// numbers; `None` when absent (every TCP port).
pub fn ports(
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
