//! Which Service is the cluster's DNS (kube-dns), so `hairpin-agent check` can
//! resolve a name as a pod does without being told the address.
//!
//! Distributions name it differently: kubeadm, EKS, AKS, GKE and k3s keep the
//! historical `kube-dns` (labelled `k8s-app: kube-dns`); RKE2's chart names it
//! `rke2-coredns-rke2-coredns`. The finder looks only in `kube-system` and only at
//! Services with a cluster IP and a port 53.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

/// The cluster DNS Service's cluster IPs (both families on dual-stack clusters,
/// primary first), or empty when there is no recognisable one.
///
/// Preference: the Service named `kube-dns`, then one labelled `k8s-app: kube-dns`,
/// then one whose name ends in `coredns`; ties go to the first name in order.
pub(crate) fn cluster_dns<'a>(services: impl IntoIterator<Item = &'a Service>) -> Vec<IpAddr> {
    let mut best: Option<(u8, &str, Vec<IpAddr>)> = None;
    for svc in services {
        let meta = &svc.metadata;
        if meta.namespace.as_deref() != Some("kube-system") {
            continue;
        }
        let name = meta.name.as_deref().unwrap_or_default();
        let labelled = meta
            .labels
            .as_ref()
            .and_then(|l| l.get("k8s-app"))
            .is_some_and(|v| v == "kube-dns");
        let rank = if name == "kube-dns" {
            0
        } else if labelled {
            1
        } else if name.ends_with("coredns") {
            2
        } else {
            continue;
        };
        let Some(spec) = &svc.spec else { continue };
        let serves_dns = spec.ports.iter().flatten().any(|p| p.port == 53);
        let ips = cluster_ips(svc);
        if !serves_dns || ips.is_empty() {
            continue;
        }
        let better = match &best {
            None => true,
            Some((r, n, _)) => (rank, name) < (*r, *n),
        };
        if better {
            best = Some((rank, name, ips));
        }
    }
    best.map(|(_, _, ips)| ips).unwrap_or_default()
}

/// `spec.clusterIPs` (or the older single `clusterIP`), parsed; `None` (headless)
/// and anything unparsable left out.
fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let listed = spec
        .cluster_ips
        .clone()
        .filter(|v| !v.is_empty())
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .unwrap_or_default();
    listed.iter().filter_map(|s| s.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Service {
        let path = format!(
            "{}/tests/fixtures/cluster-dns/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().expect("ip")).collect()
    }

    #[test]
    fn kubeadm_kube_dns_is_found_by_name() {
        assert_eq!(
            cluster_dns([&fixture("kubeadm-kube-dns.yaml")]),
            ips(&["10.96.0.10"])
        );
    }

    #[test]
    fn rke2_coredns_is_found_by_name_with_both_families() {
        assert_eq!(
            cluster_dns([&fixture("rke2-coredns-dual-stack.yaml")]),
            ips(&["10.43.0.10", "2001:cafe:43::a"])
        );
    }

    #[test]
    fn kube_dns_wins_over_other_candidates_and_others_are_ignored() {
        let kube_dns = fixture("kubeadm-kube-dns.yaml");
        let rke2 = fixture("rke2-coredns-dual-stack.yaml");
        // Same name outside kube-system: an app's own, not the cluster's.
        let mut elsewhere = kube_dns.clone();
        elsewhere.metadata.namespace = Some("default".into());
        elsewhere.spec.as_mut().expect("spec").cluster_ips = Some(vec!["10.96.5.5".into()]);
        // A headless one and one without port 53.
        let mut headless = kube_dns.clone();
        headless.metadata.name = Some("coredns".into());
        headless.spec.as_mut().expect("spec").cluster_ips = Some(vec!["None".into()]);
        let mut metrics = kube_dns.clone();
        metrics.metadata.name = Some("a-coredns".into());
        metrics
            .spec
            .as_mut()
            .expect("spec")
            .ports
            .as_mut()
            .expect("ports")
            .retain(|p| p.port != 53);
        assert_eq!(
            cluster_dns([&rke2, &elsewhere, &headless, &metrics, &kube_dns]),
            ips(&["10.96.0.10"])
        );
        assert_eq!(
            cluster_dns([&elsewhere, &headless, &metrics]),
            Vec::<IpAddr>::new()
        );
    }
}
