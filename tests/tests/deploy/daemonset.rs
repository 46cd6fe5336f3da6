//! The agent DaemonSet of every variant: the Service in front of it, probes, mounts,
//! capabilities and resources, each against the settings the agent parses from its env.

use std::collections::BTreeSet;

use hairpin_agent::k8s::CorednsMode;
use k8s_openapi::api::core::v1::Service;

use super::{
    VARIANTS,
    flags::{admin_routes, run_args, writer_args},
    render::{
        agent, daemonset, env_of, find, host_path, kustomize, mebibytes, pod_spec, read, typed,
        writer,
    },
};

#[test]
fn the_service_is_the_name_relays_listeners_and_the_coredns_target() {
    let defaults = run_args(&Default::default(), "defaults");
    let default_pairs = defaults.names_service_ports.0.clone();
    assert!(
        !default_pairs.is_empty(),
        "the agent listens for the Service by default"
    );
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let ds = daemonset(&objs, "hairpin");
        let run = run_args(&env_of(&agent(&objs), v.dir), v.dir);
        let Some(svc) = find(&objs, "Service", "hairpin") else {
            // Without CoreDNS nothing points pods at a Service: none, and no listeners.
            assert_eq!(
                run.coredns,
                CorednsMode::Off,
                "{}: CoreDNS on needs the Service",
                v.dir
            );
            assert!(
                run.names_service_ports.0.is_empty(),
                "{}: no Service, so no listeners for one",
                v.dir
            );
            continue;
        };
        assert_ne!(
            run.coredns,
            CorednsMode::Off,
            "{}: a Service nothing points at",
            v.dir
        );
        let svc: Service = typed(svc);
        let meta = svc.metadata.clone();
        let w = writer(&objs).unwrap_or_else(|| panic!("{}: a Service and no writer", v.dir));
        assert_eq!(
            writer_args(&env_of(&w, v.dir), v.dir)
                .coredns_target
                .to_string(),
            format!(
                "{}.{}.svc.cluster.local",
                meta.name.as_deref().unwrap_or_default(),
                meta.namespace.as_deref().unwrap_or_default()
            ),
            "{}: CoreDNS rewrites names to this Service",
            v.dir
        );
        let s = svc.spec.expect("spec");
        assert_eq!(s.type_.as_deref(), Some("ClusterIP"), "{}", v.dir);
        assert_eq!(
            s.internal_traffic_policy.as_deref(),
            Some("Local"),
            "{}",
            v.dir
        );
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let pairs: Vec<(u16, u16)> = s
            .ports
            .iter()
            .flatten()
            .map(|p| {
                assert_eq!(p.protocol.as_deref(), Some("TCP"), "{}", v.dir);
                let target = match &p.target_port {
                    Some(IntOrString::Int(t)) => *t,
                    other => panic!("{}: targetPort must be a number (hostNetwork pods name no ports): {other:?}", v.dir),
                };
                (p.port as u16, target as u16)
            })
            .collect();
        assert_eq!(
            pairs, run.names_service_ports.0,
            "{}: Service port -> targetPort must be the agent's --names-service-ports",
            v.dir
        );
        assert_eq!(
            pairs, default_pairs,
            "{}: and the agent's default, so an agent without the env still serves the Service",
            v.dir
        );
        let labels = ds
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.labels)
            .unwrap_or_default();
        for (key, val) in s.selector.unwrap_or_default() {
            assert_eq!(
                labels.get(&key),
                Some(&val),
                "{}: the Service selects the agent pods",
                v.dir
            );
        }
    }
}

/// The probes run `hairpin-agent health` over the admin socket, never HTTP to the
/// admin port: that port is unprivileged and the DaemonSet shares the node's
/// network, so any uid could crowd it (the kubelet's probe refused, the agent
/// restarted at will) or bind it first (tests/tests/neighbours.rs shows both).
#[test]
fn probes_ask_the_admin_socket_never_the_shared_admin_port() {
    let routes = admin_routes();
    assert!(
        routes.contains("/healthz") && routes.contains("/readyz"),
        "status/admin.rs routes: {routes:?}"
    );
    let defaults = run_args(&Default::default(), "defaults");
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let c = agent(&objs);
        let run = run_args(&env_of(&c, v.dir), v.dir);
        assert!(
            run.admin_address.ip().is_loopback(),
            "{}: admin address should stay node-local",
            v.dir
        );
        assert_eq!(
            run.admin_socket, defaults.admin_socket,
            "{}: the socket `health` asks by default",
            v.dir
        );
        let bin = c
            .command
            .as_ref()
            .and_then(|c| c.first())
            .unwrap_or_else(|| panic!("{}: the agent's command", v.dir));
        for (what, probe, ready) in [
            ("startupProbe", &c.startup_probe, false),
            ("livenessProbe", &c.liveness_probe, false),
            ("readinessProbe", &c.readiness_probe, true),
        ] {
            let p = probe
                .as_ref()
                .unwrap_or_else(|| panic!("{}: {what} missing", v.dir));
            assert!(
                p.http_get.is_none() && p.tcp_socket.is_none() && p.grpc.is_none(),
                "{}: {what} must not dial the admin port",
                v.dir
            );
            let cmd = p
                .exec
                .as_ref()
                .and_then(|e| e.command.clone())
                .unwrap_or_else(|| panic!("{}: {what} must be an exec probe", v.dir));
            let mut want = vec![bin.clone(), "health".to_string()];
            if ready {
                want.push("--ready".into());
            }
            assert_eq!(cmd, want, "{}: {what} command", v.dir);
            assert!(
                p.timeout_seconds.unwrap_or(1) >= 3,
                "{}: {what} must outlast the CLI's own 3 s timeout",
                v.dir
            );
        }
    }
}

