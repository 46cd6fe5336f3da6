//! Name routing on a simulated node: the agent's name relay routes by TLS SNI and
//! HTTP Host to two LoadBalancers, and its /etc/hosts block is read by a real
//! resolver in a private mount namespace. Each assertion carries the backend's
//! body (which echoes the PROXY header) as evidence.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::{Agent, FrontendSpec, NAMES_UNDER_EXAMPLE_COM, spec},
    cli::{admin_socket, doctor_check, run_cli},
    fakeapi::{FakeApi, digitalocean_service, recorded},
    load::Helper,
    names_support::{
        curl_resolved_from_pod, lbs_with_tls, node_with_hosts, sh_with_hosts_file, start_tls_nginx,
    },
    node::{NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, RELAY_IP4, SimNode},
    require_privileges,
    servers::{Server, start_haproxy, start_nginx},
    sh::run_in,
};

/// Two LBs, each with its own names: ingress-nginx (v1) and "haproxy" (v2).
const FRONTENDS_WITH_HOSTS: &str = "frontends:
- ip: \"203.0.113.10\"
  ports: [80, 443]
  proxyProtocol: v1
  name: ingress-nginx
  hosts: [a.example.com, \"*.apps.example.com\"]
- ip: \"203.0.113.11\"
  ports: [80, 443]
  proxyProtocol: v2
  name: haproxy
  hosts: [b.example.com]
";

/// Starts the agent, then gives it the names through a reload of its frontends
/// file (the path the static source takes on every edit).
fn agent_with_names(node: &SimNode, extra: &[&str], ready: &str) -> Agent {
    // `both`: these tests exercise the name relay beside eBPF; `auto` (the default)
    // runs it only where the programs cannot attach (see tests/modes.rs).
    agent_with_names_in(node, "both", extra, ready)
}

/// As [`agent_with_names`], in `mode`.
fn agent_with_names_in(node: &SimNode, mode: &str, extra: &[&str], ready: &str) -> Agent {
    let specs = [
        FrontendSpec {
            ip: "203.0.113.10",
            ports: vec![80, 443],
            version: "v1",
        },
        FrontendSpec {
            ip: "203.0.113.11",
            ports: vec![80, 443],
            version: "v2",
        },
    ];
    // The names are under example.com: list it, as an operator would.
    let mut args = vec!["--mode", mode, "--names-domains", "example.com"];
    args.extend_from_slice(extra);
    let mut agent = Agent::start_with(node, &specs, &args);
    fs::write(&agent.frontends, FRONTENDS_WITH_HOSTS).expect("write frontends with hosts");
    agent.wait_for_log(ready, Duration::from_secs(10));
    agent
}

/// Bytes of a node's hosts file that hairpin must keep exactly, including a last
/// line without a newline and a byte that is not UTF-8.
const NODE_HOSTS: &[u8] =
    b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n# kubelet-managed below\n10.9.9.9 keep-me \xe9\n192.0.2.1\tnode-1";

/// A node with both LBs served (plain nginx, and TLS for the names on :443) and its
/// hosts file holding [`NODE_HOSTS`]: the node, the servers and the file.
fn node_with_tls_and_hosts() -> (SimNode, Server, Server, PathBuf) {
    let node = SimNode::with_lbs(&lbs_with_tls());
    let nginx = start_nginx(&node);
    let tls = start_tls_nginx(&node);
    let hosts = node.dir.join("hosts");
    fs::write(&hosts, NODE_HOSTS).expect("write hosts");
    (node, nginx, tls, hosts)
}

/// Runs `script` as a host process whose resolver reads `hosts`; its `count` lines
/// of output, the run having succeeded (else the agent's and TLS server's logs).
fn host_lines(
    node: &SimNode,
    hosts: &Path,
    script: &str,
    count: usize,
    (agent, tls): (&Agent, &Server),
) -> Vec<String> {
    let got = sh_with_hosts_file(node, hosts, script);
    assert!(
        got.ok(),
        "{got:?}\nagent:\n{}\ntls:\n{}",
        agent.log(),
        tls.log()
    );
    let lines: Vec<String> = got.body.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), count, "{}", got.body);
    lines
}

