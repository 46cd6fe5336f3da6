//! deploy/components/monitoring and the chart's `monitoring:` values: the objects
//! render, the chart's toggle renders what the component renders, the agents serve
//! the port the PodMonitor scrapes, every alert is checked and unit-tested by
//! promtool (Debian's `prometheus` package, installed by `cargo xtask setup`), and
//! the rules and the dashboard ask only for metrics the agent exports.

use std::{collections::BTreeSet, path::Path, process::Command, sync::Arc};

use hairpin_agent::status::{ConnError, Direction, Metrics};
use serde_json::Value as Json;

use super::{
    chart::{comparable, render_chart_with},
    flags::run_args,
    render::{agent, env_of, find, kustomize_with, parse_all, read, writer},
};

const MONITORING: &str = "deploy/components/monitoring";

/// Kinds the monitoring component adds, which k8s-openapi does not type
/// (prometheus-operator's CRDs) or parse_all does not list (the ConfigMap).
const ADDED: [&str; 3] = ["PodMonitor", "PrometheusRule", "ConfigMap"];

fn chart_monitoring() -> Vec<Json> {
    render_chart_with(&["--set".into(), "monitoring.enabled=true".into()])
}

fn typed_part(objs: &[Json]) -> Vec<Json> {
    objs.iter()
        .filter(|o| !ADDED.contains(&o["kind"].as_str().unwrap_or_default()))
        .cloned()
        .collect()
}

#[test]
fn the_chart_toggle_renders_what_the_component_renders() {
    let chart = chart_monitoring();
    parse_all(&typed_part(&chart), "chart with monitoring");
    for kind in ADDED {
        assert!(
            chart.iter().any(|o| o["kind"] == kind),
            "monitoring.enabled=true renders a {kind}"
        );
    }
    let off = render_chart_with(&[]);
    assert!(
        !off.iter()
            .any(|o| ADDED.contains(&o["kind"].as_str().unwrap_or_default())),
        "monitoring is off by default"
    );
    assert!(
        env_of(&agent(&off), "chart")
            .keys()
            .all(|k| k != "HAIRPIN_METRICS_ADDRESS"),
        "without monitoring /metrics stays on 127.0.0.1"
    );
    let Some(kustomized) = kustomize_with(&[MONITORING]) else {
        return;
    };
    parse_all(&typed_part(&kustomized), MONITORING);
    let (a, b) = (comparable(chart), comparable(kustomized));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the chart with monitoring.enabled=true and {MONITORING} render different objects"
    );
    for (key, obj) in &a {
        assert_eq!(
            serde_json::to_string_pretty(obj).expect("json"),
            serde_json::to_string_pretty(&b[key]).expect("json"),
            "{key}: the chart with monitoring.enabled=true differs from {MONITORING}"
        );
    }
    // The chart's labels value reaches every object it adds (Prometheus selects by them).
    let labelled = render_chart_with(&[
        "--set".into(),
        "monitoring.enabled=true,monitoring.labels.release=kube-prometheus-stack".into(),
    ]);
    for kind in ADDED {
        let o = labelled.iter().find(|o| o["kind"] == kind).expect(kind);
        assert_eq!(
            o["metadata"]["labels"]["release"], "kube-prometheus-stack",
            "{kind} carries monitoring.labels"
        );
    }
}

