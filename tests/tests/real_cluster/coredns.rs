//! Real CoreDNS serving the cluster DNS Service from the `coredns` ConfigMap the
//! chart's CoreDNS writer rewrites (kubeadm's Corefile; an exact and a wildcard
//! name), its `kubernetes` plugin against the real API server: a pod resolves the
//! public name through glibc's resolver and the cluster DNS Service (kube-proxy's
//! DNAT), reaches the name relay through the chart's `hairpin` Service, and the
//! ingress sees the pod's own address in the header. A rewrite CoreDNS refuses
//! fails [`CoreDns::start`] with CoreDNS's error; one that answers a wrong name
//! fails the request.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::agent_bin,
    cluster::{
        Cluster, Proc,
        dns::{
            CoreDns, DnsNames, KUBEADM, cluster_dns_objects, corefile_in, in_pod_with_cluster_dns,
        },
        objects::workload_env,
    },
    fakeapi::KUBEADM_COREFILE,
    node::{INGRESS_IP4, KubeProxyMode, NODE_IP4, POD_IP4},
};
use serde_json::{Value, json};

use crate::{RELEASE_NS, RealNode, ingress_nginx_lb, vip};

/// The CoreDNS the cluster runs (the writer checks its version before it writes
/// wildcard rewrites).
pub(crate) const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.14.7";

#[test]
fn a_pod_resolves_the_public_name_through_real_coredns_and_gets_its_own_header() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Iptables) else {
        return;
    };
    let flags = writer_flags(&["coredns.mode=corefile"]);
    // kubeadm's cluster DNS: CoreDNS runs in the ingress pod's namespace (another
    // pod of the node), the kube-dns Service in front of it.
    cluster_dns_and_a_shop_ingress(
        &rn.cluster,
        &KUBEADM,
        COREDNS_IMAGE,
        KUBEADM_COREFILE,
        Vec::new(),
    );
    rn.start_agent(&flags);
    let c = &rn.cluster;
    serve_the_chart_service_from_this_node(c, &flags);
    let writer = start_writer(&rn, &flags);
    written_corefile(c, KUBEADM.configmap, &writer);
    // The API server records the writer under its own name (an operator's
    // server-side apply of the ConfigMap names it in the conflict).
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(c.client(), "kube-system");
    let cm = c
        .block_on(cms.get("coredns"))
        .expect("the coredns ConfigMap");
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "hairpin-coredns-writer"),
        "{managers:?}"
    );
    let dns = CoreDns::start(c, &rn.node.ingress_ns);
    for name in SHOP_NAMES {
        resolves_and_gets_its_own_header(&rn, &dns, name);
    }
}

/// The chart's flags: `--set` each of `values`, names published under example.com.
pub(crate) fn writer_flags(values: &[&str]) -> Vec<String> {
    values
        .iter()
        .chain(&["names.domains=example.com"])
        .flat_map(|v| ["--set".to_string(), v.to_string()])
        .collect()
}

/// The shop Ingress's names: an exact one and one under its wildcard.
pub(crate) const SHOP_NAMES: [&str; 2] = ["shop.example.com", "web.apps.example.com"];

