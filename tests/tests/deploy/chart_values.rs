//! The chart's values, through Helm itself: values.schema.json refuses what used to
//! render silently, the chart works in any namespace under any release name (the
//! CoreDNS rewrites point at that release's Service), and the values a team sets
//! (image digest, pull secrets, rollout strategy, `helm test`) reach every pod.

use std::collections::BTreeSet;

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    batch::v1::Job,
    core::v1::{Pod, PodSpec},
};
use serde_json::Value as Json;

use super::{
    chart::{dry_run_install, render_all, render_chart_with, render_error, render_hooks_with},
    flags::{run_args, uninstall_args, writer_args},
    render::{env_in, env_of, typed},
};

fn set(exprs: &[&str]) -> Vec<String> {
    exprs
        .iter()
        .flat_map(|e| ["--set".to_string(), e.to_string()])
        .collect()
}

/// Each value the issue found rendering silently is refused by Helm with the
/// schema's message naming the key, and the values.yaml spellings still pass.
#[test]
fn the_schema_refuses_each_bad_value_naming_its_key() {
    for (flags, key, says) in [
        (set(&["mode=ebfp"]), "/mode", "value must be one of"),
        (
            set(&["kernelPath.mode=onn"]),
            "/kernelPath/mode",
            "value must be one of",
        ),
        (
            vec!["--set-json".into(), "image.tag=1.0".into()],
            "/image/tag",
            "got number, want string",
        ),
        // The agent refuses CoreDNS with --mode ebpf (it runs no name relay for the
        // rewrites to reach): refused here instead of crash-looping on every node.
        (
            set(&["mode=ebpf", "coredns.mode=corefile"]),
            "/coredns/mode",
            "value must be one of",
        ),
        (
            set(&["image.digest=sha256:abc"]),
            "/image/digest",
            "does not match pattern",
        ),
        (
            set(&["updateStrategy.rollingUpdate.maxSurge=1"]),
            "/updateStrategy/rollingUpdate/maxSurge",
            "value must be 0",
        ),
        (
            set(&["kernelpath.mode=on"]),
            "",
            "additional properties 'kernelpath' not allowed",
        ),
        (
            set(&["coredns.writer.minWriteInterval=soon"]),
            "/coredns/writer/minWriteInterval",
            "does not match pattern",
        ),
    ] {
        let msg = render_error(&flags);
        assert!(
            msg.contains("HelmValuesError")
                && msg.contains(&format!("at '{key}'"))
                && msg.contains(says),
            "{flags:?}: expected the schema to refuse {key} ({says}):\n{msg}"
        );
    }
    // What values.yaml documents is accepted, unquoted on/off included (YAML 1.1
    // booleans), and renders as the agent spells it.
    for (flags, env, want) in [
        (
            vec!["--set-json".into(), "kernelPath.mode=true".into()],
            "HAIRPIN_KERNEL_PATH",
            "on",
        ),
        (
            vec!["--set-json".into(), "kernelPath.mode=false".into()],
            "HAIRPIN_KERNEL_PATH",
            "off",
        ),
        (
            vec!["--set-json".into(), "coredns.mode=false".into()],
            "HAIRPIN_COREDNS",
            "off",
        ),
        (
            set(&["mode=both", "coredns.mode=corefile"]),
            "HAIRPIN_MODE",
            "both",
        ),
        (set(&["image.tag=1.0"]), "HAIRPIN_MODE", "auto"),
        // The LoadBalancer ranges, so a Node's claim cannot switch an LB off.
        (
            vec![
                "--set-json".into(),
                r#"lbCidrs=["203.0.113.0/24","2001:db8:9::/64"]"#.into(),
            ],
            "HAIRPIN_LB_CIDRS",
            "203.0.113.0/24,2001:db8:9::/64",
        ),
    ] {
        let objs = render_chart_with(&flags);
        let got = env_of(&super::render::agent(&objs), "chart");
        assert_eq!(got.get(env).map(String::as_str), Some(want), "{flags:?}");
    }
}

/// Every pod spec the chart renders (release objects and hooks), by `Kind/name`.
fn pod_specs(objs: &[Json]) -> Vec<(String, PodSpec)> {
    objs.iter()
        .filter_map(|o| {
            let name = format!(
                "{}/{}",
                o["kind"].as_str()?,
                o["metadata"]["name"].as_str()?
            );
            let spec = match o["kind"].as_str()? {
                "DaemonSet" => typed::<DaemonSet>(o).spec?.template.spec?,
                "Deployment" => typed::<Deployment>(o).spec?.template.spec?,
                "Job" => typed::<Job>(o).spec?.template.spec?,
                "Pod" => typed::<Pod>(o).spec?,
                _ => return None,
            };
            Some((name, spec))
        })
        .collect()
}

