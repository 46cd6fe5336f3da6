//! The demo on the real control plane (`cargo xtask demo --cluster`): a simulated
//! node with the real API server, controller manager and kube-proxy (iptables), a
//! DigitalOcean-annotated LoadBalancer Service whose status is patched as the cloud
//! controller patches it, and the agent started as the chart's DaemonSet runs it
//! (its ServiceAccount's token, bound by the chart's RBAC as real Helm renders it).
//! A pod's and the node's request to the LB fail without the agent and carry their
//! own address with it. [`run`] is the one entry point of the demo binary and of the
//! `real_cluster` test that keeps it from rotting.

use std::{path::PathBuf, time::Duration};

use serde_json::json;

use super::{
    Cluster,
    objects::{DO_PROXY_PROTOCOL, LbService, chart_objects, daemonset_env_on},
    proxy::KubeProxy,
};
use crate::{
    agent::Agent,
    client::{Reply, from_host, from_pod, url},
    dataplanes::matrix::NODE_UPLINK4,
    node::{KubeProxyMode, NGINX_PP_PORT, NODE_IP4, POD_IP4, SimNode},
    servers::{Server, start_nginx},
};

/// The namespace the demo installs the chart into.
pub const RELEASE_NS: &str = "hairpin-system";
/// The demo's LoadBalancer IP (TEST-NET-3: never routed off the node).
pub const LB: &str = "203.0.113.10";
/// The demo's ingress Service.
pub const SERVICE: (&str, &str) = ("ingress-nginx", "ingress-nginx-controller");

/// Everything the demo started; dropping it stops every process and removes the
/// namespaces, cgroups and files (field order is drop order).
pub struct DemoCluster {
    /// The agent, as the DaemonSet runs it.
    pub agent: Agent,
    /// Real kube-proxy (iptables).
    pub proxy: KubeProxy,
    /// The real control plane.
    pub cluster: Cluster,
    /// nginx in the ingress pod (`listen ... proxy_protocol`).
    pub nginx: Server,
    /// The simulated node.
    pub node: SimNode,
}

impl DemoCluster {
    /// The admin kubeconfig (`kubectl --kubeconfig ...` from the host).
    pub fn kubeconfig(&self) -> PathBuf {
        self.cluster.admin_kubeconfig()
    }

    /// The `kubectl get svc` line a newcomer runs.
    pub fn kubectl_line(&self) -> String {
        format!(
            "kubectl --kubeconfig {} get svc -A -o wide",
            self.kubeconfig().display()
        )
    }

    /// Runs `kubectl --kubeconfig ... ARGS` from the host; its stdout, or its error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

/// What the demo saw.
#[derive(Debug)]
pub struct Outcome {
    /// The pod's and the node's request before the agent ran.
    pub without: (Reply, Reply),
    /// The same requests with the agent running.
    pub with: (Reply, Reply),
    /// Whether the ingress saw the pod's and the node's own addresses.
    pub ok: bool,
}

/// Prints one request's result.
fn show(who: &str, reply: &Reply) {
    if reply.ok() {
        println!("  {who:<5} -> 200, body: {}", reply.body.trim_end());
    } else {
        println!(
            "  {who:<5} -> curl exit {} ({})",
            reply.code,
            reply.stderr.trim_end()
        );
    }
}

/// Builds the node and the real cluster, shows the requests without and with the
/// agent, calls `hold` with everything running (the binary waits for Ctrl-C there,
/// the test reads it back), then tears it all down. `None` when the real components
/// are not built (outside CI; [`super::Binaries::find`] said how to build them).
pub fn run(hold: impl FnOnce(&DemoCluster)) -> Option<Outcome> {
    println!("Building a simulated node with a real control plane:");
    println!(
        "  pod {POD_IP4} --veth-- node {NODE_IP4} --veth-- ingress pod (nginx, proxy_protocol)"
    );
    let node = SimNode::for_real_kube_proxy();
    let cluster = Cluster::start(&node)?;
    // Cluster::start printed the versions and the start-up time.
    let proxy = KubeProxy::start(&cluster, KubeProxyMode::Iptables);
    println!("  kube-proxy (iptables) synced");
    let nginx = start_nginx(&node);
    let (ns, name) = SERVICE;
    cluster.create_lb_service(&LbService {
        namespace: ns,
        name,
        annotations: [(DO_PROXY_PROTOCOL.to_string(), "true".to_string())].into(),
        port: 80,
        target_port: NGINX_PP_PORT,
        dual_stack: false,
        local_traffic: false,
    });
    // What DigitalOcean's cloud controller does once its load balancer exists.
    cluster.set_lb_ingress(ns, name, json!([{"ip": LB, "ipMode": "VIP"}]));
    println!("  Service {ns}/{name}: LoadBalancer {LB}:80, annotated {DO_PROXY_PROTOCOL}\n");
    let target = url(LB, 80, "/");
    // kube-proxy programs the LB IP on its own time: wait until the ingress answers
    // (with nginx's refusal of a header-less connection, an empty reply).
    let without = poll(
        || (from_pod(&node, &target), from_host(&node, &target)),
        |(p, _)| p.code != 7 && p.code != 28,
    );
    println!("1. Without hairpin, curl {target}:");
    show("pod", &without.0);
    show("node", &without.1);

    println!("\n2. The chart's RBAC (real Helm) applied; hairpin-agent as its DaemonSet runs it:");
    let objects = chart_objects(RELEASE_NS, &[]);
    cluster.ensure_namespace(RELEASE_NS);
    cluster.kubectl_apply(&objects);
    let kubeconfig = node.dir.join("agent.kubeconfig");
    let token = cluster.service_account_token(RELEASE_NS, "hairpin");
    cluster.node_kubeconfig(&kubeconfig, &token);
    let env = daemonset_env_on(&node, &objects, RELEASE_NS);
    let mut agent = Agent::start_as_daemonset(&node, &kubeconfig, &env, &[]);
    agent.wait_for_log("agent ready", Duration::from_secs(30));
    let expect = |r: &Reply, who: &str| r.ok() && r.body.starts_with(&format!("client={who}:"));
    let with = poll(
        || (from_pod(&node, &target), from_host(&node, &target)),
        |(p, h)| expect(p, POD_IP4) && expect(h, NODE_UPLINK4),
    );
    show("pod", &with.0);
    show("node", &with.1);
    // A host process on the kernel path: the address its socket is bound to (the
    // uplink, towards the LB).
    let ok = expect(&with.0, POD_IP4) && expect(&with.1, NODE_UPLINK4);
    let demo = DemoCluster {
        agent,
        proxy,
        cluster,
        nginx,
        node,
    };
    println!("\n3. The cluster, with kubectl:");
    println!("  export KUBECONFIG={}", demo.kubeconfig().display());
    println!("  {}", demo.kubectl_line());
    match demo.kubectl(&["get", "svc", "-A", "-o", "wide"]) {
        Ok(text) => text.lines().for_each(|l| println!("    {l}")),
        Err(e) => println!("    (kubectl failed: {})", e.trim_end()),
    }
    hold(&demo);
    drop(demo);
    println!(
        "\nStopped the agent, kube-proxy and the control plane; cleaned up the simulated node."
    );
    Some(Outcome { without, with, ok })
}

/// Calls `f` until `done` says yes or 20 s passed; the last answer.
fn poll<T>(f: impl Fn() -> T, done: impl Fn(&T) -> bool) -> T {
    let started = std::time::Instant::now();
    loop {
        let v = f();
        if done(&v) || started.elapsed() > Duration::from_secs(20) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
