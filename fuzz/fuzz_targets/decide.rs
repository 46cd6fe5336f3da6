//! The per-Service decision (`k8s::decide`) over Services with arbitrary, mostly
//! malformed annotations (hairpin's own and every provider's in the table), ports
//! and load-balancer status.
//!
//! Invariants:
//! - never panics; the decision names the Service (`namespace/name`);
//! - an invalid hairpin annotation is `Invalid` with a message naming the Service,
//!   the annotation and what was expected, whole in the Event (values are quoted
//!   as excerpts), and nothing is proxied;
//! - every warning names the Service; every skip outcome carries a skip with its
//!   reason, so the Event says why; the summary fits an Event (1 KiB);
//! - a proxied frontend is one of the Service's TCP ports (1..=65535) on an
//!   ingress IP without `ipMode: Proxy`, attributed to the Service, sorted, unique;
//! - `hairpin.dev/proxy-protocol: off` proxies nothing; `v1`/`v2` fixes the version.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::{Result, Unstructured};
use hairpin_agent::{
    ProxyVersion,
    k8s::{
        Defaults, Outcome, PORTS_ANNOTATION, PROVIDER_ANNOTATIONS, PROXY_PROTOCOL_ANNOTATION,
        ValueRule, builtin_refusal, decide, port_protocol, service_key,
    },
};
use k8s_openapi::{
    api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use libfuzzer_sys::fuzz_target;

const VALUES: &[&str] = &[
    "true",
    "false",
    "True",
    "1",
    "0",
    "t",
    "yes",
    "*",
    "v1",
    "v2",
    " V2 ",
    "v3",
    "none",
    "off",
    "OFF",
    "80",
    "443",
    "80,443",
    "80, https",
    "80,,443",
    ",",
    "",
    " ",
    "http",
    "-1",
    "70000",
    "{\"proxy-protocol\":\"v2\"}",
    "{\"proxy-protocol\":\"v9\"}",
    "{\"proxy-protocol\":2}",
    "{",
    "[]",
    "proxy_protocol_v2.enabled=true",
    "proxy_protocol_v2.enabled=false,x=y",
    "=",
    "proxy-protocol",
    "proxy-protocol,foo",
    "nlb",
    "external",
    "v1\n",
    "\u{0}",
    "ünï",
];

/// A value from the list above, or any string.
fn value(u: &mut Unstructured) -> Result<String> {
    if u.ratio(3, 4)? {
        Ok(u.choose(VALUES)?.to_string())
    } else {
        u.arbitrary()
    }
}

/// Any string, cut to `max` bytes: for fields the API server bounds (names 253,
/// namespaces 63, port names 15), so messages about them fit an Event.
fn bounded(u: &mut Unstructured, max: usize) -> Result<String> {
    let mut s: String = u.arbitrary()?;
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    Ok(s)
}

fn key(u: &mut Unstructured) -> Result<String> {
    Ok(match u.int_in_range(0..=9)? {
        0..=1 => PROXY_PROTOCOL_ANNOTATION.to_string(),
        2 => PORTS_ANNOTATION.to_string(),
        3 => "service.beta.kubernetes.io/aws-load-balancer-type".to_string(),
        4 => u.arbitrary()?,
        _ => {
            let row = u.choose(PROVIDER_ANNOTATIONS)?;
            if row.rule == ValueRule::LinodePortJson {
                format!(
                    "{}{}",
                    row.key,
                    u.choose(&["80", "443", "53", "0", "-1", "x"])?
                )
            } else {
                row.key.to_string()
            }
        }
    })
}

fn port(u: &mut Unstructured) -> Result<ServicePort> {
    let number = if u.ratio(4, 5)? {
        *u.choose(&[80, 443, 53, 8080, 0, -1, 65535, 65536, i32::MIN, i32::MAX])?
    } else {
        u.arbitrary()?
    };
    let name = match u.int_in_range(0..=4)? {
        0 => None,
        1 => Some("http".to_string()),
        2 => Some("https".to_string()),
        3 => Some("dns".to_string()),
        _ => Some(bounded(u, 15)?),
    };
    let protocol = match u.int_in_range(0..=5)? {
        0 | 1 => None,
        2 => Some("TCP".to_string()),
        3 => Some("UDP".to_string()),
        4 => Some("SCTP".to_string()),
        _ => Some(bounded(u, 16)?),
    };
    Ok(ServicePort {
        name,
        port: number,
        protocol,
        ..ServicePort::default()
    })
}

fn ingress(u: &mut Unstructured) -> Result<LoadBalancerIngress> {
    let ip = match u.int_in_range(0..=6)? {
        0 => None,
        1 | 2 => Some("203.0.113.10".to_string()),
        3 => Some("2001:db8::10".to_string()),
        4 => Some("::ffff:198.51.100.1".to_string()),
        5 => Some("not-an-ip".to_string()),
        _ => Some(u.arbitrary()?),
    };
    let hostname = match u.int_in_range(0..=2)? {
        0 | 1 => None,
        _ => Some("lb.example.com".to_string()),
    };
    let ip_mode = match u.int_in_range(0..=4)? {
        0 | 1 => None,
        2 => Some("VIP".to_string()),
        3 => Some("Proxy".to_string()),
        _ => Some(u.arbitrary()?),
    };
    Ok(LoadBalancerIngress {
        ip,
        hostname,
        ip_mode,
        ..LoadBalancerIngress::default()
    })
}

fn service(u: &mut Unstructured) -> Result<(Service, Defaults)> {
    let mut notes = BTreeMap::new();
    for _ in 0..u.int_in_range(0..=6)? {
        notes.insert(key(u)?, value(u)?);
    }
    let ports = (0..u.int_in_range(0..=4)?)
        .map(|_| port(u))
        .collect::<Result<Vec<_>>>()?;
    let ingress = (0..u.int_in_range(0..=3)?)
        .map(|_| ingress(u))
        .collect::<Result<Vec<_>>>()?;
    let type_ = match u.int_in_range(0..=5)? {
        0..=2 => Some("LoadBalancer".to_string()),
        3 => None,
        4 => Some("NodePort".to_string()),
        _ => Some(u.arbitrary()?),
    };
    let class = match u.int_in_range(0..=3)? {
        0 => Some("service.k8s.aws/nlb".to_string()),
        1 => Some(u.arbitrary()?),
        _ => None,
    };
    let service = Service {
        metadata: ObjectMeta {
            name: Some(bounded(u, 253)?),
            namespace: if u.arbitrary()? {
                Some(bounded(u, 63)?)
            } else {
                None
            },
            annotations: u.arbitrary::<bool>()?.then_some(notes),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_,
            ports: Some(ports),
            load_balancer_class: class,
            ..ServiceSpec::default()
        }),
        status: Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(ingress),
            }),
            ..ServiceStatus::default()
        }),
    };
    let proxy_protocol = *u.choose(&[None, Some(ProxyVersion::V1), Some(ProxyVersion::V2)])?;
    Ok((
        service,
        Defaults {
            proxy_protocol,
            ..Defaults::default()
        },
    ))
}

