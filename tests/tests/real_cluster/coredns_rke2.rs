//! Real CoreDNS serving RKE2's cluster DNS as its rke2-coredns chart ships it: the
//! Corefile in ConfigMap `kube-system/rke2-coredns-rke2-coredns` (the chart's
//! template leaves trailing and doubled spaces and no final newline), the
//! Deployment and the dual-stack Service of the same name, no `kube-dns` Service.
//! The chart is installed with `coredns.configMap=rke2-coredns-rke2-coredns` (as
//! deploy/overlays/rke2); its CoreDNS writer adds its lines and leaves RKE2's byte
//! for byte, CoreDNS is started from that ConfigMap's Corefile, and a pod resolves
//! an exact and a wildcard name through the cluster DNS Service and gets its own
//! address in the header. A rewrite CoreDNS refuses fails [`CoreDns::start_from`]
//! with CoreDNS's error; a wrong answer fails the request.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::status,
    cluster::dns::{CoreDns, DNS_IP, DNS_IP6, RKE2},
    node::KubeProxyMode,
    repo::agent_fixture,
};

use crate::{
    RealNode,
    coredns::{
        SHOP_NAMES, cluster_dns_and_a_shop_ingress, resolves_and_gets_its_own_header,
        serve_the_chart_service_from_this_node, start_writer, writer_flags, written_corefile,
    },
};

/// The CoreDNS image RKE2 v1.35.3 ships (rancher's hardened build and its tag
/// shape, which the writer reads the version of). The CoreDNS run is the suite's
/// 1.14.7: both are past 1.8.4, the one version the writer's choice turns on.
const RKE2_IMAGE: &str = "rancher/hardened-coredns:v1.14.2-build20260310";

/// What the writer ends each of its lines with.
const MARK: &str = "# Added by hairpin";

/// RKE2's Corefile as `kubectl get cm` shows it: the recording without the lines
/// of comment above it.
fn rke2_corefile() -> String {
    let path = agent_fixture("corefiles/rke2.corefile");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let start = text
        .find(".:53 {")
        .unwrap_or_else(|| panic!("{}: no server block", path.display()));
    text[start..].to_string()
}

#[test]
fn rke2_corefile_served_by_real_coredns_and_the_pod_gets_its_own_header() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Iptables) else {
        return;
    };
    let flags = writer_flags(&[
        "coredns.mode=corefile",
        &format!("coredns.configMap={}", RKE2.configmap),
    ]);
    let shipped = rke2_corefile();
    cluster_dns_and_a_shop_ingress(&rn.cluster, &RKE2, RKE2_IMAGE, &shipped, Vec::new());
    rn.start_agent(&flags);
    let c = &rn.cluster;
    serve_the_chart_service_from_this_node(c, &flags);
    let writer = start_writer(&rn, &flags);
    let written = written_corefile(c, RKE2.configmap, &writer);
    let theirs: String = written
        .split_inclusive('\n')
        .filter(|line| !line.trim_end().ends_with(MARK))
        .collect();
    assert_eq!(theirs, shipped, "RKE2's lines are kept byte for byte");
    // The agent finds RKE2's DNS Service (by its name alone), both families, for
    // `check` to resolve as a pod does.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = status(&rn.node)["cluster_dns"].clone();
        if found == serde_json::json!([DNS_IP, DNS_IP6]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent's cluster DNS: {found}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let dns = CoreDns::start_from(c, &rn.node.ingress_ns, RKE2.configmap);
    for name in SHOP_NAMES {
        resolves_and_gets_its_own_header(&rn, &dns, name);
    }
}