#[test]
fn the_podmonitor_scrapes_the_port_the_agent_serves_metrics_on() {
    let Some(objs) = kustomize_with(&[MONITORING]) else {
        return;
    };
    let c = agent(&objs);
    let run = run_args(&env_of(&c, MONITORING), MONITORING);
    let addr = run
        .metrics_address
        .expect("the component sets HAIRPIN_METRICS_ADDRESS");
    // The node's private IPs (where Prometheus reaches a host-network pod), never
    // its public one: the agent resolves against the node IPs it is given.
    let public: std::net::IpAddr = "203.0.113.7".parse().unwrap();
    let private: std::net::IpAddr = "10.114.0.3".parse().unwrap();
    let bound = addr
        .resolve(&[public, private])
        .expect("a node with a private IP serves metrics");
    assert_eq!(
        bound.iter().map(|a| a.ip()).collect::<Vec<_>>(),
        [private],
        "/metrics on the private node IP alone: {addr}"
    );
    assert!(
        addr.resolve(&[public]).is_err(),
        "a node with only a public IP refuses to serve /metrics there: {addr}"
    );
    let addr = bound[0];
    let port = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a container port named metrics");
    assert_eq!(port.container_port, i32::from(addr.port()));
    assert_ne!(
        addr, run.admin_address,
        "/metrics alone on its own address; the probes and /status stay node-local"
    );

    let pm = find(&objs, "PodMonitor", "hairpin").expect("PodMonitor hairpin");
    assert_eq!(pm["metadata"]["namespace"], "hairpin-system");
    let endpoints = pm["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("endpoints");
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0]["port"], "metrics");
    assert_eq!(endpoints[0]["path"], "/metrics");
    // Job "hairpin", which every rule selects: the pods' app.kubernetes.io/name.
    let job_label = pm["spec"]["jobLabel"].as_str().expect("jobLabel");
    let ds = find(&objs, "DaemonSet", "hairpin").expect("DaemonSet");
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(pod_labels[job_label], "hairpin");
    let selects = |labels: &Json| {
        pm["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .iter()
            .all(|(k, v)| &labels[k] == v)
    };
    assert!(selects(pod_labels), "the PodMonitor selects the agents");
    // The CoreDNS writer serves its own /metrics on its pod IP; this PodMonitor is for
    // the agents (a writer is only in the CoreDNS variants).
    if let Some(with_writer) = kustomize_with(&["deploy/components/coredns", MONITORING]) {
        assert!(writer(&with_writer).is_some());
        let w = find(&with_writer, "Deployment", "hairpin-coredns").expect("writer");
        assert!(
            !selects(&w["spec"]["template"]["metadata"]["labels"]),
            "the PodMonitor does not select the CoreDNS writer"
        );
    }
}

#[test]
fn the_chart_serves_metrics_on_private_node_ips_unless_told_an_address() {
    let metrics_address = |extra: &[&str]| -> String {
        let mut flags = vec!["--set".to_string(), "monitoring.enabled=true".to_string()];
        for e in extra {
            flags.extend(["--set".to_string(), (*e).to_string()]);
        }
        let run = run_args(
            &env_of(&agent(&render_chart_with(&flags)), "chart"),
            "chart",
        );
        run.metrics_address
            .expect("monitoring.enabled sets HAIRPIN_METRICS_ADDRESS")
            .to_string()
    };
    assert_eq!(metrics_address(&[]), "node-ips:9902");
    assert_eq!(
        metrics_address(&[
            "monitoring.metricsHost=fd00::5",
            "monitoring.metricsPort=9990"
        ]),
        "[fd00::5]:9990"
    );
    assert_eq!(
        metrics_address(&["monitoring.metricsHost=0.0.0.0"]),
        "0.0.0.0:9902"
    );
}

/// The rule groups of the PrometheusRule in `objs`, as a Prometheus rules file.
fn rules_file(objs: &[Json]) -> String {
    let rule = find(objs, "PrometheusRule", "hairpin").expect("PrometheusRule hairpin");
    yaml_serde::to_string(&rule["spec"]).expect("rules as YAML")
}

/// promtool, or `None` (said loudly) outside CI when it is not installed.
fn promtool() -> Option<&'static str> {
    if Command::new("promtool").arg("--version").output().is_ok() {
        return Some("promtool");
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "promtool is needed (CI=true): `cargo xtask setup` installs Debian's prometheus package"
    );
    eprintln!("SKIPPED: promtool not found: `cargo xtask setup` installs it");
    None
}

