//! The decision over Services shaped as real clusters on each provider return them
//! (`kubectl get svc -o yaml`), one fixture per case under tests/fixtures/services/.

use std::path::Path;

use hairpin_agent::{
    PathChoice, ProxyVersion,
    k8s::{Defaults, Outcome, Rule, SkipReason, decide, decide_all},
};
use k8s_openapi::api::core::v1::Service;

fn load(name: &str) -> Service {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/services")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    yaml_serde::from_str(&text)
        .unwrap_or_else(|e| panic!("parsing {} as a Service: {e}", path.display()))
}

/// What a fixture must decide: Event reason, frontends as `ip:port vN`, and the deciding rule.
struct Case {
    fixture: &'static str,
    reason: &'static str,
    frontends: &'static [&'static str],
    rule: Option<&'static str>,
}

const CASES: &[Case] = &[
    Case {
        fixture: "path-relay.yaml",
        reason: "Proxied",
        frontends: &["203.0.113.42:80 v1", "203.0.113.42:443 v1"],
        rule: Some("DigitalOcean"),
    },
    Case {
        fixture: "invalid-path.yaml",
        reason: "InvalidAnnotation",
        frontends: &[],
        rule: None,
    },
    Case {
        fixture: "digitalocean.yaml",
        reason: "Proxied",
        frontends: &["203.0.113.10:80 v1", "203.0.113.10:443 v1"],
        rule: Some("DigitalOcean"),
    },
    Case {
        fixture: "hetzner-dual-stack.yaml",
        reason: "Proxied",
        frontends: &[
            "10.0.0.5:80 v1",
            "10.0.0.5:443 v1",
            "49.12.34.56:80 v1",
            "49.12.34.56:443 v1",
            "[2a01:4f8:c012:abcd::1]:80 v1",
            "[2a01:4f8:c012:abcd::1]:443 v1",
        ],
        rule: Some("Hetzner"),
    },
    Case {
        fixture: "hetzner-ipmode-proxy.yaml",
        reason: "SkippedIpModeProxy",
        frontends: &[],
        rule: Some("Hetzner"),
    },
    Case {
        fixture: "aws-classic-elb.yaml",
        reason: "SkippedHostnameOnly",
        frontends: &[],
        rule: Some("AWS"),
    },
    Case {
        fixture: "aws-nlb.yaml",
        reason: "SkippedHostnameOnly",
        frontends: &[],
        rule: Some("AWS"),
    },
    Case {
        fixture: "aws-nlb-with-ip.yaml",
        reason: "Proxied",
        frontends: &["198.51.100.77:80 v2", "198.51.100.77:443 v2"],
        rule: Some("AWS"),
    },
    Case {
        fixture: "ovh-openstack.yaml",
        reason: "Proxied",
        frontends: &["57.128.40.12:80 v2", "57.128.40.12:443 v2"],
        rule: Some("OpenStack"),
    },
    Case {
        fixture: "scaleway.yaml",
        reason: "Proxied",
        frontends: &["51.159.112.34:443 v2"],
        rule: Some("Scaleway"),
    },
    Case {
        fixture: "linode.yaml",
        reason: "Proxied",
        frontends: &["172.105.44.55:443 v2"],
        rule: Some("Linode"),
    },
    Case {
        fixture: "ibm-vpc.yaml",
        reason: "SkippedHostnameOnly",
        frontends: &[],
        rule: Some("IBM"),
    },
    Case {
        fixture: "exoscale.yaml",
        reason: "SkippedProxyProtocolOff",
        frontends: &[],
        rule: Some("default"),
    },
    Case {
        fixture: "civo.yaml",
        reason: "Proxied",
        frontends: &["74.220.20.41:80 v2", "74.220.20.41:443 v2"],
        rule: Some("Civo"),
    },
    Case {
        fixture: "udp-ports.yaml",
        reason: "Proxied",
        frontends: &["203.0.113.20:80 v1", "203.0.113.20:443 v1"],
        rule: Some("DigitalOcean"),
    },
    Case {
        fixture: "override-provider.yaml",
        reason: "Proxied",
        frontends: &["203.0.113.30:443 v2"],
        rule: Some("hairpin.dev/proxy-protocol"),
    },
    Case {
        fixture: "override-off.yaml",
        reason: "SkippedProxyProtocolOff",
        frontends: &[],
        rule: Some("hairpin.dev/proxy-protocol"),
    },
    Case {
        fixture: "invalid-version.yaml",
        reason: "InvalidAnnotation",
        frontends: &[],
        rule: None,
    },
    Case {
        fixture: "invalid-ports.yaml",
        reason: "InvalidAnnotation",
        frontends: &[],
        rule: None,
    },
    Case {
        fixture: "pending.yaml",
        reason: "SkippedNoLoadBalancerStatus",
        frontends: &[],
        rule: Some("DigitalOcean"),
    },
    Case {
        fixture: "clusterip.yaml",
        reason: "SkippedNotLoadBalancer",
        frontends: &[],
        rule: None,
    },
];

