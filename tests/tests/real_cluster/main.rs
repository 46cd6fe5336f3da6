//! hairpin against the real Kubernetes components: etcd, kube-apiserver (Node and
//! RBAC authorizers, PodSecurity admission) and kube-controller-manager, kube-proxy
//! in iptables and nftables mode, all built from source by `cargo xtask k8s`. The
//! agent runs as the chart's DaemonSet runs it: its environment from the DaemonSet
//! real Helm renders, its ServiceAccount's token, bound by the chart's RBAC applied
//! to the real server. Outside CI the suite skips when the binaries are missing;
//! under `CI=true` it fails.

mod coredns;
mod coredns_import;
mod coredns_rke2;
mod daemonset;
mod demo;
mod events;
mod gateway;
mod latency;
mod lb;
mod rbac;
mod restart;
mod uninstall;

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::Agent,
    client::{Reply, url},
    cluster::{
        Cluster,
        objects::{DO_PROXY_PROTOCOL, LbService, chart_objects},
        proxy::KubeProxy,
    },
    node::{KubeProxyMode, SimNode},
};
use serde_json::json;

/// The release namespace the chart is installed into.
const RELEASE_NS: &str = "hairpin-system";

/// A simulated node with the real control plane and kube-proxy in `mode`; `None`
/// when the suite skips (no privileges, or no binaries outside CI).
struct RealNode {
    // Drop order: the agent, kube-proxy and the control plane before the node.
    agent: Option<Agent>,
    proxy: KubeProxy,
    cluster: Cluster,
    _nginx: hairpin_tests::servers::Server,
    node: SimNode,
}

impl RealNode {
    fn start(mode: KubeProxyMode) -> Option<RealNode> {
        if !hairpin_tests::privileges::datapath_tests_can_run(module_path!()) {
            return None;
        }
        let node = SimNode::for_real_kube_proxy();
        let cluster = Cluster::start(&node)?;
        let started = Instant::now();
        let proxy = KubeProxy::start(&cluster, mode);
        eprintln!(
            "kube-proxy ({mode:?}) synced in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let nginx = hairpin_tests::servers::start_nginx(&node);
        Some(RealNode {
            agent: None,
            proxy,
            cluster,
            _nginx: nginx,
            node,
        })
    }

    /// Installs the chart's objects (real Helm, `flags`) into the real server and
    /// starts the agent as its DaemonSet runs it, with its ServiceAccount's token;
    /// returns once it is ready.
    fn start_agent(&mut self, flags: &[String]) -> &mut Agent {
        let agent = self.spawn_agent(flags, |_| {});
        agent.wait_for_log("agent ready", Duration::from_secs(30));
        agent
    }

    /// As [`RealNode::start_agent`], with `edit` applied to the chart's objects
    /// before they are installed; returns once the programs are attached.
    fn spawn_agent(
        &mut self,
        flags: &[String],
        edit: impl FnOnce(&mut Vec<serde_json::Value>),
    ) -> &mut Agent {
        let mut objects = chart_objects(RELEASE_NS, flags);
        edit(&mut objects);
        self.cluster.ensure_namespace(RELEASE_NS);
        self.cluster.kubectl_apply(&objects);
        let env = agent_env(&self.node, &objects);
        let kubeconfig = self.node.dir.join("agent.kubeconfig");
        let token = self.cluster.service_account_token(RELEASE_NS, "hairpin");
        self.cluster.node_kubeconfig(&kubeconfig, &token);
        self.agent = Some(Agent::start_as_daemonset(
            &self.node,
            &kubeconfig,
            &env,
            &[],
        ));
        self.agent.as_mut().expect("agent")
    }

    fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("the agent was started")
    }
}

/// The DaemonSet's environment for the agent on the simulated node.
fn agent_env(node: &SimNode, objects: &[serde_json::Value]) -> Vec<(String, String)> {
    hairpin_tests::cluster::objects::daemonset_env_on(node, objects, RELEASE_NS)
}

/// A DigitalOcean ingress Service: the DO PROXY protocol annotation, `extra` more.
fn do_service<'a>(namespace: &'a str, name: &'a str, extra: &[(&str, &str)]) -> LbService<'a> {
    let mut annotations = std::collections::BTreeMap::new();
    annotations.insert(DO_PROXY_PROTOCOL.to_string(), "true".to_string());
    for (k, v) in extra {
        annotations.insert(k.to_string(), v.to_string());
    }
    LbService {
        namespace,
        name,
        annotations,
        port: 80,
        target_port: hairpin_tests::node::NGINX_PP_PORT,
        dual_stack: true,
        local_traffic: false,
    }
}

/// The DigitalOcean Service `ingress-nginx/name` (with `extra` annotations), its
/// status patched to `ips` in VIP mode as a cloud controller would.
fn ingress_nginx_lb(c: &Cluster, name: &str, extra: &[(&str, &str)], ips: &[&str]) {
    c.create_lb_service(&do_service("ingress-nginx", name, extra));
    c.set_lb_ingress("ingress-nginx", name, vip(ips));
}

/// Who sends a request: the pod (its namespace and cgroup) or a host process.
#[derive(Clone, Copy, Debug)]
enum From {
    Pod,
    Host,
}

/// One request to `lb`:80 with short timeouts (a poll must not sit out a rule that
/// is not there yet).
fn request(node: &SimNode, from: From, lb: &str) -> Reply {
    let (ns, cgroup) = match from {
        From::Pod => (&node.pod_ns, node.pod_cgroup()),
        From::Host => (&node.node_ns, node.host_cgroup()),
    };
    Reply::from_output(hairpin_tests::sh::output_in(
        ns,
        Some(&cgroup),
        &[
            "curl",
            "-sS",
            "--connect-timeout",
            "0.5",
            "--max-time",
            "2",
            &url(lb, 80, "/"),
        ],
    ))
}

/// Requests `lb`:80 until the reply satisfies `done`, or fails after `within` with
/// the last reply; returns how long it took.
fn until_reply(
    node: &SimNode,
    from: From,
    lb: &str,
    within: Duration,
    done: impl Fn(&Reply) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let reply = request(node, from, lb);
        if done(&reply) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{from:?} -> {lb}: not within {within:?}: {reply:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the reply carries a header naming `client`.
fn names(reply: &Reply, client: &str) -> bool {
    reply.ok() && reply.body.starts_with(&format!("client={client}:"))
}

/// The ingress for `ips`, each `{"ip": ip, "ipMode": "VIP"}`.
fn vip(ips: &[&str]) -> serde_json::Value {
    json!(
        ips.iter()
            .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
            .collect::<Vec<_>>()
    )
}
