//! `hairpin-agent uninstall` against the fake API server, with the settings Helm
//! and kustomize render for it. The fake plays the cluster: a foreground deletion
//! marks a workload deleting until the test, as its controller, has stopped its
//! pods; a revoked token gets 403, as an account whose RBAC was deleted. End to end
//! on the simulated node: `helm uninstall` (its pre-delete hooks in Helm's order,
//! then everything deleted in one pass) leaves CoreDNS byte for byte as it was
//! before the install, the node's /etc/hosts as it was, and no link, pin or listen
//! address.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use hairpin_agent::names::corefile;
use hairpin_tests::{
    agent::{Agent, NAMES_UNDER_EXAMPLE_COM, agent_bin},
    fakeapi::{FakeApi, digitalocean_service, recorded},
    helm::render_workspace_chart,
    node::SimNode,
    repo::workspace,
    require_privileges,
    servers::start_nginx,
    sh::command_in,
};
use serde_json::{Value, json};

/// kubeadm's Corefile, as the cluster had it before hairpin.
const KUBEADM: &str = hairpin_tests::fakeapi::KUBEADM_COREFILE;

/// The node's /etc/hosts before hairpin.
const HOSTS: &str = "127.0.0.1 localhost\n192.0.2.1 sim-node\n";

/// Every wait here ends well within this.
const WITHIN: Duration = Duration::from_secs(60);

fn configmap(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "kube-system"}, "data": data})
}