#[test]
fn every_fixture_decides_as_expected() {
    let defaults = Defaults::default();
    for case in CASES {
        let decision = decide(&load(case.fixture), &defaults);
        let context = format!("{}: {decision:#?}", case.fixture);
        assert_eq!(decision.reason(), case.reason, "{context}");
        let got: Vec<String> = decision
            .frontends
            .iter()
            .map(|f| format!("{} {}", std::net::SocketAddr::new(f.ip, f.port), f.version))
            .collect();
        assert_eq!(got, case.frontends, "{context}");
        for frontend in &decision.frontends {
            assert_eq!(
                frontend.source,
                hairpin_agent::Origin::Service(decision.service.clone()),
                "{context}"
            );
        }
        match (case.rule, &decision.rule) {
            (None, None) => {}
            (Some(want), Some(rule)) => assert!(rule.to_string().contains(want), "{context}"),
            (want, got) => panic!("{}: rule {got:?}, want {want:?}", case.fixture),
        }
        let summary = decision.summary();
        assert!(!summary.is_empty() && summary.len() <= 1024, "{context}");
    }
}

#[test]
fn invalid_annotations_name_the_service_the_annotation_and_what_was_expected() {
    let version = decide(&load("invalid-version.yaml"), &Defaults::default());
    let Outcome::Invalid(error) = &version.outcome else {
        panic!("{version:#?}")
    };
    assert_eq!(
        error.to_string(),
        "service ingress-nginx/ingress-nginx-controller: annotation hairpin.dev/proxy-protocol is \"v3\"; expected v1, v2 or off"
    );
    assert!(version.summary().contains("expected v1, v2 or off"));

    let ports = decide(&load("invalid-ports.yaml"), &Defaults::default());
    let Outcome::Invalid(error) = &ports.outcome else {
        panic!("{ports:#?}")
    };
    let message = error.to_string();
    assert!(
        message.contains("ingress-nginx/ingress-nginx-controller"),
        "{message}"
    );
    assert!(
        message.contains("hairpin.dev/ports") && message.contains("\"abc\""),
        "{message}"
    );
    assert!(message.contains("80/http, 443/https"), "{message}");

    let mut not_in_service = load("digitalocean.yaml");
    not_in_service
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("hairpin.dev/ports".into(), "8443".into());
    let decision = decide(&not_in_service, &Defaults::default());
    assert_eq!(decision.reason(), "InvalidAnnotation", "{decision:#?}");
    assert!(decision.summary().contains("\"8443\""));
}

