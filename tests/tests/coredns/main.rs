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
    k8s::coredns::{
        CorednsConfig, CorednsMode, rewrites,
        task::{self as coredns_loop, REASON_UNRECOGNIZED, Reporting, Timing},
    },
    model::ProxyVersion,
    names::{
        corefile::{self, IMPORT_KEY},
        hostname::Hostname,
        routes::NameRoute,
    },
    status::{AgentState, metrics::Metrics},
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
    tokio::spawn(coredns_loop::run(
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

#[tokio::test]
async fn corefile_mode_writes_our_lines_and_nothing_else() {
    let api = FakeApi::start();
    api.put_configmap(configmap(
        "coredns",
        json!({"Corefile": KUBEADM, "other": "kept\n"}),
    ));
    let w = start(&api, CorednsMode::Corefile, true);
    until(Duration::from_secs(5), "Corefile written", || {
        corefile(&api) != KUBEADM
    })
    .await;
    let written = corefile(&api);
    assert_eq!(written, expected(KUBEADM), "byte for byte apply()'s output");
    assert_eq!(written.matches(corefile::MARKER).count(), 2, "{written}");
    assert_eq!(corefile::remove(&written), KUBEADM, "nothing else changed");
    let cm = api.configmap("kube-system/coredns").expect("configmap");
    assert_eq!(cm["data"]["other"], "kept\n");
    // Several resyncs later nothing more was written: the text did not change.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(puts(&api), 1, "{:#?}", api.requests());
    let st = w.state.snapshot().coredns.expect("coredns status");
    assert!(
        st.leader && st.last_error.is_none() && st.rewrites == 2,
        "{st:?}"
    );

    // Names gone: our lines go, the Corefile is the original again.
    w.routes.send_replace(Some(Vec::new()));
    until(Duration::from_secs(5), "lines removed", || {
        corefile(&api) == KUBEADM
    })
    .await;
}

#[tokio::test]
async fn a_concurrent_edit_gets_409_and_is_kept_after_the_retry() {
    let api = kubeadm_cluster();
    let edited = KUBEADM.replace("cache 30", "cache 60");
    api.change_before_next_update("kube-system/coredns", "Corefile", &edited);
    let _w = start(&api, CorednsMode::Corefile, true);
    until(Duration::from_secs(5), "retried after 409", || {
        corefile(&api).contains(corefile::MARKER)
    })
    .await;
    assert_eq!(api.conflicts(), 1, "{:#?}", api.requests());
    assert_eq!(
        corefile(&api),
        expected(&edited),
        "the other writer's change is kept"
    );
}

#[tokio::test]
async fn import_mode_owns_only_its_key() {
    let api = FakeApi::start();
    let w = start(&api, CorednsMode::Import, true);
    let ours = |api: &FakeApi| {
        api.configmap("kube-system/coredns-custom")
            .and_then(|cm| cm["data"][IMPORT_KEY].as_str().map(String::from))
    };
    let target = Hostname::parse(TARGET).expect("target");
    let want = corefile::render_import(&rewrites(&routes(), &target));
    until(Duration::from_secs(5), "coredns-custom created", || {
        ours(&api).as_deref() == Some(want.as_str())
    })
    .await;
    // Another key appears (k3s users put theirs here); ours changes; theirs stays.
    let mut cm = api.configmap("kube-system/coredns-custom").expect("cm");
    cm["data"]["mine.server"] = json!("example.org:53 { forward . 1.1.1.1 }\n");
    api.put_configmap(cm);
    w.routes.send_replace(Some(vec![route("only.example.com")]));
    let want = corefile::render_import(&rewrites(&[route("only.example.com")], &target));
    until(Duration::from_secs(5), "import key updated", || {
        ours(&api).as_deref() == Some(want.as_str())
    })
    .await;
    let cm = api.configmap("kube-system/coredns-custom").expect("cm");
    assert_eq!(
        cm["data"]["mine.server"],
        "example.org:53 { forward . 1.1.1.1 }\n"
    );
    assert!(api.configmap("kube-system/coredns").is_none());
}

/// Starts the writer (corefile mode, the leader) on a ConfigMap holding `text`,
/// which it must refuse: one Warning Event on the ConfigMap, never a write, the
/// Corefile left as it was. The error its status shows.
async fn refused(api: &FakeApi, text: &str) -> String {
    api.put_configmap(configmap("coredns", json!({"Corefile": text})));
    let w = start(api, CorednsMode::Corefile, true);
    until(Duration::from_secs(5), "event published", || {
        !api.events().is_empty()
    })
    .await;
    let ev = &api.events()[0];
    assert_eq!(ev["reason"], REASON_UNRECOGNIZED);
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["kind"], "ConfigMap");
    assert_eq!(ev["regarding"]["name"], "coredns");
    let err = w
        .state
        .snapshot()
        .coredns
        .and_then(|c| c.last_error)
        .expect("error in status");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(api.events().len(), 1, "one Event per distinct error");
    assert_eq!(puts(api), 0, "never written: {:#?}", api.requests());
    assert_eq!(corefile(api), text);
    err
}

#[tokio::test]
async fn an_unrecognized_corefile_is_an_error_in_status_and_a_warning_event() {
    let api = FakeApi::start();
    let err = refused(&api, "example.org:53 {\n    forward . 1.1.1.1\n}\n").await;
    assert!(
        err.contains("kube-system/coredns") && err.contains("main server block"),
        "{err}"
    );
}

/// Issue 14 finding 3: a Corefile CoreDNS itself could not parse (here the main
/// block's closing brace is missing) is never edited: an error in status naming the
/// ConfigMap and the line, one Warning Event, no write.
#[tokio::test]
async fn an_unbalanced_corefile_is_never_written() {
    let api = FakeApi::start();
    let cut = KUBEADM.trim_end().strip_suffix('}').expect("closing brace");
    assert_eq!(
        refused(&api, cut).await,
        "configmap kube-system/coredns: data.Corefile: corefile: block opened at line 1 is \
         never closed (expected a matching '}')"
    );
}

/// Issue 14 finding 3: `answer auto` needs CoreDNS 1.8.4 (an older one refuses the
/// whole Corefile). Against 1.8.3 only the exact name is written and status says
/// which wildcard was held back and why; after the upgrade the wildcard follows
/// within a resync. With no Deployment to read, the version is unknown: the same.
#[tokio::test]
async fn wildcards_wait_for_a_coredns_that_takes_answer_auto() {
    let api = kubeadm_cluster();
    api.put_deployment(coredns_deployment("registry.k8s.io/coredns/coredns:v1.8.3"));
    let w = start_writer(&api, CorednsMode::Corefile, true);
    let target = Hostname::parse(TARGET).expect("target");
    let exact_only: Vec<_> = rewrites(&routes(), &target)
        .into_iter()
        .filter(|r| !r.host().is_wildcard())
        .collect();
    let want = corefile::apply(KUBEADM, &exact_only).expect("apply");
    until(Duration::from_secs(5), "exact names written", || {
        corefile(&api) == want
    })
    .await;
    assert!(
        !corefile(&api).contains("answer auto"),
        "{}",
        corefile(&api)
    );
    let st = w.state.snapshot().coredns.expect("status");
    let held = st.held_back.clone().expect("held-back warning in status");
    assert!(
        held.contains("*.apps.example.com")
            && held.contains(
                "CoreDNS 1.8.3 (image registry.k8s.io/coredns/coredns:v1.8.3) is older than 1.8.4"
            ),
        "{held}"
    );
    assert!(st.last_error.is_none() && st.rewrites == 1, "{st:?}");

    // The upgrade: every rewrite, and the warning goes.
    api.put_deployment(coredns_deployment(CURRENT_IMAGE));
    until(
        Duration::from_secs(5),
        "wildcard written after the upgrade",
        || corefile(&api) == expected(KUBEADM),
    )
    .await;
    until(Duration::from_secs(5), "warning cleared", || {
        w.state
            .snapshot()
            .coredns
            .is_some_and(|c| c.held_back.is_none() && c.rewrites == 2)
    })
    .await;

    // No Deployment by that name: unknown, held back again, naming the object.
    let api = kubeadm_cluster();
    let w = start_writer(&api, CorednsMode::Import, true);
    until(Duration::from_secs(5), "unknown version reported", || {
        w.state
            .snapshot()
            .coredns
            .and_then(|c| c.held_back)
            .is_some_and(|h| {
                h.contains(
                    "the CoreDNS version is unknown (Deployment kube-system/coredns: not found)",
                )
            })
    })
    .await;
    let import = api
        .configmap("kube-system/coredns-custom")
        .and_then(|cm| cm["data"][IMPORT_KEY].as_str().map(String::from))
        .expect("import key");
    assert_eq!(import, corefile::render_import(&exact_only));
}

#[tokio::test]
async fn only_the_lease_holder_writes() {
    let api = kubeadm_cluster();
    api.put_daemonset(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "node-local-dns", "namespace": "kube-system"}}));
    let w = start(&api, CorednsMode::Corefile, false);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(puts(&api), 0, "a follower wrote: {:#?}", api.requests());
    assert_eq!(corefile(&api), KUBEADM);
    let st = w.state.snapshot().coredns.expect("status");
    assert!(!st.leader);
    let warning = st.node_local_dns.expect("node-local-dns warning");
    assert!(
        warning.contains("__PILLAR__UPSTREAM__SERVERS__"),
        "{warning}"
    );
    w.leader.send_replace(true);
    until(Duration::from_secs(5), "leader writes", || {
        corefile(&api) == expected(KUBEADM)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_restores_the_corefile_byte_for_byte_and_deletes_the_lease() {
    let api = kubeadm_cluster();
    let w = start(&api, CorednsMode::Corefile, true);
    until(Duration::from_secs(5), "written", || {
        corefile(&api) != KUBEADM
    })
    .await;
    drop(w);
    // A Lease as the agent makes one.
    let c = api.client();
    let (tx, _rx) = watch::channel(false);
    let lease = tokio::spawn(hairpin_agent::k8s::lease::run(
        c,
        hairpin_agent::k8s::lease::LeaseConfig {
            namespace: "hairpin-system".into(),
            name: "hairpin-agent".into(),
            identity: "node-a".into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(60),
        },
        tx,
    ));
    until(Duration::from_secs(5), "lease", || !api.leases().is_empty()).await;
    lease.abort();

    let dir = std::env::temp_dir().join(format!("hairpin-cleanup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let cleanup = || {
        let out = std::process::Command::new(agent_bin())
            .args([
                "cleanup",
                // The cluster's objects only: this test runs in the machine's own
                // network namespace, whose links the node scope would look at.
                "--scope",
                "cluster",
                "--coredns",
                "corefile",
                "--output",
                "json",
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .output()
            .expect("run cleanup");
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code(), json)
    };
    let (code, report) = tokio::task::block_in_place(cleanup);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(corefile(&api), KUBEADM, "byte for byte");
    let outcomes: Vec<(&str, &str)> = report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or(""),
                s["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [("coredns", "removed"), ("lease", "removed")],
        "{report:#}"
    );
    assert!(api.leases().is_empty());
    // Idempotent: a second run finds nothing and still succeeds.
    let (code, report) = tokio::task::block_in_place(cleanup);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["steps"][0]["outcome"], "absent", "{report:#}");
    assert_eq!(report["steps"][1]["outcome"], "absent", "{report:#}");
    assert_eq!(corefile(&api), KUBEADM);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The whole CoreDNS path with a running agent process: it decides from the watch
/// streams, takes the Lease, writes the rewrite for the Ingress host into the
/// Corefile, and a pod given what CoreDNS would answer for that name (the rewrite
/// target, the `hairpin` Service's ClusterIP) gets the page through the name relay
/// with its own address in the PROXY header. The DNS answer is given here (the
/// ClusterIP is passed to curl with `--resolve`) to keep this test on the recorded
/// API server; real CoreDNS answering from the Corefile the agent wrote is
/// `real_cluster`'s `coredns` scenario.
#[test]
fn a_running_agent_writes_the_rewrite_and_the_pod_reaches_the_lb_through_the_service() {
    require_privileges!();
    const CLUSTER_IP: &str = "203.0.113.200";
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    node.add_cluster_ip(CLUSTER_IP, 80, NODE_IP4, 880);
    let api = FakeApi::start_in_netns(&node.node_ns);
    api.put_configmap(configmap("coredns", json!({"Corefile": KUBEADM})));
    api.apply(digitalocean_service());
    let ingresses = recorded("ingresses/two-controllers.yaml");
    let shop = ingresses["items"][0].clone();
    assert_eq!(shop["metadata"]["name"], "shop");
    api.apply(shop);
    let kubeconfig = api.node_kubeconfig(&node);

    let mut agent = Agent::start_kube(
        &node,
        &kubeconfig,
        &[
            NAMES_UNDER_EXAMPLE_COM.as_slice(),
            &["--coredns", "corefile"],
        ]
        .concat(),
    );
    // The agent writes nothing in CoreDNS: the writer, its own process, does.
    let mut writer = WriterProcess::start_in(
        Some(&node.node_ns),
        &kubeconfig,
        "writer-0",
        &["--names-domains", "example.com"],
    );
    until_blocking(
        Duration::from_secs(20),
        "the writer wrote the rewrite",
        || corefile(&api).contains("shop.example.com"),
    );
    let written = corefile(&api);
    let line = format!("rewrite name exact shop.example.com {TARGET} # Added by hairpin");
    assert!(written.contains(&line), "{written}");
    assert_eq!(
        corefile::remove(&written),
        KUBEADM,
        "only our lines were added"
    );

    // What CoreDNS answers for shop.example.com after that rewrite: the Service.
    let got = curl_resolved_from_pod(
        &node,
        &format!("shop.example.com:80:{CLUSTER_IP}"),
        "http://shop.example.com/",
    );
    assert!(got.ok(), "{got:?}\nagent:\n{}", agent.log());
    let body = got.body.trim_end();
    assert!(body.starts_with(&format!("client={POD_IP4}:")), "{body}");
    assert!(body.ends_with("dst=203.0.113.10:80"), "{body}");

    writer.stop();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(30)).success(),
        "{}",
        agent.log()
    );
    assert_eq!(
        corefile(&api),
        written,
        "a restart keeps the rewrites (only `cleanup` removes them)"
    );
}

/// `hairpin-agent coredns-writer` as a process, logging to a file of its own.
struct WriterProcess {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl WriterProcess {
    fn start(kubeconfig: &std::path::Path, identity: &str, extra: &[&str]) -> WriterProcess {
        WriterProcess::start_in(None, kubeconfig, identity, extra)
    }

    /// In network namespace `netns` when given (where the fake API listens).
    fn start_in(
        netns: Option<&str>,
        kubeconfig: &std::path::Path,
        identity: &str,
        extra: &[&str],
    ) -> WriterProcess {
        let log = kubeconfig.with_file_name(format!("{identity}.log"));
        let out = std::fs::File::create(&log).expect("writer log");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "exec", ns]).arg(agent_bin());
                c
            }
            None => std::process::Command::new(agent_bin()),
        };
        let child = cmd
            .args(["coredns-writer", "--coredns", "corefile", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--identity", identity, "--admin-address", "127.0.0.1:0"])
            .args([
                "--lease-duration",
                "3s",
                "--log",
                "hairpin_agent=debug,info",
            ])
            .args(extra)
            .env_remove("HAIRPIN_NAMES_DOMAINS")
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start coredns-writer");
        WriterProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for WriterProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn until_blocking(within: Duration, what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !pred() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A proxied LoadBalancer Service and an Ingress on it naming `hosts`.
fn lb_and_ingress(api: &FakeApi, hosts: &[String]) {
    api.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "ingress-nginx", "namespace": "ingress", "uid": "u-svc",
                     "creationTimestamp": "2024-01-01T00:00:00Z",
                     "annotations": {"hairpin.dev/proxy-protocol": "v1"}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}));
    let rules: Vec<Value> = hosts.iter().map(|h| json!({"host": h})).collect();
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "shop", "uid": "u-ing",
                     "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {"rules": rules},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
    );
}

