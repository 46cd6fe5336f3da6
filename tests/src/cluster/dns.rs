//! Real CoreDNS as the cluster's DNS: the cluster DNS Service (10.96.0.10, kube-proxy
//! DNATs to it), CoreDNS running in a pod namespace of the node with the Corefile of
//! the distribution's ConfigMap as the kubelet projects it, its `kubernetes`
//! plugin reaching the real API server with in-cluster configuration (the
//! `coredns` ServiceAccount's token and the CA at the in-cluster path, in a private
//! mount namespace; the distribution's ClusterRole). [`KUBEADM`] and [`RKE2`] name
//! the objects as those distributions do.
//!
//! Each [`CoreDns::start`] is a fresh process: a Corefile CoreDNS refuses makes it
//! exit, and the start fails with CoreDNS's own error (a reload would keep the old
//! configuration and hide it).

use std::{
    fs,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{Value, json};

use super::{APISERVER_PORT, Cluster, Proc};
use crate::{
    client::Reply,
    node::{NODE_IP4, SimNode},
    sh::output_in,
};

/// The cluster DNS Service's IP (kubeadm's: the tenth of the service range).
pub const DNS_IP: &str = "10.96.0.10";
/// Its IPv6 address where the distribution makes it dual-stack (RKE2): the tenth
/// of the IPv6 service range.
pub const DNS_IP6: &str = "fd00:10:96::a";

/// How a distribution names its cluster DNS in `kube-system`.
#[derive(Clone, Copy, Debug)]
pub struct DnsNames {
    /// The ConfigMap holding the Corefile, and the CoreDNS Deployment: both
    /// distributions name them alike, and the chart's CoreDNS writer reads
    /// CoreDNS's version from the Deployment named like the ConfigMap.
    pub configmap: &'static str,
    /// CoreDNS's ClusterRole and its binding to the `coredns` ServiceAccount.
    pub cluster_role: &'static str,
    /// The cluster DNS Service at [`DNS_IP`].
    service: fn() -> Value,
}

/// kubeadm's: the `coredns` ConfigMap and Deployment, ClusterRole `system:coredns`,
/// the `kube-dns` Service.
pub const KUBEADM: DnsNames = DnsNames {
    configmap: "coredns",
    cluster_role: "system:coredns",
    service: kube_dns_service,
};

/// RKE2's, from its rke2-coredns Helm chart (release `rke2-coredns`): ConfigMap,
/// Deployment, ClusterRole and Service all `rke2-coredns-rke2-coredns`; the chart
/// names the ServiceAccount `coredns` (its `serviceAccount.name`).
pub const RKE2: DnsNames = DnsNames {
    configmap: "rke2-coredns-rke2-coredns",
    cluster_role: "rke2-coredns-rke2-coredns",
    service: rke2_coredns_service,
};

fn kube_dns_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
           "spec": {"clusterIP": DNS_IP, "selector": {"k8s-app": "kube-dns"},
                    "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                              {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}})
}

/// The recorded RKE2 Service (dual-stack, found by its name alone: the recording
/// has no `k8s-app` label), at this cluster's addresses: RKE2's 10.43.0.10 is
/// outside this API server's service range.
fn rke2_coredns_service() -> Value {
    let recorded = crate::fakeapi::recorded("cluster-dns/rke2-coredns-dual-stack.yaml");
    let mut spec = recorded["spec"].clone();
    spec["clusterIP"] = json!(DNS_IP);
    spec["clusterIPs"] = json!([DNS_IP, DNS_IP6]);
    let meta = &recorded["metadata"];
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                        "labels": meta["labels"], "annotations": meta["annotations"]},
           "spec": spec})
}

/// kubeadm's cluster DNS objects: see [`cluster_dns_objects`].
pub fn kube_dns_objects(endpoint_ip: &str) -> Vec<Value> {
    cluster_dns_objects(&KUBEADM, endpoint_ip)
}

/// The distribution's RBAC for CoreDNS, its ServiceAccount and the cluster DNS
/// Service; the Service's endpoints are `endpoint_ip`, where CoreDNS runs.
pub fn cluster_dns_objects(dns: &DnsNames, endpoint_ip: &str) -> Vec<Value> {
    let service = (dns.service)();
    let service_name = service["metadata"]["name"].clone();
    // kube-proxy pairs the slice's ports with the Service's by name.
    let ports: Vec<Value> = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| json!({"name": p["name"], "port": 53, "protocol": p["protocol"]}))
        .collect();
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "coredns", "namespace": "kube-system"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": dns.cluster_role},
        "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": dns.cluster_role},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": dns.cluster_role},
               "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]}),
        service,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": format!("{}-sim", service_name.as_str().unwrap_or_default()),
                            "namespace": "kube-system",
                            "labels": {"kubernetes.io/service-name": service_name,
                                       "endpointslice.kubernetes.io/managed-by": "hairpin-tests"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [endpoint_ip], "nodeName": super::NODE_NAME,
                              "conditions": {"ready": true, "serving": true, "terminating": false}}],
               "ports": ports}),
    ]
}

/// A running CoreDNS; killed on drop.
pub struct CoreDns {
    proc: Proc,
    /// The Corefile it runs.
    pub corefile: String,
}

