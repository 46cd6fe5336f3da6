//! The install manifests (`deploy/`): kustomize base, component and overlays, the
//! uninstall manifests, the Helm chart and the Dockerfile, checked against the
//! agent's own code. Non-privileged.
//!
//! What is verified here: every rendered object parses into its k8s-openapi type with
//! no field lost (a misspelt field fails); `kubectl kustomize` renders every variant;
//! the agent's env parses through its own clap options (`flags.rs`) into the settings
//! each variant is for; probes hit routes that status/admin.rs serves on the admin address's
//! port; mounts match the parsed paths; the Service's ports are the name relay's
//! listeners; the RBAC equals the calls the code makes with those settings, exactly,
//! each call pointing at its code (`rbac.rs`); the uninstall undoes what its install
//! wrote (`uninstall.rs`); the chart, rendered and linted by Helm v4 itself (its Go SDK as
//! a library, helm-python-sdk), renders the same objects as kustomize (`chart.rs`); the
//! monitoring component and the chart's toggle agree, and promtool checks and
//! unit-tests every alert (`monitoring.rs`). What is not: that a cluster admits and
//! runs them (no API server or kubelet here), and that the image builds (no container
//! engine in this suite: the Dockerfile is checked statically).

mod bpffs;
mod chart;
mod chart_values;
mod daemonset;
mod doc_values;
mod flags;
mod hooks;
mod image;
mod kernel_path;
mod monitoring;
mod node_cleanup;
mod placement;
mod rbac;
mod render;
mod seccomp;
mod uninstall;
mod upgrade;
mod workflow;
mod writer_placement;

use std::{collections::BTreeSet, process::Command};

use hairpin_agent::{Mode, k8s::CorednsMode};
use hairpin_tests::repo::workspace;
use k8s_openapi::api::core::v1::Container;

use flags::{agent_binary, global_env_names, run_args, writer_args};
use render::{agent, env_of, field_of, kind_names, kustomize, parse_all, writer};

/// One way to install hairpin, and what it is for.
pub struct Variant {
    /// The kustomization.
    pub dir: &'static str,
    /// The agent's --mode.
    pub mode: Mode,
    /// The agent's --coredns (CoreDNS sends pods to its name relay), and the mode of
    /// the hairpin-coredns writer Deployment (off: no writer).
    pub coredns: CorednsMode,
    /// The ConfigMap the CoreDNS writer edits, `namespace/name`.
    pub written: Option<&'static str>,
    /// Whether the node's /etc/hosts is managed.
    pub hosts: bool,
    /// The kustomization that removes this install (`kubectl apply -k`).
    pub uninstall: &'static str,
    /// The chart values (dotted key, YAML value) that render the same objects.
    pub chart: &'static [(&'static str, &'static str)],
}

/// The kustomization at the repository's root: the agents alone, in `--mode auto`
/// with the hosts file, writing no CoreDNS. Every other variant is this one but for
/// what it names.
const ROOT: Variant = Variant {
    dir: "deploy",
    mode: Mode::Auto,
    coredns: CorednsMode::Off,
    written: None,
    hosts: true,
    uninstall: "deploy/uninstall",
    chart: &[],
};

/// Every kustomization that installs hairpin (`every_kustomization_is_a_variant`
/// fails on one missing here).
pub const VARIANTS: [Variant; 6] = [
    ROOT,
    Variant {
        dir: "deploy/base",
        ..ROOT
    },
    Variant {
        dir: "deploy/overlays/coredns",
        coredns: CorednsMode::Corefile,
        written: Some("kube-system/coredns"),
        uninstall: "deploy/uninstall/coredns",
        chart: &[("coredns.mode", "corefile")],
        ..ROOT
    },
    Variant {
        dir: "deploy/overlays/coredns-import",
        coredns: CorednsMode::Import,
        written: Some("kube-system/coredns-custom"),
        uninstall: "deploy/uninstall/coredns-import",
        chart: &[("coredns.mode", "import")],
        ..ROOT
    },
    Variant {
        dir: "deploy/overlays/rke2",
        coredns: CorednsMode::Corefile,
        written: Some("kube-system/rke2-coredns-rke2-coredns"),
        uninstall: "deploy/uninstall/rke2",
        chart: &[
            ("coredns.mode", "corefile"),
            ("coredns.configMap", "rke2-coredns-rke2-coredns"),
        ],
        ..ROOT
    },
    Variant {
        dir: "deploy/overlays/fallbacks-off",
        mode: Mode::Ebpf,
        hosts: false,
        // No hosts file to clean (nor to mount).
        uninstall: "deploy/uninstall/fallbacks-off",
        chart: &[("mode", "ebpf"), ("hostsFile.enabled", "false")],
        ..ROOT
    },
];

