//! The pure decision for one Service: which (LB IP, TCP port) frontends need a PROXY header.
//!
//! Order of the rules (docs/architecture.md, "The control plane"): type LoadBalancer; our
//! annotations valid; PROXY on by `hairpin.dev/proxy-protocol`, else a provider annotation,
//! else the agent-wide default; LB ingress IPs without `ipMode: Proxy`; TCP ports, narrowed by
//! `hairpin.dev/ports` and, when our annotation is absent, by the provider's own port selection.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service, ServicePort, ServiceSpec};

use crate::model::{Frontend, Origin, ProxyVersion, ServiceName};

use super::{
    annotations::{self, AnnotationError, FirstSpeakers, OurSetting, Paths},
    decision::{Decision, Outcome, Rule, Skip, SkipReason},
    lb_address::LbAddressPolicy,
    provider_eval,
};

/// `--max-frontends-per-namespace`'s default: a Service of a thousand ports fits,
/// and sixteen such namespaces fill the default frontends map.
pub(crate) const DEFAULT_MAX_FRONTENDS_PER_NAMESPACE: usize = 4096;

/// How many frontends (LoadBalancer (IP, port) pairs) one namespace and all may
/// have. Applied as [`crate::names::caps`] applies the name caps: per namespace the
/// oldest Services' frontends first; in all, round robin between namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontendCaps {
    /// `--max-frontends-per-namespace`.
    pub per_namespace: usize,
    /// `--max-frontends` (the kernel map's capacity).
    pub total: usize,
}

impl Default for FrontendCaps {
    fn default() -> Self {
        FrontendCaps {
            per_namespace: DEFAULT_MAX_FRONTENDS_PER_NAMESPACE,
            total: hairpin_ebpf::MAX_FRONTENDS as usize,
        }
    }
}

/// Agent-wide settings the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// PROXY version for LoadBalancer Services that neither our annotation nor a provider
    /// annotation decides; `None` (the default) leaves them alone.
    pub proxy_protocol: Option<ProxyVersion>,
    /// Which LoadBalancer addresses may be redirected.
    pub addresses: LbAddressPolicy,
    /// How many frontends one namespace, and all, may have.
    pub frontend_caps: FrontendCaps,
}

/// A Service's name; a missing namespace reads as `default`, as kubectl does.
pub(crate) fn service_name(service: &Service) -> ServiceName {
    ServiceName::new(
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or(""),
    )
}

/// `namespace/name` of a Service, for messages (see [`service_name`]).
pub fn service_key(service: &Service) -> String {
    service_name(service).to_string()
}

/// Records that `decision` ends here, skipped for `reason`.
fn skip(decision: &mut Decision, reason: SkipReason, message: String) {
    decision.skips.push(Skip { reason, message });
    decision.outcome = Outcome::Skipped(reason);
}

/// What one step of [`decide`] leaves to the next, or `None` when the decision
/// is final (its outcome already set).
type Next<T> = Option<T>;

/// Decides which frontends of `service` need a PROXY header. Pure: no I/O, never panics, and
/// an invalid annotation only affects this Service.
///
/// The steps, in the order of the module docs: the type, our annotations, the TCP
/// ports, the rule and the versions it chooses, the LB addresses, the frontends.
pub fn decide(service: &Service, defaults: &Defaults) -> Decision {
    let name = service_name(service);
    let input = Input {
        key: name.to_string(),
        notes: service.metadata.annotations.as_ref(),
        spec: service.spec.as_ref(),
    };
    let mut decision = Decision::new(name);
    let d = &mut decision;
    let Some(()) = load_balancer_type(&input, d) else {
        return decision;
    };
    let Some(ours) = our_annotations(&input, d) else {
        return decision;
    };
    let tcp_ports = tcp_ports(input.ports(), d);
    let Some(chosen) = versions(&input, ours.proxy_protocol, &tcp_ports, defaults, d) else {
        return decision;
    };
    let chosen = narrow_to_listed(&input, chosen, ours.ports.as_ref(), d);
    let Some(ips) = load_balancer_ips(service, &input.key, defaults, d) else {
        return decision;
    };
    if chosen.is_empty() {
        let message = format!(
            "service {} has no TCP port left to proxy after {}",
            input.key,
            annotations::PORTS
        );
        skip(d, SkipReason::NothingToProxy, message);
        return decision;
    }
    decision.frontends = frontends(&decision.service, &ips, &chosen, &ours);
    decision
}