/// Issue 21: `hairpin.dev/path: relay` reaches each frontend it names, and only
/// those; a value it does not take invalidates the Service with a Warning naming the
/// Service, the annotation and what was expected.
#[test]
fn the_path_annotation_asks_for_the_relay_port_by_port() {
    let d = decide(&load("path-relay.yaml"), &Defaults::default());
    let got: Vec<String> = d
        .frontends
        .iter()
        .map(|f| format!("{} {}", f.port, f.path))
        .collect();
    assert_eq!(got, ["80 auto", "443 relay"], "{d:#?}");
    assert!(!d.is_warning(), "{d:#?}");
    assert!(
        d.frontends
            .iter()
            .filter(|f| f.port == 443)
            .all(|f| f.path == PathChoice::Relay)
    );
    // Without the annotation every frontend is `auto`.
    let plain = decide(&load("digitalocean.yaml"), &Defaults::default());
    assert!(
        plain.frontends.iter().all(|f| f.path == PathChoice::Auto),
        "{plain:#?}"
    );

    let bad = decide(&load("invalid-path.yaml"), &Defaults::default());
    let Outcome::Invalid(error) = &bad.outcome else {
        panic!("{bad:#?}")
    };
    assert_eq!(
        error.to_string(),
        "service ingress-nginx/ingress-nginx-controller: annotation hairpin.dev/path is \
         \"kernel\"; expected auto, relay, or PORT=auto|relay entries separated by commas, \
         PORT a TCP port number or name in spec.ports (the Service has 80/http, 443/https): \
         \"kernel\" is not PORT=auto|relay"
    );
    assert!(bad.is_warning());
    assert_eq!(bad.reason(), "InvalidAnnotation");
    assert!(bad.frontends.is_empty());
}

#[test]
fn skips_say_why_per_port_and_per_ingress_entry() {
    let udp = decide(&load("udp-ports.yaml"), &Defaults::default());
    assert!(
        udp.skips
            .iter()
            .any(|s| s.reason == SkipReason::NotTcp && s.message.contains("53/53-udp is UDP"))
    );

    let scaleway = decide(&load("scaleway.yaml"), &Defaults::default());
    assert!(
        scaleway
            .skips
            .iter()
            .any(|s| s.reason == SkipReason::PortNotSelected && s.message.contains("port 80"))
    );
    let Some(Rule::Provider { annotations, .. }) = &scaleway.rule else {
        panic!("{scaleway:#?}")
    };
    assert_eq!(
        annotations,
        &["service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v2"]
    );

    let ipmode = decide(&load("hetzner-ipmode-proxy.yaml"), &Defaults::default());
    assert_eq!(
        ipmode
            .skips
            .iter()
            .filter(|s| s.reason == SkipReason::IpModeProxy)
            .count(),
        2
    );
    assert!(ipmode.summary().contains("ipMode Proxy"));
}

#[test]
fn the_agent_default_applies_only_where_nothing_else_decides() {
    let v1 = Defaults {
        proxy_protocol: Some(ProxyVersion::V1),
        ..Defaults::default()
    };
    let exoscale = decide(&load("exoscale.yaml"), &v1);
    assert_eq!(exoscale.reason(), "Proxied");
    assert_eq!(exoscale.rule, Some(Rule::Default));
    assert_eq!(exoscale.frontends.len(), 2);
    // A provider annotation wins over the default, and our `off` over both.
    assert_eq!(
        decide(&load("ovh-openstack.yaml"), &v1).frontends[0].version,
        ProxyVersion::V2
    );
    assert_eq!(
        decide(&load("override-off.yaml"), &v1).reason(),
        "SkippedProxyProtocolOff"
    );
}