fn promtool_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_the_rules_and_passes_each_alerts_unit_tests() {
    let Some(_) = promtool() else { return };
    let Some(objs) = kustomize_with(&[MONITORING]) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("hairpin-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("rules.yaml"), rules_file(&objs)).expect("write rules.yaml");
    let tests = read(&format!("{MONITORING}/rules.test.yaml"));
    std::fs::write(dir.join("rules.test.yaml"), &tests).expect("write rules.test.yaml");

    let checked = promtool_in(&dir, &["check", "rules", "rules.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool_in(&dir, &["test", "rules", "rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a unit test that expects it to fire.
    let rules: Json = serde_json::to_value(
        yaml_serde::from_str::<yaml_serde::Value>(&rules_file(&objs)).expect("rules"),
    )
    .expect("json");
    let alerts: BTreeSet<String> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    let test_doc: Json =
        serde_json::to_value(yaml_serde::from_str::<yaml_serde::Value>(&tests).expect("tests"))
            .expect("json");
    let fired: BTreeSet<String> = test_doc["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str().map(String::from))
        .collect();
    assert_eq!(
        fired, alerts,
        "each alert has a unit test in which it fires"
    );

    // And the tests can fail: a rule whose threshold moved breaks them.
    let broken = rules_file(&objs).replace("> 30", "> 300");
    assert_ne!(broken, rules_file(&objs));
    std::fs::write(dir.join("rules.yaml"), broken).expect("write rules.yaml");
    let out = Command::new("promtool")
        .current_dir(&dir)
        .args(["test", "rules", "rules.test.yaml"])
        .output()
        .expect("run promtool");
    assert!(
        !out.status.success(),
        "promtool passed rules whose stale-heartbeat threshold moved"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every series name the agent's /metrics can export: each family's `# TYPE` line,
/// with the suffixes its samples carry (counters `_total`, histograms `_bucket`,
/// `_sum`, `_count`). The kernel programs' counters appear once a reader is set.
fn exported() -> BTreeSet<String> {
    let m = Metrics::default();
    // A labelled family is rendered once it has a sample: record one of each.
    m.set_kernel_counters(Arc::new(|| vec![("kernel_missed_push".to_string(), 1)]));
    m.set_datapath_heartbeat(Arc::new(|| (Some(1.0), 600.0)));
    m.bytes(Direction::Upstream, 1);
    m.upstream_error(ConnError::Refused);
    m.client_error(ConnError::Reset);
    m.shed("per_source");
    m.watch_restart("services");
    m.set_connect_hook_behind("connect4", false);
    let mut out = BTreeSet::new();
    for line in m.render().lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut w = rest.split_whitespace();
        let (Some(name), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The `hairpin_*` names in a PromQL expression.
fn hairpin_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("hairpin_"))
        .map(String::from)
        .collect()
}

#[test]
fn the_rules_and_the_dashboard_use_metrics_the_agent_exports() {
    let exported = exported();
    for name in [
        "hairpin_relay_shed_total",
        "hairpin_kernel_events_total",
        "hairpin_datapath_heartbeat_age_seconds",
        "hairpin_datapath_ttl_seconds",
        "hairpin_names_withheld",
    ] {
        assert!(exported.contains(name), "{name}: {exported:?}");
    }
    let mut used = BTreeSet::new();
    let rule_text = read(&format!("{MONITORING}/prometheusrule.yaml"));
    for line in rule_text.lines() {
        used.extend(hairpin_names(line));
    }
    let dashboard: Json =
        serde_json::from_str(&read(&format!("{MONITORING}/dashboard.json"))).expect("dashboard");
    let panels = dashboard["panels"].as_array().expect("panels");
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            used.extend(hairpin_names(t["expr"].as_str().expect("expr")));
        }
    }
    let unknown: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "not exported by the agent: {unknown:?} (exported: {exported:?})"
    );
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_and_the_configmap_holds_it() {
    let text = read(&format!("{MONITORING}/dashboard.json"));
    let d: Json = serde_json::from_str(&text).expect("dashboard.json is JSON");
    assert_eq!(d["uid"], "hairpin-agent");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let panels = d["panels"].as_array().expect("panels");
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has its own id");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}: no query", p["title"]);
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "{}: the data source variable",
                p["title"]
            );
        }
    }
    // The chart ships the same file.
    assert_eq!(
        text,
        read("deploy/chart/hairpin/files/dashboard.json"),
        "the chart's dashboard is the component's"
    );
    let Some(objs) = kustomize_with(&[MONITORING]) else {
        return;
    };
    let cm = find(&objs, "ConfigMap", "hairpin-dashboard").expect("ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["data"]["hairpin.json"].as_str(), Some(text.as_str()));
}

/// The alerts follow the monitoring mixins' conventions: each has a `for`, a
/// severity, and a `runbook_url` whose anchor is a section of docs/runbooks.md; no
/// alert fires on a single event of a counter (`increase(...) > 0`); every alert on
/// an agent's series keeps its `node`.
#[test]
fn every_alert_has_a_runbook_section_a_for_and_no_single_event_trigger() {
    let Some(objs) = kustomize_with(&[MONITORING]) else {
        return;
    };
    let rules: Json = serde_json::to_value(
        yaml_serde::from_str::<yaml_serde::Value>(&rules_file(&objs)).expect("rules"),
    )
    .expect("json");
    let runbooks = read("docs/runbooks.md");
    let anchors: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let prefix = "https://github.com/hairpin-dev/hairpin/blob/main/docs/runbooks.md#";
    let mut seen = BTreeSet::new();
    for r in rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
    {
        let Some(alert) = r["alert"].as_str() else {
            continue;
        };
        let url = r["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{alert}: no runbook_url"));
        let anchor = url
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{alert}: {url} is not in docs/runbooks.md"));
        assert!(
            anchors.contains(anchor),
            "{alert}: docs/runbooks.md has no section #{anchor}"
        );
        assert_eq!(anchor, alert.to_lowercase(), "{alert}: its own section");
        assert!(r["for"].is_string(), "{alert}: no `for`");
        assert!(r["labels"]["severity"].is_string(), "{alert}: no severity");
        let expr = r["expr"]
            .as_str()
            .expect("expr")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            !(expr.contains("increase(") && expr.ends_with("> 0")),
            "{alert}: fires on a single event: {expr}"
        );
        let about_an_agent = expr.contains("hairpin_") || expr.contains("up{job=\"hairpin");
        let keeps_node = !expr.contains(" by (") || expr.contains("node");
        assert!(
            !about_an_agent || keeps_node,
            "{alert}: drops the node label: {expr}"
        );
        seen.insert(anchor.to_string());
    }
    assert_eq!(
        seen, anchors,
        "every section of docs/runbooks.md is an alert's"
    );
}

