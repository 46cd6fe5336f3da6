//! Reading the provider table against one Service: which of its TCP ports the provider's load
//! balancer sends a PROXY header on, and which version.

use std::collections::BTreeMap;

use crate::model::ProxyVersion;

use super::annotations::{EXCERPT_MAX, excerpt};
use super::providers::{
    Confidence, PROVIDER_ANNOTATIONS, ProviderAnnotation, ValueRule, aws_is_nlb,
};

/// What the provider annotations present on a Service say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProviderSelection {
    /// The provider whose annotations decided.
    pub provider: &'static str,
    /// The annotation keys of that provider found on the Service.
    pub annotations: Vec<String>,
    /// Service port -> version, for the TCP ports the provider turns PROXY on for.
    pub ports: BTreeMap<i32, ProxyVersion>,
    /// Things an operator should know: unparseable values, disagreeing providers, unconfirmed versions.
    pub warnings: Vec<String>,
}

/// What one row says about one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Speak {
    On(ProxyVersion),
    Off,
    /// The row does not mention this port (a port list without it, or an absent key).
    Silent,
}

/// Go's `strconv.ParseBool`, which most CCMs use for boolean annotations.
fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The value a row reads for `port`, and the key it was found under.
fn row_value<'a>(
    row: &ProviderAnnotation,
    annotations: &'a BTreeMap<String, String>,
    port: i32,
) -> Option<(String, &'a str)> {
    let key = match row.rule {
        ValueRule::LinodePortJson => format!("{}{port}", row.key),
        _ => row.key.to_string(),
    };
    annotations.get(&key).map(|v| (key, v.as_str()))
}

/// What a provider's controller would have expected of a value it refuses.
#[derive(Debug, thiserror::Error)]
enum Refused {
    /// Not a Go boolean.
    #[error("expected a boolean such as true or false")]
    Bool,
    /// Not `none`, `v1` nor `v2`.
    #[error("expected none, v1 or v2")]
    NoneOrVersion,
    /// A list entry that is not a port number.
    #[error("expected true, false, * or Service port numbers, got {0:?}")]
    PortList(String),
    /// Not JSON: the parser's error.
    #[error("expected a JSON object: {0}")]
    Json(#[source] serde_json::Error),
}

/// Applies one row's value to one port, as the provider's CCM would.
fn speak(
    row: &ProviderAnnotation,
    value: &str,
    port: i32,
    aws_nlb: bool,
) -> Result<Speak, Refused> {
    let on_or_off = |on: bool, version| if on { Speak::On(version) } else { Speak::Off };
    match row.rule {
        ValueRule::GoBool(version) => go_bool(value.trim())
            .map(|on| on_or_off(on, version))
            .ok_or(Refused::Bool),
        ValueRule::Exact(values) => Ok(values
            .iter()
            .find(|(v, _)| *v == value.trim())
            .map_or(Speak::Off, |(_, version)| Speak::On(*version))),
        ValueRule::NoneOrVersion => match value.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Speak::Off),
            "v1" => Ok(Speak::On(ProxyVersion::V1)),
            "v2" => Ok(Speak::On(ProxyVersion::V2)),
            _ => Err(Refused::NoneOrVersion),
        },
        ValueRule::BoolStarOrPorts(version) => {
            let value = value.trim();
            // Scaleway reads "1" and "0" as port numbers, not booleans.
            if let Some(on) = go_bool(value).filter(|_| value != "1" && value != "0") {
                // "false" only means this annotation enables nothing; another may.
                return Ok(if on {
                    Speak::On(version)
                } else {
                    Speak::Silent
                });
            }
            match value {
                "*" => Ok(Speak::On(version)),
                "" => Ok(Speak::Silent),
                list => {
                    let mut listed = false;
                    for entry in list.split(',').map(str::trim) {
                        let n: i32 = entry
                            .parse()
                            .map_err(|_| Refused::PortList(excerpt(entry, EXCERPT_MAX)))?;
                        listed |= n == port;
                    }
                    Ok(if listed {
                        Speak::On(version)
                    } else {
                        Speak::Silent
                    })
                }
            }
        }
        ValueRule::FeatureToken(token, version) => Ok(on_or_off(
            value.split(',').any(|f| f.trim() == token),
            version,
        )),
        ValueRule::AwsStar => Ok(if value.trim() == "*" {
            Speak::On(if aws_nlb {
                ProxyVersion::V2
            } else {
                ProxyVersion::V1
            })
        } else {
            Speak::Off
        }),
        ValueRule::AwsTargetGroupAttributes => {
            let enabled = value
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .find_map(|(k, v)| {
                    (k.trim() == "proxy_protocol_v2.enabled").then(|| v.trim() == "true")
                });
            Ok(match enabled {
                Some(on) => on_or_off(on, ProxyVersion::V2),
                None => Speak::Silent,
            })
        }
        ValueRule::LinodePortJson => {
            let parsed: serde_json::Value = serde_json::from_str(value).map_err(Refused::Json)?;
            match parsed
                .get("proxy-protocol")
                .and_then(serde_json::Value::as_str)
            {
                None => Ok(Speak::Silent),
                Some(pp) => speak(
                    &ProviderAnnotation {
                        rule: ValueRule::NoneOrVersion,
                        ..*row
                    },
                    pp,
                    port,
                    aws_nlb,
                ),
            }
        }
    }
}