fuzz_target!(|data: &[u8]| {
    let Ok((svc, defaults)) = service(&mut Unstructured::new(data)) else {
        return;
    };
    let decision = decide(&svc, &defaults);
    let key = service_key(&svc);
    assert_eq!(decision.service.to_string(), key);
    let summary = decision.summary();
    assert!(!summary.is_empty() && summary.len() <= 1024, "{summary:?}");
    for warning in &decision.warnings {
        assert!(
            warning.starts_with(&format!("service {key}")),
            "{warning:?}"
        );
    }
    let notes = svc.metadata.annotations.clone().unwrap_or_default();
    let ours = notes
        .get(PROXY_PROTOCOL_ANNOTATION)
        .map(|v| v.trim().to_ascii_lowercase());
    match &decision.outcome {
        Outcome::Invalid(error) => {
            let msg = error.to_string();
            assert!(
                msg.starts_with(&format!("service {key}: annotation hairpin.dev/")),
                "{msg}"
            );
            assert!(decision.frontends.is_empty());
            assert!(
                [
                    "expected",
                    "which is not a port number or name",
                    "hairpin proxies TCP ports only"
                ]
                .iter()
                .any(|what| msg.contains(what)),
                "{msg}"
            );
            // Values are quoted in excerpts, so the whole message, with what was
            // expected at its end, fits the Event.
            assert_eq!(summary, format!("hairpin skips this Service: {msg}"));
        }
        Outcome::Skipped(reason) => {
            assert!(decision.frontends.is_empty());
            assert!(
                decision.skips.iter().any(|s| s.reason == *reason),
                "no skip says why ({reason:?}): {decision:#?}"
            );
        }
        Outcome::Proxied => {
            assert!(!decision.frontends.is_empty());
            assert_ne!(ours.as_deref(), Some("off"));
            let spec_ports = svc
                .spec
                .as_ref()
                .and_then(|s| s.ports.clone())
                .unwrap_or_default();
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.clone())
                .unwrap_or_default();
            for f in &decision.frontends {
                assert!(f.port != 0, "{f:?}");
                assert!(
                    spec_ports
                        .iter()
                        .any(|p| p.port == i32::from(f.port) && port_protocol(p) == "TCP"),
                    "{f:?} is not a TCP port of the Service"
                );
                assert!(
                    ingress.iter().any(|i| {
                        i.ip_mode.as_deref() != Some("Proxy")
                            && i.ip.as_deref().and_then(|ip| ip.parse().ok()) == Some(f.ip)
                    }),
                    "{f:?} is not an ingress IP without ipMode Proxy"
                );
                assert_eq!(
                    builtin_refusal(f.ip),
                    None,
                    "{f:?}: no LoadBalancer has this address"
                );
                assert_eq!(f.source.to_string(), format!("Service {key}"));
                match ours.as_deref() {
                    Some("v1") => assert_eq!(f.version, ProxyVersion::V1),
                    Some("v2") => assert_eq!(f.version, ProxyVersion::V2),
                    _ => {}
                }
            }
            assert!(
                decision
                    .frontends
                    .windows(2)
                    .all(|w| (w[0].ip, w[0].port) < (w[1].ip, w[1].port)),
                "sorted and unique: {:?}",
                decision.frontends
            );
        }
    }
});
