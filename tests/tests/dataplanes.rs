//! The ingress data planes users run, as real binaries, behind the simulated node's
//! LBs: Envoy 1.40 (strict, and `allow_requests_without_proxy_protocol`), Traefik 3.7
//! (`proxyProtocol.trustedIPs` holding the cluster's sources, the pod network alone,
//! and neither), Caddy 2.11
//! (the `proxy_protocol` listener wrapper with `allow` and `fallback_policy require`,
//! and with the cluster outside `allow`), HAProxy 2.8 (`accept-proxy`, and
//! `expect-proxy layer4 if { src ... }` as the HAProxy Kubernetes ingress controller
//! writes it), and gunicorn, which reads PROXY v1 only.
//!
//! Each test starts its server once and runs every case against it
//! (`hairpin_tests::dataplanes::matrix`): pod and node clients, IPv4 and IPv6, v1 and
//! v2 where the server reads them, the default path (the kernel path) and `path:
//! relay`; the server's own view of each request (its access log, or its answer
//! echoing what it saw) must name the client's true address and the LB address and
//! port the client dialled. Where a server trusts headers only from listed peers and
//! the cluster is not listed, the header is dropped without a word and the server
//! names the wrong client: those cases assert that symptom. Each test also shows what
//! the server does with a connection that carries no header (what in-cluster clients
//! send without hairpin): an error, or an answer that names the wrong client.

use hairpin_tests::{
    cli::{doctor_check, run_cli},
    client::{Reply, from_host, url},
    dataplanes::{
        caddy::{CaddyListener, start_caddy},
        envoy::{EnvoyRun, INGRESS_ACCESS_PREFIX, ingress_config, start_envoy},
        gunicorn::start_gunicorn,
        haproxy::{Expects, start_haproxy28},
        matrix::{
            self, CLOUD_LB_SOURCES, CLUSTER_SOURCES, Case, Expect, NODE_UPLINK4, POD_SOURCES, Seen,
            Variant,
        },
        traefik::{EntryPoint, Route, access_client, start_traefik},
    },
    node::{INGRESS_IP4, SimNode},
    require_privileges,
    servers::{Server, start_nginx},
    wait::eventually,
};

const BOTH: &[&str] = &["v1", "v2"];

const fn variant(
    name: &'static str,
    lb_port: u16,
    backend_port: u16,
    versions: &'static [&'static str],
    expect: Expect,
) -> Variant {
    Variant {
        name,
        lb_port,
        backend_port,
        versions,
        expect,
    }
}

/// A request straight to the ingress pod's `port` from a node process, with no
/// header: what an in-cluster client sends where hairpin does not run (the LB's
/// address DNATed to the same place). Not an LB address, so hairpin leaves it alone.
fn headerless(node: &SimNode, port: u16, path: &str) -> Reply {
    from_host(node, &url(INGRESS_IP4, port, path))
}

/// Asserts that a headerless request was served as the peer's (the node's uplink
/// address, not a client's): the server is lenient.
fn assert_served_as_peer(who: &str, reply: &Reply, view: &str) {
    let seen = Seen::parse(view).unwrap_or_else(|| panic!("{who}: {reply:?} {view}"));
    assert!(reply.ok(), "{who}: {reply:?}");
    assert_eq!(
        seen.client.0.to_string(),
        NODE_UPLINK4,
        "{who}: a headerless request is served as its peer's: {view}"
    );
}

/// `hairpin-agent check LB:PORT` from the node (the agent running): asserts it says
/// the in-cluster request works and how the server takes the header (`required` or
/// `lenient`), and that it warns of a lenient server's silent drop, and only of that.
fn assert_check_says(node: &SimNode, target: &str, handling: &str) {
    let run = run_cli(node, &["check", target, "--output", "json"]);
    let j = run.json();
    let a = &j["addresses"][0];
    assert_eq!(run.code, 0, "check {target}: {run:?}");
    assert_eq!(a["verdict"], "works", "check {target}: {a}");
    assert_eq!(a["header_handling"], handling, "check {target}: {a}");
    let warning = a["warning"].as_str().unwrap_or("");
    assert_eq!(
        warning.contains("drops a header from a peer outside its trusted list"),
        handling == "lenient",
        "check {target}: {a}"
    );
}

