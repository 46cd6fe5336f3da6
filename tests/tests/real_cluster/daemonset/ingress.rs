//! The ingress behind the `daemonset_` scenarios' LoadBalancers: a real pod on the
//! node (nginx with the PROXY protocol on, its configuration from a ConfigMap), and
//! Services that select it, so the endpoints kube-proxy balances to are the ones
//! the controller manager's EndpointSlice controller made from the pod.

use std::time::Duration;

use hairpin_tests::cluster::{NODE_NAME, kubelet::NGINX_IMAGE};
use serde_json::{Value, json};

use super::node::KubeletNode;
use crate::{do_service, vip};

/// The ingress pods' namespace, as ingress-nginx installs itself.
pub(super) const INGRESS_NS: &str = "ingress-nginx";
/// The port nginx listens on in the pod (not 80: it runs as a user, unprivileged);
/// [`NGINX_CONF`]'s `@PORT@`.
const INGRESS_PORT: u16 = 8080;
/// The label the ingress Services select.
const INGRESS_LABEL: (&str, &str) = ("app.kubernetes.io/name", "ingress-nginx");

/// nginx as an ingress controller behind a PROXY-protocol LB runs it: every
/// connection must start with a header, and the reply names the client it gave
/// (`client=IP:PORT`). Writable paths are all under the pod's /tmp.
const NGINX_CONF: &str = r#"daemon off;
worker_processes 1;
pid /tmp/nginx.pid;
error_log stderr;
events { worker_connections 256; }
http {
    access_log /dev/stdout;
    client_body_temp_path /tmp/body;
    proxy_temp_path /tmp/proxy;
    fastcgi_temp_path /tmp/fastcgi;
    uwsgi_temp_path /tmp/uwsgi;
    scgi_temp_path /tmp/scgi;
    server {
        listen @PORT@ proxy_protocol;
        listen [::]:@PORT@ proxy_protocol;
        location / {
            default_type text/plain;
            return 200 "client=$proxy_protocol_addr:$proxy_protocol_port\n";
        }
    }
}
"#;

impl KubeletNode {
    /// The ingress controller's pod, Ready; its IPs (`status.podIPs`).
    pub(super) fn ingress_pod(&self) -> Vec<String> {
        let c = &self.rn.cluster;
        c.ensure_namespace(INGRESS_NS);
        let (key, value) = INGRESS_LABEL;
        c.kubectl_apply(&[
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "ingress-nginx", "namespace": INGRESS_NS},
                "data": {"nginx.conf": NGINX_CONF.replace("@PORT@", &INGRESS_PORT.to_string())}}),
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ingress-nginx-controller", "namespace": INGRESS_NS,
                         "labels": {key: value}},
            "spec": {
                "nodeName": NODE_NAME,
                "terminationGracePeriodSeconds": 0,
                "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "runAsNonRoot": true},
                "containers": [{
                    "name": "controller",
                    "image": NGINX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/sbin/nginx", "-e", "stderr", "-c", "/etc/ingress/nginx.conf"],
                    "ports": [{"name": "http", "containerPort": INGRESS_PORT}],
                    "readinessProbe": {"tcpSocket": {"port": INGRESS_PORT}, "periodSeconds": 1},
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "readOnlyRootFilesystem": true,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "conf", "mountPath": "/etc/ingress"},
                                     {"name": "tmp", "mountPath": "/tmp"}],
                }],
                "volumes": [{"name": "conf", "configMap": {"name": "ingress-nginx"}},
                            {"name": "tmp", "emptyDir": {}}],
            }}),
        ]);
        let pod = self.wait_ready(
            INGRESS_NS,
            &format!("{key}={value}"),
            Duration::from_secs(60),
        );
        pod_ips(&pod)
    }

    /// The DigitalOcean Service `ingress-nginx/name` (with `extra` annotations)
    /// selecting the ingress pod, its status patched to `ips` as a cloud controller
    /// would.
    pub(super) fn ingress_pod_lb(&self, name: &str, extra: &[(&str, &str)], ips: &[&str]) {
        let c = &self.rn.cluster;
        let mut svc = do_service(INGRESS_NS, name, extra);
        svc.target_port = INGRESS_PORT;
        let (key, value) = INGRESS_LABEL;
        c.create_lb_service_for_pods(&svc, &json!({key: value}));
        c.set_lb_ingress(INGRESS_NS, name, vip(ips));
    }

    /// What the ingress pod's nginx logged (its errors: a connection without a
    /// header is `broken header`).
    pub(super) fn ingress_log(&self) -> String {
        let out = self.kubectl(&["logs", "-n", INGRESS_NS, "ingress-nginx-controller"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A pod's IPs, its IPv4 first as the kubelet lists them.
pub(super) fn pod_ips(pod: &Value) -> Vec<String> {
    pod["status"]["podIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["ip"].as_str().map(str::to_string))
        .collect()
}