/// Asserts that `line`, what a backend echoed, names the node's IP as the true
/// client (after `prefix`, the TLS server's own) and `dst` as the LB.
fn assert_from_node(line: &str, prefix: &str, dst: &str) {
    assert!(
        line.starts_with(&format!("{prefix}client={NODE_IP4}:")) && line.ends_with(dst),
        "a host process -> the node IP as the PROXY source, to {dst}: {line}"
    );
}

#[test]
fn a_real_resolver_reads_the_managed_hosts_file_and_reaches_the_lb_through_the_name_relay() {
    require_privileges!();
    let (node, _nginx, tls, hosts) = node_with_tls_and_hosts();
    let system_hosts = fs::read("/etc/hosts").expect("read /etc/hosts");
    let hosts_arg = hosts.to_str().expect("utf-8 path");
    let mut agent = agent_with_names(&node, &["--hosts-file", hosts_arg], "hosts file updated");

    let written = fs::read(&hosts).expect("read hosts");
    assert!(
        written.starts_with(NODE_HOSTS),
        "every byte before the block survives"
    );
    let block = String::from_utf8_lossy(&written[NODE_HOSTS.len()..]).into_owned();
    assert_eq!(
        block,
        format!(
            "\n# BEGIN hairpin managed block (do not edit)\n{RELAY_IP4}\ta.example.com\n\
             {RELAY_IP4}\tb.example.com\n# END hairpin managed block"
        ),
        "exact names only, pointing at the name relay; the wildcard is left out"
    );
    assert!(
        agent
            .log()
            .contains("/etc/hosts cannot express wildcard names"),
        "{}",
        agent.log()
    );

    let lines = host_lines(
        &node,
        &hosts,
        "getent hosts a.example.com && curl -sS --max-time 10 http://a.example.com/ \
         && curl -sS -k --max-time 10 https://b.example.com/",
        3,
        (&agent, &tls),
    );
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [RELAY_IP4, "a.example.com"]
    );
    assert_from_node(&lines[1], "", "dst=203.0.113.10:80");
    assert_from_node(
        &lines[2],
        "tls-b sni=b.example.com ",
        "dst=203.0.113.11:443",
    );
    assert_eq!(
        fs::read("/etc/hosts").expect("read /etc/hosts"),
        system_hosts,
        "the bind mount must stay inside the private mount namespace"
    );

    // SIGTERM keeps the block: names keep resolving while the next agent starts.
    agent.stop();
    assert_eq!(fs::read(&hosts).expect("read hosts"), written);
    // `cleanup` removes it and restores the file byte for byte.
    assert!(hairpin_agent::names::hosts_writer::cleanup(&hosts).expect("cleanup"));
    assert_eq!(fs::read(&hosts).expect("read hosts"), NODE_HOSTS);
}