/// In namespace `edge` as release `shop` with CoreDNS on: every object is in that
/// namespace or names it, the writer's rewrites answer with the Service this
/// release renders there, and every reference between objects (ServiceAccounts,
/// RBAC subjects, the agents' own DaemonSet and Lease, the uninstall's targets)
/// names an object of this release.
#[expect(
    clippy::too_many_lines,
    reason = "one rendered release checked object by object, in the order Helm renders them"
)]
#[test]
fn another_namespace_and_release_name_with_coredns_on_render_one_consistent_release() {
    let flags = set(&["coredns.mode=corefile", "tests.target=shop.example.com:443"]);
    let objs = render_all("edge", "shop", &flags);
    let names: BTreeSet<String> = objs
        .iter()
        .map(|o| {
            format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["namespace"].as_str().unwrap_or("-"),
                o["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    let has = |kind: &str, ns: &str, name: &str| names.contains(&format!("{kind}/{ns}/{name}"));
    for o in &objs {
        let ns = o["metadata"]["namespace"].as_str();
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            name.starts_with("shop-hairpin"),
            "{} {name}: named after the release",
            o["kind"]
        );
        assert!(
            matches!(ns, None | Some("edge") | Some("kube-system")),
            "{} {name} in {ns:?}",
            o["kind"]
        );
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/instance"], "shop",
            "{name}"
        );
        // Every subject is a ServiceAccount of this release in its namespace.
        for s in o["subjects"].as_array().into_iter().flatten() {
            let sa = s["name"].as_str().unwrap_or_default();
            assert!(
                s["namespace"] == "edge" && has("ServiceAccount", "edge", sa),
                "{name}: subject {s}"
            );
        }
        if let Some(role) = o["roleRef"]["name"].as_str() {
            let kind = o["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_ns = if kind == "Role" {
                ns.unwrap_or("-")
            } else {
                "-"
            };
            assert!(has(kind, role_ns, role), "{name}: roleRef {kind} {role}");
        }
    }
    for (name, pod) in pod_specs(&objs) {
        let sa = pod.service_account_name.clone().unwrap_or_default();
        assert!(
            sa.is_empty() || has("ServiceAccount", "edge", &sa),
            "{name}: serviceAccountName {sa}"
        );
    }
    // The rewrites point at this release's Service in this namespace.
    let agent = super::render::only_container(&super::render::pod_spec(&super::render::daemonset(
        &objs,
        "shop-hairpin",
    )));
    let writer_pod = pod_specs(&objs)
        .into_iter()
        .find(|(n, _)| n == "Deployment/shop-hairpin-coredns")
        .expect("the writer with CoreDNS on")
        .1;
    let writer = super::render::only_container(&writer_pod);
    let w = writer_args(&env_in(&writer, "chart", "edge"), "chart");
    assert!(has("Service", "edge", "shop-hairpin"), "{names:?}");
    assert_eq!(
        w.coredns_target.to_string(),
        "shop-hairpin.edge.svc.cluster.local"
    );
    assert_eq!(
        (w.namespace.as_str(), w.lease_name.as_str()),
        ("edge", "shop-hairpin-coredns")
    );
    let run = run_args(&env_in(&agent, "chart", "edge"), "chart");
    assert_eq!(
        run.daemonset.expect("--daemonset").to_string(),
        "edge/shop-hairpin"
    );
    assert!(has("DaemonSet", "edge", "shop-hairpin"));
    // The Roles name the Leases the processes elect.
    let rules = |kind: &str, ns: &str, name: &str| -> String {
        objs.iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && o["metadata"]["namespace"] == ns
            })
            .map(|o| o["rules"].to_string())
            .unwrap_or_else(|| panic!("{kind} {ns}/{name}"))
    };
    assert!(rules("Role", "edge", "shop-hairpin").contains(&format!("\"{}\"", run.lease_name)));
    assert!(rules("Role", "edge", "shop-hairpin-coredns").contains("\"shop-hairpin-coredns\""));
    // The uninstall stops and waits for this release's workloads and Leases.
    let hooks: Vec<&Json> = objs.iter().filter(|o| super::chart::is_hook(o)).collect();
    let job = hooks
        .iter()
        .find(|o| o["kind"] == "Job")
        .expect("the uninstall Job");
    let job: Job = typed(job);
    let c = &job
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers[0];
    let u = uninstall_args(&env_of(c, "chart"), "chart");
    let stop: Vec<String> = u.stop.iter().map(ToString::to_string).collect();
    assert_eq!(
        stop,
        [
            "deployment/edge/shop-hairpin-coredns",
            "daemonset/edge/shop-hairpin"
        ]
    );
    let leases: Vec<String> = u.leases.iter().map(ToString::to_string).collect();
    assert_eq!(
        leases,
        ["edge/shop-hairpin-coredns", "edge/shop-hairpin-agent"]
    );
    assert_eq!(
        u.nodes.expect("--nodes").to_string(),
        "edge/shop-hairpin-cleanup"
    );
    assert!(has("DaemonSet", "edge", "shop-hairpin-cleanup"));
    assert!(
        u.delete_namespace.is_none(),
        "Helm deletes the release, never the namespace"
    );
    // fullnameOverride names everything without the release.
    let named = render_all("edge", "shop", &set(&["fullnameOverride=hp"]));
    assert!(named.iter().all(|o| {
        o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("hp"))
    }));
}

