//! The kernel path by default: every variant and the chart's defaults run the agent
//! with `--kernel-path auto` and mount hairpin's directory of the host's bpf
//! filesystem (where it pins what outlives the agent, `--bpf-pin-dir`), exactly once,
//! outside the container's /sys, and nothing else of /sys/fs/bpf; the deprecated `components/kernel-path` changes nothing;
//! `components/kernel-path-perfmon` adds CAP_PERFMON and nothing else; the chart's
//! `kernelPath` values render the same objects, and with `kernelPath.mode: off`
//! (HAIRPIN_KERNEL_PATH=off) nothing mounts /sys/fs/bpf.

use std::{collections::BTreeMap, path::Path};

use hairpin_agent::KernelPathMode;
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

/// hairpin's own directory of the host's bpf filesystem: the agent's default
/// `--bpf-pin-dir` on the host. Only it: not other tools' pins.
const BPFFS: &str = "/sys/fs/bpf/hairpin";

/// Where the DaemonSet mounts [`BPFFS`], and its `--bpf-pin-dir`: outside /sys, since
/// the runtime mounts a fresh sysfs there, in which no mount point can be made.
const BPFFS_MOUNT: &str = "/host/sys/fs/bpf/hairpin";

/// The agent's mount of the host's bpf filesystem, exactly as the DaemonSet writes it
/// (writable: the agent pins and unpins there; no mountPropagation: the bind is the
/// host's bpffs instance itself).
fn bpffs_mount() -> Json {
    json!({"name": "bpffs", "mountPath": BPFFS_MOUNT})
}

/// The hostPath volume behind [`bpffs_mount`].
fn bpffs_volume() -> Json {
    json!({"name": "bpffs", "hostPath": {"path": BPFFS, "type": "DirectoryOrCreate"}})
}

/// `objs` with the agent's HAIRPIN_KERNEL_PATH, HAIRPIN_BPF_PIN_DIR and
/// HAIRPIN_PIN_OWNER entries, CAP_PERFMON and CAP_CHOWN, the pod's supplementary
/// groups, and the bpffs mount and volume (only as [`bpffs_mount`] and
/// [`bpffs_volume`] write them) taken out.
fn without_kernel_path(mut objs: Vec<Json>) -> Vec<Json> {
    for o in &mut objs {
        if o["kind"] != "DaemonSet" {
            continue;
        }
        let c = &mut o["spec"]["template"]["spec"]["containers"][0];
        if let Some(env) = c["env"].as_array_mut() {
            env.retain(|e| {
                e["name"] != "HAIRPIN_KERNEL_PATH"
                    && e["name"] != "HAIRPIN_BPF_PIN_DIR"
                    && e["name"] != "HAIRPIN_PIN_OWNER"
            });
        }
        if let Some(add) = c["securityContext"]["capabilities"]["add"].as_array_mut() {
            add.retain(|a| a != "PERFMON" && a != "CHOWN");
        }
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            mounts.retain(|m| *m != bpffs_mount());
        }
        let pod = &mut o["spec"]["template"]["spec"];
        // The pins' owner's group: only where something is pinned.
        if let Some(sc) = pod
            .get_mut("securityContext")
            .and_then(|v| v.as_object_mut())
        {
            sc.remove("supplementalGroups");
            if sc.is_empty() {
                pod.as_object_mut().map(|p| p.remove("securityContext"));
            }
        }
        if let Some(volumes) = pod["volumes"].as_array_mut() {
            volumes.retain(|v| *v != bpffs_volume());
        }
    }
    objs
}

/// How many of the agent's mounts are at or under /sys/fs/bpf (or its /host stand-in)
/// and how many volumes are the host's /sys/fs/bpf or a directory of it.
fn bpffs_count(objs: &[Json]) -> (usize, usize) {
    let pod = pod_spec(&daemonset(objs, "hairpin"));
    let mounts = agent(objs)
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            let p = Path::new(&m.mount_path);
            p.starts_with("/sys/fs/bpf") || p.starts_with("/host/sys/fs/bpf")
        })
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

/// The chart values of `v`, parsed, plus `extra`.
fn chart_values<'a>(
    v: &'a super::Variant,
    extra: &[(&'a str, yaml_serde::Value)],
) -> Vec<(&'a str, yaml_serde::Value)> {
    v.chart
        .iter()
        .map(|(k, val)| (*k, yaml_serde::from_str(val).expect("a YAML value")))
        .chain(extra.iter().cloned())
        .collect()
}

/// The kernel path is on by `auto`, with bpffs mounted once as written, in `objs`.
fn assert_kernel_path_by_default(objs: &[Json], source: &str) {
    let env = env_of(&agent(objs), source);
    let run = run_args(&env, source);
    assert_eq!(run.kernel_path, KernelPathMode::Auto, "{source}");
    // The agent's --bpf-pin-dir is the mount of the host's directory.
    assert!(
        run.bpf_pin_dir == Path::new(BPFFS_MOUNT),
        "{source}: --bpf-pin-dir {} is not the mounted {BPFFS_MOUNT}",
        run.bpf_pin_dir.display()
    );
    let pod = pod_spec(&daemonset(objs, "hairpin"));
    assert_eq!(
        host_path(&pod, &agent(objs), Path::new(BPFFS_MOUNT), source),
        (BPFFS.into(), "DirectoryOrCreate".into(), false),
        "{source}"
    );
    // Nothing mounted inside the container's /sys: the runtime could not make the
    // mount point in its sysfs, and the pod would not start.
    assert!(
        agent(objs)
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| !Path::new(&m.mount_path).starts_with("/sys")),
        "{source}: a mount under /sys"
    );
    assert_eq!(bpffs_count(objs), (1, 1), "{source}");
    assert!(
        !caps(objs)
            .as_array()
            .expect("caps")
            .contains(&json!("PERFMON")),
        "{source}: no CAP_PERFMON by default"
    );
}