impl CoreDns {
    /// Starts CoreDNS in `netns` with the Corefile the `kube-system/coredns`
    /// ConfigMap holds now; waits until its `ready` endpoint (:8181) answers, or
    /// fails with its log when it refuses the Corefile or never gets ready.
    pub fn start(cluster: &Cluster, netns: &str) -> CoreDns {
        CoreDns::start_from(cluster, netns, KUBEADM.configmap)
    }

    /// As [`CoreDns::start`], with the Corefile of `kube-system/<configmap>`
    /// (RKE2's `rke2-coredns-rke2-coredns`).
    pub fn start_from(cluster: &Cluster, netns: &str, configmap: &str) -> CoreDns {
        CoreDns::start_with(cluster, netns, configmap, None)
    }

    /// As [`CoreDns::start`], with every key of the `kube-system/<custom>` ConfigMap
    /// projected as a file where the Corefile's `import` lines look for them (k3s,
    /// RKE2, AKS mount it at /etc/coredns/custom). The directory is this cluster's
    /// own, and the Corefile's path to it is rewritten to there: the host has no
    /// /etc/coredns, and making one would write to the machine's /etc.
    pub fn start_importing(cluster: &Cluster, netns: &str, custom: &str) -> CoreDns {
        CoreDns::start_with(cluster, netns, KUBEADM.configmap, Some(custom))
    }

    fn start_with(
        cluster: &Cluster,
        netns: &str,
        configmap: &str,
        custom: Option<&str>,
    ) -> CoreDns {
        let dir = cluster.dir.join("coredns");
        let secrets = dir.join("serviceaccount");
        fs::create_dir_all(&secrets).expect("coredns dir");
        let token = cluster.service_account_token("kube-system", "coredns");
        fs::write(secrets.join("token"), token).expect("token");
        fs::copy(cluster.ca_cert(), secrets.join("ca.crt")).expect("ca");
        fs::write(secrets.join("namespace"), "kube-system").expect("namespace");
        let mut corefile = corefile_in(cluster, configmap);
        if let Some(custom) = custom {
            let files = dir.join("custom");
            let _ = fs::remove_dir_all(&files);
            fs::create_dir_all(&files).expect("custom dir");
            let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "kube-system");
            let cm = cluster
                .block_on(cms.get(custom))
                .unwrap_or_else(|e| panic!("the {custom} ConfigMap: {e}"));
            for (key, value) in cm.data.unwrap_or_default() {
                fs::write(files.join(key), value).expect("custom file");
            }
            corefile = corefile.replace("/etc/coredns/custom", files.to_str().expect("utf-8 path"));
        }
        let conf = dir.join("Corefile");
        fs::write(&conf, &corefile).expect("Corefile");
        // The in-cluster path, seen only by CoreDNS: a tmpfs over /run in its own
        // mount namespace (/var/run is /run here).
        let script = format!(
            "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io && \
             cp -r {secrets} /run/secrets/kubernetes.io/serviceaccount && \
             cd {dir} && exec {bin} -conf {conf}",
            secrets = secrets.display(),
            dir = dir.display(),
            bin = cluster.bins.coredns.display(),
            conf = conf.display(),
        );
        let mut proc = Proc::spawn_env(
            "coredns",
            netns,
            &cluster.dir,
            &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ],
            &[
                ("KUBERNETES_SERVICE_HOST", NODE_IP4.to_string()),
                ("KUBERNETES_SERVICE_PORT", APISERVER_PORT.to_string()),
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            proc.assert_running();
            let out = output_in(
                netns,
                None,
                &[
                    "curl",
                    "-sf",
                    "--max-time",
                    "1",
                    "http://127.0.0.1:8181/ready",
                ],
            );
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "CoreDNS not ready within 20 s with this Corefile:\n{corefile}\nlog:\n{}",
                super::tail(&proc.log_text())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        CoreDns { proc, corefile }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.proc.log_text()
    }
}

/// The Corefile of `kube-system/coredns`, as the kubelet projects it into the pod.
pub fn corefile_of(cluster: &Cluster) -> String {
    corefile_in(cluster, KUBEADM.configmap)
}

/// The Corefile of `kube-system/<configmap>`, as the kubelet projects it into the pod.
pub fn corefile_in(cluster: &Cluster, configmap: &str) -> String {
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "kube-system");
    let cm = cluster
        .block_on(cms.get(configmap))
        .unwrap_or_else(|e| panic!("the {configmap} ConfigMap: {e}"));
    cm.data
        .and_then(|d| d.get("Corefile").cloned())
        .unwrap_or_else(|| panic!("the {configmap} ConfigMap has no Corefile key"))
}

/// The pod resolving through the cluster DNS Service: a resolv.conf as the kubelet
/// writes it for `dnsPolicy: ClusterFirst`, bind-mounted over the pod's, then
/// `script` (curl through glibc's resolver).
pub fn in_pod_with_cluster_dns(node: &SimNode, script: &str) -> Reply {
    let resolv = node.dir.join("pod-resolv.conf");
    fs::write(
        &resolv,
        format!(
            "search default.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver {DNS_IP}\noptions ndots:5\n"
        ),
    )
    .expect("resolv.conf");
    Reply::from_output(crate::sh::sh_with_files_over(
        &node.pod_ns,
        &node.pod_cgroup(),
        &[(resolv.as_path(), "/etc/resolv.conf")],
        script,
    ))
}