/// The names the issue saw written into a node's /etc/hosts, beside one the operator
/// listed: only the listed one gets a line; each other is left out naming its rule,
/// in the log and in `/status`, and a real resolver still answers `localhost` from the
/// node's own line.
#[test]
fn refused_names_never_reach_the_hosts_block_and_an_allowed_one_does() {
    require_privileges!();
    let (node, _nginx, hosts) = node_with_hosts(NODE_HOSTS);
    let sock = admin_socket(&node);
    let specs = [spec("203.0.113.10", "v1")];
    let mut agent = Agent::start_with(
        &node,
        &specs,
        &[
            NAMES_UNDER_EXAMPLE_COM.as_slice(),
            &[
                "--hosts-file",
                hosts.to_str().expect("utf-8 path"),
                "--admin-socket",
                sock.to_str().expect("utf-8 path"),
            ],
        ]
        .concat(),
    );
    fs::write(
        &agent.frontends,
        "frontends:
- ip: \"203.0.113.10\"
  ports: [80]
  proxyProtocol: v1
  hosts: [localhost, kubernetes.default.svc.cluster.local, metadata.google.internal,
          registry-1.docker.io, intranet, a.example.com]
",
    )
    .expect("write frontends");
    agent.wait_for_log("hosts file updated", Duration::from_secs(10));

    let written = fs::read(&hosts).expect("read hosts");
    assert!(written.starts_with(NODE_HOSTS), "the node's lines survive");
    let block = String::from_utf8_lossy(&written[NODE_HOSTS.len()..]).into_owned();
    assert_eq!(
        block,
        format!(
            "\n# BEGIN hairpin managed block (do not edit)\n{RELAY_IP4}\ta.example.com\n\
             # END hairpin managed block"
        ),
        "only the name under --names-domains"
    );
    let log = agent.log();
    for rule in [
        "host localhost refused (rule localhost)",
        "host kubernetes.default.svc.cluster.local refused (rule cluster-domain)",
        "host metadata.google.internal refused (rule metadata-endpoint)",
        "host registry-1.docker.io refused (rule outside-domains)",
        "host intranet refused (rule single-label)",
    ] {
        assert!(log.contains(rule), "{rule}: {log}");
    }
    let status = run_cli(&node, &["status", "--output", "json"]).json();
    let names = &status["status"]["names"];
    assert_eq!(
        names["domains"],
        serde_json::json!(["example.com"]),
        "{names}"
    );
    let skips = names["skips"].as_array().cloned().unwrap_or_default();
    assert_eq!(skips.len(), 5, "{names}");
    assert!(
        skips[0]
            .as_str()
            .is_some_and(|s| s.contains("frontends[0].hosts[0]: host localhost refused")),
        "{names}"
    );
    let got = sh_with_hosts_file(
        &node,
        &hosts,
        "getent hosts localhost; getent hosts metadata.google.internal || echo none; \
         curl -sS --max-time 10 http://a.example.com/",
    );
    let lines: Vec<&str> = got.body.lines().collect();
    assert!(
        lines
            .first()
            .and_then(|l| l.split_whitespace().next())
            .is_some_and(|a| a == "127.0.0.1" || a == "::1"),
        "localhost is the node's own line, not the relay: {got:?}"
    );
    assert_eq!(lines.get(1), Some(&"none"), "{got:?}");
    assert!(
        lines
            .get(2)
            .is_some_and(|l| l.ends_with("dst=203.0.113.10:80")),
        "the allowed name reaches its LB through the relay: {got:?}\n{}",
        agent.log()
    );
    agent.stop();
}

