//! The install manifests (`deploy/`): kustomize base, component and overlays, the
//! uninstall manifests, the Helm chart and the Dockerfile, checked against the
//! agent's own code. Non-privileged.
//!
//! What is verified here: every rendered object parses into its k8s-openapi type with
//! no field lost (a misspelt field fails); `kubectl kustomize` renders every variant;
//! the agent's env parses through its own clap options (`flags.rs`) into the settings
//! each variant is for; probes hit routes that admin.rs serves on the admin address's
//! port; mounts match the parsed paths; the Service's ports are the name relay's
//! listeners; the RBAC equals the calls the code makes with those settings, exactly,
//! each call pointing at its code (`rbac.rs`); the uninstall undoes what its install
//! wrote (`uninstall.rs`); the chart renders the same objects as kustomize
//! (`chart.rs`). What is not: that a cluster admits and runs them (no API server or
//! kubelet here), that Helm itself renders the chart (Helm is not installable here:
//! `chart.rs` renders it with a renderer that implements only the template constructs
//! the chart uses and fails on any other), and that the image builds (no container
//! engine here: the Dockerfile is checked statically).

mod chart;
mod flags;
mod rbac;
mod render;
mod uninstall;

use std::{collections::BTreeSet, process::Command};

use hairpin_agent::{k8s::coredns::CorednsMode, mode::Mode};
use k8s_openapi::api::core::v1::Service;

use flags::{admin_routes, agent_binary, global_env_names, run_args};
use render::{
    agent, daemonset, env_of, field_of, find, host_path, kustomize, mebibytes, parse_all, pod_spec,
    read, root, typed,
};

/// One way to install hairpin, and what it is for.
pub struct Variant {
    /// The kustomization.
    pub dir: &'static str,
    /// The agent's --mode.
    pub mode: Mode,
    /// The agent's --coredns.
    pub coredns: CorednsMode,
    /// The ConfigMap the CoreDNS writer edits, `namespace/name`.
    pub written: Option<&'static str>,
    /// Whether the node's /etc/hosts is managed.
    pub hosts: bool,
    /// The kustomization that removes what these agents wrote.
    pub uninstall: &'static str,
    /// The chart values (dotted key, YAML value) that render the same objects.
    pub chart: &'static [(&'static str, &'static str)],
}

/// Every kustomization that installs hairpin (`every_kustomization_is_a_variant`
/// fails on one missing here).
pub const VARIANTS: [Variant; 6] = [
    Variant {
        dir: "deploy",
        mode: Mode::Auto,
        coredns: CorednsMode::Off,
        written: None,
        hosts: true,
        uninstall: "deploy/uninstall",
        chart: &[],
    },
    Variant {
        dir: "deploy/base",
        mode: Mode::Auto,
        coredns: CorednsMode::Off,
        written: None,
        hosts: true,
        uninstall: "deploy/uninstall",
        chart: &[],
    },
    Variant {
        dir: "deploy/overlays/coredns",
        mode: Mode::Auto,
        coredns: CorednsMode::Corefile,
        written: Some("kube-system/coredns"),
        hosts: true,
        uninstall: "deploy/uninstall/coredns",
        chart: &[("coredns.mode", "corefile")],
    },
    Variant {
        dir: "deploy/overlays/coredns-import",
        mode: Mode::Auto,
        coredns: CorednsMode::Import,
        written: Some("kube-system/coredns-custom"),
        hosts: true,
        uninstall: "deploy/uninstall/coredns-import",
        chart: &[("coredns.mode", "import")],
    },
    Variant {
        dir: "deploy/overlays/rke2",
        mode: Mode::Auto,
        coredns: CorednsMode::Corefile,
        written: Some("kube-system/rke2-coredns-rke2-coredns"),
        hosts: true,
        uninstall: "deploy/uninstall/rke2",
        chart: &[
            ("coredns.mode", "corefile"),
            ("coredns.configMap", "rke2-coredns-rke2-coredns"),
        ],
    },
    Variant {
        dir: "deploy/overlays/fallbacks-off",
        mode: Mode::Ebpf,
        coredns: CorednsMode::Off,
        written: None,
        hosts: false,
        // Nothing outside the namespace was written; the Job deletes the Lease and the
        // node step finds no block.
        uninstall: "deploy/uninstall",
        chart: &[("mode", "ebpf"), ("hostsFile.enabled", "false")],
    },
];

/// The kustomization directories under `dir` (those holding a kustomization.yaml).
fn kustomizations_under(dir: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root().join(dir)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                let rel = d.strip_prefix(root()).expect("under root");
                out.insert(rel.to_str().expect("utf-8").to_string());
            }
        }
    }
    out
}

#[test]
fn every_kustomization_is_a_variant_or_an_uninstall() {
    let known: BTreeSet<String> = VARIANTS
        .iter()
        .flat_map(|v| [v.dir.to_string(), v.uninstall.to_string()])
        // Not installable alone: the component, and the uninstall's shared base.
        .chain(["deploy/components/coredns", "deploy/uninstall/base"].map(String::from))
        .collect();
    let found = kustomizations_under("deploy");
    assert_eq!(
        found, known,
        "every kustomization is tested as a variant (VARIANTS) or an uninstall"
    );
}

