//! The CoreDNS writer against the fake API server over real HTTP: Corefile mode
//! writes exactly `names::corefile::apply`'s text (nothing else changes), every
//! update carries the resourceVersion (a concurrent edit gets 409 and is kept),
//! import mode owns one key, an unrecognized Corefile is an error and an Event,
//! only the Lease holder writes, and `cleanup` restores the Corefile byte for byte.
//! Wildcard rewrites (`answer auto`) are written only for a CoreDNS Deployment at
//! 1.8.4 or later and held back, with a warning in status, below it or when the
//! version is unknown. And end to end in a running agent: the rewrite it writes names the Service a pod
//! then reaches the LB through.

use std::time::{Duration, Instant};

use hairpin_agent::{
    ProxyVersion,
    k8s::{
        COREDNS_REASON_UNRECOGNIZED as REASON_UNRECOGNIZED, CorednsConfig, CorednsMode,
        CorednsReporting as Reporting, CorednsTiming as Timing, coredns_rewrites as rewrites,
        run_corefile_writer,
    },
    names::{
        Hostname, NameRoute,
        corefile::{self, IMPORT_KEY},
    },
    status::{AgentState, Metrics},
};
use hairpin_tests::{
    agent::{Agent, NAMES_UNDER_EXAMPLE_COM, agent_bin},
    fakeapi::{FakeApi, digitalocean_service, recorded},
    names_support::curl_resolved_from_pod,
    node::{NODE_IP4, POD_IP4, SimNode},
    require_privileges,
    servers::start_nginx,
};
use serde_json::{Value, json};
use tokio::sync::watch;

const TARGET: &str = "hairpin.hairpin-system.svc.cluster.local";

/// kubeadm's Corefile, as `kubectl -n kube-system get cm coredns -o yaml` shows it.
const KUBEADM: &str = hairpin_tests::fakeapi::KUBEADM_COREFILE;

fn route(host: &str) -> NameRoute {
    NameRoute {
        host: Hostname::parse(host).expect("name"),
        lb: "203.0.113.10".parse().expect("ip"),
        ports: vec![80, 443],
        version: ProxyVersion::V1,
        source: "Ingress shop/web".into(),
    }
}

fn routes() -> Vec<NameRoute> {
    vec![
        route("shop.example.com"),
        route("*.apps.example.com"),
        route("shop.example.com"),
    ]
}

fn configmap(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "kube-system"}, "data": data})
}

fn config(mode: CorednsMode) -> CorednsConfig {
    CorednsConfig {
        mode,
        configmap: "kube-system/coredns".parse().expect("name"),
        custom: "kube-system/coredns-custom".parse().expect("name"),
        target: Hostname::parse(TARGET).expect("target"),
    }
}

/// A cluster whose CoreDNS ConfigMap holds kubeadm's Corefile.
fn kubeadm_cluster() -> FakeApi {
    let api = FakeApi::start();
    api.put_configmap(configmap("coredns", json!({"Corefile": KUBEADM})));
    api
}

struct Writer {
    leader: watch::Sender<bool>,
    routes: watch::Sender<Option<Vec<NameRoute>>>,
    state: AgentState,
}

/// kubeadm's CoreDNS image for Kubernetes 1.30.
const CURRENT_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.11.1";

/// The CoreDNS Deployment as kubeadm names it, running `image`.
fn coredns_deployment(image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "coredns", "namespace": "kube-system"},
           "spec": {"selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    "template": {"spec": {"containers": [{"name": "coredns", "image": image}]}}}})
}

/// Starts the writer against a cluster running a current CoreDNS.
fn start(api: &FakeApi, mode: CorednsMode, leader: bool) -> Writer {
    api.put_deployment(coredns_deployment(CURRENT_IMAGE));
    start_writer(api, mode, leader)
}

fn start_writer(api: &FakeApi, mode: CorednsMode, leader: bool) -> Writer {
    let (leader_tx, leader_rx) = watch::channel(leader);
    let (routes_tx, routes_rx) = watch::channel(Some(routes()));
    let state = AgentState::new(hairpin_ebpf::DEFAULT_BYPASS_MARK);
    tokio::spawn(run_corefile_writer(
        api.client(),
        config(mode),
        Reporting {
            instance: "writer-0".into(),
            state: state.clone(),
            metrics: Metrics::default(),
        },
        routes_rx,
        leader_rx,
        Timing {
            conflict_retry: Duration::from_millis(50),
            resync: Duration::from_millis(200),
            min_write_interval: Duration::ZERO,
        },
    ));
    Writer {
        leader: leader_tx,
        routes: routes_tx,
        state,
    }
}

/// Waits until `pred` holds, or fails after `within` with `what`.
async fn until(within: Duration, what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !pred() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn corefile(api: &FakeApi) -> String {
    api.configmap("kube-system/coredns").expect("configmap")["data"]["Corefile"]
        .as_str()
        .expect("Corefile")
        .to_string()
}

fn puts(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("PUT /api/v1/namespaces/kube-system/configmaps/"))
        .count()
}

fn expected(original: &str) -> String {
    let target = Hostname::parse(TARGET).expect("target");
    corefile::apply(original, &rewrites(&routes(), &target)).expect("apply")
}

mod in_process;
mod processes;