#[test]
fn sni_and_host_route_each_name_to_its_own_lb_with_the_true_client() {
    require_privileges!();
    let node = SimNode::with_lbs(&lbs_with_tls());
    let _nginx = start_nginx(&node);
    let _haproxy = start_haproxy(&node);
    let tls = start_tls_nginx(&node);
    let missing = node.dir.join("no-such-hosts");
    let missing_arg = missing.to_str().expect("utf-8 path");
    let agent = agent_with_names(
        &node,
        &["--hosts-file", missing_arg],
        "name relay listening",
    );

    let fetch = |name: &str, scheme: &str, port: u16| {
        let url = format!("{scheme}://{name}/");
        curl_resolved_from_pod(&node, &format!("{name}:{port}:{RELAY_IP4}"), &url)
    };
    let cases = [
        (
            "a.example.com",
            "http",
            80,
            "client=",
            "dst=203.0.113.10:80",
        ),
        (
            "b.example.com",
            "http",
            80,
            "client=",
            "dst=203.0.113.11:80",
        ),
        (
            "a.example.com",
            "https",
            443,
            "tls-a sni=a.example.com client=",
            "dst=203.0.113.10:443",
        ),
        (
            "b.example.com",
            "https",
            443,
            "tls-b sni=b.example.com client=",
            "dst=203.0.113.11:443",
        ),
        (
            "x.apps.example.com",
            "https",
            443,
            "tls-a sni=x.apps.example.com client=",
            "dst=203.0.113.10:443",
        ),
        (
            "Y.Apps.Example.com",
            "http",
            80,
            "client=",
            "dst=203.0.113.10:80",
        ),
    ];
    for (name, scheme, port, prefix, dst) in cases {
        let got = fetch(name, scheme, port);
        assert!(
            got.ok(),
            "{name} {scheme}: {got:?}\nagent:\n{}\ntls:\n{}",
            agent.log(),
            tls.log()
        );
        let body = got.body.trim_end();
        assert!(
            body.starts_with(&format!("{prefix}{POD_IP4}:")),
            "{name} {scheme}: the PROXY source must be the pod: {body}"
        );
        assert!(body.ends_with(dst), "{name} {scheme}: {body}");
    }

    // Unknown names: HTTP gets a 421, TLS an unrecognized_name alert (curl exit 35).
    let unknown = fetch("nobody.example.com", "http", 80);
    assert!(unknown.ok(), "{unknown:?}");
    assert!(
        unknown.body.contains("no proxied loadbalancer serves"),
        "{unknown:?}"
    );
    let unknown_tls = fetch("nobody.example.com", "https", 443);
    assert_eq!(unknown_tls.code, 35, "{unknown_tls:?}");
    assert!(
        unknown_tls.stderr.contains("unrecognized name"),
        "{unknown_tls:?}"
    );

    // A hosts file that is not there is reported and does not stop name routing.
    let log = agent.log();
    assert!(log.contains("hosts file not managed"), "{log}");
    assert!(log.contains("does not exist"), "{log}");
}

/// What a CoreDNS rewrite hands a pod: the `hairpin` Service's ClusterIP. kube-proxy
/// DNATs it to this node's endpoint, the hostNetwork agent at the node IP and the
/// Service's target port; the relay routes it as the Service port by Host or SNI.
#[test]
fn pods_reach_the_name_relay_through_the_hairpin_cluster_ip_service() {
    require_privileges!();
    const CLUSTER_IP4: &str = "203.0.113.200";
    const CLUSTER_IP6: &str = "2001:db8:ffff::200";
    let node = SimNode::with_lbs(&lbs_with_tls());
    let _nginx = start_nginx(&node);
    let _haproxy = start_haproxy(&node);
    let tls = start_tls_nginx(&node);
    // The base manifest's ports: 80 -> 880, 443 -> 843 (the agent's default).
    for (cluster_ip, endpoint) in [(CLUSTER_IP4, NODE_IP4), (CLUSTER_IP6, NODE_IP6)] {
        node.add_cluster_ip(cluster_ip, 80, endpoint, 880);
        node.add_cluster_ip(cluster_ip, 443, endpoint, 843);
    }
    // The names address is elsewhere (as with --names-link), so only the Service
    // listeners are on the node IPs: the test cannot pass by reaching :80 directly.
    let agent = agent_with_names(
        &node,
        &["--names-address", "127.0.0.53", "--names-ports", "80,443"],
        &format!("[{NODE_IP6}]:843"),
    );
    let log = agent.log();
    for l in [
        format!("{NODE_IP4}:880"),
        format!("{NODE_IP4}:843"),
        format!("[{NODE_IP6}]:880"),
    ] {
        assert!(log.contains(&l), "listener {l} missing:\n{log}");
    }

    let cases = [
        (
            CLUSTER_IP4,
            POD_IP4,
            "a.example.com",
            "http",
            80,
            "client=",
            "dst=203.0.113.10:80",
        ),
        (
            CLUSTER_IP4,
            POD_IP4,
            "b.example.com",
            "http",
            80,
            "client=",
            "dst=203.0.113.11:80",
        ),
        (
            CLUSTER_IP4,
            POD_IP4,
            "b.example.com",
            "https",
            443,
            "tls-b sni=b.example.com client=",
            "dst=203.0.113.11:443",
        ),
        (
            CLUSTER_IP4,
            POD_IP4,
            "x.apps.example.com",
            "https",
            443,
            "tls-a sni=x.apps.example.com client=",
            "dst=203.0.113.10:443",
        ),
        // A v6 client to a v4 LB: TCP6 with the destination IPv4-mapped, as the spec
        // allows (nginx prints the mapped form).
        (
            CLUSTER_IP6,
            POD_IP6,
            "a.example.com",
            "http",
            80,
            "client=",
            "dst=::ffff:203.0.113.10:80",
        ),
    ];
    for (cluster_ip, client, name, scheme, port, prefix, dst) in cases {
        let addr = if cluster_ip.contains(':') {
            format!("[{cluster_ip}]")
        } else {
            cluster_ip.to_string()
        };
        let got = curl_resolved_from_pod(
            &node,
            &format!("{name}:{port}:{addr}"),
            &format!("{scheme}://{name}/"),
        );
        assert!(
            got.ok(),
            "{name} {scheme} via {cluster_ip}: {got:?}\nagent:\n{}\ntls:\n{}",
            agent.log(),
            tls.log()
        );
        let body = got.body.trim_end();
        let want = format!("{prefix}{client}:");
        assert!(
            body.starts_with(&want),
            "{name} {scheme} via {cluster_ip}: the PROXY source must be the pod ({want}): {body}"
        );
        assert!(
            body.ends_with(dst),
            "{name} {scheme} via {cluster_ip}: {body}"
        );
    }
}

