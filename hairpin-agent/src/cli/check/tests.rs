use super::*;
use crate::{
    cli::probe::{Outcome, ProbeResult},
    model::{LivePath, Paths},
};

fn t(host: &str, port: u16, tls: bool) -> Target {
    Target {
        host: host.into(),
        port,
        tls,
    }
}

#[test]
fn targets_parse_with_default_ports_and_brackets() {
    assert_eq!(
        parse_target("203.0.113.10", false),
        Ok(t("203.0.113.10", 80, false))
    );
    assert_eq!(
        parse_target("203.0.113.10", true),
        Ok(t("203.0.113.10", 443, true))
    );
    assert_eq!(
        parse_target("example.com:443", false),
        Ok(t("example.com", 443, true))
    );
    assert_eq!(
        parse_target("example.com:8080", true),
        Ok(t("example.com", 8080, true))
    );
    assert_eq!(
        parse_target("[2001:db8::10]:81", false),
        Ok(t("2001:db8::10", 81, false))
    );
    assert_eq!(
        parse_target("[2001:db8::10]", false),
        Ok(t("2001:db8::10", 80, false))
    );
    assert_eq!(
        parse_target("2001:db8::10", false),
        Ok(t("2001:db8::10", 80, false))
    );
    for bad in [
        "",
        "host:",
        "host:0",
        "host:99999",
        "[2001:db8::1",
        "[::1]x",
        ":80",
    ] {
        assert!(parse_target(bad, false).is_err(), "{bad:?}");
    }
}

fn r(outcome: Outcome) -> ProbeResult {
    ProbeResult {
        outcome,
        detail: String::new(),
    }
}

#[test]
fn the_verdict_follows_the_in_cluster_probe_then_the_header_probe() {
    use Outcome::*;
    assert_eq!(verdict(&r(Answered), &r(NoAnswer)), Verdict::Works);
    assert_eq!(verdict(&r(Answered), &r(Answered)), Verdict::Works);
    assert_eq!(verdict(&r(NoAnswer), &r(Answered)), Verdict::Broken);
    assert_eq!(verdict(&r(NoAnswer), &r(NoAnswer)), Verdict::Unknown);
    assert_eq!(
        verdict(&r(ConnectFailed), &r(ConnectFailed)),
        Verdict::Unknown
    );
    assert_eq!(Verdict::Broken.exit_code(), 1);
}

#[test]
fn one_broken_address_makes_the_target_broken() {
    use Outcome::*;
    let a = |ip: &str, in_cluster, header| {
        AddressReport::new(
            SocketAddr::new(ip.parse().expect("ip"), 80),
            vec![],
            Coverage::NotCovered,
            r(in_cluster),
            r(NoAnswer),
            r(header),
        )
    };
    let report = |addresses| {
        CheckReport::new(
            t("lb.example", 80, false),
            Resolution::default(),
            None,
            KubeProxy::default(),
            addresses,
        )
    };
    let works = a("203.0.113.10", Answered, NoAnswer);
    let broken = a("2001:db8::10", NoAnswer, Answered);
    let unknown = a("203.0.113.11", ConnectFailed, ConnectFailed);
    assert!(
        broken.explanation.contains("does not cover"),
        "{}",
        broken.explanation
    );
    assert_eq!(report(vec![works.clone(), broken]).exit_code, 1);
    assert_eq!(report(vec![works, unknown.clone()]).exit_code, 0);
    assert_eq!(report(vec![unknown]).exit_code, 2);
    let none = report(vec![]);
    assert_eq!(none.exit_code, 2);
    assert!(none.render(false).contains("no address to probe"));
}

#[test]
fn coverage_comes_from_the_agents_frontends() {
    let mut snap = Snapshot::default();
    let addr: SocketAddr = "203.0.113.10:80".parse().expect("addr");
    assert_eq!(coverage(None, addr), Coverage::Unknown);
    assert_eq!(coverage(Some(&snap), addr), Coverage::NotCovered);
    snap.frontends.push(crate::status::FrontendStatus {
        ip: addr.ip(),
        port: 80,
        version: crate::model::ProxyVersion::V2,
        source: "file f".into(),
        state: FrontendState::Active,
        listener: Some("192.0.2.1:4000".parse().expect("addr")),
        reason: None,
        retry: None,
        path: Paths(vec![LivePath::Ebpf]),
    });
    assert_eq!(
        coverage(Some(&snap), addr),
        Coverage::Active {
            listener: Some("192.0.2.1:4000".parse().expect("addr")),
            version: "v2".into(),
            path: Paths(vec![LivePath::Ebpf])
        }
    );
    assert_eq!(
        coverage(Some(&snap), "203.0.113.10:81".parse().expect("a")),
        Coverage::NotCovered
    );
}

#[test]
fn resolution_merges_node_and_pod_answers_without_duplicates() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let server: SocketAddr = "10.96.0.10:53".parse().expect("addr");
    let r = Resolution::from_lookups(
        Ok(vec![ip("203.0.113.10")]),
        Some((
            server,
            "--dns-server",
            Ok(vec![ip("203.0.113.10"), ip("2001:db8::10")]),
        )),
    );
    assert_eq!(r.addresses(), vec![ip("203.0.113.10"), ip("2001:db8::10")]);
    assert_eq!(r.pod_dns_from, Some("--dns-server"));
    let r = Resolution::from_lookups(Err("no such host".into()), None);
    assert!(r.addresses().is_empty());
    assert!(r.pod_note.as_deref().expect("note").starts_with("skipped"));
}

#[test]
fn pod_lookups_use_the_flag_else_the_agents_cluster_dns() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let mut agent = Snapshot::default();
    assert_eq!(pod_dns_server(None, Some(&agent)), None, "nothing known");
    assert_eq!(pod_dns_server(None, None), None, "no agent");
    agent.cluster_dns = vec![ip("10.43.0.10"), ip("2001:cafe:43::a")];
    assert_eq!(
        pod_dns_server(None, Some(&agent)),
        Some((ip("10.43.0.10"), "the cluster DNS Service, from the agent"))
    );
    assert_eq!(
        pod_dns_server(Some(ip("10.96.0.10")), Some(&agent)),
        Some((ip("10.96.0.10"), "--dns-server")),
        "the flag wins"
    );
}
