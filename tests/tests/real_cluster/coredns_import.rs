//! Real CoreDNS in import mode (k3s, RKE2, AKS): the main Corefile is the
//! distribution's and `import`s `*.override` files from the `coredns-custom`
//! ConfigMap; the chart's CoreDNS writer (`coredns.mode=import`, its own RBAC) owns
//! the `hairpin.override` key alone. CoreDNS loads that key as the distribution
//! mounts it, a pod resolves an exact and a wildcard name through the cluster DNS
//! Service, reaches the name relay through the chart's `hairpin` Service, and the
//! ingress sees the pod's own address in the header. A key CoreDNS refuses fails
//! [`CoreDns::start_importing`] with CoreDNS's error; a wrong answer fails the request.

use std::time::{Duration, Instant};

use hairpin_tests::{
    cluster::dns::{CoreDns, KUBEADM, corefile_of},
    node::KubeProxyMode,
};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use crate::{
    RealNode,
    coredns::{
        COREDNS_IMAGE, SHOP_NAMES, cluster_dns_and_a_shop_ingress,
        resolves_and_gets_its_own_header, serve_the_chart_service_from_this_node, start_writer,
        writer_flags,
    },
};

/// k3s's Corefile (its `coredns.yaml` manifest) without its `hosts
/// /etc/coredns/NodeHosts` block, which lists k3s's own nodes and has no part in
/// the import shape.
const K3S_COREFILE: &str = ".:53 {
    errors
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
    import /etc/coredns/custom/*.override
}
import /etc/coredns/custom/*.server
";

/// The key another tool (or the user) keeps in `coredns-custom`: it stays.
const THEIRS: (&str, &str) = ("mine.server", "example.org:53 {\n    errors\n}\n");

#[test]
fn import_mode_real_coredns_loads_the_override_key_and_the_pod_gets_its_own_header() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Iptables) else {
        return;
    };
    let flags = writer_flags(&["coredns.mode=import"]);
    // k3s names its cluster DNS as kubeadm does.
    cluster_dns_and_a_shop_ingress(
        &rn.cluster,
        &KUBEADM,
        COREDNS_IMAGE,
        K3S_COREFILE,
        vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "coredns-custom", "namespace": "kube-system"},
            "data": {THEIRS.0: THEIRS.1}})],
    );
    rn.start_agent(&flags);
    let c = &rn.cluster;
    serve_the_chart_service_from_this_node(c, &flags);
    let writer = start_writer(&rn, &flags);
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(c.client(), "kube-system");
    let deadline = Instant::now() + Duration::from_secs(30);
    let data = loop {
        let data = c
            .block_on(cms.get("coredns-custom"))
            .expect("the coredns-custom ConfigMap")
            .data
            .unwrap_or_default();
        let ours = data.get("hairpin.override").cloned().unwrap_or_default();
        if ours.contains("shop.example.com") && ours.contains(r"apps\.example\.com") {
            break data;
        }
        assert!(
            Instant::now() < deadline,
            "the writer wrote no hairpin.override: {data:?}\nwriter:\n{}",
            writer.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("hairpin.override as written:\n{}", data["hairpin.override"]);
    assert_eq!(data.get(THEIRS.0).map(String::as_str), Some(THEIRS.1));
    assert_eq!(
        corefile_of(c),
        K3S_COREFILE,
        "import mode leaves the main Corefile alone"
    );
    let dns = CoreDns::start_importing(c, &rn.node.ingress_ns, "coredns-custom");
    for name in SHOP_NAMES {
        resolves_and_gets_its_own_header(&rn, &dns, name);
    }
}