/// `hairpin-agent doctor` from the node (the agent running): its `lenient_servers`
/// check probes every active frontend directly and warns naming exactly the
/// lenient ones (`lenient`), and none of the others.
fn assert_doctor_names_lenient(node: &SimNode, lenient: &[&str], strict: &[&str]) {
    let c = doctor_check(
        &run_cli(node, &["doctor", "--output", "json"]).json(),
        "lenient_servers",
    );
    let detail = c["detail"].as_str().unwrap_or("");
    let want = if lenient.is_empty() { "ok" } else { "warn" };
    assert_eq!(c["status"], want, "doctor: {c}");
    for f in lenient {
        assert!(detail.contains(f), "doctor names {f} as lenient: {c}");
    }
    for f in strict {
        assert!(!detail.contains(f), "doctor does not name {f}: {c}");
    }
}

/// The line of an ingress Envoy's access log for the request to `path`.
fn envoy_access(envoy: &Server, path: &str) -> String {
    let needle = format!(" path={path} ");
    let text = eventually(|| envoy.log(), |t| t.contains(&needle));
    text.lines()
        .find(|l| l.starts_with(INGRESS_ACCESS_PREFIX) && l.contains(&needle))
        .unwrap_or_default()
        .to_string()
}

const ENVOY: [Variant; 2] = [
    variant("envoy-strict", 80, 9100, BOTH, Expect::TrueClient),
    variant("envoy-lenient", 81, 9101, BOTH, Expect::TrueClient),
];

#[test]
fn envoy_1_40_strict_and_lenient() {
    require_privileges!();
    let node = matrix::node(&ENVOY);
    let config = ingress_config(&[("envoy-strict", 9100, false), ("envoy-lenient", 9101, true)]);
    let envoy = start_envoy(&EnvoyRun {
        name: "envoy-ingress",
        dir: &node.dir,
        netns: &node.ingress_ns,
        cgroup: None,
        uid: None,
        config: &config,
        ports: &[9100, 9101],
    });
    let agent = matrix::agent(&node, &ENVOY);
    matrix::run(&node, &agent, &matrix::cases(&ENVOY), |case, _| {
        envoy_access(&envoy, &case.tag())
    });
    // Without a header: the strict listener resets the connection; the lenient one
    // serves it as its peer's.
    let strict = headerless(&node, 9100, "/no-header");
    assert!(!strict.ok(), "the strict listener refuses it: {strict:?}");
    let lenient = headerless(&node, 9101, "/no-header-lenient");
    assert_served_as_peer(
        "envoy-lenient",
        &lenient,
        &envoy_access(&envoy, "/no-header-lenient"),
    );
    assert_check_says(&node, "203.0.113.21:80", "required");
    assert_check_says(&node, "203.0.113.21:81", "lenient");
    assert_doctor_names_lenient(&node, &["203.0.113.21:81"], &["203.0.113.21:80"]);
}

const TRAEFIK: [Variant; 5] = [
    variant(
        "traefik-http-trusted",
        80,
        9300,
        BOTH,
        Expect::TrueClientOnly,
    ),
    variant("traefik-tcp-trusted", 81, 9301, BOTH, Expect::TrueClient),
    variant(
        "traefik-http-untrusted",
        82,
        9302,
        BOTH,
        Expect::PeerInstead,
    ),
    variant("traefik-tcp-untrusted", 83, 9303, BOTH, Expect::PeerInstead),
    // The pod network alone is not enough: kube-proxy's masquerade makes the node the
    // peer.
    variant(
        "traefik-tcp-pod-range-only",
        84,
        9304,
        BOTH,
        Expect::PeerInstead,
    ),
];