#[test]
fn kustomize_renders_every_variant_into_kubernetes_types() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        parse_all(&objs, v.dir);
        let kinds: BTreeSet<String> = objs
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        for must in [
            "Namespace/hairpin-system",
            "ServiceAccount/hairpin",
            "ClusterRole/hairpin",
            "ClusterRoleBinding/hairpin",
            "Role/hairpin",
            "RoleBinding/hairpin",
            "DaemonSet/hairpin",
        ] {
            assert!(
                kinds.contains(must),
                "{}: {must} missing from {kinds:?}",
                v.dir
            );
        }
        assert!(
            !objs.iter().any(|o| o["kind"] == "PodDisruptionBudget"),
            "{}: a PDB does not apply to a DaemonSet's rollout (it gates evictions only) and would block node drains",
            v.dir
        );
    }
}

#[test]
fn each_variant_runs_the_agent_as_it_says() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let run = run_args(&env_of(&agent(&objs), v.dir), v.dir);
        assert_eq!(run.mode, v.mode, "{}: --mode", v.dir);
        assert_eq!(run.coredns, v.coredns, "{}: --coredns", v.dir);
        let written = match run.coredns {
            CorednsMode::Off => None,
            CorednsMode::Corefile => Some(run.coredns_objects.configmap.to_string()),
            CorednsMode::Import => Some(run.coredns_objects.custom_configmap.to_string()),
        };
        assert_eq!(
            written.as_deref(),
            v.written,
            "{}: the ConfigMap written",
            v.dir
        );
        assert_eq!(run.hosts_file.is_some(), v.hosts, "{}: --hosts-file", v.dir);
        // run.rs `coredns_config` refuses CoreDNS without the name relay.
        assert!(
            run.coredns == CorednsMode::Off || run.mode.allows_names(),
            "{}: --coredns needs a mode with the name relay",
            v.dir
        );
        assert!(
            run.frontends.is_none() && run.kubeconfig.is_none(),
            "{}: in-cluster",
            v.dir
        );
    }
}

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
        assert_eq!(
            run.coredns_target.to_string(),
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

#[test]
fn env_names_are_flags_the_agent_binary_has() {
    // flags.rs parses `run`'s env in-process; this asks the built binary too, which
    // also knows the global flags (main.rs).
    let Some(bin) = agent_binary() else { return };
    let out = Command::new(&bin)
        .args(["run", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("failed to run {} run --help: {e}", bin.display()));
    assert!(out.status.success(), "`hairpin-agent run --help` failed");
    let help = String::from_utf8_lossy(&out.stdout);
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let c = agent(&objs);
        for e in c.env.iter().flatten() {
            assert!(
                help.contains(&format!("[env: {}=", e.name)),
                "{}: env {} is not in `hairpin-agent run --help`",
                v.dir,
                e.name
            );
        }
        assert_eq!(
            c.command,
            Some(vec!["/usr/local/bin/hairpin-agent".to_string()]),
            "{}",
            v.dir
        );
        assert_eq!(c.args, Some(vec!["run".to_string()]), "{}", v.dir);
        assert_eq!(
            field_of(&c, "HAIRPIN_NODE_NAME").as_deref(),
            Some("spec.nodeName"),
            "{}",
            v.dir
        );
        assert_eq!(
            field_of(&c, "HAIRPIN_NODE_IPS").as_deref(),
            Some("status.hostIPs"),
            "{}",
            v.dir
        );
        assert_eq!(
            field_of(&c, "HAIRPIN_NAMESPACE").as_deref(),
            Some("metadata.namespace"),
            "{}",
            v.dir
        );
    }
    assert!(
        global_env_names()
            .iter()
            .all(|g| help.contains(&format!("[env: {g}=")))
    );
}

#[test]
fn the_agent_binary_accepts_each_variants_settings() {
    // Beyond clap: run.rs refuses some combinations (CoreDNS with --mode ebpf) before
    // it touches anything. Run `hairpin-agent run` with the DaemonSet's env and a
    // kubeconfig that does not exist: the agent validates every setting, then fails
    // building the client, before it attaches or binds anything.
    let Some(bin) = agent_binary() else { return };
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let c = agent(&objs);
        let out = Command::new(&bin)
            .args(c.args.clone().unwrap_or_default())
            .env_clear()
            .env("RUST_BACKTRACE", "0")
            .envs(env_of(&c, v.dir))
            .env(
                "HAIRPIN_KUBECONFIG",
                "/nonexistent/hairpin-deploy-test/kubeconfig",
            )
            .output()
            .expect("run the agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(1)
                && stderr.contains("failed to read kubeconfig /nonexistent/"),
            "{}: the agent did not accept the DaemonSet's settings (exit {:?}):\n{stderr}",
            v.dir,
            out.status.code()
        );
    }
}