/// Gateway API through the Kubernetes source: an HTTPRoute's hostname, attached to
/// a Gateway whose address is a proxied LB, is routed by the name relay to that LB;
/// deleting the route takes the name away again.
// Fake API: Gateway API: its CRDs are not available offline here, so the real server does not serve HTTPRoutes.
#[test]
fn an_httproute_hostname_is_routed_to_its_gateways_lb_from_the_watch_stream() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    api.serve_gateway_api();
    // Envoy Gateway's LoadBalancer Service on DigitalOcean with the PROXY protocol:
    // the DO fixture, renamed, on the simulated node's 203.0.113.12.
    let mut svc = digitalocean_service();
    svc["metadata"]["name"] = "envoy-public".into();
    svc["metadata"]["namespace"] = "envoy-gateway-system".into();
    svc["status"]["loadBalancer"]["ingress"][0]["ip"] = "203.0.113.12".into();
    api.apply(svc);
    let list = recorded("gateways/envoy-gateway.yaml");
    let items = list["items"].as_array().expect("items");
    let gateway = items[0].clone();
    let route = items[2].clone();
    assert_eq!(
        (gateway["kind"].as_str(), route["kind"].as_str()),
        (Some("Gateway"), Some("HTTPRoute"))
    );
    api.apply(gateway);
    api.apply(route.clone());

    let kubeconfig = api.node_kubeconfig(&node);
    let mut agent = Agent::start_kube(
        &node,
        &kubeconfig,
        &["--mode", "both", "--names-domains", "example.net"],
    );
    agent.wait_for_log("name relay listening", Duration::from_secs(20));
    let log = agent.log();
    assert!(
        log.contains("watching Gateway API kind") && log.contains("HTTPRoute"),
        "{log}"
    );

    let fetch = || {
        curl_resolved_from_pod(
            &node,
            &format!("docs.example.net:80:{RELAY_IP4}"),
            "http://docs.example.net/",
        )
    };
    let got = fetch();
    assert!(got.ok(), "{got:?}\nagent:\n{}", agent.log());
    let body = got.body.trim_end();
    assert!(body.starts_with(&format!("client={POD_IP4}:")), "{body}");
    assert!(body.ends_with("dst=203.0.113.12:80"), "{body}");

    api.delete(&route);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = fetch();
        if got.body.contains("no proxied loadbalancer serves") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the name stayed routed after its HTTPRoute was deleted: {got:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.stop();
}

