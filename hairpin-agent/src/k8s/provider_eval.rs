//! Reading the provider table against one Service: which of its TCP ports the provider's load
//! balancer sends a PROXY header on, and which version.

use std::collections::BTreeMap;

use crate::frontends::ProxyVersion;

use super::providers::{
    Confidence, PROVIDER_ANNOTATIONS, ProviderAnnotation, ValueRule, aws_is_nlb,
};

/// What the provider annotations present on a Service say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSelection {
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

/// Applies one row's value to one port, as the provider's CCM would.
fn speak(row: &ProviderAnnotation, value: &str, port: i32, aws_nlb: bool) -> Result<Speak, String> {
    let on_or_off = |on: bool, version| if on { Speak::On(version) } else { Speak::Off };
    match row.rule {
        ValueRule::GoBool(version) => go_bool(value.trim())
            .map(|on| on_or_off(on, version))
            .ok_or_else(|| "expected a boolean such as true or false".to_string()),
        ValueRule::Exact(values) => Ok(values
            .iter()
            .find(|(v, _)| *v == value.trim())
            .map_or(Speak::Off, |(_, version)| Speak::On(*version))),
        ValueRule::NoneOrVersion => match value.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Speak::Off),
            "v1" => Ok(Speak::On(ProxyVersion::V1)),
            "v2" => Ok(Speak::On(ProxyVersion::V2)),
            _ => Err("expected none, v1 or v2".to_string()),
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
                        let n: i32 = entry.parse().map_err(|_| {
                            format!(
                                "expected true, false, * or Service port numbers, got {entry:?}"
                            )
                        })?;
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
            let parsed: serde_json::Value =
                serde_json::from_str(value).map_err(|e| format!("expected a JSON object: {e}"))?;
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
pub fn evaluate(
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
                        "service {service}: annotation {key} is {value:?}, which the {provider} controller does not accept ({expected}); hairpin ignores it"
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
mod tests {
    use super::*;

    fn eval(pairs: &[(&str, &str)], class: Option<&str>) -> Option<ProviderSelection> {
        let notes = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        evaluate("ns/svc", &notes, class, &[80, 443])
    }

    fn ports(selection: &ProviderSelection) -> Vec<(i32, ProxyVersion)> {
        selection.ports.iter().map(|(p, v)| (*p, *v)).collect()
    }

    #[test]
    fn no_provider_annotation_means_no_selection() {
        assert_eq!(eval(&[("unrelated/annotation", "true")], None), None);
    }

    #[test]
    fn go_bool_spellings_follow_strconv_parse_bool() {
        for on in ["1", "t", "T", "TRUE", "true", "True"] {
            let s = eval(
                &[("load-balancer.hetzner.cloud/uses-proxyprotocol", on)],
                None,
            )
            .expect("hetzner");
            assert_eq!(s.ports.len(), 2, "{on}");
        }
        let s = eval(
            &[("load-balancer.hetzner.cloud/uses-proxyprotocol", "yes")],
            None,
        )
        .expect("hetzner");
        assert!(s.ports.is_empty());
        assert!(
            s.warnings[0].contains("does not accept"),
            "{:?}",
            s.warnings
        );
    }

    #[test]
    fn aws_star_is_v1_on_classic_elb_and_v2_on_nlb() {
        let key = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
        let classic = eval(&[(key, "*")], None).expect("aws");
        assert_eq!(
            ports(&classic),
            [(80, ProxyVersion::V1), (443, ProxyVersion::V1)]
        );
        let nlb = eval(
            &[
                (key, "*"),
                ("service.beta.kubernetes.io/aws-load-balancer-type", "nlb"),
            ],
            None,
        );
        assert_eq!(nlb.expect("aws").ports[&443], ProxyVersion::V2);
        let class = eval(&[(key, "*")], Some("service.k8s.aws/nlb")).expect("aws");
        assert_eq!(class.ports[&80], ProxyVersion::V2);
    }

    #[test]
    fn scaleway_reads_one_and_zero_as_ports_and_both_lists_conflict() {
        let v1 = "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v1";
        let v2 = "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v2";
        assert!(eval(&[(v1, "1")], None).expect("scw").ports.is_empty());
        let s = eval(&[(v1, "false"), (v2, "*")], None).expect("scw");
        assert_eq!(ports(&s), [(80, ProxyVersion::V2), (443, ProxyVersion::V2)]);
        let both = eval(&[(v1, "80, 443"), (v2, "443")], None).expect("scw");
        assert_eq!(
            ports(&both),
            [(80, ProxyVersion::V1), (443, ProxyVersion::V1)]
        );
        assert!(
            both.warnings
                .iter()
                .any(|w| w.contains("port 443 is PROXY v1")),
            "{:?}",
            both.warnings
        );
    }

    #[test]
    fn linode_per_port_beats_default_beats_deprecated() {
        let s = eval(
            &[
                (
                    "service.beta.kubernetes.io/linode-loadbalancer-port-443",
                    r#"{"proxy-protocol":"v1"}"#,
                ),
                (
                    "service.beta.kubernetes.io/linode-loadbalancer-default-proxy-protocol",
                    "none",
                ),
                (
                    "service.beta.kubernetes.io/linode-loadbalancer-proxy-protocol",
                    "v2",
                ),
            ],
            None,
        )
        .expect("linode");
        assert_eq!(ports(&s), [(443, ProxyVersion::V1)]);
        let bad = eval(
            &[(
                "service.beta.kubernetes.io/linode-loadbalancer-proxy-protocol",
                "v3",
            )],
            None,
        );
        assert!(bad.expect("linode").warnings[0].contains("expected none, v1 or v2"));
    }

    #[test]
    fn ibm_feature_list_and_aws_target_group_attributes() {
        let ibm = eval(
            &[(
                "service.kubernetes.io/ibm-load-balancer-cloud-provider-enable-features",
                "nlb, proxy-protocol",
            )],
            None,
        );
        assert_eq!(ibm.expect("ibm").ports[&80], ProxyVersion::V1);
        let tg = "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
        assert_eq!(
            eval(&[(tg, "stickiness.enabled=true")], None)
                .expect("aws")
                .ports
                .len(),
            0
        );
        assert_eq!(
            eval(&[(tg, "proxy_protocol_v2.enabled=true")], None)
                .expect("aws")
                .ports[&443],
            ProxyVersion::V2
        );
    }

    #[test]
    fn several_providers_and_unconfirmed_versions_warn() {
        let s = eval(
            &[
                (
                    "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol",
                    "true",
                ),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol",
                    "*",
                ),
            ],
            None,
        )
        .expect("two providers");
        assert_eq!(s.provider, "DigitalOcean");
        assert!(
            s.warnings[0].contains("DigitalOcean, AWS"),
            "{:?}",
            s.warnings
        );
        let vultr = eval(
            &[(
                "service.beta.kubernetes.io/vultr-loadbalancer-proxy-protocol",
                "true",
            )],
            None,
        );
        assert!(vultr.expect("vultr").warnings[0].contains("not confirmed"));
    }

    #[test]
    fn every_row_is_documented() {
        for row in PROVIDER_ANNOTATIONS {
            assert!(row.source.starts_with("https://"), "{}", row.key);
            assert!(
                !row.on_values.is_empty() && !row.version.is_empty(),
                "{}",
                row.key
            );
        }
    }
}