#[test]
fn mounts_match_the_agents_paths() {
    let defaults = run_args(&Default::default(), "defaults");
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let ds = daemonset(&objs, "hairpin");
        let pod = pod_spec(&ds);
        let c = agent(&objs);
        let run = run_args(&env_of(&c, v.dir), v.dir);
        let cgroup = run
            .cgroup_path
            .clone()
            .expect("--cgroup-path (see the YAML: discovery finds the container's own cgroup)");
        assert_eq!(
            host_path(&pod, &c, &cgroup, v.dir),
            ("/sys/fs/cgroup".into(), "Directory".into(), true),
            "{}: --cgroup-path must be the node's cgroup2 hierarchy",
            v.dir
        );
        assert_eq!(
            run.admin_socket, defaults.admin_socket,
            "{}: the socket `status` looks for by default",
            v.dir
        );
        let dir = run.admin_socket.parent().expect("socket dir");
        assert_eq!(
            host_path(&pod, &c, dir, v.dir),
            ("/run/hairpin".into(), "DirectoryOrCreate".into(), false),
            "{}: the admin socket's directory must be the node's /run/hairpin",
            v.dir
        );
        match &run.hosts_file {
            Some(hosts) => assert_eq!(
                host_path(&pod, &c, hosts, v.dir),
                ("/etc/hosts".into(), "File".into(), false),
                "{}: --hosts-file must be the node's /etc/hosts, writable",
                v.dir
            ),
            None => assert!(
                !pod.volumes.iter().flatten().any(|vol| vol
                    .host_path
                    .as_ref()
                    .is_some_and(|h| h.path == "/etc/hosts")),
                "{}: /etc/hosts mounted but not managed",
                v.dir
            ),
        }
        // The kernel path (on by `auto`) pins under --bpf-pin-dir, which must be the
        // node's own directory of its bpf filesystem (tests/tests/kernel_path/ checks the rest).
        if run.kernel_path.loads() {
            let pins = run.pin_dir().expect("--bpf-pin-dir");
            assert_eq!(
                host_path(&pod, &c, pins, v.dir),
                (
                    "/sys/fs/bpf/hairpin".into(),
                    "DirectoryOrCreate".into(),
                    false
                ),
                "{}: --bpf-pin-dir must be a mount of the node's /sys/fs/bpf/hairpin, writable",
                v.dir
            );
        }
        // Nothing else: none of /sys/fs/bpf but hairpin's own directory, no stray
        // host paths.
        let paths: BTreeSet<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|vol| Some(vol.host_path.as_ref()?.path.clone()))
            .collect();
        let allowed: BTreeSet<String> = [
            "/sys/fs/cgroup",
            "/run/hairpin",
            "/etc/hosts",
            "/sys/fs/bpf/hairpin",
        ]
        .map(String::from)
        .into();
        assert!(
            paths.is_subset(&allowed),
            "{}: unexpected host paths {paths:?}",
            v.dir
        );
    }
}