#[test]
fn a_name_relay_port_held_by_another_process_is_retried_until_it_is_free() {
    require_privileges!();
    let (node, _nginx, hosts) = node_with_hosts(NODE_HOSTS);
    // Something else on the node already listens on the names address at :80 (the
    // address left on lo by an earlier agent). With `--names-redirect off` the name
    // relay binds the names ports themselves; by default nothing binds them (see
    // the test below).
    run_in(
        &node.node_ns,
        &["ip", "addr", "add", &format!("{RELAY_IP4}/32"), "dev", "lo"],
    );
    let squat = format!("{RELAY_IP4}:80");
    let mut squatter = Helper::in_netns(&node.node_ns, &["serve", &squat]);
    assert_eq!(squatter.line(), "listening");
    let sock = admin_socket(&node);
    let mut agent = agent_with_names_in(
        &node,
        "fallback",
        &[
            "--hosts-file",
            hosts.to_str().expect("utf-8 path"),
            "--admin-socket",
            sock.to_str().expect("utf-8 path"),
            "--names-redirect",
            "off",
        ],
        "name relay cannot listen",
    );

    // Said, shown in status and failed by doctor, with the address and the cause.
    let status = run_cli(&node, &["status", "--output", "json"]).json();
    let names = &status["status"]["names"];
    let failed = names["failed_listeners"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(failed.len(), 1, "{names}");
    assert_eq!(failed[0]["address"], squat.as_str(), "{names}");
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("in use"), "{names}");
    assert!(
        names["listeners"]
            .as_array()
            .is_some_and(|l| l.iter().any(|a| *a == format!("{RELAY_IP4}:443"))),
        "the other port is unaffected: {names}"
    );
    let doctor = run_cli(&node, &["doctor", "--output", "json"]);
    assert_eq!(doctor.code, 1, "{doctor:?}");
    let check = doctor_check(&doctor.json(), "name_relay");
    assert_eq!(check["status"], "fail", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap_or_default()
            .contains(&squat),
        "{check}"
    );
    let text = run_cli(&node, &["status"]);
    assert!(
        text.stdout.contains(&format!("cannot listen on {squat}: ")),
        "{}",
        text.stdout
    );
    // Its name is on :80 too: the hosts file does not point it at a relay that
    // cannot serve that port (all of a name's ports, or none).
    // The node's file holds bytes that are not UTF-8 (kept as they are): read bytes.
    let block = String::from_utf8_lossy(&fs::read(&hosts).expect("hosts")).into_owned();
    assert!(!block.contains("a.example.com"), "{block}");

    // The port is freed: the agent binds it on its own (no signal, no change) and
    // the name answers through the relay.
    let freed = Instant::now();
    squatter.kill();
    let mut last = None;
    while freed.elapsed() < Duration::from_secs(40) {
        let got = sh_with_hosts_file(&node, &hosts, "curl -sS --max-time 5 http://a.example.com/");
        if got.ok() && got.body.trim_end().ends_with("dst=203.0.113.10:80") {
            last = None;
            break;
        }
        last = Some(got);
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = agent.log();
    assert!(last.is_none(), "not retried on its own: {last:?}\n{log}");
    eprintln!(
        "name relay port held: listening {:?} after the port was freed",
        freed.elapsed()
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("name relay cannot listen") && l.contains(&squat))
            .count(),
        1,
        "the error is said once, not on every retry\n{log}"
    );
    let names = &run_cli(&node, &["status", "--output", "json"]).json()["status"]["names"];
    assert!(names.get("failed_listeners").is_none(), "{names}");
    agent.stop();
}

/// Python on the node that binds each address with a plain `bind()` (no
/// SO_REUSEADDR, as a strict server would), listens, says `bound`, and holds them
/// until killed: a hostNetwork ingress starting after names were published.
const BIND_WILDCARDS: &str = "import socket, sys, time
socks = []
for port in (80, 443):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(('0.0.0.0', port))
    s.listen(16)
    socks.append(s)