#[test]
fn decide_all_merges_sorts_and_resolves_conflicts_deterministically() {
    // Two Services share one LB IP (MetalLB allow-shared-ip style) and disagree on the version.
    let older = load("digitalocean.yaml");
    let mut newer = load("override-provider.yaml");
    newer.metadata.name = Some("second-ingress".into());
    newer.status = older.status.clone();
    let mut invalid = load("invalid-version.yaml");
    invalid.metadata.name = Some("broken-ingress".into());
    let mut hostname = load("aws-classic-elb.yaml");
    hostname.metadata.name = Some("aws-ingress".into());

    let forward = decide_all([&older, &newer, &invalid, &hostname], &Defaults::default());
    let backward = decide_all([&hostname, &invalid, &newer, &older], &Defaults::default());
    assert_eq!(
        forward, backward,
        "the order the watcher lists Services in must not matter"
    );

    let got: Vec<String> = forward
        .frontends
        .iter()
        .map(|f| format!("{}:{} {} {}", f.ip, f.port, f.version, f.source))
        .collect();
    assert_eq!(
        got,
        [
            "203.0.113.10:80 v1 Service ingress-nginx/ingress-nginx-controller",
            "203.0.113.10:443 v1 Service ingress-nginx/ingress-nginx-controller",
        ]
    );
    assert_eq!(forward.conflicts.len(), 1);
    let conflict = &forward.conflicts[0];
    assert_eq!(
        (conflict.port, conflict.loser.to_string().as_str()),
        (443, "ingress-nginx/second-ingress")
    );
    let loser = forward
        .decisions
        .iter()
        .find(|d| d.service.to_string() == "ingress-nginx/second-ingress");
    let Some(loser) = loser else {
        panic!("{forward:#?}")
    };
    assert_eq!(loser.reason(), "SkippedConflict");
    assert!(
        loser
            .warnings
            .iter()
            .any(|w| w.contains("ingress-nginx/ingress-nginx-controller"))
    );
    // One invalid Service does not disturb the others.
    assert_eq!(forward.decisions.len(), 4);
}

/// Issue 31: two Services share one (IP, port) with the same version but ask for
/// different paths. The path that serves both wins (server first, relay), on every
/// node alike, and the younger Service's decision says so instead of dropping it.
#[test]
fn a_shared_frontend_takes_the_path_that_serves_both_and_the_younger_is_told() {
    let older = load("digitalocean.yaml");
    let mut younger = older.clone();
    younger.metadata.name = Some("smtp-ingress".into());
    younger.metadata.uid = Some("0f0e0000-0000-4000-8000-00000000ffff".into());
    // A day after the fixture's 2025-03-02T10:14:07Z.
    younger.metadata.creation_timestamp =
        Some(serde_json::from_value(serde_json::json!("2025-03-03T10:14:07Z")).expect("a time"));
    younger
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("hairpin.dev/path".into(), "443=relay".into());
    younger
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("hairpin.dev/first-speaker".into(), "80=server".into());

    let forward = decide_all([&older, &younger], &Defaults::default());
    let backward = decide_all([&younger, &older], &Defaults::default());
    assert_eq!(forward, backward, "the listing order must not matter");
    let by_port = |port: u16| {
        forward
            .frontends
            .iter()
            .find(|f| f.port == port)
            .unwrap_or_else(|| panic!("no frontend on {port}: {forward:#?}"))
    };
    // The older Service keeps the entries; the younger's choices are merged in.
    assert_eq!(
        by_port(80).source.to_string(),
        "Service ingress-nginx/ingress-nginx-controller"
    );
    assert_eq!(by_port(80).first_speaker.to_string(), "server");
    assert_eq!(by_port(443).path.to_string(), "relay");
    assert!(forward.conflicts.is_empty(), "{:?}", forward.conflicts);
    let told = forward
        .decisions
        .iter()
        .find(|d| d.service.to_string() == "ingress-nginx/smtp-ingress")
        .expect("the younger decision");
    assert_eq!(told.reason(), "Proxied");
    assert!(told.is_warning());
    assert_eq!(told.warnings.len(), 2, "{:?}", told.warnings);
    assert!(
        told.warnings
            .iter()
            .any(|w| w.contains("203.0.113.10:443") && w.contains("path relay")),
        "{:?}",
        told.warnings
    );
}