#[test]
fn probes_hit_routes_the_admin_server_serves_on_its_address() {
    let routes = admin_routes();
    assert!(
        routes.contains("/healthz") && routes.contains("/readyz"),
        "admin.rs routes: {routes:?}"
    );
    let defaults = run_args(&Default::default(), "defaults");
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let c = agent(&objs);
        let address = run_args(&env_of(&c, v.dir), v.dir).admin_address;
        assert_eq!(
            address, defaults.admin_address,
            "{}: the agent's default admin address",
            v.dir
        );
        assert!(
            address.ip().is_loopback(),
            "{}: admin address should stay node-local",
            v.dir
        );
        for (what, probe, path) in [
            ("startupProbe", &c.startup_probe, "/healthz"),
            ("livenessProbe", &c.liveness_probe, "/healthz"),
            ("readinessProbe", &c.readiness_probe, "/readyz"),
        ] {
            let get = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .unwrap_or_else(|| panic!("{}: {what} must be an httpGet", v.dir));
            let p = get.path.as_deref().unwrap_or("/");
            assert_eq!(p, path, "{}: {what} path", v.dir);
            assert!(
                routes.contains(p),
                "{}: {what} path {p} is not served by admin.rs ({routes:?})",
                v.dir
            );
            assert_eq!(
                get.port,
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                    address.port().into()
                ),
                "{}: {what} port must be the admin address's",
                v.dir
            );
            // Kubelet would dial the node IP otherwise, where the loopback listener is not.
            assert_eq!(
                get.host.as_deref(),
                Some(address.ip().to_string().as_str()),
                "{}: {what} host",
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
        // Nothing else: no /sys/fs/bpf (nothing is pinned), no stray host paths.
        let paths: BTreeSet<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|vol| Some(vol.host_path.as_ref()?.path.clone()))
            .collect();
        let allowed: BTreeSet<String> = ["/sys/fs/cgroup", "/run/hairpin", "/etc/hosts"]
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
        // NET_BIND_SERVICE exactly when a name relay may run and binds a port < 1024.
        let binds_low = run.mode.allows_names()
            && (run.names_ports.0.iter().any(|p| *p < 1024)
                || run.names_service_ports.0.iter().any(|(_, l)| *l < 1024));
        let mut want: BTreeSet<String> = ["BPF", "NET_ADMIN"].map(String::from).into();
        if binds_low {
            want.insert("NET_BIND_SERVICE".into());
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

#[test]
fn no_todo_or_planned_text_is_left_in_deploy() {
    let mut stack = vec![root().join("deploy")];
    let mut checked = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            for word in ["TODO", "PLANNED", "FIXME"] {
                assert!(
                    !text.contains(word),
                    "{}: {word} left in the manifests",
                    p.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "walked deploy/ ({checked} files)");
}

#[test]
fn dockerfile_builds_both_arches_and_ships_the_binary_the_daemonset_runs() {
    let text = read("deploy/Dockerfile");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(
        froms.len(),
        3,
        "three stages: ebpf, agent, runtime: {froms:?}"
    );
    for stage in ["AS ebpf", "AS agent", "AS runtime"] {
        assert!(
            froms.iter().any(|f| f.ends_with(stage)),
            "stage {stage} missing: {froms:?}"
        );
    }
    for f in &froms[..2] {
        assert!(
            f.contains("--platform=$BUILDPLATFORM"),
            "build stages run natively and cross-compile: {f}"
        );
    }
    for f in &froms {
        let image = f
            .split_whitespace()
            .find(|w| !w.starts_with("--") && *w != "FROM")
            .expect("image");
        assert!(
            image.contains(':') && !image.ends_with(":latest"),
            "pin a tag, never latest: {f}"
        );
    }
    assert!(!text.contains(":latest"), "no latest tags anywhere");
    for needle in [
        "ARG TARGETARCH",
        "amd64)",
        "arm64)",
        "cargo xtask build-ebpf",
        "--component rust-src",
        "HAIRPIN_EBPF_OBJECT=",
        "--release",
    ] {
        assert!(text.contains(needle), "Dockerfile lacks {needle:?}");
    }
    let runtime = &text[text.find("AS runtime").expect("runtime stage")..];
    assert!(runtime.contains("COPY --from=agent /out/hairpin-agent /usr/local/bin/hairpin-agent"));
    assert!(
        runtime.contains("USER 0:0"),
        "the runtime stage states its user"
    );
    assert!(
        !runtime.contains("apt-get"),
        "the runtime image holds only the binary"
    );
    if let Some(objs) = kustomize("deploy") {
        let c = agent(&objs);
        assert_eq!(
            c.command.as_deref(),
            Some(&["/usr/local/bin/hairpin-agent".to_string()][..])
        );
        let tag = read("deploy/chart/hairpin/Chart.yaml");
        assert!(
            c.image.as_deref().is_some_and(|i| tag.contains(&format!(
                "appVersion: \"{}\"",
                i.rsplit(':').next().unwrap_or_default()
            ))),
            "the kustomize image tag and the chart's appVersion agree"
        );
    }
}