#[test]
fn traefik_3_7_trusted_ips_with_the_cluster_in_and_out_of_the_list() {
    require_privileges!();
    let node = matrix::node(&TRAEFIK);
    let _nginx = start_nginx(&node);
    let traefik = start_traefik(
        &node,
        &[
            EntryPoint {
                name: "http-trusted",
                port: 9300,
                trusted: &CLUSTER_SOURCES,
                route: Route::Http,
            },
            EntryPoint {
                name: "tcp-trusted",
                port: 9301,
                trusted: &CLUSTER_SOURCES,
                route: Route::Tcp,
            },
            EntryPoint {
                name: "http-untrusted",
                port: 9302,
                trusted: &CLOUD_LB_SOURCES,
                route: Route::Http,
            },
            EntryPoint {
                name: "tcp-untrusted",
                port: 9303,
                trusted: &CLOUD_LB_SOURCES,
                route: Route::Tcp,
            },
            EntryPoint {
                name: "tcp-pod-range-only",
                port: 9304,
                trusted: &POD_SOURCES,
                route: Route::Tcp,
            },
        ],
    );
    let agent = matrix::agent(&node, &TRAEFIK);
    matrix::run(
        &node,
        &agent,
        &matrix::cases(&TRAEFIK),
        |case: &Case, reply: &Reply| match case.variant.lb_port {
            // The TCP routes: nginx echoes the header Traefik wrote from what it saw.
            81 | 83 | 84 => reply.body.clone(),
            _ => access_client(&traefik, &case.tag()),
        },
    );
    // Without a header: served, as the peer's.
    let reply = headerless(&node, 9300, "/no-header");
    assert_served_as_peer("traefik", &reply, &access_client(&traefik, "/no-header"));
}

const CADDY: [Variant; 2] = [
    variant("caddy-allow-require", 80, 9200, BOTH, Expect::TrueClient),
    variant("caddy-allow-elsewhere", 81, 9201, BOTH, Expect::PeerInstead),
];

#[test]
fn caddy_2_11_proxy_protocol_wrapper_with_allow_and_fallback_policy() {
    require_privileges!();
    let node = matrix::node(&CADDY);
    let _caddy = start_caddy(
        &node,
        &[
            CaddyListener {
                port: 9200,
                allow: &CLUSTER_SOURCES,
                fallback: Some("require"),
            },
            CaddyListener {
                port: 9201,
                allow: &CLOUD_LB_SOURCES,
                fallback: None,
            },
        ],
    );
    let agent = matrix::agent(&node, &CADDY);
    matrix::run(&node, &agent, &matrix::cases(&CADDY), |_, reply| {
        reply.body.clone()
    });
    // Without a header: a peer in `allow` is served as itself.
    let reply = headerless(&node, 9200, "/no-header");
    assert_served_as_peer("caddy", &reply, &reply.body);
    assert_check_says(&node, "203.0.113.21:80", "lenient");
    assert_check_says(&node, "203.0.113.21:81", "lenient");
}

const HAPROXY: [Variant; 2] = [
    variant("haproxy-accept-proxy", 80, 9400, BOTH, Expect::TrueClient),
    variant("haproxy-expect-proxy", 81, 9401, BOTH, Expect::TrueClient),
];

#[test]
fn haproxy_2_8_accept_proxy_and_expect_proxy_from_listed_sources() {
    require_privileges!();
    let node = matrix::node(&HAPROXY);
    let _haproxy = start_haproxy28(
        &node,
        &[
            ("accept-proxy", 9400, Expects::AcceptProxy),
            (
                "expect-proxy",
                9401,
                Expects::ExpectProxyFrom(&CLUSTER_SOURCES),
            ),
        ],
    );
    let agent = matrix::agent(&node, &HAPROXY);
    matrix::run(&node, &agent, &matrix::cases(&HAPROXY), |_, reply| {
        reply.body.clone()
    });
    // Without a header: refused on both (the node's uplink is a listed source).
    for port in [9400, 9401] {
        let reply = headerless(&node, port, "/no-header");
        assert!(!reply.ok(), "haproxy :{port} refuses it: {reply:?}");
    }
    assert_check_says(&node, "203.0.113.21:80", "required");
    assert_check_says(&node, "203.0.113.21:81", "required");
    assert_doctor_names_lenient(&node, &[], &["203.0.113.21:80", "203.0.113.21:81"]);
}

const GUNICORN: [Variant; 2] = [
    variant("gunicorn-v1", 80, 9500, &["v1"], Expect::TrueClient),
    // Its parser reads the text line only: a v2 header is a bad request to it.
    variant("gunicorn-v2", 81, 9500, &["v2"], Expect::Refused),
];

#[test]
fn gunicorn_reads_v1_only() {
    require_privileges!();
    let node = matrix::node(&GUNICORN);
    let _gunicorn = start_gunicorn(&node, 9500);
    let agent = matrix::agent(&node, &GUNICORN);
    matrix::run(&node, &agent, &matrix::cases(&GUNICORN), |_, reply| {
        reply.body.clone()
    });
    // It serves a request without a header too.
    assert_check_says(&node, "203.0.113.21:80", "lenient");
}
