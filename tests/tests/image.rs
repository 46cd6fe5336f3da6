//! The runtime image `cargo xtask image` builds (`localhost/hairpin-agent:dev`: the
//! static agent on an empty base), run by podman with runc the way the DaemonSet's pod
//! spec says: the host network (the simulated node's), exactly the added
//! capabilities, a read-only root, no privilege escalation, uid 0, the hostPath
//! mounts (mapped onto the simulated node's cgroup, hosts file and run directory) and
//! the shipped Localhost seccomp profile. A pod of the simulated node then gets its
//! true address in the PROXY header through the containerized agent, and
//! `hairpin-agent status` answers through `podman exec`. With podman's default
//! seccomp profile (which refuses bpf() with CAP_BPF alone), the agent falls back and
//! says why, as docs/seccomp.md describes.
//!
//! Needs root, podman and runc (`cargo xtask setup`) and the image (`cargo xtask
//! image`; `cargo xtask test` builds it first). runc, not crun: crun fails on hybrid
//! cgroup hosts. The ulimits are given because podman's defaults raise them, which a
//! sandbox without CAP_SYS_RESOURCE refuses.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::{SIM_POD_NETWORKS, frontends_yaml, spec},
    client::{from_pod, url},
    node::{NODE_IP4, POD_IP4, SimNode},
    privileges::datapath_tests_can_run,
    repo::{workspace, write_kustomization},
    servers::start_nginx,
};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Container, PodSpec},
};
use serde_json::Value as Json;

/// The image `cargo xtask image` builds.
const IMAGE: &str = "localhost/hairpin-agent:dev";

/// The LoadBalancer the test's frontend names (nginx with `proxy_protocol`, v1).
const LB: &str = "203.0.113.10";

/// `podman --runtime runc ARGS`.
fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("failed to run podman {args:?}: {e}"))
}

/// `podman run --rm --network none` with the ulimits the runtime gives the DaemonSet,
/// then `args`.
fn podman_run_offline(args: &[&str]) -> Output {
    let mut all = vec![
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ];
    all.extend_from_slice(args);
    podman(&all)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether the image can be run here: root, podman and the image. Off CI a missing
/// piece skips loudly; with CI=true it fails.
fn image_can_run(test: &str) -> bool {
    if !datapath_tests_can_run(test) {
        return false;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let exists = Command::new("podman")
        .args(["image", "exists", IMAGE])
        .status();
    match exists {
        Ok(s) if s.success() => true,
        other => {
            assert!(
                !ci,
                "{test}: {IMAGE} is not in local container storage ({other:?}): \
                 `cargo xtask image` builds it (CI=true, so this is a failure)"
            );
            eprintln!("SKIPPED {test}: no {IMAGE}: run `cargo xtask image`");
            false
        }
    }
}

/// Removes the container on drop, also when the test panics.
struct Running {
    name: String,
}

impl Running {
    fn logs(&self) -> String {
        text(&podman(&["logs", &self.name]))
    }

    /// `hairpin-agent status` inside the container.
    fn status(&self, json: bool) -> Output {
        let mut args = vec![
            "exec",
            self.name.as_str(),
            "/usr/local/bin/hairpin-agent",
            "status",
        ];
        if json {
            args.extend(["--output", "json"]);
        }
        podman(&args)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "5", &self.name]);
    }
}

#[test]
fn the_image_holds_the_static_agent_alone_and_answers_version() {
    if !image_can_run(module_path!()) {
        return;
    }
    let out = podman_run_offline(&[IMAGE, "--version"]);
    assert!(out.status.success(), "--version: {}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("hairpin-agent {}", env!("CARGO_PKG_VERSION"))
    );

    let inspect = podman(&["image", "inspect", IMAGE]);
    assert!(inspect.status.success(), "{}", text(&inspect));
    let doc: Json = serde_json::from_slice(&inspect.stdout).expect("inspect is JSON");
    let img = &doc[0];
    assert_eq!(
        img["Config"]["User"], "0:0",
        "uid 0, as the DaemonSet runs it"
    );
    assert_eq!(
        img["Config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/hairpin-agent"])
    );
    assert_eq!(img["Config"]["Cmd"], serde_json::json!(["run"]));
    assert_eq!(
        img["RootFS"]["Layers"].as_array().map(Vec::len),
        Some(1),
        "one layer on the empty base: the binary"
    );
    eprintln!("{IMAGE}: {} bytes", img["Size"]);

    // No shell, no package manager: only the agent is there to run.
    for probe in ["/bin/sh", "/usr/bin/apt-get", "/bin/busybox"] {
        let out = podman_run_offline(&["--entrypoint", probe, IMAGE]);
        assert!(!out.status.success(), "{probe} exists in the image");
    }
}