/// What every step reads of the Service.
struct Input<'a> {
    /// `namespace/name`, for messages.
    key: String,
    notes: Option<&'a BTreeMap<String, String>>,
    spec: Option<&'a ServiceSpec>,
}

impl Input<'_> {
    fn note(&self, key: &str) -> Option<&str> {
        self.notes.and_then(|n| n.get(key)).map(String::as_str)
    }

    fn has_note(&self, key: &str) -> bool {
        self.notes.is_some_and(|n| n.contains_key(key))
    }

    fn ports(&self) -> &[ServicePort] {
        self.spec.and_then(|s| s.ports.as_deref()).unwrap_or(&[])
    }
}

/// Step 1: only type LoadBalancer; our annotations on another type are a warning.
fn load_balancer_type(input: &Input<'_>, d: &mut Decision) -> Next<()> {
    let key = &input.key;
    let service_type = input
        .spec
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP");
    if service_type == "LoadBalancer" {
        return Some(());
    }
    if [
        annotations::PROXY_PROTOCOL,
        annotations::PORTS,
        annotations::FIRST_SPEAKER,
        annotations::PATH,
    ]
    .iter()
    .any(|a| input.has_note(a))
    {
        d.warnings.push(format!(
            "service {key} has hairpin annotations but is of type {service_type}; they only apply to type LoadBalancer"
        ));
    }
    let message = format!("service {key} is of type {service_type}, not LoadBalancer");
    skip(d, SkipReason::NotLoadBalancer, message);
    None
}

/// Our annotations, parsed.
struct Ours {
    proxy_protocol: Option<OurSetting>,
    ports: Option<BTreeSet<i32>>,
    speakers: FirstSpeakers,
    paths: Paths,
}

/// Step 2: our annotations; the first invalid one makes the Service invalid.
fn our_annotations(input: &Input<'_>, d: &mut Decision) -> Next<Ours> {
    match parse_ours(input) {
        Ok(ours) => Some(ours),
        Err(error) => {
            d.outcome = Outcome::Invalid(error);
            None
        }
    }
}

/// Our annotations in the order they are checked.
fn parse_ours(input: &Input<'_>) -> Result<Ours, AnnotationError> {
    let (key, ports) = (input.key.as_str(), input.ports());
    Ok(Ours {
        proxy_protocol: annotations::proxy_protocol(key, input.note(annotations::PROXY_PROTOCOL))?,
        ports: annotations::ports(key, input.note(annotations::PORTS), ports)?,
        speakers: annotations::first_speaker(key, input.note(annotations::FIRST_SPEAKER), ports)?,
        paths: annotations::path(key, input.note(annotations::PATH), ports)?,
    })
}

/// Step 3: the TCP ports; other protocols and numbers outside 1-65535 are skips.
fn tcp_ports(spec_ports: &[ServicePort], d: &mut Decision) -> Vec<i32> {
    let mut tcp_ports = Vec::new();
    for port in spec_ports {
        let protocol = annotations::protocol(port);
        if protocol == "TCP" && !(1..=65535).contains(&port.port) {
            // Kept out here so a Service whose ports are all invalid is skipped with
            // this reason, not reported as proxied with no frontend.
            d.skips.push(Skip {
                reason: SkipReason::InvalidPort,
                message: format!(
                    "port {} is outside 1-65535; not a TCP port hairpin can proxy",
                    port_label(port)
                ),
            });
        } else if protocol == "TCP" {
            tcp_ports.push(port.port);
        } else {
            d.skips.push(Skip {
                reason: SkipReason::NotTcp,
                message: format!(
                    "port {} is {protocol}; the PROXY header applies to TCP only",
                    port_label(port)
                ),
            });
        }
    }
    tcp_ports
}

