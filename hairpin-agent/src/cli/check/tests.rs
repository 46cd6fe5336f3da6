use super::report::{Verdict, verdict};
use super::*;
use crate::{
    cli::probe::{Outcome, ProbeResult},
    model::{LivePath, Paths},
    status::KernelPathState,
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
    assert_eq!(report(vec![unknown]).exit_code, 5);
    let none = report(vec![]);
    assert_eq!(none.exit_code, 5);
    assert!(none.render(false).contains("no address to probe"));
}

#[test]
fn coverage_comes_from_the_agents_frontends() {
    let mut snap = Snapshot::default();
    let addr: SocketAddr = "203.0.113.10:80".parse().expect("addr");
    assert_eq!(coverage(None, addr), Coverage::Unknown);
    assert_eq!(coverage(Some(&snap), addr), Coverage::NotCovered);
    snap.frontends.push(crate::status::FrontendStatus {
        version: crate::model::ProxyVersion::V2,
        ..crate::status::FrontendStatus::active_for_test("203.0.113.10:80", "192.0.2.1:4000")
    });
    assert_eq!(
        coverage(Some(&snap), addr),
        Coverage::Active {
            listener: Some("192.0.2.1:4000".parse().expect("addr")),
            version: "v2".into(),
            path: Paths(vec![LivePath::Relay]),
            header_by: HeaderBy::Relay,
            why: "the kernel path is off".into(),
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
    let r = Resolution::from_lookups(Err(std::io::Error::other("no such host")), None);
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

/// An agent with `--kernel-path` in `state` (its reason) and two active frontends:
/// port 80 as the agent reports a kernel-path one (or, when the kernel path is not
/// on, a relayed one), port 25 whose server speaks first.
fn kernel_path_agent(state: KernelPathState, reason: Option<&str>) -> Snapshot {
    let on = state == KernelPathState::On;
    let mut snap = Snapshot {
        kernel_path: Some(crate::status::KernelPathStatus {
            configured: crate::model::KernelPathMode::On,
            state,
            reason: reason.map(Into::into),
            reason_kind: None,
            sockets_map_id: on.then_some(33),
            sockets_capacity: on.then_some(65_536),
            sockets_map_pin: None,
            sockets_map_pin_error: None,
            mptcp_detection: None,
        }),
        ..Snapshot::default()
    };
    let why = |first: &str| match (state, first) {
        (KernelPathState::Off, _) => None,
        (KernelPathState::Unavailable, _) => {
            Some("relay: the kernel path is unavailable on this node".to_string())
        }
        (KernelPathState::On, "client") => Some("kernel: the client speaks first".into()),
        (KernelPathState::On, _) => Some(
            "relay: the server speaks first (the kernel writes the header only ahead of the \
             client's first bytes)"
                .into(),
        ),
    };
    for (port, first, listener) in [
        (80, "client", "192.0.2.1:4000"),
        (25, "server", "192.0.2.1:4001"),
    ] {
        let kernel = on && first == "client";
        snap.frontends.push(crate::status::FrontendStatus {
            reason: why(first),
            path: Paths(vec![if kernel {
                LivePath::Kernel
            } else {
                LivePath::Relay
            }]),
            ..crate::status::FrontendStatus::active_for_test(
                &format!("203.0.113.10:{port}"),
                listener,
            )
        });
    }
    snap
}

fn covered(snap: &Snapshot, port: u16) -> (HeaderBy, String) {
    match coverage(
        Some(snap),
        SocketAddr::new("203.0.113.10".parse().expect("ip"), port),
    ) {
        Coverage::Active { header_by, why, .. } => (header_by, why),
        other => panic!("not active: {other:?}"),
    }
}

/// Issue 13: `check` says which path a destination takes and why: the kernel for a
/// client-speaks-first frontend with the kernel path on, else the relay because the
/// server speaks first, or the kernel path is unavailable (with its reason) or off.
#[test]
fn check_says_which_path_a_destination_takes_and_why() {
    let on = kernel_path_agent(KernelPathState::On, None);
    assert_eq!(
        covered(&on, 80),
        (HeaderBy::Kernel, "the client speaks first".into())
    );
    assert_eq!(
        covered(&on, 25),
        (
            HeaderBy::Relay,
            "the server speaks first (the kernel writes the header only ahead of the client's \
             first bytes)"
                .into()
        )
    );
    let unavailable = kernel_path_agent(
        KernelPathState::Unavailable,
        Some("this kernel has no sk_msg programs"),
    );
    for port in [80, 25] {
        assert_eq!(
            covered(&unavailable, port),
            (
                HeaderBy::Relay,
                "the kernel path is unavailable on this node: this kernel has no sk_msg programs"
                    .into()
            )
        );
    }
    let off = kernel_path_agent(KernelPathState::Off, None);
    assert_eq!(
        covered(&off, 80),
        (HeaderBy::Relay, "the kernel path is off".into())
    );
    // An agent from before the kernel path: no `kernel_path`, no reason.
    let mut old = off.clone();
    old.kernel_path = None;
    assert_eq!(
        covered(&old, 80),
        (HeaderBy::Relay, "the kernel path is off".into())
    );
}

/// The path, in the text and the JSON of the report.
#[test]
fn the_path_a_destination_takes_is_in_the_text_and_the_json() {
    use Outcome::*;
    let on = kernel_path_agent(KernelPathState::On, None);
    let address = |port| {
        let addr = SocketAddr::new("203.0.113.10".parse().expect("ip"), port);
        AddressReport::new(
            addr,
            vec![],
            coverage(Some(&on), addr),
            r(Answered),
            r(NoAnswer),
            r(Answered),
        )
    };
    let report = CheckReport::new(
        t("203.0.113.10", 80, false),
        Resolution::literal("203.0.113.10".parse().expect("ip")),
        None,
        KubeProxy::default(),
        vec![address(80), address(25)],
    );
    let text = report.render(false);
    assert!(
        text.contains(
            "  hairpin     covers it (kernel): kernel path: the kernel writes PROXY v1 on the \
             client's socket (the client speaks first; a socket it cannot take goes to the relay \
             at 192.0.2.1:4000)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "  hairpin     covers it (ebpf): relay at 192.0.2.1:4001 writes PROXY v1: the server \
             speaks first (the kernel writes the header only ahead of the client's first bytes)\n"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&report).expect("json");
    let hp = &json["addresses"][0]["hairpin"];
    assert_eq!(hp["state"], "active", "{hp}");
    assert_eq!(hp["path"], "kernel", "{hp}");
    assert_eq!(hp["header_by"], "kernel", "{hp}");
    assert_eq!(hp["why"], "the client speaks first", "{hp}");
    let hp = &json["addresses"][1]["hairpin"];
    assert_eq!(hp["header_by"], "relay", "{hp}");
    assert_eq!(hp["listener"], "192.0.2.1:4001", "{hp}");
}

fn said(outcome: Outcome, detail: &str) -> ProbeResult {
    ProbeResult {
        outcome,
        detail: detail.into(),
    }
}

/// Issue 30: the two direct probes tell a server that requires the header, one that
/// takes it or not (lenient), and one that speaks no PROXY protocol.
#[test]
fn the_direct_probes_tell_required_lenient_and_not_spoken() {
    use Outcome::*;
    let ok = said(Answered, "HTTP/1.1 200 OK");
    let not_found = said(Answered, "HTTP/1.1 404 Not Found");
    let bad = said(Answered, "HTTP/1.1 400 Bad Request");
    let reset = said(NoAnswer, "empty reply: the server closed the connection");
    let tls = said(Answered, "TLSv1_3");
    let h = header_handling;
    // nginx `listen ... proxy_protocol`, HAProxy accept-proxy, strict Envoy.
    assert_eq!(h(&reset, &ok), HeaderHandling::Required);
    // Traefik, Caddy with allow, lenient Envoy, gunicorn: the same answer either way,
    // whatever the path's status.
    assert_eq!(h(&ok, &ok), HeaderHandling::Lenient);
    assert_eq!(h(&not_found, &not_found), HeaderHandling::Lenient);
    assert_eq!(h(&tls, &tls), HeaderHandling::Lenient);
    // A plain server reads the header as its request line.
    assert_eq!(h(&ok, &bad), HeaderHandling::NotSpoken);
    assert_eq!(h(&bad, &bad), HeaderHandling::NotSpoken);
    assert_eq!(h(&ok, &not_found), HeaderHandling::NotSpoken);
    assert_eq!(h(&tls, &reset), HeaderHandling::NotSpoken);
    assert_eq!(h(&ok, &reset), HeaderHandling::NotSpoken);
    assert_eq!(h(&reset, &reset), HeaderHandling::Unknown);
}

/// A lenient server: check warns that it drops an untrusted peer's header without a
/// word, covered or not; uncovered, the verdict says the client is named wrong instead
/// of "no PROXY header needed". A strict or plain server gets no warning.
#[test]
fn a_lenient_server_is_named_and_warned_about() {
    use Outcome::*;
    let ok = || said(Answered, "HTTP/1.1 200 OK");
    let addr = SocketAddr::new("203.0.113.10".parse().expect("ip"), 80);
    let on = kernel_path_agent(KernelPathState::On, None);
    let lenient = |hairpin| AddressReport::new(addr, vec![], hairpin, ok(), ok(), ok());

    let uncovered = lenient(Coverage::NotCovered);
    assert_eq!(uncovered.verdict, Verdict::Works);
    assert_eq!(uncovered.header_handling, HeaderHandling::Lenient);
    assert!(
        uncovered.explanation.contains("names the wrong client"),
        "{}",
        uncovered.explanation
    );
    assert_eq!(uncovered.warning.as_deref(), Some(LENIENT_WARNING));
    let covered = lenient(coverage(Some(&on), addr));
    assert_eq!(covered.explanation, "works (hairpin proxies it)");
    assert_eq!(covered.warning.as_deref(), Some(LENIENT_WARNING));

    let report = CheckReport::new(
        t("203.0.113.10", 80, false),
        Resolution::literal(addr.ip()),
        None,
        KubeProxy::default(),
        vec![covered],
    );
    let text = report.render(false);
    assert!(
        text.contains(
            "  warning     the server is lenient: it answers with a PROXY header and without one"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["addresses"][0]["header_handling"], "lenient");
    assert!(
        json["addresses"][0]["warning"]
            .as_str()
            .is_some_and(|w| w.contains("wrong client address, not an error")),
        "{json}"
    );

    let strict = AddressReport::new(
        addr,
        vec![],
        coverage(Some(&on), addr),
        ok(),
        said(NoAnswer, "reset"),
        ok(),
    );
    assert_eq!(strict.header_handling, HeaderHandling::Required);
    assert_eq!(strict.warning, None);
    let plain = AddressReport::new(
        addr,
        vec![],
        Coverage::NotCovered,
        ok(),
        ok(),
        said(Answered, "HTTP/1.1 400 Bad Request"),
    );
    assert_eq!(plain.header_handling, HeaderHandling::NotSpoken);
    assert_eq!(plain.explanation, "works directly: no PROXY header needed");
    assert_eq!(plain.warning, None);
    let json = serde_json::to_value(&plain).expect("json");
    assert!(json.get("warning").is_none(), "{json}");
}