print('bound', flush=True)
time.sleep(120)
";

/// Issue 22: where the programs are attached, the names ports are frontends of
/// the connect programs, not bound sockets, so a hostNetwork ingress that starts
/// after the first name is published binds `0.0.0.0:80` and `0.0.0.0:443`, and
/// names still reach their LBs through the name relay with the true client.
#[test]
fn a_later_wildcard_bind_of_80_and_443_succeeds_and_names_still_work() {
    later_wildcard_bind("both", "redirected by the connect programs");
}

/// The same without programs (`fallback`, or `auto` where they cannot attach): the
/// agent's own nftables table sends the names ports to the listeners.
#[test]
fn without_programs_a_later_wildcard_bind_succeeds_too_through_the_nftables_table() {
    later_wildcard_bind("fallback", "nftables");
}

fn later_wildcard_bind(mode: &str, how: &str) {
    require_privileges!();
    let (node, _nginx, tls, hosts) = node_with_tls_and_hosts();
    let sock = admin_socket(&node);
    let agent = agent_with_names_in(
        &node,
        mode,
        &[
            "--hosts-file",
            hosts.to_str().expect("utf-8 path"),
            "--admin-socket",
            sock.to_str().expect("utf-8 path"),
        ],
        "hosts file updated",
    );

    // The ingress starts now, in the node's network namespace, outside hairpin.
    let mut ingress =
        hairpin_tests::sh::command_in(&node.node_ns, None, &["python3", "-c", BIND_WILDCARDS])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start python");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(ingress.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read python");
    if line.trim() != "bound" {
        let out = ingress.wait_with_output().expect("python output");
        panic!(
            "a later 0.0.0.0:80/443 bind failed: {}\nagent:\n{}",
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
    }

    // Names still go through the name relay, with the true client, to each LB.
    let lines = host_lines(
        &node,
        &hosts,
        "curl -sS --max-time 10 http://a.example.com/ \
         && curl -sS -k --max-time 10 https://b.example.com/",
        2,
        (&agent, &tls),
    );
    let _ = ingress.kill();
    let _ = ingress.wait();
    assert_from_node(&lines[0], "", "dst=203.0.113.10:80");
    assert_from_node(
        &lines[1],
        "tls-b sni=b.example.com ",
        "dst=203.0.113.11:443",
    );

    // Status says how: each names port redirected to a listener on another port.
    let names = &run_cli(&node, &["status", "--output", "json"]).json()["status"]["names"];
    assert!(
        names["redirect"].as_str().is_some_and(|r| r.contains(how)),
        "{names}"
    );
    let redirects = names["redirects"].as_array().cloned().unwrap_or_default();
    let dialled: Vec<&str> = redirects
        .iter()
        .filter_map(|r| r["dialled"].as_str())
        .collect();
    assert_eq!(
        dialled,
        [format!("{RELAY_IP4}:80"), format!("{RELAY_IP4}:443")],
        "{names}"
    );
    let mut listener_ports = Vec::new();
    for r in &redirects {
        let listener = r["listener"].as_str().unwrap_or_default();
        assert!(
            listener.starts_with(&format!("{RELAY_IP4}:"))
                && !listener.ends_with(":80")
                && !listener.ends_with(":443"),
            "{names}"
        );
        // Issue 31: a privileged port, never an ephemeral one.
        let port: u16 = listener
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        assert!((512..1024).contains(&port), "{listener}: {names}");
        listener_ports.push(port);
    }
    let text = run_cli(&node, &["status"]);
    assert!(
        text.stdout
            .contains(&format!("{RELAY_IP4}:80 (redirected to {RELAY_IP4}:")),
        "{}",
        text.stdout
    );

    // Issue 31: the agent dies and its redirect stays (the table or the frontends
    // entry outlives it); no uid without CAP_NET_BIND_SERVICE can take the port the
    // names' traffic is sent to.
    let mut agent = agent;
    agent.signal(nix::sys::signal::Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    for port in listener_ports {
        let out = hairpin_tests::sh::command_in(
            &node.node_ns,
            None,
            &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                // Debian's interpreter: a pyenv shim under /root is not nobody's.
                "/usr/bin/python3",
                "-c",
                &format!(
                    "import socket, errno\ns = socket.socket()\ntry:\n    s.bind(('{RELAY_IP4}', {port}))\n    print('bound')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])"
                ),
            ],
        )
        .output()
        .expect("python as nobody");
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            said.trim(),
            "EACCES",
            "nobody binding {RELAY_IP4}:{port}: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Issue 14: a tenant past `--max-names-per-namespace` loses only its own newest
/// names; another namespace's name is still published, and `status` counts what
/// was withheld.
// Fake API: many names in one namespace at once, in seconds; could move to real_cluster.
#[test]
fn a_namespace_past_its_name_cap_keeps_its_oldest_names_and_does_not_block_another() {
    require_privileges!();
    let (node, _nginx, hosts) = node_with_hosts(NODE_HOSTS);
    let sock = admin_socket(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    let mut svc = digitalocean_service();
    svc["status"]["loadBalancer"]["ingress"][0]["ip"] = "203.0.113.10".into();
    api.apply(svc);
    let ingress = |ns: &str, name: &str, created: &str, host: &str| {
        serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1",
                         "creationTimestamp": created},
            "spec": {"rules": [{"host": host}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}})
    };
    // tenant-a asks for five names, a cap of three; tenant-b, newer, for one.
    for i in 0..5 {
        api.apply(ingress(
            "tenant-a",
            &format!("a{i}"),
            &format!("2026-01-01T00:00:0{i}Z"),
            &format!("a{i}.example.com"),
        ));
    }
    api.apply(ingress(
        "tenant-b",
        "b",
        "2026-02-01T00:00:00Z",
        "b.example.com",
    ));
    let kubeconfig = api.node_kubeconfig(&node);
    let mut agent = Agent::start_kube(
        &node,
        &kubeconfig,
        &[
            NAMES_UNDER_EXAMPLE_COM.as_slice(),
            &[
                "--max-names-per-namespace",
                "3",
                "--hosts-file",
                hosts.to_str().expect("utf-8 path"),
                "--admin-socket",
                sock.to_str().expect("utf-8 path"),
            ],
        ]
        .concat(),
    );
    let names_in_block = || -> Vec<String> {
        let written = fs::read(&hosts).expect("read hosts");
        String::from_utf8_lossy(&written[NODE_HOSTS.len()..])
            .lines()
            .filter_map(|l| l.split('\t').nth(1).map(str::to_owned))
            .collect()
    };
    let want = [
        "a0.example.com",
        "a1.example.com",
        "a2.example.com",
        "b.example.com",
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    while names_in_block() != want {
        assert!(
            Instant::now() < deadline,
            "hosts block {:?}, expected {want:?}\n{}",
            names_in_block(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = agent.log();
    assert!(
        log.contains(
            "Ingress tenant-a/a3: spec.rules[0].host: host a3.example.com withheld \
             (rule max-names-per-namespace)"
        ),
        "{log}"
    );
    let names = &run_cli(&node, &["status", "--output", "json"]).json()["status"]["names"];
    let limits = &names["limits"];
    assert_eq!(limits["max_names_per_namespace"], 3, "{names}");
    assert_eq!(limits["withheld"], 2, "{names}");
    assert_eq!(
        limits["withheld_by_namespace"],
        serde_json::json!({"tenant-a": 2}),
        "{names}"
    );
    assert!(
        names["hosts_writer"]["writes"]
            .as_u64()
            .is_some_and(|w| w >= 1),
        "{names}"
    );
    agent.stop();
}