/// For the writer subcommand: a kubeadm cluster with a current CoreDNS, an LB and
/// an Ingress naming a0.example.com; a kubeconfig for it in a directory of `name`.
fn writer_cluster(name: &str) -> (FakeApi, std::path::PathBuf) {
    let api = kubeadm_cluster();
    api.put_deployment(coredns_deployment(CURRENT_IMAGE));
    lb_and_ingress(&api, &["a0.example.com".to_string()]);
    let dir = std::env::temp_dir().join(format!("hairpin-writer-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    (api, kubeconfig)
}

/// Item 7 of issue 14: an Ingress that flaps must not rewrite the ConfigMap (and make
/// CoreDNS reload) on every change. 20 changes within the writer's minimum interval
/// give at most two writes (the first at once, the rest folded into one), and the
/// last state is what is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_subcommand_coalesces_a_burst_of_ingress_changes() {
    let (api, kubeconfig) = writer_cluster("burst");
    let w = WriterProcess::start(
        &kubeconfig,
        "writer-0",
        &[
            "--names-domains",
            "example.com",
            "--coredns-min-write-interval",
            "3s",
        ],
    );
    until(Duration::from_secs(20), "first write", || {
        corefile(&api).contains("a0.example.com")
    })
    .await;
    let before = puts(&api);
    assert_eq!(before, 1, "{}", w.log());
    let mut hosts = vec!["a0.example.com".to_string()];
    for i in 1..=20 {
        hosts.push(format!("a{i}.example.com"));
        lb_and_ingress(&api, &hosts);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until(Duration::from_secs(20), "the last state written", || {
        corefile(&api).contains("a20.example.com")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = puts(&api) - before;
    assert!(
        (1..=2).contains(&writes),
        "20 changes within the interval: {writes} writes\n{}",
        w.log()
    );
    for i in 0..=20 {
        assert!(
            corefile(&api).contains(&format!("a{i}.example.com")),
            "a{i}"
        );
    }
}

/// Two writer replicas: only the Lease holder writes; when it dies the other takes
/// the Lease and writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_does_not_write_while_the_first_holds_the_lease() {
    let (api, kubeconfig) = writer_cluster("lease");
    let args = [
        "--names-domains",
        "example.com",
        "--coredns-min-write-interval",
        "0s",
    ];
    let mut first = WriterProcess::start(&kubeconfig, "writer-0", &args);
    until(Duration::from_secs(20), "the first writer wrote", || {
        corefile(&api).contains("a0.example.com")
    })
    .await;
    let second = WriterProcess::start(&kubeconfig, "writer-1", &args);
    // Changes while both run: the first writes them, the second never does.
    for i in 1..=3 {
        let hosts: Vec<String> = (0..=i).map(|j| format!("a{j}.example.com")).collect();
        lb_and_ingress(&api, &hosts);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    until(
        Duration::from_secs(10),
        "the holder wrote the changes",
        || corefile(&api).contains("a3.example.com"),
    )
    .await;
    let holder = |api: &FakeApi| {
        api.leases()["hairpin-system/hairpin-coredns"]["spec"]["holderIdentity"]
            .as_str()
            .map(String::from)
    };
    assert_eq!(holder(&api).as_deref(), Some("writer-0"));
    assert!(
        !second.log().contains("CoreDNS rewrites written"),
        "the follower wrote:\n{}",
        second.log()
    );
    // The holder dies: the other takes the Lease within its duration and writes.
    first.kill();
    lb_and_ingress(&api, &["b.example.com".to_string()]);
    until(
        Duration::from_secs(20),
        "the second writer took over",
        || corefile(&api).contains("b.example.com"),
    )
    .await;
    assert_eq!(holder(&api).as_deref(), Some("writer-1"));
    // It logs the write once the PUT has returned: a moment after the fake API has it.
    until(
        Duration::from_secs(5),
        "the second writer logged its write",
        || second.log().contains("CoreDNS rewrites written"),
    )
    .await;
}