/// A DigitalOcean-annotated Service `namespace/name` with `ports` TCP ports on
/// `ip`, created `created`.
fn with_ports(namespace: &str, name: &str, ip: &str, ports: u16, created: &str) -> Service {
    let mut s = load("digitalocean.yaml");
    s.metadata.namespace = Some(namespace.into());
    s.metadata.name = Some(name.into());
    s.metadata.uid = Some(format!("uid-{namespace}-{name}"));
    s.metadata.creation_timestamp =
        Some(serde_json::from_value(serde_json::json!(created)).expect("a time"));
    let spec = s.spec.as_mut().expect("spec");
    spec.ports = Some(
        (0..ports)
            .map(|i| k8s_openapi::api::core::v1::ServicePort {
                name: Some(format!("p{i}")),
                port: 10_000 + i32::from(i),
                protocol: Some("TCP".into()),
                ..Default::default()
            })
            .collect(),
    );
    let lb = s
        .status
        .as_mut()
        .and_then(|st| st.load_balancer.as_mut())
        .and_then(|lb| lb.ingress.as_mut())
        .expect("ingress");
    lb.truncate(1);
    lb[0].ip = Some(ip.into());
    lb[0].hostname = None;
    s
}

/// Issue 31: one tenant's Service of many ports cannot take the frontends map from
/// another namespace: past `--max-frontends-per-namespace` only its own newest
/// frontends are withheld; past `--max-frontends` the namespaces share round robin;
/// each withheld frontend is a skip and a Warning on its Service.
#[test]
fn frontend_caps_withhold_only_the_greedy_namespaces_newest_and_share_the_rest() {
    use hairpin_agent::k8s::FrontendCaps;
    let greedy = with_ports(
        "tenant-a",
        "wide",
        "203.0.113.20",
        10,
        "2026-01-01T00:00:00Z",
    );
    let older = with_ports("tenant-a", "old", "203.0.113.21", 2, "2025-01-01T00:00:00Z");
    let other = with_ports("tenant-b", "web", "203.0.113.30", 2, "2026-06-01T00:00:00Z");
    let third = with_ports("tenant-c", "web", "203.0.113.40", 2, "2026-06-02T00:00:00Z");
    let caps = |per_namespace, total| Defaults {
        frontend_caps: FrontendCaps {
            per_namespace,
            total,
        },
        ..Defaults::default()
    };
    let count = |d: &hairpin_agent::k8s::DesiredState, ip: &str| {
        d.frontends
            .iter()
            .filter(|f| f.ip.to_string() == ip)
            .count()
    };

    // Per namespace: tenant-a keeps its older Service whole and 2 of the wide one.
    let d = decide_all([&greedy, &older, &other, &third], &caps(4, 1000));
    assert_eq!(count(&d, "203.0.113.21"), 2);
    assert_eq!(count(&d, "203.0.113.20"), 2);
    assert_eq!(
        (count(&d, "203.0.113.30"), count(&d, "203.0.113.40")),
        (2, 2)
    );
    let wide = d
        .decisions
        .iter()
        .find(|d| d.service.to_string() == "tenant-a/wide")
        .expect("a decision");
    assert_eq!(wide.reason(), "Proxied");
    assert!(wide.is_warning());
    let capped: Vec<&str> = wide
        .skips
        .iter()
        .filter(|s| s.reason == SkipReason::FrontendCap)
        .map(|s| s.message.as_str())
        .collect();
    assert_eq!(capped.len(), 8, "{capped:?}");
    assert!(
        capped[0].contains("namespace tenant-a already has 4 older frontends")
            && capped[0].contains("--max-frontends-per-namespace"),
        "{}",
        capped[0]
    );

    // In all: 8 places round robin; tenant-a cannot push b and c under their share.
    let d = decide_all([&greedy, &older, &other, &third], &caps(100, 8));
    assert_eq!(d.frontends.len(), 8);
    assert_eq!(
        (count(&d, "203.0.113.30"), count(&d, "203.0.113.40")),
        (2, 2)
    );
    assert_eq!(count(&d, "203.0.113.21") + count(&d, "203.0.113.20"), 4);
    let wide = d
        .decisions
        .iter()
        .find(|d| d.service.to_string() == "tenant-a/wide")
        .expect("a decision");
    assert!(
        wide.skips
            .iter()
            .any(|s| s.message.contains("shared round robin") && s.message.contains("keeps 4")),
        "{:?}",
        wide.skips
    );

    // A namespace capped out of an address another namespace also claims keeps it.
    let mut shared = with_ports(
        "tenant-b",
        "shared",
        "203.0.113.20",
        10,
        "2026-07-01T00:00:00Z",
    );
    shared.metadata.uid = Some("uid-shared".into());
    // tenant-a claims 12 under a cap of 10 (its 2 newest withheld), tenant-b 10.
    let d = decide_all([&greedy, &older, &shared], &caps(10, 1000));
    let lost = d
        .decisions
        .iter()
        .find(|d| d.service.to_string() == "tenant-a/wide")
        .map_or(0, |d| {
            d.skips
                .iter()
                .filter(|s| s.reason == SkipReason::FrontendCap)
                .count()
        });
    assert_eq!(lost, 2);
    assert_eq!(
        count(&d, "203.0.113.20"),
        10,
        "tenant-b keeps what tenant-a lost"
    );

    // The defaults serve a Service of a thousand ports whole.
    let thousand = with_ports(
        "tenant-a",
        "wide",
        "203.0.113.20",
        1000,
        "2026-01-01T00:00:00Z",
    );
    let d = decide_all([&thousand], &Defaults::default());
    assert_eq!(d.frontends.len(), 1000);
}

