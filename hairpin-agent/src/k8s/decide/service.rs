//! The pure decision for one Service: which (LB IP, TCP port) frontends need a PROXY header.
//!
//! Order of the rules (docs/architecture.md, "The control plane"): type LoadBalancer; our
//! annotations valid; PROXY on by `hairpin.dev/proxy-protocol`, else a provider annotation,
//! else the agent-wide default; LB ingress IPs without `ipMode: Proxy`; TCP ports, narrowed by
//! `hairpin.dev/ports` and, when our annotation is absent, by the provider's own port selection.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::Service;

use crate::model::{Frontend, ProxyVersion};

use super::{
    annotations::{self, OurSetting},
    decision::{Decision, Outcome, Rule, Skip, SkipReason},
    lb_address::LbAddressPolicy,
    provider_eval,
};

/// Agent-wide settings the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// PROXY version for LoadBalancer Services that neither our annotation nor a provider
    /// annotation decides; `None` (the default) leaves them alone.
    pub proxy_protocol: Option<ProxyVersion>,
    /// Which LoadBalancer addresses may be redirected.
    pub addresses: LbAddressPolicy,
}

/// `namespace/name` of a Service; a missing namespace reads as `default`, as kubectl does.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or("")
    )
}

fn skipped(mut decision: Decision, reason: SkipReason, message: String) -> Decision {
    decision.skips.push(Skip { reason, message });
    decision.outcome = Outcome::Skipped(reason);
    decision
}

