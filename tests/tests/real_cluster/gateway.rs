//! Gateway API routes feeding the name relay, against the real API server serving
//! the Gateway API's own CRDs (v1.6.3, standard channel, fetched by `cargo xtask
//! k8s`), installed after the agent started as operators often do: an HTTPRoute's
//! hostname, accepted by a Gateway whose address is a proxied LB, reaches that LB
//! with the pod's own address in the header; TLSRoute is watched at the version the
//! CRDs serve (v1 alone since Gateway API v1.5); deleting the route takes the name
//! away again.

use std::time::{Duration, Instant};

use hairpin_tests::{
    names_support::curl_resolved_from_pod,
    node::{KubeProxyMode, POD_IP4, RELAY_IP4},
};
use serde_json::json;

use crate::{RealNode, do_service, vip};

/// The Gateway's controller, as Envoy Gateway names itself.
const CONTROLLER: &str = "gateway.envoyproxy.io/gatewayclass-controller";

/// `host`, asked for by the pod through the name relay, reaches the Gateway's LB
/// (203.0.113.12:80) with the pod's own address in the header, by `deadline`.
fn served_through_the_gateway(rn: &RealNode, host: &str, deadline: Instant) {
    let got = loop {
        let got = curl_resolved_from_pod(
            &rn.node,
            &format!("{host}:80:{RELAY_IP4}"),
            &format!("http://{host}/"),
        );
        if got.ok() || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(got.ok(), "{host}: {got:?}\nagent:\n{}", rn.agent().log());
    let body = got.body.trim_end();
    assert!(
        body.starts_with(&format!("client={POD_IP4}:")),
        "{host}: {body}"
    );
    assert!(body.ends_with("dst=203.0.113.12:80"), "{host}: {body}");
}

/// `kubectl ARGS` as the admin.
fn kubectl(rn: &RealNode, args: &[&str]) {
    rn.cluster.kubectl(args);
}

/// Writes `status` on `kind/name` in `namespace` as the Gateway's controller would.
fn set_status(rn: &RealNode, namespace: &str, kind: &str, name: &str, status: serde_json::Value) {
    let patch = json!({ "status": status }).to_string();
    kubectl(
        rn,
        &[
            "-n",
            namespace,
            "patch",
            kind,
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
    );
}

#[test]
fn an_httproute_and_a_grpcroute_on_the_real_crds_are_routed_to_their_gateways_lb_and_tlsroute_is_watched_at_v1()
 {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Iptables) else {
        return;
    };
    let flags: Vec<String> = ["--set", "mode=both", "--set", "names.domains=example.net"]
        .map(String::from)
        .to_vec();
    rn.start_agent(&flags);
    // Envoy Gateway's LoadBalancer Service on DigitalOcean with the PROXY protocol.
    rn.cluster
        .create_lb_service(&do_service("envoy-gateway-system", "envoy-public", &[]));
    rn.cluster.set_lb_ingress(
        "envoy-gateway-system",
        "envoy-public",
        vip(&["203.0.113.12"]),
    );

    // The CRDs arrive after the agent: it must look again for the kinds.
    let started = Instant::now();
    rn.cluster.install_gateway_api_crds(&[
        "gatewayclasses",
        "gateways",
        "httproutes",
        "grpcroutes",
        "tlsroutes",
    ]);
    rn.cluster.ensure_namespace("docs");
    rn.cluster.kubectl_apply(&[
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "eg"}, "spec": {"controllerName": CONTROLLER}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "eg", "namespace": "envoy-gateway-system"},
            "spec": {"gatewayClassName": "eg", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.net",
                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "docs", "namespace": "docs"},
            "spec": {"parentRefs": [{"name": "eg", "namespace": "envoy-gateway-system"}],
                     "hostnames": ["docs.example.net"],
                     "rules": [{"backendRefs": [{"name": "docs", "port": 80}]}]}}),
        // A gRPC API on the same HTTP listener (GRPCRoute: an HTTP listener's kind).
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
            "metadata": {"name": "api", "namespace": "docs"},
            "spec": {"parentRefs": [{"name": "eg", "namespace": "envoy-gateway-system"}],
                     "hostnames": ["api.example.net"],
                     "rules": [{"backendRefs": [{"name": "api", "port": 50051}]}]}}),
    ]);
    let now = "2026-01-01T00:00:00Z";
    set_status(
        &rn,
        "envoy-gateway-system",
        "gateway",
        "eg",
        json!({"addresses": [{"type": "IPAddress", "value": "203.0.113.12"}]}),
    );
    for (kind, name) in [("httproute", "docs"), ("grpcroute", "api")] {
        set_status(
            &rn,
            "docs",
            kind,
            name,
            json!({"parents": [{
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                              "name": "eg", "namespace": "envoy-gateway-system"},
                "controllerName": CONTROLLER,
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                                "message": "accepted", "observedGeneration": 1,
                                "lastTransitionTime": now}]}]}),
        );
    }

    served_through_the_gateway(&rn, "docs.example.net", started + Duration::from_secs(40));
    eprintln!(
        "CRDs installed -> the route's name served: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The GRPCRoute's name, routed the same way (the relay routes by name, not by
    // what the connection carries: an HTTP/1.1 request stands for the gRPC call).
    served_through_the_gateway(
        &rn,
        "api.example.net",
        Instant::now() + Duration::from_secs(40),
    );
    // Each kind is found at the next look after its CRD is served (the looks come
    // 1, 2, 4, 8, 16 s ... apart): TLSRoute's may come a look after HTTPRoute's.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (kind, version) in [
        ("HTTPRoute", "v1"),
        ("GRPCRoute", "v1"),
        ("TLSRoute", "v1"),
        ("Gateway", "v1"),
    ] {
        let watched = |log: &str| {
            log.lines().any(|l| {
                l.contains("watching Gateway API kind")
                    && l.contains(&format!("kind=\"{kind}\""))
                    && l.contains(&format!("version=\"{version}\""))
            })
        };
        while !watched(&rn.agent().log()) {
            assert!(
                Instant::now() < deadline,
                "{kind} not watched at {version}:\n{}",
                rn.agent().log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    kubectl(&rn, &["-n", "docs", "delete", "httproute", "docs"]);
    let fetch = || {
        curl_resolved_from_pod(
            &rn.node,
            &format!("docs.example.net:80:{RELAY_IP4}"),
            "http://docs.example.net/",
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = fetch();
        if got.body.contains("no proxied loadbalancer serves") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the name stayed routed after its HTTPRoute was deleted: {got:?}\n{}",
            rn.agent().log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
