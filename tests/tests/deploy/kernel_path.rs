//! The kernel-path components: `components/kernel-path` turns the kernel path on and
//! mounts the host's bpf filesystem (for the pinned sockets map) and changes nothing
//! else, `components/kernel-path-perfmon` adds CAP_PERFMON and nothing else, the
//! agent's own options read the result as meant, the chart's `kernelPath` values
//! render the same objects, and without the kernel path nothing mounts /sys/fs/bpf.

use std::path::Path;

use hairpin_agent::model::KernelPathMode;
use serde_json::{Value as Json, json};

use super::{
    VARIANTS,
    chart::{comparable, render_chart},
    flags::run_args,
    render::{agent, daemonset, env_of, host_path, kustomize, kustomize_with, parse_all, pod_spec},
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

/// hairpin's own directory of the host's bpf filesystem, mounted from and at the same
/// path: the agent's default `--bpf-pin-dir`. Only it: not other tools' pins.
const BPFFS: &str = "/sys/fs/bpf/hairpin";

/// The agent's mount of the host's bpf filesystem, exactly as the component writes it
/// (writable: the agent pins and unpins there; no mountPropagation: the bind is the
/// host's bpffs instance itself).
fn bpffs_mount() -> Json {
    json!({"name": "bpffs", "mountPath": BPFFS})
}

/// The hostPath volume behind [`bpffs_mount`].
fn bpffs_volume() -> Json {
    json!({"name": "bpffs", "hostPath": {"path": BPFFS, "type": "DirectoryOrCreate"}})
}

/// `objs` with the agent's HAIRPIN_KERNEL_PATH entry, CAP_PERFMON, and the bpffs
/// mount and volume (only as [`bpffs_mount`] and [`bpffs_volume`] write them) taken out.
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
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            mounts.retain(|m| *m != bpffs_mount());
        }
        let pod = &mut o["spec"]["template"]["spec"];
        if let Some(volumes) = pod["volumes"].as_array_mut() {
            volumes.retain(|v| *v != bpffs_volume());
        }
    }
    objs
}

/// How many of the agent's mounts are at or under /sys/fs/bpf and how many volumes
/// are the host's /sys/fs/bpf or a directory of it.
fn bpffs_count(objs: &[Json]) -> (usize, usize) {
    let pod = pod_spec(&daemonset(objs, "hairpin"));
    let mounts = agent(objs)
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| Path::new(&m.mount_path).starts_with("/sys/fs/bpf"))
        .count();
    let volumes = pod
        .volumes
        .iter()
        .flatten()
        .filter(|v| {
            v.host_path
                .as_ref()
                .is_some_and(|h| Path::new(&h.path).starts_with("/sys/fs/bpf"))
        })
        .count();
    (mounts, volumes)
}

#[test]
fn the_kernel_path_component_turns_it_on_mounts_bpffs_and_changes_nothing_else() {
    let (Some(with), Some(base)) = (kustomize_with(&[KERNEL_PATH]), kustomize("deploy")) else {
        return;
    };
    parse_all(&with, KERNEL_PATH);
    let env = env_of(&agent(&base), "deploy");
    assert!(!env.contains_key("HAIRPIN_KERNEL_PATH"), "{env:?}");
    assert_eq!(run_args(&env, "deploy").kernel_path, KernelPathMode::Off);
    let env = env_of(&agent(&with), KERNEL_PATH);
    let run = run_args(&env, KERNEL_PATH);
    assert_eq!(run.kernel_path, KernelPathMode::On);
    assert_eq!(caps(&with), caps(&base));
    assert!(
        !caps(&with)
            .as_array()
            .expect("caps")
            .contains(&json!("PERFMON"))
    );
    // The host's bpffs, writable, at the same path: once, as written; the agent's
    // --bpf-pin-dir (its default: the component does not set it) lies on it.
    assert!(!env.contains_key("HAIRPIN_BPF_PIN_DIR"), "{env:?}");
    assert!(
        run.bpf_pin_dir == Path::new(BPFFS),
        "--bpf-pin-dir {} is not the mounted {BPFFS}",
        run.bpf_pin_dir.display()
    );
    let pod = pod_spec(&daemonset(&with, "hairpin"));
    assert_eq!(
        host_path(&pod, &agent(&with), Path::new(BPFFS), KERNEL_PATH),
        (BPFFS.into(), "DirectoryOrCreate".into(), false)
    );
    assert_eq!(bpffs_count(&with), (1, 1));
    assert_eq!(bpffs_count(&base), (0, 0));
    // Stripped of exactly that mount and volume (and the env entry), the rest is the
    // base: nothing else added, and the mount carries no other field.
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

#[test]
fn without_the_kernel_path_nothing_mounts_the_bpf_filesystem() {
    // The chart's defaults and every variant's values: kernelPath.mode "off".
    for v in VARIANTS {
        let set: Vec<(&str, yaml_serde::Value)> = v
            .chart
            .iter()
            .map(|(k, val)| (*k, yaml_serde::from_str(val).expect("a YAML value")))
            .collect();
        let chart = render_chart(&set);
        assert_eq!(bpffs_count(&chart), (0, 0), "chart with {set:?}");
    }
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let env = env_of(&agent(&objs), v.dir);
        assert_eq!(run_args(&env, v.dir).kernel_path, KernelPathMode::Off);
        assert_eq!(bpffs_count(&objs), (0, 0), "{}", v.dir);
    }
}