#[test]
fn daemonset_runs_everywhere_with_only_the_capabilities_it_needs() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int;
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let ds = daemonset(&objs, "hairpin");
        let spec = ds.spec.clone().expect("spec");
        let pod = pod_spec(&ds);
        let c = agent(&objs);
        let run = run_args(&env_of(&c, v.dir), v.dir);
        let k = v.dir;
        assert_eq!(pod.host_network, Some(true), "{k}: hostNetwork");
        assert_eq!(
            pod.dns_policy.as_deref(),
            Some("ClusterFirstWithHostNet"),
            "{k}"
        );
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some("system-node-critical"),
            "{k}"
        );
        let tol = pod.tolerations.clone().unwrap_or_default();
        assert!(
            tol.iter().any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
            "{k}: must tolerate every taint: {tol:?}"
        );
        let strategy = spec.update_strategy.expect("updateStrategy");
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"), "{k}");
        let ru = strategy.rolling_update.expect("rollingUpdate");
        assert_eq!(ru.max_unavailable, Some(Int(1)), "{k}: maxUnavailable");
        assert_eq!(
            ru.max_surge,
            Some(Int(0)),
            "{k}: two agents on one node collide (see the YAML)"
        );
        let grace = std::time::Duration::from_secs(
            pod.termination_grace_period_seconds.expect("grace period") as u64,
        );
        assert!(
            grace > run.drain_timeout,
            "{k}: grace period {grace:?} must exceed the drain timeout {:?}",
            run.drain_timeout
        );

        let sc = c.security_context.clone().expect("securityContext");
        assert_eq!(sc.privileged, Some(false), "{k}");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{k}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{k}");
        assert_eq!(
            sc.run_as_user,
            Some(0),
            "{k}: uid 0 writes the node's /etc/hosts"
        );
        let caps = sc.capabilities.expect("capabilities");
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{k}");
        let added: BTreeSet<String> = caps.add.unwrap_or_default().into_iter().collect();
        // NET_BIND_SERVICE always: the relay's listeners take privileged ports (the
        // connect programs send only to such a listener), and a name relay may bind
        // its ports 80/443.
        let mut want: BTreeSet<String> = ["BPF", "NET_ADMIN", "NET_BIND_SERVICE"]
            .map(String::from)
            .into();
        // CHOWN exactly when the pins are handed to an owner, whose group the pod has.
        let groups = pod
            .security_context
            .as_ref()
            .and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default();
        match run.pin_owner {
            Some(owner) => {
                want.insert("CHOWN".into());
                assert!(
                    groups.contains(&i64::from(owner.gid)),
                    "{k}: the pod must be in the pin owner's group {}: {groups:?}",
                    owner.gid
                );
            }
            None => assert!(groups.is_empty(), "{k}: {groups:?}"),
        }
        assert_eq!(added, want, "{k}: capabilities");
    }
}

/// BENCHMARKS.md's idle RSS (MiB) for `frontends` (e.g. "1000").
fn idle_rss(frontends: &str) -> String {
    let text = read("BENCHMARKS.md");
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("| agent RSS, {frontends} frontends (MiB)")))
        .unwrap_or_else(|| panic!("BENCHMARKS.md has no RSS row for {frontends} frontends"));
    let after = &row[row.find("idle ").expect("an idle figure") + 5..];
    after
        .split_whitespace()
        .next()
        .expect("a number")
        .to_string()
}

#[test]
fn resources_are_sized_from_the_benchmarks() {
    let (k1, k10) = (idle_rss("1000"), idle_rss("10000"));
    for file in [
        "deploy/base/daemonset.yaml",
        "deploy/chart/hairpin/values.yaml",
    ] {
        let text = read(file);
        for claim in [
            format!("{k1} MiB idle at 1,000 frontends"),
            format!("{k10} MiB idle at 10,000"),
        ] {
            assert!(
                text.contains(&claim),
                "{file}: its comment must quote BENCHMARKS.md: {claim:?}"
            );
        }
    }
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let r = agent(&objs).resources.expect("resources");
        let get = |m: &Option<
            std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >| {
            mebibytes(&m.as_ref().and_then(|m| m.get("memory")).expect("memory").0)
        };
        let (request, limit) = (get(&r.requests), get(&r.limits));
        let idle: f64 = k10.parse().expect("MiB");
        assert!(
            request >= idle,
            "{}: the request covers an idle agent at 10,000 frontends ({idle} MiB)",
            v.dir
        );
        assert!(limit > request, "{}", v.dir);
        assert!(
            r.limits.as_ref().is_some_and(|l| !l.contains_key("cpu")),
            "{}: no CPU limit (throttling adds latency to relayed requests)",
            v.dir
        );
    }
}

/// The agent and its cleanup are Linux programs (BPF, /etc/hosts): in a cluster with
/// Windows nodes they must never be scheduled there, where they would crash-loop.
#[test]
fn every_pod_hairpin_runs_selects_linux_nodes() {
    for v in VARIANTS {
        for dir in [v.dir, v.uninstall] {
            let Some(objs) = kustomize(dir) else { return };
            for obj in &objs {
                let kind = obj["kind"].as_str().unwrap_or_default();
                if !matches!(kind, "DaemonSet" | "Job" | "Deployment") {
                    continue;
                }
                let selector = &obj["spec"]["template"]["spec"]["nodeSelector"];
                assert_eq!(
                    selector["kubernetes.io/os"], "linux",
                    "{dir}: {kind} {} has nodeSelector {selector}",
                    obj["metadata"]["name"]
                );
            }
        }
    }
}