/// The DaemonSet as `deploy/` with `components` renders it.
fn daemonset(components: &[&str]) -> DaemonSet {
    let dir = std::env::temp_dir().join(format!(
        "hairpin-image-k-{}-{}",
        std::process::id(),
        components.len()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    write_kustomization(&dir, components);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl kustomize (cargo xtask setup installs kubectl)");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "kustomize: {}", text(&out));
    let stream = String::from_utf8(out.stdout).expect("utf-8");
    for doc in stream.split("\n---\n") {
        let v: Json =
            serde_json::to_value(yaml_serde::from_str::<yaml_serde::Value>(doc).expect("yaml"))
                .expect("json");
        if v["kind"] == "DaemonSet" && v["metadata"]["name"] == "hairpin" {
            return serde_json::from_value(v).expect("a DaemonSet");
        }
    }
    panic!("no DaemonSet hairpin in deploy/ with {components:?}");
}

/// The container's hostPath volume mounts as podman `--volume`s, each mapped onto
/// the simulated node's stand-in.
fn volume_args(pod: &PodSpec, c: &Container, node: &SimNode) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    let mut add = |a: &[&str]| args.extend(a.iter().map(|s| s.to_string()));
    // The hostPath volumes, mapped onto the simulated node.
    let run_dir = node.dir.join("run-hairpin");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    let hosts = node.dir.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("hosts");
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            let host = v
                .host_path
                .as_ref()
                .expect("hostPath volumes only")
                .path
                .clone();
            (v.name.clone(), host)
        })
        .collect();
    for m in c.volume_mounts.iter().flatten() {
        let on_node = match volumes[&m.name].as_str() {
            "/sys/fs/cgroup" => node.cgroup.clone(),
            "/etc/hosts" => hosts.clone(),
            "/run/hairpin" => run_dir.clone(),
            // The kernel path's pins: the simulated node's own bpf filesystem.
            "/sys/fs/bpf/hairpin" => {
                std::fs::create_dir_all(node.pin_dir()).expect("pin dir");
                node.pin_dir()
            }
            other => panic!("hostPath {other} has no stand-in on the simulated node: add one"),
        };
        let ro = if m.read_only == Some(true) { ":ro" } else { "" };
        add(&[
            "--volume",
            &format!("{}:{}{ro}", on_node.display(), m.mount_path),
        ]);
    }
    args
}

/// `podman run` arguments for the agent container as `ds`'s pod spec says, on
/// `node`: its network namespace is the host network, its cgroup, a copy of a hosts
/// file and a run directory of its own stand in for the node's hostPaths, and the
/// frontends file replaces the cluster (no API server here).
fn pod_spec_args(
    ds: &DaemonSet,
    node: &SimNode,
    name: &str,
    seccomp: Option<&Path>,
) -> Vec<String> {
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    let c: &Container = &pod.containers[0];
    let mut args: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--name".into(),
        name.into(),
    ];
    let mut add = |a: &[&str]| args.extend(a.iter().map(|s| s.to_string()));
    add(&[
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ]);
    assert_eq!(
        pod.host_network,
        Some(true),
        "the agent runs in the host network"
    );
    add(&["--network", &format!("ns:/run/netns/{}", node.node_ns)]);

    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    add(&["--cap-drop", "ALL"]);
    for cap in caps.add.iter().flatten() {
        add(&["--cap-add", &format!("CAP_{cap}")]);
    }
    if sc.read_only_root_filesystem == Some(true) {
        // Kubernetes adds no tmpfs over a read-only root; podman would.
        add(&["--read-only", "--read-only-tmpfs=false"]);
    }
    if sc.allow_privilege_escalation == Some(false) {
        add(&["--security-opt", "no-new-privileges"]);
    }
    add(&[
        "--user",
        &format!(
            "{}:{}",
            sc.run_as_user.expect("runAsUser"),
            sc.run_as_group.expect("runAsGroup")
        ),
    ]);
    // The pod's supplementalGroups (the pins' owner's group).
    for g in pod
        .security_context
        .as_ref()
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default()
    {
        add(&["--group-add", &g.to_string()]);
    }
    if let Some(profile) = seccomp {
        add(&["--security-opt", &format!("seccomp={}", profile.display())]);
    }

    let volumes = volume_args(&pod, c, node);
    add(&volumes.iter().map(String::as_str).collect::<Vec<_>>());
    let frontends = node.dir.join("frontends.yaml");
    std::fs::write(&frontends, frontends_yaml(&[spec(LB, "v1")])).expect("frontends");
    add(&[
        "--volume",
        &format!("{}:/etc/hairpin/frontends.yaml:ro", frontends.display()),
    ]);

    // The env as the kubelet gives it: downward-API fields filled in for this node.
    // HAIRPIN_DAEMONSET names the DaemonSet read from the API server on SIGTERM,
    // which a frontends file (no cluster) does not go with: the agent refuses both.
    for e in c
        .env
        .iter()
        .flatten()
        .filter(|e| e.name != "HAIRPIN_DAEMONSET")
    {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                match from
                    .field_ref
                    .as_ref()
                    .expect("fieldRef")
                    .field_path
                    .as_str()
                {
                    "spec.nodeName" => "sim-node".into(),
                    "status.hostIPs" | "status.hostIP" => NODE_IP4.into(),
                    "metadata.namespace" => "hairpin-system".into(),
                    other => panic!("no stand-in for the downward-API field {other}"),
                }
            }
            (None, None) => String::new(),
        };
        add(&["--env", &format!("{}={value}", e.name)]);
    }
    add(&["--env", "HAIRPIN_FRONTENDS=/etc/hairpin/frontends.yaml"]);
    add(&[
        "--env",
        &format!("HAIRPIN_ALLOWED_CLIENTS={SIM_POD_NETWORKS}"),
    ]);

    let command = c.command.clone().expect("command");
    assert_eq!(command, vec!["/usr/local/bin/hairpin-agent".to_string()]);
    add(&["--entrypoint", &command[0], IMAGE]);
    for a in c.args.iter().flatten() {
        add(&[a]);
    }
    args
}