/// Evaluates the provider table for a Service whose TCP ports are `tcp_ports`.
/// Returns `None` when no provider annotation is present.
pub(crate) fn evaluate(
    service: &str,
    annotations: &BTreeMap<String, String>,
    load_balancer_class: Option<&str>,
    tcp_ports: &[i32],
) -> Option<ProviderSelection> {
    let present = |row: &ProviderAnnotation| {
        tcp_ports
            .iter()
            .any(|p| row_value(row, annotations, *p).is_some())
            || (row.rule != ValueRule::LinodePortJson && annotations.contains_key(row.key))
    };
    let mut providers: Vec<&'static str> = Vec::new();
    for row in PROVIDER_ANNOTATIONS.iter().filter(|r| present(r)) {
        if !providers.contains(&row.provider) {
            providers.push(row.provider);
        }
    }
    let provider = *providers.first()?;
    let mut selection = ProviderSelection {
        provider,
        annotations: Vec::new(),
        ports: BTreeMap::new(),
        warnings: Vec::new(),
    };
    if providers.len() > 1 {
        selection.warnings.push(format!(
            "service {service} carries PROXY-protocol annotations of several providers ({}); following {provider}, the first in hairpin's table; set hairpin.dev/proxy-protocol to decide explicitly",
            providers.join(", ")
        ));
    }
    let aws_nlb = aws_is_nlb(annotations, load_balancer_class);
    let rows: Vec<&ProviderAnnotation> = PROVIDER_ANNOTATIONS
        .iter()
        .filter(|r| r.provider == provider)
        .collect();
    for &port in tcp_ports {
        let mut decided: Option<(Speak, String)> = None;
        for row in &rows {
            let Some((key, value)) = row_value(row, annotations, port) else {
                continue;
            };
            if !selection.annotations.contains(&key) {
                selection.annotations.push(key.clone());
            }
            let said = match speak(row, value, port, aws_nlb) {
                Ok(said) => said,
                Err(expected) => {
                    let warning = format!(
                        "service {service}: annotation {key} is {:?}, which the {provider} controller does not accept ({expected}); hairpin ignores it",
                        excerpt(value, EXCERPT_MAX)
                    );
                    if !selection.warnings.contains(&warning) {
                        selection.warnings.push(warning);
                    }
                    continue;
                }
            };
            match (&decided, said) {
                (_, Speak::Silent) => {}
                (None, _) => {
                    if let (Speak::On(_), Confidence::Unconfirmed) = (said, row.confidence) {
                        let warning = format!(
                            "service {service}: the PROXY version {provider} sends for {key} is not confirmed (assumed {}); set hairpin.dev/proxy-protocol to be sure",
                            row.version
                        );
                        if !selection.warnings.contains(&warning) {
                            selection.warnings.push(warning);
                        }
                    }
                    decided = Some((said, key));
                }
                (Some((Speak::On(first), first_key)), Speak::On(later)) if *first != later => {
                    // Scaleway's CCM rejects a port in both its v1 and v2 lists; hairpin keeps
                    // the first and says so rather than guessing silently.
                    selection.warnings.push(format!(
                        "service {service}: port {port} is PROXY {first} by {first_key} but {later} by {key}; using {first}"
                    ));
                }
                _ => {}
            }
        }
        if let Some((Speak::On(version), _)) = decided {
            selection.ports.insert(port, version);
        }
    }
    Some(selection)
}

#[cfg(test)]
mod tests;
