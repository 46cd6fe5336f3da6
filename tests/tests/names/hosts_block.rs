//! The managed hosts block: a real resolver reads it, refused names never reach it, and
//! a namespace past its name cap keeps its oldest names.

use super::*;

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
    assert!(hairpin_agent::names::remove_hosts_block(&hosts).expect("cleanup"));
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
