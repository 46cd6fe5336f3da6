//! The kernel-path components: `components/kernel-path` turns the kernel path on and
//! changes nothing else, `components/kernel-path-perfmon` adds CAP_PERFMON and nothing
//! else, the agent's own options read the result as meant, and the chart's
//! `kernelPath` values render the same objects.

use hairpin_agent::model::KernelPathMode;
use serde_json::{Value as Json, json};

use super::{
    chart::{comparable, render_chart},
    flags::run_args,
    render::{agent, env_of, kustomize, kustomize_with, parse_all},
};

const KERNEL_PATH: &str = "deploy/components/kernel-path";
const PERFMON: &str = "deploy/components/kernel-path-perfmon";

fn caps(objs: &[Json]) -> Json {
    let ds = objs
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
        .clone()
}

/// `objs` with the agent's HAIRPIN_KERNEL_PATH entry and CAP_PERFMON taken out.
fn without_kernel_path(mut objs: Vec<Json>) -> Vec<Json> {
    for o in &mut objs {
        if o["kind"] != "DaemonSet" {
            continue;
        }
        let c = &mut o["spec"]["template"]["spec"]["containers"][0];
        if let Some(env) = c["env"].as_array_mut() {
            env.retain(|e| e["name"] != "HAIRPIN_KERNEL_PATH");
        }
        if let Some(add) = c["securityContext"]["capabilities"]["add"].as_array_mut() {
            add.retain(|a| a != "PERFMON");
        }
    }
    objs
}

#[test]
fn the_kernel_path_component_turns_it_on_and_changes_nothing_else() {
    let (Some(with), Some(base)) = (kustomize_with(&[KERNEL_PATH]), kustomize("deploy")) else {
        return;
    };
    parse_all(&with, KERNEL_PATH);
    let env = env_of(&agent(&base), "deploy");
    assert!(!env.contains_key("HAIRPIN_KERNEL_PATH"), "{env:?}");
    assert_eq!(run_args(&env, "deploy").kernel_path, KernelPathMode::Off);
    let env = env_of(&agent(&with), KERNEL_PATH);
    assert_eq!(run_args(&env, KERNEL_PATH).kernel_path, KernelPathMode::On);
    assert_eq!(caps(&with), caps(&base));
    assert!(
        !caps(&with)
            .as_array()
            .expect("caps")
            .contains(&json!("PERFMON"))
    );
    assert_eq!(comparable(without_kernel_path(with)), comparable(base));
}

#[test]
fn the_perfmon_component_adds_cap_perfmon_and_nothing_else() {
    let (Some(with), Some(base)) = (kustomize_with(&[KERNEL_PATH, PERFMON]), kustomize("deploy"))
    else {
        return;
    };
    parse_all(&with, PERFMON);
    let mut expected = caps(&base).as_array().expect("caps").clone();
    expected.push(json!("PERFMON"));
    assert_eq!(caps(&with), Json::Array(expected));
    let env = env_of(&agent(&with), PERFMON);
    assert_eq!(run_args(&env, PERFMON).kernel_path, KernelPathMode::On);
    assert_eq!(comparable(without_kernel_path(with)), comparable(base));
}

#[test]
fn the_charts_kernel_path_values_render_what_the_components_render() {
    // The string "on", as values.yaml quotes it (a bare on is true in YAML 1.1).
    let on = yaml_serde::Value::String("on".into());
    let t = yaml_serde::Value::Bool(true);
    let chart = render_chart(&[("kernelPath.mode", on.clone())]);
    parse_all(&chart, "chart");
    let both = render_chart(&[("kernelPath.mode", on), ("kernelPath.perfmon", t)]);
    parse_all(&both, "chart");
    let (Some(kp), Some(kpp)) = (
        kustomize_with(&[KERNEL_PATH]),
        kustomize_with(&[KERNEL_PATH, PERFMON]),
    ) else {
        return;
    };
    assert_eq!(comparable(chart), comparable(kp));
    assert_eq!(comparable(both), comparable(kpp));
}