fn corefile_of(api: &FakeApi) -> String {
    api.configmap("kube-system/coredns")
        .expect("the Corefile ConfigMap")["data"]["Corefile"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn until(what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !pred() {
        assert!(Instant::now() < deadline, "not within {WITHIN:?}: {what}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// The literal env of a rendered container; downward API fields (node name,
/// namespace, pod name) are left to the caller, which knows them.
fn env(c: &Value) -> BTreeMap<String, String> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} not rendered"))
}

/// `hairpin-agent ARGS` in network namespace `netns` (the node's) with exactly `env`
/// (and so the kubeconfig of one account), its output captured in `log`.
fn spawn(netns: &str, args: &[&str], env: &BTreeMap<String, String>, log: &Path) -> Child {
    let bin = agent_bin();
    let mut argv = vec![bin.to_str().expect("utf-8 path")];
    argv.extend_from_slice(args);
    let out = std::fs::File::create(log).expect("log");
    command_in(netns, None, &argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env)
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {argv:?}: {e}"))
}

fn wait(child: &mut Child, what: &str, log: &Path) -> i32 {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not end within {WITHIN:?}:\n{}", read(log));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The node's programs, pins and listen addresses left by hairpin.
fn leftovers(node: &SimNode) -> Vec<String> {
    let mut left = Vec::new();
    let attached = node.attached_programs();
    if attached.contains("hairpin") {
        left.push(format!("attached: {attached}"));
    }
    if let Ok(d) = std::fs::read_dir(node.pin_dir()) {
        left.extend(d.flatten().map(|e| format!("pin {}", e.path().display())));
    }
    let addrs = hairpin_tests::sh::output_in(&node.node_ns, None, &["ip", "-o", "addr", "show"]);
    for l in String::from_utf8_lossy(&addrs.stdout).lines() {
        if l.contains("169.254.104.1") || l.contains("fd68:6169:7270:696e::1") {
            left.push(format!("address: {l}"));
        }
    }
    left
}

/// What the test does as the cluster's controllers while the uninstall runs: the
/// DaemonSet and Deployment controllers (a foreground deletion stops the pods, then
/// the object goes) and the kubelet of the one node.
struct Controllers {
    agent: Agent,
    writer: Child,
}

impl Controllers {
    /// Until both workloads are gone: each marked deleting gets its process
    /// SIGTERMed and awaited, then removed from the API.
    fn run(mut self, api: Arc<FakeApi>, stop: Arc<AtomicBool>) -> (String, Option<i32>) {
        let (mut agent_done, mut writer_code) = (false, None);
        let finished = |agent_done: bool, writer: Option<i32>| agent_done && writer.is_some();
        while !stop.load(Ordering::Relaxed) && !finished(agent_done, writer_code) {
            let deleting = |o: Option<Value>| {
                o.is_some_and(|o| o["metadata"]["deletionTimestamp"].is_string())
            };
            if writer_code.is_none() && deleting(api.deployment("hairpin-system/hairpin-coredns")) {
                let pid = nix::unistd::Pid::from_raw(self.writer.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                writer_code = Some(self.writer.wait().expect("writer").code().unwrap_or(-1));
                api.remove_deployment("hairpin-system/hairpin-coredns");
            }
            if !agent_done && deleting(api.daemonset("hairpin-system/hairpin")) {
                self.agent.signal(nix::sys::signal::Signal::SIGTERM);
                let _ = self.agent.wait(WITHIN);
                api.remove_daemonset("hairpin-system/hairpin");
                agent_done = true;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = self.writer.kill();
        (self.agent.log(), writer_code)
    }
}

/// `helm uninstall` of a release with CoreDNS on, the way Helm runs it: the chart's
/// pre-delete hooks in Helm's order (the node cleanup DaemonSet created, then the
/// Job, awaited), then every object of the release deleted in one pass (each
/// account's RBAC gone at once). Before the install's last trace is checked, every
/// token is revoked: nothing may still depend on it.
// Fake API: every token revoked at a chosen step, and Helm's one-pass delete with no kubelet; the hook's RBAC against the real authorizer: real_cluster/uninstall.rs.
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario (install, hooks in Helm's order, a one-pass delete, the checks) read in order"
)]
#[test]
fn helm_uninstall_leaves_coredns_and_the_node_as_they_were_before_the_install() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = Arc::new(FakeApi::start_in_netns(&node.node_ns));
    api.put_configmap(configmap("coredns", json!({"Corefile": KUBEADM})));
    api.put_deployment(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system"},
        "spec": {"template": {"spec": {"containers": [{"name": "coredns", "image": "registry.k8s.io/coredns/coredns:v1.11.1"}]}}}}));
    api.apply(digitalocean_service());
    api.apply(recorded("ingresses/two-controllers.yaml")["items"][0].clone());
    let hosts = node.dir.join("hosts");
    std::fs::write(&hosts, HOSTS).expect("hosts");
    let kubeconfig = |account: &str| -> PathBuf {
        let p = node.dir.join(format!("kubeconfig-{account}"));
        api.write_kubeconfig_as(&p, account);
        p
    };

    // The release, as Helm renders it, in the cluster.
    let flags: Vec<String> = [
        "coredns.mode=corefile",
        "mode=both",
        "names.domains=example.com",
    ]
    .iter()
    .flat_map(|s| ["--set".to_string(), s.to_string()])
    .collect();
    let chart = render_workspace_chart("hairpin-system", "hairpin", &flags);
    let ds = find(&chart, "DaemonSet", "hairpin");
    let mut agent_ds = recorded("daemonsets/hairpin.yaml");
    agent_ds["metadata"]["name"] = ds["metadata"]["name"].clone();
    api.put_daemonset(agent_ds);
    api.put_deployment(find(&chart, "Deployment", "hairpin-coredns").clone());
    let agent_env = env(&ds["spec"]["template"]["spec"]["containers"][0]);
    let mut agent = Agent::start_kube(
        &node,
        &kubeconfig("agent"),
        &[
            NAMES_UNDER_EXAMPLE_COM.as_slice(),
            &[
                "--kernel-path",
                "auto",
                "--coredns",
                "corefile",
                "--drain-timeout",
                "1s",
                "--daemonset",
                &agent_env["HAIRPIN_DAEMONSET"],
                "--lease-name",
                &agent_env["HAIRPIN_LEASE_NAME"],
                "--hosts-file",
                hosts.to_str().expect("utf-8"),
            ],
        ]
        .concat(),
    );
    agent.wait_for_log("agent ready", WITHIN);
    let mut writer_env = env(
        &find(&chart, "Deployment", "hairpin-coredns")["spec"]["template"]["spec"]["containers"][0],
    );
    writer_env.extend([
        (
            "HAIRPIN_KUBECONFIG".to_string(),
            kubeconfig("writer").display().to_string(),
        ),
        (
            "HAIRPIN_IDENTITY".to_string(),
            "hairpin-coredns-0".to_string(),
        ),
        (
            "HAIRPIN_NAMESPACE".to_string(),
            "hairpin-system".to_string(),
        ),
        (
            "HAIRPIN_ADMIN_ADDRESS".to_string(),
            "127.0.0.1:0".to_string(),
        ),
        (
            "HAIRPIN_ADMIN_SOCKET".to_string(),
            node.dir.join("writer.sock").display().to_string(),
        ),
    ]);
    let writer = spawn(
        &node.node_ns,
        &["coredns-writer"],
        &writer_env,
        &node.dir.join("writer.log"),
    );
    until("the writer wrote its rewrite", || {
        corefile_of(&api).contains("shop.example.com")
    });
    until("the agent wrote its hosts block", || {
        read(&hosts).contains("shop.example.com")
    });
    assert!(
        !leftovers(&node).is_empty(),
        "the agent pinned and attached its datapath"
    );

    // Helm's pre-delete hooks: -5 the node cleanup DaemonSet (its pod starts on
    // this node: its init containers run in order), 0 the Job, awaited.
    let hooks: Vec<Value> = chart
        .iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete")
        .cloned()
        .collect();
    let mut cleanup_ds = find(&hooks, "DaemonSet", "hairpin-cleanup").clone();
    cleanup_ds["metadata"]["generation"] = json!(1);
    api.put_daemonset(cleanup_ds.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let controllers = {
        let (api, stop) = (api.clone(), stop.clone());
        let c = Controllers { agent, writer };
        thread::spawn(move || c.run(api, stop))
    };
    let node_pod = {
        let inits = cleanup_ds["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .expect("init containers")
            .clone();
        let (api, dir, pin_dir) = (api.clone(), node.dir.clone(), node.pin_dir());
        let node_ns = node.node_ns.clone();
        let (cleanup_kc, hosts) = (kubeconfig("cleanup"), hosts.clone());
        thread::spawn(move || {
            let mut logs = String::new();
            for c in &inits {
                let mut e = env(c);
                e.insert("HAIRPIN_UNINSTALL_TIMEOUT".into(), "50s".into());
                e.insert(
                    "HAIRPIN_KUBECONFIG".into(),
                    cleanup_kc.display().to_string(),
                );
                // The pod's mounts, at this node's paths.
                if e.contains_key("HAIRPIN_HOSTS_FILE") {
                    e.insert("HAIRPIN_HOSTS_FILE".into(), hosts.display().to_string());
                }
                if e.contains_key("HAIRPIN_BPF_PIN_DIR") {
                    e.insert("HAIRPIN_BPF_PIN_DIR".into(), pin_dir.display().to_string());
                }
                let args: Vec<String> = serde_json::from_value(c["args"].clone()).expect("args");
                let log = dir.join(format!("{}.log", c["name"].as_str().expect("name")));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let mut child = spawn(&node_ns, &args, &e, &log);
                let code = wait(&mut child, c["name"].as_str().unwrap_or(""), &log);
                logs.push_str(&read(&log));
                assert_eq!(code, 0, "init container {} failed:\n{logs}", c["name"]);
            }
            // The pod runs: ready on the one node.
            let mut ds = api
                .daemonset("hairpin-system/hairpin-cleanup")
                .expect("the node cleanup");
            ds["status"] = json!({"observedGeneration": 1, "desiredNumberScheduled": 1, "numberReady": 1, "updatedNumberScheduled": 1, "currentNumberScheduled": 1, "numberMisscheduled": 0});
            api.put_daemonset(ds);
            logs
        })
    };
    let job = find(&hooks, "Job", "hairpin-uninstall");
    let mut job_env = env(&job["spec"]["template"]["spec"]["containers"][0]);
    job_env.insert(
        "HAIRPIN_KUBECONFIG".into(),
        kubeconfig("uninstall").display().to_string(),
    );
    job_env.insert("HAIRPIN_UNINSTALL_TIMEOUT".into(), "50s".into());
    job_env.insert("HAIRPIN_OUTPUT".into(), "json".into());
    let job_log = node.dir.join("uninstall.log");
    let mut child = spawn(&node.node_ns, &["uninstall"], &job_env, &job_log);
    let code = wait(&mut child, "the uninstall Job", &job_log);
    stop.store(true, Ordering::Relaxed);
    let (agent_log, writer_code) = controllers.join().expect("controllers");
    let node_logs = node_pod
        .join()
        .unwrap_or_else(|_| panic!("the node cleanup failed; Job:\n{}", read(&job_log)));
    assert_eq!(
        code,
        0,
        "the Job:\n{}\nnode:\n{node_logs}\nagent:\n{agent_log}",
        read(&job_log)
    );

    // Helm deletes the release in one pass: no account has RBAC any more.
    for account in ["agent", "writer", "uninstall", "cleanup"] {
        api.revoke(account);
    }
    assert_eq!(writer_code, Some(0), "the writer stopped cleanly");
    assert!(
        agent_log.contains("datapath removed"),
        "the agent saw its uninstall:\n{agent_log}"
    );
    assert_eq!(corefile_of(&api), KUBEADM, "CoreDNS as before the install");
    assert_eq!(corefile::remove(KUBEADM), KUBEADM);
    assert_eq!(
        read(&hosts),
        HOSTS,
        "the node's /etc/hosts as before:\n{node_logs}"
    );
    assert_eq!(
        leftovers(&node),
        Vec::<String>::new(),
        "nothing of hairpin on the node:\n{node_logs}"
    );
    assert!(
        api.leases().is_empty(),
        "{:?}",
        api.leases().keys().collect::<Vec<_>>()
    );
    let forbidden: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.contains("(forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "nothing called after its RBAC went: {forbidden:?}"
    );
}

/// `kubectl kustomize DIR` as JSON values.
fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(workspace().join(dir))
        .output()
        .expect("kubectl (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hairpin_tests::helm::docs(&String::from_utf8_lossy(&out.stdout))
}

/// kubeadm's Corefile with the writer's rewrite of shop.example.com in it.
fn with_our_lines() -> String {
    use hairpin_agent::names::{Hostname, corefile::Rewrite};
    let name = |n: &str| Hostname::parse(n).expect("name");
    let rewrite = Rewrite::new(
        name("shop.example.com"),
        name("hairpin.hairpin-system.svc.cluster.local"),
    )
    .expect("rewrite");
    let text = corefile::apply(KUBEADM, &[rewrite]).expect("apply");
    assert!(text.contains(corefile::MARKER), "{text}");
    text
}

/// `hairpin-agent uninstall` with `env` against the fake, as one account; its exit
/// code and JSON report.
fn uninstall(api: &FakeApi, env: &BTreeMap<String, String>, account: &str) -> (i32, Value) {
    let dir = tempfile::tempdir().expect("dir");
    let kc = dir.path().join("kubeconfig");
    api.write_kubeconfig_as(&kc, account);
    let out = Command::new(agent_bin())
        .arg("uninstall")
        .env_clear()
        .envs(env)
        .env("HAIRPIN_KUBECONFIG", &kc)
        .env("HAIRPIN_OUTPUT", "json")
        .env("HAIRPIN_UNINSTALL_TIMEOUT", "10s")
        .output()
        .expect("run uninstall");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not json ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// The kustomize uninstall has no Helm to delete the rest: its Job makes the
/// namespace the owner of every object outside it and deletes the namespace (the
/// garbage collector then removes them). Its workloads already gone (absent), it
/// restores the Corefile and deletes the Leases first.
// Fake API: records the owner references the Job writes; could move to real_cluster (its garbage collector runs there).
#[test]
fn the_kustomize_uninstall_deletes_the_namespace_with_every_object_outside_it() {
    let api = FakeApi::start();
    api.put_namespace(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hairpin-system"}}),
    );
    let install = kustomize("deploy/overlays/coredns");
    let removal = kustomize("deploy/uninstall/coredns");
    for o in install.iter().chain(&removal) {
        if o["kind"].as_str().is_some_and(|k| k.contains("Role")) {
            api.put_rbac(o.clone());
        }
    }
    api.put_configmap(configmap("coredns", json!({"Corefile": with_our_lines()})));
    api.put_lease("hairpin-system/hairpin-agent");
    api.put_lease("hairpin-system/hairpin-coredns");
    let mut nodes = find(&removal, "DaemonSet", "hairpin-cleanup").clone();
    nodes["metadata"]["generation"] = json!(1);
    nodes["status"] = json!({"observedGeneration": 1, "desiredNumberScheduled": 2, "numberReady": 2, "updatedNumberScheduled": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0});
    api.put_daemonset(nodes);
    let job_env = env(
        &find(&removal, "Job", "hairpin-uninstall")["spec"]["template"]["spec"]["containers"][0],
    );

    let (code, report) = uninstall(&api, &job_env, "uninstall");
    assert_eq!(code, 0, "{report:#}");
    assert!(
        api.namespace("hairpin-system").is_none(),
        "the namespace was deleted"
    );
    let owned: Vec<&str> = job_env["HAIRPIN_UNINSTALL_WITH_NAMESPACE"]
        .split(',')
        .collect();
    assert!(owned.len() >= 8, "{owned:?}");
    for o in owned {
        let (kind, rest) = o.split_once('/').expect("kind/");
        let kind = match kind {
            "clusterrole" => "ClusterRole",
            "clusterrolebinding" => "ClusterRoleBinding",
            "role" => "Role",
            "rolebinding" => "RoleBinding",
            other => panic!("{other}"),
        };
        let key = match rest.split_once('/') {
            Some((ns, name)) => format!("{kind}/{ns}/{name}"),
            None => format!("{kind}/-/{rest}"),
        };
        let obj = api
            .rbac(&key)
            .unwrap_or_else(|| panic!("{key} was installed"));
        assert_eq!(
            obj["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Namespace", "name": "hairpin-system", "uid": "uid-namespace-hairpin-system"}]),
            "{key}"
        );
    }
    assert!(api.leases().is_empty());
    assert_eq!(corefile_of(&api), KUBEADM);
    let steps = hairpin_tests::cli::steps(&report);
    assert_eq!(
        steps[0],
        ("stop".to_string(), "absent".to_string()),
        "{steps:?}"
    );
    assert_eq!(
        steps.last(),
        Some(&("namespace".to_string(), "removed".to_string())),
        "{steps:?}"
    );
}

/// The order is the point: an uninstall whose account cannot stop the agents (its
/// RBAC gone, 403) stops there, exit 1, and removes nothing the agents would then
/// write back or still need (the rewrites, the Leases, the namespace).
// Fake API: 403 to the first step alone, on cue; a real authorizer's refusal of a removed hook permission: real_cluster/uninstall.rs.
#[test]
fn without_its_rbac_the_uninstall_stops_at_the_first_step_and_removes_nothing() {
    let api = FakeApi::start();
    let removal = kustomize("deploy/uninstall/coredns");
    api.put_namespace(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hairpin-system"}}),
    );
    api.put_configmap(configmap("coredns", json!({"Corefile": with_our_lines()})));
    api.put_lease("hairpin-system/hairpin-agent");
    let job_env = env(
        &find(&removal, "Job", "hairpin-uninstall")["spec"]["template"]["spec"]["containers"][0],
    );
    api.revoke("uninstall");
    let (code, report) = uninstall(&api, &job_env, "uninstall");
    assert_eq!(code, 1, "{report:#}");
    let steps = report["steps"].as_array().expect("steps");
    assert!(
        steps.iter().all(|s| s["name"] == "stop"),
        "stopped at the first step: {report:#}"
    );
    assert!(
        steps
            .iter()
            .all(|s| s["outcome"] == "failed"
                && s["detail"].as_str().is_some_and(|d| d.contains("403"))),
        "{report:#}"
    );
    assert_eq!(
        corefile_of(&api),
        with_our_lines(),
        "the rewrites stay while the writer may run"
    );
    assert!(
        api.namespace("hairpin-system").is_some() && !api.leases().is_empty(),
        "nothing removed"
    );
}