/// The kustomization directories under `dir` (those holding a kustomization.yaml).
fn kustomizations_under(dir: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![workspace().join(dir)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                let rel = d.strip_prefix(workspace()).expect("under root");
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
        .chain(
            [
                "deploy/components/coredns",
                "deploy/components/seccomp-localhost",
                "deploy/components/kernel-path",
                "deploy/components/kernel-path-perfmon",
                "deploy/components/monitoring",
                "deploy/uninstall/coredns-writer",
                "deploy/uninstall/base",
            ]
            .map(String::from),
        )
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
        let kinds: BTreeSet<String> = kind_names(&objs).into_iter().collect();
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
        let writer = [
            "Deployment/hairpin-coredns",
            "ServiceAccount/hairpin-coredns",
        ];
        for w in writer {
            assert_eq!(
                kinds.contains(w),
                v.coredns != CorednsMode::Off,
                "{}: {w} exactly when CoreDNS is written",
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
        // The agents write no CoreDNS; the writer Deployment does, in the same mode.
        let written = writer(&objs).map(|c| {
            let w = writer_args(&env_of(&c, v.dir), v.dir);
            assert_eq!(w.coredns, v.coredns, "{}: the writer's --coredns", v.dir);
            assert_eq!(
                (
                    w.decision.names_domains.clone(),
                    w.decision.cluster_domain.clone()
                ),
                (
                    run.decision.names_domains.clone(),
                    run.decision.cluster_domain.clone()
                ),
                "{}: the writer publishes the names the agents route",
                v.dir
            );
            match w.coredns {
                CorednsMode::Off => panic!("{}: a writer that writes nothing", v.dir),
                CorednsMode::Corefile => w.coredns_objects.configmap.to_string(),
                CorednsMode::Import => w.coredns_objects.custom_configmap.to_string(),
            }
        });
        assert_eq!(
            written.as_deref(),
            v.written,
            "{}: the ConfigMap written",
            v.dir
        );
        assert_eq!(run.hosts_file.is_some(), v.hosts, "{}: --hosts-file", v.dir);
        // agent/mod.rs `coredns_config` refuses CoreDNS without the name relay.
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

/// `hairpin-agent SUB --help`.
fn help_of(bin: &std::path::Path, sub: &str) -> String {
    let out = Command::new(bin)
        .args([sub, "--help"])
        .output()
        .unwrap_or_else(|e| panic!("failed to run {} {sub} --help: {e}", bin.display()));
    assert!(out.status.success(), "`hairpin-agent {sub} --help` failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every env variable container `c` (of variant `dir`) sets is a flag `help` (of
/// `hairpin-agent SUB --help`) lists.
fn assert_env_in_help(c: &Container, help: &str, sub: &str, dir: &str) {
    for e in c.env.iter().flatten() {
        assert!(
            help.contains(&format!("[env: {}=", e.name)),
            "{dir}: env {} is not in `hairpin-agent {sub} --help`",
            e.name
        );
    }
}

#[test]
fn env_names_are_flags_the_agent_binary_has() {
    // flags.rs parses `run`'s env in-process; this asks the built binary too, which
    // also knows the global flags (main.rs).
    let Some(bin) = agent_binary() else { return };
    let help = help_of(&bin, "run");
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let c = agent(&objs);
        assert_env_in_help(&c, &help, "run", v.dir);
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
    let help = help_of(&bin, "coredns-writer");
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let Some(c) = writer(&objs) else { continue };
        assert_env_in_help(&c, &help, "coredns-writer", v.dir);
        assert_eq!(
            c.args,
            Some(vec!["coredns-writer".to_string()]),
            "{}",
            v.dir
        );
        assert_eq!(
            field_of(&c, "HAIRPIN_IDENTITY").as_deref(),
            Some("metadata.name"),
            "{}: each replica its own Lease identity",
            v.dir
        );
    }
}

#[test]
fn the_agent_binary_accepts_each_variants_settings() {
    // Beyond clap: the agent (agent/mod.rs) refuses some combinations (CoreDNS with --mode ebpf) before
    // it touches anything. Run `hairpin-agent run` with the DaemonSet's env and a
    // kubeconfig that does not exist: the agent validates every setting, then fails
    // building the client, before it attaches or binds anything.
    let Some(bin) = agent_binary() else { return };
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        for c in [Some(agent(&objs)), writer(&objs)].into_iter().flatten() {
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
                out.status.code() == Some(hairpin_agent::cli::Exit::Failed.code())
                    && stderr.contains("failed to read kubeconfig /nonexistent/"),
                "{}: {} did not accept its manifest's settings (exit {:?}):\n{stderr}",
                v.dir,
                c.name,
                out.status.code()
            );
        }
    }
}

#[test]
fn no_todo_or_planned_text_is_left_in_deploy() {
    let mut stack = vec![workspace().join("deploy")];
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
fn the_readme_lists_every_variant_and_the_one_command_uninstalls() {
    let readme = render::read("README.md");
    for v in VARIANTS.iter().filter(|v| v.dir != "deploy/base") {
        let name = v.dir.trim_start_matches("deploy/");
        assert!(
            readme.contains(name),
            "README: the Install section lists {}",
            v.dir
        );
    }
    // One command each: the kustomize uninstall is applied (its Job orders the
    // removal), never the install deleted in one pass; Helm's runs its hooks.
    for want in [
        "kubectl apply -k deploy/uninstall",
        "helm uninstall hairpin -n hairpin-system",
        "kubectl wait --for=delete namespace/hairpin-system",
    ] {
        assert!(readme.contains(want), "README lacks {want:?}");
    }
    assert!(
        !readme.contains("kubectl delete -k deploy/overlays/"),
        "README: deleting the install in one pass leaves CoreDNS pointing at nothing"
    );
}
