//! Objects the suites put into the real API server: LoadBalancer Services without
//! selectors and their EndpointSlices (the simulated ingress pod is the endpoint)
//! or selecting a real ingress pod,
//! load-balancer status patched as a cloud controller patches it, the chart's RBAC
//! as real Helm renders it, and the agent's ServiceAccount token.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Namespace, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
    events::v1::Event,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::Cluster;
use crate::node::{INGRESS_IP4, INGRESS_IP6};

/// The DigitalOcean cloud controller's PROXY protocol annotation.
pub const DO_PROXY_PROTOCOL: &str =
    "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol";

/// A LoadBalancer Service the test creates: `name` in `namespace`, TCP `port`
/// served by the ingress pod's `target_port`, in the families of its LB IPs.
pub struct LbService<'a> {
    /// Namespace (created when missing).
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// The Service port (the LB port).
    pub port: u16,
    /// The ingress pod's port behind it.
    pub target_port: u16,
    /// Whether the Service is dual-stack (an IPv6 LB address needs it).
    pub dual_stack: bool,
    /// `externalTrafficPolicy: Local` (else Cluster); the ingress pod is on this node.
    pub local_traffic: bool,
}

impl LbService<'_> {
    /// The Service object: no selector (its endpoints are the test's EndpointSlices).
    fn object(&self) -> Value {
        self.object_selecting(None)
    }

    /// The Service object, selecting the pods with the labels `selector` when given.
    fn object_selecting(&self, selector: Option<&Value>) -> Value {
        let (policy, families) = if self.dual_stack {
            ("RequireDualStack", json!(["IPv4", "IPv6"]))
        } else {
            ("SingleStack", json!(["IPv4"]))
        };
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.name, "namespace": self.namespace, "annotations": self.annotations},
            "spec": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": if self.local_traffic { "Local" } else { "Cluster" },
                "ipFamilyPolicy": policy,
                "ipFamilies": families,
                "ports": [{"name": "http", "protocol": "TCP", "port": self.port, "targetPort": self.target_port}],
                "selector": selector,
            },
        })
    }
}

