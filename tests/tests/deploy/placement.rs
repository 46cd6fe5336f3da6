//! The values an operator expects of a DaemonSet's chart, typed in values.schema.json
//! rather than free-form env: `nodeSelector`, `affinity`, `podAnnotations`,
//! `priorityClassName` and the default PROXY version, rendered by Helm into the pods
//! and, for the PROXY version, parsed by the agent's and the writer's own flags.

use hairpin_agent::ProxyVersion;
use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::PodSpec};
use serde_json::{Value as Json, json};

use super::{
    chart::{render_chart_with, render_error},
    flags::{run_args, writer_args},
    render::{agent, env_of, typed, writer},
};

fn agent_pod(objs: &[Json]) -> (PodSpec, Json) {
    let o = objs
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let ds: DaemonSet = typed(o);
    let template = ds.spec.expect("spec").template;
    let annotations =
        serde_json::to_value(template.metadata.and_then(|m| m.annotations)).expect("annotations");
    (template.spec.expect("pod spec"), annotations)
}

/// By default: Linux nodes only, no affinity, no annotations, system-node-critical,
/// and no PROXY version of the chart's own (the agent's default, `off`).
#[test]
fn the_defaults_place_the_agents_on_every_linux_node_and_leave_the_proxy_version_off() {
    let objs = render_chart_with(&[]);
    let (pod, annotations) = agent_pod(&objs);
    assert_eq!(
        serde_json::to_value(&pod.node_selector).expect("json"),
        json!({"kubernetes.io/os": "linux"})
    );
    assert!(pod.affinity.is_none(), "{:?}", pod.affinity);
    assert_eq!(annotations, Json::Null);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(!env_of(&agent(&objs), "chart").contains_key("HAIRPIN_DEFAULT_PROXY_PROTOCOL"));
}

/// Each value set reaches the agents' pods as Kubernetes spells it; the PROXY version
/// reaches the agents and the writer, whose flags parse it.
#[test]
fn node_selector_affinity_annotations_priority_and_proxy_version_reach_the_pods() {
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}]}]}}});
    let flags: Vec<String> = [
        (
            "--set-json",
            r#"nodeSelector={"node.example.com/pool":"workers"}"#.to_string(),
        ),
        ("--set-json", format!("affinity={affinity}")),
        (
            "--set-json",
            r#"podAnnotations={"example.com/scrape":"true"}"#.to_string(),
        ),
        ("--set", "priorityClassName=hairpin-critical".to_string()),
        ("--set", "defaultProxyProtocol=v2".to_string()),
        ("--set", "coredns.mode=corefile".to_string()),
    ]
    .into_iter()
    .flat_map(|(f, e)| [f.to_string(), e])
    .collect();
    let objs = render_chart_with(&flags);
    let (pod, annotations) = agent_pod(&objs);
    assert_eq!(
        serde_json::to_value(&pod.node_selector).expect("json"),
        json!({"kubernetes.io/os": "linux", "node.example.com/pool": "workers"})
    );
    assert_eq!(serde_json::to_value(&pod.affinity).expect("json"), affinity);
    assert_eq!(annotations, json!({"example.com/scrape": "true"}));
    assert_eq!(pod.priority_class_name.as_deref(), Some("hairpin-critical"));

    let agent_env = env_of(&agent(&objs), "chart");
    assert_eq!(
        agent_env
            .get("HAIRPIN_DEFAULT_PROXY_PROTOCOL")
            .map(String::as_str),
        Some("v2")
    );
    let run = run_args(&agent_env, "chart");
    assert!(matches!(
        run.decision.default_proxy_protocol.0,
        Some(ProxyVersion::V2)
    ));
    let writer_env = env_of(&writer(&objs).expect("the writer"), "chart");
    let w = writer_args(&writer_env, "chart");
    assert!(matches!(
        w.decision.default_proxy_protocol.0,
        Some(ProxyVersion::V2)
    ));
}

/// What the schema refuses, naming the key: a PROXY version the agent does not know,
/// a node label that is not a string, an affinity of another shape.
#[test]
fn the_schema_refuses_a_bad_placement_or_proxy_version() {
    for (flags, key, says) in [
        (
            ["--set", "defaultProxyProtocol=v3"],
            "/defaultProxyProtocol",
            "value must be one of",
        ),
        (
            ["--set-json", r#"nodeSelector={"pool":1}"#],
            "/nodeSelector/pool",
            "got number, want string",
        ),
        (
            ["--set-json", r#"affinity={"nodeAfinity":{}}"#],
            "/affinity",
            "additional properties 'nodeAfinity' not allowed",
        ),
        (
            ["--set-json", r#"podAnnotations={"a":true}"#],
            "/podAnnotations/a",
            "got boolean, want string",
        ),
    ] {
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let msg = render_error(&flags);
        assert!(
            msg.contains("HelmValuesError")
                && msg.contains(&format!("at '{key}'"))
                && msg.contains(says),
            "{flags:?}: expected the schema to refuse {key} ({says}):\n{msg}"
        );
    }
}

/// The monitoring pieces switch one by one: each off leaves the others, and the
/// agents' metrics listener, as they were.
#[test]
fn each_monitoring_piece_switches_on_its_own() {
    let pieces = |extra: &[&str]| -> Vec<String> {
        let mut flags = vec!["--set".to_string(), "monitoring.enabled=true".to_string()];
        for e in extra {
            flags.extend(["--set".to_string(), (*e).to_string()]);
        }
        let objs = render_chart_with(&flags);
        assert!(
            env_of(&agent(&objs), "chart").contains_key("HAIRPIN_METRICS_ADDRESS"),
            "{extra:?}: the metrics listener"
        );
        objs.iter()
            .filter(|o| {
                o["metadata"]["labels"]["app.kubernetes.io/component"] == "monitoring"
                    || matches!(o["kind"].as_str(), Some("PodMonitor" | "PrometheusRule"))
            })
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or(""),
                    o["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    let all = pieces(&[]);
    assert_eq!(
        all,
        [
            "PodMonitor/hairpin",
            "PodMonitor/hairpin-coredns",
            "PrometheusRule/hairpin",
            "ConfigMap/hairpin-dashboard",
        ]
    );
    for (switch, gone) in [
        (
            "monitoring.podMonitors=false",
            &["PodMonitor/hairpin", "PodMonitor/hairpin-coredns"][..],
        ),
        (
            "monitoring.prometheusRule=false",
            &["PrometheusRule/hairpin"],
        ),
        (
            "monitoring.dashboard=false",
            &["ConfigMap/hairpin-dashboard"],
        ),
    ] {
        let want: Vec<String> = all
            .iter()
            .filter(|p| !gone.contains(&p.as_str()))
            .cloned()
            .collect();
        assert_eq!(pieces(&[switch]), want, "{switch}");
    }
}