/// The writer is scraped (job hairpin-coredns, with its node) and the dashboard
/// filters every panel by cluster and node.
#[test]
fn the_writer_is_scraped_and_the_dashboard_has_cluster_and_node_variables() {
    let Some(objs) = kustomize_with(&[MONITORING, "deploy/components/coredns"]) else {
        return;
    };
    let pm = find(&objs, "PodMonitor", "hairpin-coredns").expect("the writer's PodMonitor");
    let writer = find(&objs, "Deployment", "hairpin-coredns").expect("the writer");
    let labels = &writer["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("labels")
    {
        assert_eq!(
            &labels[k], v,
            "the writer's PodMonitor selects the writer's pods ({k})"
        );
    }
    let port = pm["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .expect("port");
    let ports = writer["spec"]["template"]["spec"]["containers"][0]["ports"].to_string();
    assert!(ports.contains(&format!("\"name\":\"{port}\"")), "{ports}");
    let relabel = pm["spec"]["podMetricsEndpoints"][0]["relabelings"].to_string();
    assert!(
        relabel.contains("hairpin-coredns") && relabel.contains("__meta_kubernetes_pod_node_name")
    );
    let agents = find(&objs, "PodMonitor", "hairpin").expect("agents' PodMonitor");
    assert!(
        agents["spec"]["podMetricsEndpoints"][0]["relabelings"]
            .to_string()
            .contains("\"targetLabel\":\"node\"")
    );

    let dash: Json =
        serde_json::from_str(&read(&format!("{MONITORING}/dashboard.json"))).expect("json");
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "cluster", "namespace", "node", "pod"]);
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().expect("expr");
            assert!(
                e.contains("cluster=~\"$cluster\"") && e.contains("node=~\"$node\""),
                "{e}"
            );
        }
    }
}