impl Cluster {
    /// Creates `namespace` when it does not exist.
    pub fn ensure_namespace(&self, namespace: &str) {
        let api: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))
            .expect("namespace object");
        self.block_on(async {
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("create namespace {namespace}: {e}"),
            }
        });
    }

    /// Creates the Service and its EndpointSlices (the ingress pod, each family of
    /// the Service, ready), as an ingress controller's Service with its pods.
    pub fn create_lb_service(&self, svc: &LbService<'_>) {
        self.ensure_namespace(svc.namespace);
        let services: Api<Service> = Api::namespaced(self.client(), svc.namespace);
        let slices: Api<EndpointSlice> = Api::namespaced(self.client(), svc.namespace);
        let object: Service = serde_json::from_value(svc.object()).expect("service object");
        let mut families = vec![("IPv4", INGRESS_IP4, "v4")];
        if svc.dual_stack {
            families.push(("IPv6", INGRESS_IP6, "v6"));
        }
        self.block_on(async {
            services
                .create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("create Service {}/{}: {e}", svc.namespace, svc.name));
            for (family, ip, tag) in families {
                let slice: EndpointSlice = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("{}-{tag}", svc.name),
                        "namespace": svc.namespace,
                        "labels": {
                            "kubernetes.io/service-name": svc.name,
                            "endpointslice.kubernetes.io/managed-by": "hairpin-tests",
                        },
                    },
                    "addressType": family,
                    "endpoints": [{"addresses": [ip], "nodeName": super::NODE_NAME, "conditions": {"ready": true, "serving": true, "terminating": false}}],
                    "ports": [{"name": "http", "protocol": "TCP", "port": svc.target_port}],
                }))
                .expect("endpoint slice object");
                slices
                    .create(&PostParams::default(), &slice)
                    .await
                    .unwrap_or_else(|e| panic!("create EndpointSlice for {}: {e}", svc.name));
            }
        });
    }

    /// Creates the Service selecting the pods labelled `selector`: the controller
    /// manager's EndpointSlice controller makes its endpoints from them.
    pub fn create_lb_service_for_pods(&self, svc: &LbService<'_>, selector: &Value) {
        self.ensure_namespace(svc.namespace);
        let services: Api<Service> = Api::namespaced(self.client(), svc.namespace);
        let object: Service =
            serde_json::from_value(svc.object_selecting(Some(selector))).expect("service object");
        self.block_on(async {
            services
                .create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("create Service {}/{}: {e}", svc.namespace, svc.name));
        });
    }

    /// Sets `status.loadBalancer.ingress` of a Service, as a cloud controller does
    /// once its load balancer exists (each entry: `{"ip": ..}`, `{"hostname": ..}`,
    /// with `ipMode` where the provider sets it).
    pub fn set_lb_ingress(&self, namespace: &str, name: &str, ingress: Value) {
        let services: Api<Service> = Api::namespaced(self.client(), namespace);
        let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        self.block_on(async {
            services
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("patch the LB status of {namespace}/{name}: {e}"));
        });
    }

    /// Sets `status.loadBalancer.ingress` of an Ingress, as its controller does.
    pub fn set_ingress_lb(&self, namespace: &str, name: &str, ingress: Value) {
        let api: Api<k8s_openapi::api::networking::v1::Ingress> =
            Api::namespaced(self.client(), namespace);
        let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        self.block_on(async {
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("patch the status of Ingress {namespace}/{name}: {e}"));
        });
    }

    /// Merge-patches a Service's metadata annotations (`null` removes one).
    pub fn annotate_service(&self, namespace: &str, name: &str, annotations: Value) {
        let services: Api<Service> = Api::namespaced(self.client(), namespace);
        let patch = json!({"metadata": {"annotations": annotations}});
        self.block_on(async {
            services
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("annotate {namespace}/{name}: {e}"));
        });
    }

    /// Deletes a Service.
    pub fn delete_service(&self, namespace: &str, name: &str) {
        let services: Api<Service> = Api::namespaced(self.client(), namespace);
        self.block_on(async {
            services
                .delete(name, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("delete {namespace}/{name}: {e}"));
        });
    }

    /// The Events (events.k8s.io/v1) regarding the Service `namespace/name`:
    /// (type, reason, note).
    pub fn service_events(&self, namespace: &str, name: &str) -> Vec<(String, String, String)> {
        let events: Api<Event> = Api::namespaced(self.client(), namespace);
        let lp = ListParams::default().fields(&format!("regarding.name={name}"));
        self.block_on(async {
            events
                .list(&lp)
                .await
                .unwrap_or_else(|e| panic!("list Events of {namespace}/{name}: {e}"))
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Service"))
                .map(|e| {
                    (
                        e.type_.unwrap_or_default(),
                        e.reason.unwrap_or_default(),
                        e.note.unwrap_or_default(),
                    )
                })
                .collect()
        })
    }

    /// Applies `objects` with `kubectl apply --server-side` as the admin, as an
    /// operator installing manifests does; fails with kubectl's own message.
    pub fn kubectl_apply(&self, objects: &[Value]) {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let file = self.dir.join(format!(
            "apply-{}.json",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos()
        ));
        std::fs::write(&file, serde_json::to_vec(&list).expect("json")).expect("write manifests");
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(["apply", "--server-side", "--field-manager=helm", "-f"])
            .arg(&file)
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl apply: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl ARGS` as the admin; panics with kubectl's output on failure.
    pub fn kubectl(&self, args: &[&str]) {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Installs the Gateway API's standard CRDs of `kinds` (plural resource names,
    /// e.g. `httproutes`) as an operator does, with `kubectl apply --server-side`,
    /// and waits until the API server serves them.
    pub fn install_gateway_api_crds(&self, kinds: &[&str]) {
        let kubectl = |args: &[&str]| self.kubectl(args);
        for kind in kinds {
            let file = self
                .bins
                .gateway_api_crds
                .join(format!("gateway.networking.k8s.io_{kind}.yaml"));
            let file = file.to_str().expect("utf-8 path");
            kubectl(&["apply", "--server-side", "-f", file]);
            kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                &format!("crd/{kind}.gateway.networking.k8s.io"),
            ]);
        }
    }

    /// A token of ServiceAccount `namespace/name` (TokenRequest, one hour), as the
    /// kubelet projects it into the pod.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": 3600},
        }))
        .expect("token request");
        let answer: TokenRequest = self.block_on(async {
            accounts
                .create_subresource("token", name, &PostParams::default(), &request)
                .await
                .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"))
        });
        answer.status.expect("token status").token
    }
}

/// The chart as `helm install hairpin deploy/chart/hairpin -n NAMESPACE` renders it
/// with `flags` (real Helm, tests/src/helm.rs), hooks left out: the objects an
/// install creates.
pub fn chart_objects(namespace: &str, flags: &[String]) -> Vec<Value> {
    crate::helm::render_workspace_chart(namespace, "hairpin", flags)
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect()
}

/// The DaemonSet's agent container environment with its field references resolved
/// as the kubelet resolves them on the simulated node.
pub fn daemonset_env(objects: &[Value], namespace: &str) -> Vec<(String, String)> {
    workload_env(objects, "DaemonSet", namespace, "hairpin-agent-0")
}

/// The first container's environment of the chart's `kind` (DaemonSet, Deployment),
/// field references resolved as the kubelet resolves them for a pod `pod_name` on
/// the simulated node.
pub fn workload_env(
    objects: &[Value],
    kind: &str,
    namespace: &str,
    pod_name: &str,
) -> Vec<(String, String)> {
    let workload = objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("the chart renders no {kind}"));
    let container = &workload["spec"]["template"]["spec"]["containers"][0];
    let node_ips = format!("{},{}", crate::node::NODE_IP4, crate::node::NODE_IP6);
    container["env"]
        .as_array()
        .expect("env list")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_string();
            let value = match e["value"].as_str() {
                Some(v) => v.to_string(),
                None => match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("spec.nodeName") => super::NODE_NAME.to_string(),
                    Some("status.hostIP" | "status.hostIPs") => node_ips.clone(),
                    Some("metadata.namespace") => namespace.to_string(),
                    Some("metadata.name") => pod_name.to_string(),
                    other => panic!("the {kind}'s env {name} refers to {other:?}"),
                },
            };
            (name, value)
        })
        .collect()
}

/// Creates a single-stack DigitalOcean-annotated LoadBalancer Service `namespace/name`
/// and sets its status to `ip`, with `client` (for bulk loads, many in flight).
pub async fn create_service_with_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    ip: &str,
) {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let svc = LbService {
        namespace,
        name,
        annotations: [(DO_PROXY_PROTOCOL.to_string(), "true".to_string())].into(),
        port: 80,
        target_port: 80,
        dual_stack: false,
        local_traffic: false,
    };
    let mut object = svc.object();
    // The node port range holds 2,768 ports: past that the real API server refuses
    // the Service ("failed to allocate a nodePort: range is full"). Clouds whose LBs
    // reach the pods directly turn allocation off the same way.
    object["spec"]["allocateLoadBalancerNodePorts"] = json!(false);
    let object: Service = serde_json::from_value(object).expect("service object");
    services
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create Service {namespace}/{name}: {e}"));
    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}});
    services
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch the LB status of {namespace}/{name}: {e}"));
}

/// The DaemonSet's environment for an agent on `node` (as [`daemonset_env`]), the
/// host paths it names replaced by the node's own (its bpffs, admin socket); the
/// node's /etc/hosts is never the machine's.
pub fn daemonset_env_on(
    node: &crate::node::SimNode,
    objects: &[Value],
    namespace: &str,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = daemonset_env(objects, namespace)
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "HAIRPIN_HOSTS_FILE" | "HAIRPIN_CGROUP_PATH" | "HAIRPIN_PIN_OWNER"
            )
        })
        .collect();
    for (k, v) in [
        ("HAIRPIN_BPF_PIN_DIR", node.pin_dir().display().to_string()),
        (
            "HAIRPIN_ADMIN_SOCKET",
            node.dir.join("admin.sock").display().to_string(),
        ),
    ] {
        env.retain(|(name, _)| name != k);
        env.push((k.to_string(), v));
    }
    env
}