#[test]
fn the_binary_defaults_to_auto_and_off_still_turns_the_kernel_path_off() {
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        run_args(&env(&[]), "no env").kernel_path,
        KernelPathMode::Auto
    );
    for (value, mode) in [
        ("auto", KernelPathMode::Auto),
        ("on", KernelPathMode::On),
        ("off", KernelPathMode::Off),
    ] {
        let run = run_args(&env(&[("HAIRPIN_KERNEL_PATH", value)]), value);
        assert_eq!(run.kernel_path, mode);
        assert_eq!(run.kernel_path.loads(), mode != KernelPathMode::Off);
    }
}

#[test]
fn every_variant_and_the_chart_run_the_kernel_path_by_auto_with_bpffs_mounted() {
    for v in VARIANTS {
        let chart = render_chart(&chart_values(&v, &[]));
        assert_kernel_path_by_default(&chart, &format!("chart for {}", v.dir));
    }
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        assert_kernel_path_by_default(&objs, v.dir);
    }
}

#[test]
fn the_deprecated_kernel_path_component_changes_nothing() {
    let (Some(with), Some(base)) = (kustomize_with(&[KERNEL_PATH]), kustomize("deploy")) else {
        return;
    };
    parse_all(&with, KERNEL_PATH);
    assert_eq!(comparable(with), comparable(base));
}

#[test]
fn the_perfmon_component_adds_cap_perfmon_and_nothing_else() {
    let (Some(with), Some(base)) = (kustomize_with(&[PERFMON]), kustomize("deploy")) else {
        return;
    };
    parse_all(&with, PERFMON);
    let mut expected = caps(&base).as_array().expect("caps").clone();
    expected.push(json!("PERFMON"));
    assert_eq!(caps(&with), Json::Array(expected));
    let env = env_of(&agent(&with), PERFMON);
    assert_eq!(run_args(&env, PERFMON).kernel_path, KernelPathMode::Auto);
    assert_eq!(bpffs_count(&with), (1, 1));
    assert_eq!(
        comparable(without_kernel_path(with)),
        comparable(without_kernel_path(base))
    );
    // With the deprecated component listed too, as an overlay of the last release does.
    let Some(both) = kustomize_with(&[KERNEL_PATH, PERFMON]) else {
        return;
    };
    let Some(perfmon) = kustomize_with(&[PERFMON]) else {
        return;
    };
    assert_eq!(comparable(both), comparable(perfmon));
}

#[test]
fn the_charts_kernel_path_values_render_what_kustomize_renders() {
    let t = yaml_serde::Value::Bool(true);
    let perfmon = render_chart(&[("kernelPath.perfmon", t)]);
    parse_all(&perfmon, "chart");
    let Some(kpp) = kustomize_with(&[PERFMON]) else {
        return;
    };
    assert_eq!(comparable(perfmon), comparable(kpp));
    // "on" (quoted in values.yaml: a bare on is true in YAML 1.1) renders the
    // default objects with only the env's value changed.
    let on = render_chart(&[("kernelPath.mode", yaml_serde::Value::String("on".into()))]);
    parse_all(&on, "chart");
    let env = env_of(&agent(&on), "chart on");
    assert_eq!(run_args(&env, "chart on").kernel_path, KernelPathMode::On);
    assert_eq!(bpffs_count(&on), (1, 1));
    let default = render_chart(&[]);
    assert_eq!(
        comparable(without_kernel_path(on)),
        comparable(without_kernel_path(default))
    );
}

#[test]
fn with_the_kernel_path_off_nothing_mounts_the_bpf_filesystem() {
    let off = yaml_serde::Value::String("off".into());
    for v in VARIANTS {
        let set = chart_values(&v, &[("kernelPath.mode", off.clone())]);
        let chart = render_chart(&set);
        parse_all(&chart, "chart");
        let env = env_of(&agent(&chart), v.dir);
        assert_eq!(
            run_args(&env, v.dir).kernel_path,
            KernelPathMode::Off,
            "chart with {set:?}"
        );
        assert_eq!(bpffs_count(&chart), (0, 0), "chart with {set:?}");
        // Nothing else changes: the same objects as the variant's defaults, less
        // the env entry and the mount.
        let default = render_chart(&chart_values(&v, &[]));
        assert_eq!(
            comparable(without_kernel_path(chart)),
            comparable(without_kernel_path(default)),
            "chart with {set:?}"
        );
    }
}
