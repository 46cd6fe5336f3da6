//! The agent and the `coredns-writer` subcommand as processes: the rewrite a running agent
//! writes, a burst of Ingress changes coalesced, and a second writer held off by the Lease.

use super::*;

/// The whole CoreDNS path with a running agent process: it decides from the watch
/// streams, takes the Lease, writes the rewrite for the Ingress host into the
/// Corefile, and a pod given what CoreDNS would answer for that name (the rewrite
/// target, the `hairpin` Service's ClusterIP) gets the page through the name relay
/// with its own address in the PROXY header. The DNS answer is given here (the
/// ClusterIP is passed to curl with `--resolve`) to keep this test on the recorded
/// API server; real CoreDNS answering from the Corefile the agent wrote is
/// `real_cluster`'s `coredns` scenario.
// Fake API: the DNS answer given; real CoreDNS answering: real_cluster/coredns.rs.
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
            Some(ns) => hairpin_tests::sh::command_in(
                ns,
                None,
                &[agent_bin().to_str().expect("utf-8 path")],
            ),
            None => hairpin_tests::agent::agent_command(),
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
// Fake API: in process, counting each write; the same against the real server: real_cluster/uninstall.rs.
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