/// The standard labels on every object, the image by digest, the pull secrets on
/// every pod (agents, writer, uninstall, test) and the rollout strategy as set.
#[test]
fn labels_digest_pull_secrets_and_update_strategy_reach_every_object() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let flags = set(&[
        "coredns.mode=import",
        "monitoring.enabled=true",
        "tests.target=203.0.113.10:443",
        &format!("image.digest={digest}"),
        "imagePullSecrets[0].name=mirror",
        "updateStrategy.rollingUpdate.maxUnavailable=10%",
    ]);
    let objs = render_all("hairpin-system", "hairpin", &flags);
    let chart_version = super::render::read("deploy/chart/hairpin/Chart.yaml")
        .lines()
        .find_map(|l| l.strip_prefix("version: "))
        .expect("Chart.yaml version")
        .to_string();
    for o in &objs {
        let l = &o["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
        ] {
            assert!(
                l[key].is_string(),
                "{} {}: label {key}",
                o["kind"],
                o["metadata"]["name"]
            );
        }
        assert_eq!(l["helm.sh/chart"], format!("hairpin-{chart_version}"));
    }
    let pods = pod_specs(&objs);
    assert_eq!(
        pods.len(),
        5,
        "agents, writer, node cleanup, uninstall Job, test pod: {:?}",
        pods.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    for (name, pod) in &pods {
        let secrets: Vec<&str> = pod
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(secrets, ["mirror"], "{name}");
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            assert_eq!(
                c.image.as_deref(),
                Some(format!("ghcr.io/hairpin-dev/hairpin-agent:0.1.0@{digest}").as_str()),
                "{name}: {}",
                c.name
            );
        }
    }
    let ds: DaemonSet = typed(
        objs.iter()
            .find(|o| o["kind"] == "DaemonSet" && !super::chart::is_hook(o))
            .expect("ds"),
    );
    let strategy = ds.spec.expect("spec").update_strategy.expect("strategy");
    let ru = strategy.rolling_update.expect("rolling");
    assert_eq!(
        (strategy.type_.as_deref(), ru.max_surge, ru.max_unavailable),
        (
            Some("RollingUpdate"),
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)),
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("10%".into()))
        )
    );
}

/// `helm test` runs `hairpin-agent check TARGET` from an ordinary pod (pod network,
/// the cluster's DNS); nothing is rendered without a target.
#[test]
fn helm_test_runs_check_against_the_configured_target_from_a_pod() {
    let none = render_hooks_with(&[]);
    assert!(
        !none.iter().any(|o| o["kind"] == "Pod"),
        "no target, no test pod"
    );
    let hooks = render_hooks_with(&set(&[
        "tests.target=shop.example.com:443",
        "tests.args[0]=--tls",
    ]));
    let pod = hooks
        .iter()
        .find(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .expect("a test hook");
    let pod: Pod = typed(pod);
    let spec = pod.spec.expect("spec");
    assert_eq!(
        spec.host_network, None,
        "from the pod network, as workloads connect"
    );
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let c = &spec.containers[0];
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/hairpin-agent".to_string()][..])
    );
    assert_eq!(
        c.args.as_deref(),
        Some(
            &[
                "check".to_string(),
                "shop.example.com:443".into(),
                "--tls".into()
            ][..]
        )
    );
}

/// NOTES.txt says how to check the install, what is not published yet, how to test
/// and what `helm uninstall` does, with this release's names.
#[test]
fn the_notes_name_this_release_and_what_to_do_next() {
    let (_, notes) = dry_run_install("edge", "shop", &set(&["coredns.mode=corefile"]));
    for want in [
        "kubectl -n edge rollout status ds/shop-hairpin",
        "kubectl -n edge exec ds/shop-hairpin -- hairpin-agent status",
        "names.domains",
        "shop-hairpin.edge.svc.cluster.local",
        "--set tests.target=",
        "helm uninstall shop -n edge",
        "docs/troubleshooting.md",
    ] {
        assert!(notes.contains(want), "NOTES.txt lacks {want:?}:\n{notes}");
    }
}