#[test]
#[ignore = "prints every fixture's Event reason and message for eyeballing"]
fn print_summaries() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/services");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    for name in names {
        let name = name.to_string_lossy().to_string();
        let d = decide(&load(&name), &Defaults::default());
        println!("{name}: {} | {}", d.reason(), d.summary());
    }
}

/// A LoadBalancer status is written by whoever may update the Service's status: an
/// address no LoadBalancer has (the metadata endpoint, loopback, a cluster IP, this
/// node) is never redirected, and the decision is a Warning naming the address.
#[test]
fn load_balancer_addresses_no_lb_may_have_are_refused_with_a_warning() {
    use hairpin_agent::k8s::LbAddressPolicy;
    let with_ip = |ip: &str| {
        let mut s = load("digitalocean.yaml");
        let status = s.status.as_mut().expect("status");
        let lb = status.load_balancer.as_mut().expect("lb");
        lb.ingress.as_mut().expect("ingress")[0].ip = Some(ip.into());
        s
    };
    for (ip, says) in [
        ("169.254.169.254", "instance metadata endpoint"),
        ("169.254.1.1", "link-local"),
        ("127.0.0.1", "loopback"),
        ("192.0.2.1", "an address of this node"),
    ] {
        let defaults = Defaults {
            addresses: LbAddressPolicy {
                reserved: vec![(
                    "192.0.2.1/32".parse().expect("net"),
                    "an address of this node".into(),
                )],
                ..LbAddressPolicy::default()
            },
            ..Defaults::default()
        };
        let d = decide(&with_ip(ip), &defaults);
        assert_eq!(
            d.outcome,
            Outcome::Skipped(SkipReason::UnsafeIngressIp),
            "{ip}"
        );
        assert!(d.frontends.is_empty(), "{ip}");
        assert!(d.is_warning(), "{ip}");
        let summary = d.summary();
        assert!(summary.contains(ip) && summary.contains(says), "{summary}");
    }
    // Another Service's cluster IP published as this one's LB address.
    let victim = load("digitalocean.yaml");
    let cluster_ip = victim
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("ip");
    let mut thief = with_ip(&cluster_ip);
    thief.metadata.name = Some("thief".into());
    thief.metadata.namespace = Some("tenant-a".into());
    let all = decide_all([&victim, &thief], &Defaults::default());
    let d = all
        .decisions
        .iter()
        .find(|d| d.service.to_string() == "tenant-a/thief")
        .expect("thief decided");
    assert_eq!(d.outcome, Outcome::Skipped(SkipReason::UnsafeIngressIp));
    assert!(
        d.summary().contains(&format!(
            "{cluster_ip} is the cluster IP of Service ingress-nginx/ingress-nginx-controller"
        )),
        "{}",
        d.summary()
    );
    assert_eq!(all.frontends.len(), 2, "the victim's own frontends stay");
}