/// Decides which frontends of `service` need a PROXY header. Pure: no I/O, never panics, and
/// an invalid annotation only affects this Service.
pub fn decide(service: &Service, defaults: &Defaults) -> Decision {
    let key = service_key(service);
    let mut decision = Decision {
        service: key.clone(),
        outcome: Outcome::Proxied,
        frontends: Vec::new(),
        rule: None,
        skips: Vec::new(),
        warnings: Vec::new(),
    };
    let empty = BTreeMap::new();
    let notes = service.metadata.annotations.as_ref().unwrap_or(&empty);
    let spec = service.spec.as_ref();
    let spec_ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or(&[]);

    let service_type = spec.and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP");
    if service_type != "LoadBalancer" {
        if notes.contains_key(annotations::PROXY_PROTOCOL)
            || notes.contains_key(annotations::PORTS)
            || notes.contains_key(annotations::FIRST_SPEAKER)
            || notes.contains_key(annotations::PATH)
        {
            decision.warnings.push(format!(
                "service {key} has hairpin annotations but is of type {service_type}; they only apply to type LoadBalancer"
            ));
        }
        let message = format!("service {key} is of type {service_type}, not LoadBalancer");
        return skipped(decision, SkipReason::NotLoadBalancer, message);
    }

    let ours = match annotations::proxy_protocol(
        &key,
        notes.get(annotations::PROXY_PROTOCOL).map(String::as_str),
    ) {
        Ok(ours) => ours,
        Err(error) => {
            decision.outcome = Outcome::Invalid(error);
            return decision;
        }
    };
    let narrowed = match annotations::ports(
        &key,
        notes.get(annotations::PORTS).map(String::as_str),
        spec_ports,
    ) {
        Ok(narrowed) => narrowed,
        Err(error) => {
            decision.outcome = Outcome::Invalid(error);
            return decision;
        }
    };
    let speakers = match annotations::first_speaker(
        &key,
        notes.get(annotations::FIRST_SPEAKER).map(String::as_str),
        spec_ports,
    ) {
        Ok(speakers) => speakers,
        Err(error) => {
            decision.outcome = Outcome::Invalid(error);
            return decision;
        }
    };
    let paths = match annotations::path(
        &key,
        notes.get(annotations::PATH).map(String::as_str),
        spec_ports,
    ) {
        Ok(paths) => paths,
        Err(error) => {
            decision.outcome = Outcome::Invalid(error);
            return decision;
        }
    };

    let mut tcp_ports = Vec::new();
    for port in spec_ports {
        let protocol = annotations::protocol(port);
        if protocol == "TCP" && !(1..=65535).contains(&port.port) {
            // Kept out here so a Service whose ports are all invalid is skipped with
            // this reason, not reported as proxied with no frontend.
            decision.skips.push(Skip {
                reason: SkipReason::InvalidPort,
                message: format!(
                    "port {} is outside 1-65535; not a TCP port hairpin can proxy",
                    port_label(port)
                ),
            });
        } else if protocol == "TCP" {
            tcp_ports.push(port.port);
        } else {
            decision.skips.push(Skip {
                reason: SkipReason::NotTcp,
                message: format!(
                    "port {} is {protocol}; the PROXY header applies to TCP only",
                    port_label(port)
                ),
            });
        }
    }

    let all = |version| {
        tcp_ports
            .iter()
            .map(|p| (*p, version))
            .collect::<BTreeMap<_, _>>()
    };
    let (rule, mut chosen) = match ours {
        Some(OurSetting::On(version)) => (Rule::Annotation, all(version)),
        Some(OurSetting::Off) => (Rule::Annotation, BTreeMap::new()),
        None => {
            let class = spec.and_then(|s| s.load_balancer_class.as_deref());
            match provider_eval::evaluate(&key, notes, class, &tcp_ports) {
                Some(selection) => {
                    decision.warnings.extend(selection.warnings);
                    let rule = Rule::Provider {
                        provider: selection.provider,
                        annotations: selection.annotations,
                    };
                    (rule, selection.ports)
                }
                None => (
                    Rule::Default,
                    defaults.proxy_protocol.map(all).unwrap_or_default(),
                ),
            }
        }
    };
    if chosen.is_empty() {
        let message = format!("the PROXY protocol is off for service {key}, per {rule}");
        decision.rule = Some(rule);
        return skipped(decision, SkipReason::ProxyProtocolOff, message);
    }
    for port in tcp_ports.iter().filter(|p| !chosen.contains_key(p)) {
        decision.skips.push(Skip {
            reason: SkipReason::PortNotSelected,
            message: format!("port {port}: {rule} does not turn the PROXY protocol on for it"),
        });
    }
    if let Some(selected) = narrowed {
        for port in selected.iter().filter(|p| !chosen.contains_key(p)) {
            decision.warnings.push(format!(
                "service {key}: {} lists port {port}, but {rule} does not turn the PROXY protocol on for it; not proxied",
                annotations::PORTS
            ));
        }
        for port in chosen.keys().filter(|p| !selected.contains(p)) {
            decision.skips.push(Skip {
                reason: SkipReason::PortNotSelected,
                message: format!("port {port} is not listed in {}", annotations::PORTS),
            });
        }
        chosen.retain(|port, _| selected.contains(port));
    }
    decision.rule = Some(rule);

    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[]);
    if ingress.is_empty() {
        let message = format!(
            "service {key} has no status.loadBalancer.ingress yet: the load balancer is not provisioned"
        );
        return skipped(decision, SkipReason::NoLoadBalancerStatus, message);
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut first_skip = None;
    for entry in ingress {
        let (reason, message) = match (entry.ip.as_deref(), entry.hostname.as_deref()) {
            (Some(ip), _) => match ip.parse::<IpAddr>() {
                Err(_) => (
                    SkipReason::InvalidIngressIp,
                    format!("ingress IP {ip:?} is not an IP address"),
                ),
                // kube-proxy programs nothing for ipMode Proxy: pods' connects reach the real
                // LB, which adds the header itself.
                Ok(addr) if entry.ip_mode.as_deref() == Some("Proxy") => (
                    SkipReason::IpModeProxy,
                    format!(
                        "load balancer IP {addr} has ipMode Proxy, so in-cluster traffic already goes through the load balancer"
                    ),
                ),
                Ok(addr) => match defaults.addresses.refusal(addr) {
                    Some(why) => (
                        SkipReason::UnsafeIngressIp,
                        format!("status.loadBalancer.ingress ip {why}: hairpin never redirects it"),
                    ),
                    None => {
                        if !ips.contains(&addr) {
                            ips.push(addr);
                        }
                        continue;
                    }
                },
            },
            (None, Some(host)) => (
                SkipReason::HostnameOnly,
                format!(
                    "load balancer {host} is published as a hostname only, so in-cluster traffic resolves to the load balancer itself"
                ),
            ),
            (None, None) => continue,
        };
        first_skip.get_or_insert(reason);
        decision.skips.push(Skip { reason, message });
    }
    if ips.is_empty() {
        let Some(reason) = first_skip else {
            // Only entries with neither an ip nor a hostname: not provisioned yet.
            let message = format!(
                "service {key} has status.loadBalancer.ingress entries without an ip or hostname: the load balancer is not provisioned"
            );
            return skipped(decision, SkipReason::NoLoadBalancerStatus, message);
        };
        decision.outcome = Outcome::Skipped(reason);
        return decision;
    }
    if chosen.is_empty() {
        let message = format!(
            "service {key} has no TCP port left to proxy after {}",
            annotations::PORTS
        );
        return skipped(decision, SkipReason::NothingToProxy, message);
    }

    let source = format!("Service {key}");
    for ip in ips {
        for (port, version) in &chosen {
            // Ports outside 1..=65535 were skipped above, as InvalidPort.
            let Ok(port) = u16::try_from(*port) else {
                continue;
            };
            decision.frontends.push(Frontend {
                ip,
                port,
                version: *version,
                source: source.clone(),
                first_speaker: speakers.for_port(i32::from(port)),
                path: paths.for_port(i32::from(port)),
            });
        }
    }
    decision.frontends.sort();
    decision
}

