//! Routing by TLS SNI and HTTP Host: each name to its own LB with the true client, from
//! the node, from pods through the hairpin ClusterIP Service, and from an HTTPRoute.

use super::*;

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
// Fake API: the recorded Envoy Gateway objects as served; the same path against the real Gateway API CRDs: real_cluster/gateway.rs.
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