fn start(ds: &DaemonSet, node: &SimNode, seccomp: Option<&Path>) -> Running {
    let name = format!("{}-agent", node.id);
    let args = pod_spec_args(ds, node, &name, seccomp);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = podman(&argv);
    let running = Running { name };
    assert!(out.status.success(), "podman {args:?}: {}", text(&out));
    running
}

/// Waits for `needle` in the container's log.
fn wait_for_log(c: &Running, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let logs = c.logs();
        if logs.contains(needle) {
            return logs;
        }
        let running = podman(&["inspect", "--format", "{{.State.Running}}", &c.name]);
        assert!(
            String::from_utf8_lossy(&running.stdout).trim() != "false",
            "the containerized agent exited before logging {needle:?}:\n{logs}"
        );
        assert!(
            Instant::now() < deadline,
            "the containerized agent did not log {needle:?} within {within:?}:\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_pod_gets_its_true_address_through_the_containerized_agent() {
    if !image_can_run(module_path!()) {
        return;
    }
    let ds = daemonset(&["deploy/components/seccomp-localhost"]);
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // The profile the component installs on every node, as the kubelet hands it to
    // the runtime.
    let profile = workspace().join("deploy/components/seccomp-localhost/bpf.json");
    let agent = start(&ds, &node, Some(&profile));
    wait_for_log(&agent, "agent ready", Duration::from_secs(30));

    let status = agent.status(false);
    assert!(
        status.status.success(),
        "`hairpin-agent status` through podman exec (exit {:?}):\n{}",
        status.status.code(),
        text(&status)
    );
    let json = agent.status(true);
    let doc: Json = serde_json::from_slice(&json.stdout)
        .unwrap_or_else(|e| panic!("status --output json: {e}: {}", text(&json)));
    let shown = doc.to_string();
    assert!(shown.contains(LB), "status lists the frontend: {shown}");

    let reply = from_pod(&node, &url(LB, 80, "/"));
    assert!(
        reply.ok(),
        "pod -> {LB}: {reply:?}\nagent:\n{}",
        agent.logs()
    );
    assert!(
        reply.body.starts_with(&format!("client={POD_IP4}:")),
        "the header names the pod: {}\nagent:\n{}",
        reply.body,
        agent.logs()
    );
    assert!(
        reply.body.trim_end().ends_with(&format!("dst={LB}:80")),
        "{}",
        reply.body
    );
}

#[test]
fn with_podmans_default_seccomp_profile_the_agent_falls_back_and_says_why() {
    if !image_can_run(module_path!()) {
        return;
    }
    // The base DaemonSet (RuntimeDefault): podman's default profile, like containerd
    // before 1.6.9, refuses bpf() to a container without CAP_SYS_ADMIN.
    let ds = daemonset(&[]);
    let node = SimNode::new();
    let agent = start(&ds, &node, None);
    let logs = wait_for_log(
        &agent,
        "a seccomp filter refused bpf()",
        Duration::from_secs(30),
    );
    assert!(
        logs.contains("docs/seccomp.md"),
        "the agent points at the remedy: {logs}"
    );
    // --mode auto: it goes on without the programs, and says so.
    let status = agent.status(true);
    let shown = text(&status);
    assert!(
        shown.contains("seccomp"),
        "`status` says why eBPF is not live: {shown}"
    );
}