/// The Corefile of `kube-system/<configmap>` once the writer has put both shop
/// rewrites in (the wildcard only after it read CoreDNS's version); fails after
/// 30 s with the writer's log.
pub(crate) fn written_corefile(c: &Cluster, configmap: &str, writer: &Proc) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = corefile_in(c, configmap);
        if text.contains("shop.example.com") && text.contains(r"apps\.example\.com") {
            eprintln!("Corefile as written:\n{text}");
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the writer wrote no rewrite: {text}\nwriter:\n{}",
            writer.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A pod resolves `name` through the cluster DNS Service (glibc's resolver) to the
/// chart's `hairpin` Service, reaches the ingress through the name relay and gets
/// its own address in the header, with the LB's as the destination. Polled for up
/// to 20 s: kube-proxy's DNAT for the DNS Service and CoreDNS's informers settle
/// on their own time; a wrong or refused rewrite never passes.
pub(crate) fn resolves_and_gets_its_own_header(rn: &RealNode, dns: &CoreDns, name: &str) {
    let started = Instant::now();
    let reply = loop {
        let reply = in_pod_with_cluster_dns(
            &rn.node,
            &format!("getent ahostsv4 {name} | head -1; curl -sS --max-time 5 http://{name}/"),
        );
        if reply.ok() || started.elapsed() > Duration::from_secs(20) {
            break reply;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "{name}: answered after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        reply.ok() && reply.body.contains(&format!("client={POD_IP4}:")),
        "{name}: {reply:?}\nCoreDNS:\n{}\nagent:\n{}",
        dns.log(),
        rn.agent().log()
    );
    assert!(
        reply.body.trim_end().ends_with("dst=203.0.113.10:80"),
        "{name}: {reply:?}"
    );
}

/// The cluster DNS as a distribution ships it, named as `dns` says (its Service in
/// front of CoreDNS in the ingress pod's namespace, its ConfigMap holding
/// `corefile`, `extra` objects beside it, a CoreDNS Deployment of `image` for the
/// writer to read the version of), an ingress controller's DigitalOcean LB at
/// 203.0.113.10 and an Ingress `shop/shop` on it for `shop.example.com` and
/// `*.apps.example.com`.
pub(crate) fn cluster_dns_and_a_shop_ingress(
    c: &Cluster,
    dns: &DnsNames,
    image: &str,
    corefile: &str,
    extra: Vec<Value>,
) {
    let mut objects = cluster_dns_objects(dns, INGRESS_IP4);
    objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": dns.configmap, "namespace": "kube-system"},
        "data": {"Corefile": corefile}}));
    objects.extend(extra);
    objects.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": dns.configmap, "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                 "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}},
                              "spec": {"containers": [{"name": "coredns", "image": image}]}}}}));
    c.kubectl_apply(&objects);
    ingress_nginx_lb(c, "ingress-nginx-controller", &[], &["203.0.113.10"]);
    c.ensure_namespace("shop");
    c.kubectl_apply(&[
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "shop"},
        "spec": {"ingressClassName": "nginx", "rules": [
            {"host": "shop.example.com"}, {"host": "*.apps.example.com"}]}}),
    ]);
    c.set_ingress_lb("shop", "shop", vip(&["203.0.113.10"]));
}

/// `hairpin-agent coredns-writer` as the chart's Deployment runs it: its
/// environment, its own ServiceAccount's token.
pub(crate) fn start_writer(rn: &RealNode, flags: &[String]) -> Proc {
    let objects = hairpin_tests::cluster::objects::chart_objects(RELEASE_NS, flags);
    let env: Vec<(String, String)> =
        workload_env(&objects, "Deployment", RELEASE_NS, "hairpin-coredns-0")
            .into_iter()
            .filter(|(k, _)| {
                !matches!(k.as_str(), "HAIRPIN_ADMIN_ADDRESS" | "HAIRPIN_ADMIN_SOCKET")
            })
            .collect();
    let token = rn
        .cluster
        .service_account_token(RELEASE_NS, "hairpin-coredns");
    let kubeconfig = rn.node.dir.join("writer.kubeconfig");
    rn.cluster.node_kubeconfig(&kubeconfig, &token);
    let sock = rn.node.dir.join("writer.sock");
    let env: Vec<(&str, String)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .chain([
            ("HAIRPIN_ADMIN_ADDRESS", "127.0.0.1:0".to_string()),
            ("HAIRPIN_ADMIN_SOCKET", sock.display().to_string()),
        ])
        .collect();
    Proc::spawn_env(
        "coredns-writer",
        &rn.node.node_ns,
        &rn.node.dir,
        &[
            agent_bin().to_str().expect("utf-8 path"),
            "coredns-writer",
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8 path"),
            "--log",
            "hairpin_agent=debug,info",
        ],
        &env,
    )
}

/// The DaemonSet's pod on this node (hostNetwork) as the chart Service's endpoint,
/// at the Service's own target ports (the name relay's, `--names-service-ports`).
pub(crate) fn serve_the_chart_service_from_this_node(
    c: &hairpin_tests::cluster::Cluster,
    flags: &[String],
) {
    let chart = hairpin_tests::cluster::objects::chart_objects(RELEASE_NS, flags);
    let service = chart
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "hairpin")
        .expect("the chart renders the hairpin Service");
    let target_port = |name: &str| {
        service["spec"]["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["name"] == name))
            .and_then(|p| p["targetPort"].as_u64())
            .unwrap_or_else(|| {
                panic!("the hairpin Service has no numeric targetPort {name}: {service}")
            })
    };
    let (http, https) = (target_port("http"), target_port("https"));
    c.kubectl_apply(&[
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "hairpin-sim", "namespace": RELEASE_NS,
                     "labels": {"kubernetes.io/service-name": "hairpin",
                                "endpointslice.kubernetes.io/managed-by": "hairpin-tests"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP4], "nodeName": "sim-node",
                       "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [{"name": "http", "port": http, "protocol": "TCP"},
                  {"name": "https", "port": https, "protocol": "TCP"}]}),
    ]);
}