fn port_label(port: &k8s_openapi::api::core::v1::ServicePort) -> String {
    match &port.name {
        Some(name) => format!("{}/{name}", port.port),
        None => port.port.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FirstSpeaker, PathChoice};

    fn service(annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "mail", "namespace": "ns", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "http", "port": 80},
                {"name": "smtp", "port": 25},
                {"name": "imap", "port": 143},
            ]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
        }))
        .expect("service")
    }

    fn speakers(d: &Decision) -> Vec<String> {
        d.frontends
            .iter()
            .map(|f| format!("{} {}", f.port, f.first_speaker))
            .collect()
    }

    #[test]
    fn first_speaker_annotation_sets_each_frontend_and_a_bad_one_invalidates_the_service() {
        let pp = |extra: Option<&str>| {
            let mut notes = serde_json::json!({"hairpin.dev/proxy-protocol": "v1"});
            if let Some(v) = extra {
                notes["hairpin.dev/first-speaker"] = v.into();
            }
            decide(&service(notes), &Defaults::default())
        };
        assert_eq!(
            speakers(&pp(None)),
            ["25 client", "80 client", "143 client"]
        );
        assert_eq!(
            speakers(&pp(Some("server"))),
            ["25 server", "80 server", "143 server"]
        );
        assert_eq!(
            speakers(&pp(Some("smtp=server,143=server"))),
            ["25 server", "80 client", "143 server"]
        );
        let bad = pp(Some("pop3=server"));
        assert!(bad.frontends.is_empty());
        match bad.outcome {
            Outcome::Invalid(e) => assert!(
                e.to_string()
                    .contains("\"pop3\" is not a TCP port of the Service"),
                "{e}"
            ),
            other => panic!("expected invalid, got {other:?}"),
        }
        assert!(
            pp(Some("server"))
                .frontends
                .iter()
                .all(|f| f.first_speaker == FirstSpeaker::Server)
        );
    }

    #[test]
    fn path_annotation_sets_each_frontend_and_a_bad_one_invalidates_the_service() {
        let with = |value: Option<&str>| {
            let mut notes = serde_json::json!({"hairpin.dev/proxy-protocol": "v2"});
            if let Some(v) = value {
                notes["hairpin.dev/path"] = v.into();
            }
            decide(&service(notes), &Defaults::default())
        };
        let paths = |d: &Decision| -> Vec<String> {
            d.frontends
                .iter()
                .map(|f| format!("{} {}", f.port, f.path))
                .collect()
        };
        assert_eq!(paths(&with(None)), ["25 auto", "80 auto", "143 auto"]);
        assert_eq!(
            paths(&with(Some("relay"))),
            ["25 relay", "80 relay", "143 relay"]
        );
        assert_eq!(
            paths(&with(Some("http=relay"))),
            ["25 auto", "80 relay", "143 auto"]
        );
        let bad = with(Some("http=kernel"));
        assert!(bad.frontends.is_empty());
        assert_eq!(bad.reason(), "InvalidAnnotation");
        assert!(bad.is_warning());
        assert_eq!(
            bad.summary(),
            "hairpin skips this Service: service ns/mail: annotation hairpin.dev/path is \
             \"http=kernel\"; expected auto, relay, or PORT=auto|relay entries separated by \
             commas, PORT a TCP port number or name in spec.ports (the Service has 80/http, \
             25/smtp, 143/imap): \"kernel\" is neither auto nor relay"
        );
        // Not a LoadBalancer: the annotation is named as one that does not apply.
        let mut cluster_ip = service(serde_json::json!({"hairpin.dev/path": "relay"}));
        if let Some(spec) = cluster_ip.spec.as_mut() {
            spec.type_ = Some("ClusterIP".into());
        }
        let d = decide(&cluster_ip, &Defaults::default());
        assert!(
            d.warnings
                .iter()
                .any(|w| w.contains("has hairpin annotations but is of type ClusterIP")),
            "{:?}",
            d.warnings
        );
        assert!(
            with(Some("relay"))
                .frontends
                .iter()
                .all(|f| f.path == PathChoice::Relay && f.first_speaker == FirstSpeaker::Client)
        );
    }
}