/// Step 4: the rule that decides (ours, a provider's, the default) and the version
/// it gives each TCP port; a rule that turns PROXY off ends the decision.
fn versions(
    input: &Input<'_>,
    ours: Option<OurSetting>,
    tcp_ports: &[i32],
    defaults: &Defaults,
    d: &mut Decision,
) -> Next<BTreeMap<i32, ProxyVersion>> {
    let all = |version| {
        tcp_ports
            .iter()
            .map(|p| (*p, version))
            .collect::<BTreeMap<_, _>>()
    };
    let (rule, chosen) = match ours {
        Some(OurSetting::On(version)) => (Rule::Annotation, all(version)),
        Some(OurSetting::Off) => (Rule::Annotation, BTreeMap::new()),
        None => {
            let class = input.spec.and_then(|s| s.load_balancer_class.as_deref());
            let empty = BTreeMap::new();
            let notes = input.notes.unwrap_or(&empty);
            match provider_eval::evaluate(&input.key, notes, class, tcp_ports) {
                Some(selection) => {
                    d.warnings.extend(selection.warnings);
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
        let message = format!(
            "the PROXY protocol is off for service {}, per {rule}",
            input.key
        );
        d.rule = Some(rule);
        skip(d, SkipReason::ProxyProtocolOff, message);
        return None;
    }
    for port in tcp_ports.iter().filter(|p| !chosen.contains_key(p)) {
        d.skips.push(Skip {
            reason: SkipReason::PortNotSelected,
            message: format!("port {port}: {rule} does not turn the PROXY protocol on for it"),
        });
    }
    d.rule = Some(rule);
    Some(chosen)
}

/// Step 5: `hairpin.dev/ports` narrows the ports the rule chose; a listed port the
/// rule left off is a warning.
fn narrow_to_listed(
    input: &Input<'_>,
    mut chosen: BTreeMap<i32, ProxyVersion>,
    listed: Option<&BTreeSet<i32>>,
    d: &mut Decision,
) -> BTreeMap<i32, ProxyVersion> {
    let Some(selected) = listed else {
        return chosen;
    };
    let rule = d.rule.as_ref().map_or(String::new(), ToString::to_string);
    for port in selected.iter().filter(|p| !chosen.contains_key(p)) {
        d.warnings.push(format!(
            "service {}: {} lists port {port}, but {rule} does not turn the PROXY protocol on for it; not proxied",
            input.key,
            annotations::PORTS
        ));
    }
    for port in chosen.keys().filter(|p| !selected.contains(p)) {
        d.skips.push(Skip {
            reason: SkipReason::PortNotSelected,
            message: format!("port {port} is not listed in {}", annotations::PORTS),
        });
    }
    chosen.retain(|port, _| selected.contains(port));
    chosen
}

/// Step 6: the LoadBalancer IPs that may be redirected; each ingress entry left out
/// is a skip, and none left ends the decision with the first skip's reason.
fn load_balancer_ips(
    service: &Service,
    key: &str,
    defaults: &Defaults,
    d: &mut Decision,
) -> Next<Vec<IpAddr>> {
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
        skip(d, SkipReason::NoLoadBalancerStatus, message);
        return None;
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut first_skip = None;
    for entry in ingress {
        let (reason, message) = match ingress_ip(entry, defaults) {
            Ok(Some(addr)) => {
                if !ips.contains(&addr) {
                    ips.push(addr);
                }
                continue;
            }
            Ok(None) => continue,
            Err(skipped) => skipped,
        };
        first_skip.get_or_insert(reason);
        d.skips.push(Skip { reason, message });
    }
    if !ips.is_empty() {
        return Some(ips);
    }
    match first_skip {
        Some(reason) => d.outcome = Outcome::Skipped(reason),
        // Only entries with neither an ip nor a hostname: not provisioned yet.
        None => skip(
            d,
            SkipReason::NoLoadBalancerStatus,
            format!(
                "service {key} has status.loadBalancer.ingress entries without an ip or hostname: the load balancer is not provisioned"
            ),
        ),
    }
    None
}

/// One ingress entry: its IP when it may be redirected, `None` when it has neither
/// an ip nor a hostname, or why it is left out.
fn ingress_ip(
    entry: &LoadBalancerIngress,
    defaults: &Defaults,
) -> Result<Option<IpAddr>, (SkipReason, String)> {
    match (entry.ip.as_deref(), entry.hostname.as_deref()) {
        (Some(ip), _) => match ip.parse::<IpAddr>() {
            Err(_) => Err((
                SkipReason::InvalidIngressIp,
                format!("ingress IP {ip:?} is not an IP address"),
            )),
            // kube-proxy programs nothing for ipMode Proxy: pods' connects reach the real
            // LB, which adds the header itself.
            Ok(addr) if entry.ip_mode.as_deref() == Some("Proxy") => Err((
                SkipReason::IpModeProxy,
                format!(
                    "load balancer IP {addr} has ipMode Proxy, so in-cluster traffic already goes through the load balancer"
                ),
            )),
            Ok(addr) => match defaults.addresses.refusal(addr) {
                Some(why) => Err((
                    SkipReason::UnsafeIngressIp,
                    format!("status.loadBalancer.ingress ip {why}: hairpin never redirects it"),
                )),
                None => Ok(Some(addr)),
            },
        },
        (None, Some(host)) => Err((
            SkipReason::HostnameOnly,
            format!(
                "load balancer {host} is published as a hostname only, so in-cluster traffic resolves to the load balancer itself"
            ),
        )),
        (None, None) => Ok(None),
    }
}

/// Step 7: one frontend per (LB IP, chosen port), sorted.
fn frontends(
    name: &ServiceName,
    ips: &[IpAddr],
    chosen: &BTreeMap<i32, ProxyVersion>,
    ours: &Ours,
) -> Vec<Frontend> {
    let source = Origin::Service(name.clone());
    let mut out = Vec::new();
    for ip in ips {
        for (port, version) in chosen {
            // Ports outside 1..=65535 were skipped above, as InvalidPort.
            let Ok(port) = u16::try_from(*port) else {
                continue;
            };
            out.push(Frontend {
                ip: *ip,
                port,
                version: *version,
                source: source.clone(),
                first_speaker: ours.speakers.for_port(i32::from(port)),
                path: ours.paths.for_port(i32::from(port)),
            });
        }
    }
    out.sort();
    out
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

    /// Issue 22: a Service whose status names every platform endpoint of the table
    /// (and NAT64 and IPv4-mapped spellings of the metadata address) beside a real
    /// LB: only the real LB is proxied, each endpoint is a skip naming it, and the
    /// decision is a Warning (its Event).
    #[test]
    fn every_platform_endpoint_in_a_status_is_refused_by_name() {
        use crate::k8s::decide::lb_address::PLATFORM_ENDPOINTS;
        let mut ingress: Vec<serde_json::Value> = PLATFORM_ENDPOINTS
            .iter()
            .map(|(ip, _, _)| serde_json::json!({"ip": ip}))
            .collect();
        for spelling in [
            "64:ff9b::a9fe:a9fe",
            "::ffff:169.254.169.254",
            "64:ff9b::6464:64c8",
        ] {
            ingress.push(serde_json::json!({"ip": spelling}));
        }
        ingress.push(serde_json::json!({"ip": "203.0.113.10"}));
        let mut svc = service(serde_json::json!({"hairpin.dev/proxy-protocol": "v1"}));
        svc.status =
            serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": ingress}}))
                .expect("status");
        let d = decide(&svc, &Defaults::default());
        assert!(
            d.frontends
                .iter()
                .all(|f| f.ip.to_string() == "203.0.113.10"),
            "{:?}",
            d.frontends
        );
        assert_eq!(d.frontends.len(), 3, "the real LB's three ports");
        let refused: Vec<&Skip> = d
            .skips
            .iter()
            .filter(|s| s.reason == SkipReason::UnsafeIngressIp)
            .collect();
        assert_eq!(refused.len(), PLATFORM_ENDPOINTS.len() + 3, "{refused:?}");
        for (ip, what, _) in PLATFORM_ENDPOINTS {
            assert!(
                refused
                    .iter()
                    .any(|s| s.message.contains(ip) && s.message.contains(what)),
                "{ip} not named: {refused:?}"
            );
        }
        assert!(d.is_warning(), "a refused address is a Warning Event");
    }
}
