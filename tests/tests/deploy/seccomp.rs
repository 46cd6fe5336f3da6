//! The seccomp variants (docs/seccomp.md): `components/seccomp-localhost` sets the
//! Localhost profile and nothing else, the chart's `seccompProfile` value renders the
//! same, and the shipped profile is containerd's current default resolved for the
//! DaemonSet's capabilities, with `bpf` and nothing that needs CAP_SYS_ADMIN.

use std::{collections::BTreeSet, path::Path};

use hairpin_tests::{
    pod::{Resolved, daemonset_container, resolve_profile},
    repo::workspace,
};
use serde_json::{Value as Json, json};

use super::{
    chart::{comparable, render_chart},
    render::{kustomize, kustomize_with, parse_all, read},
};

const COMPONENT: &str = "deploy/components/seccomp-localhost";

/// `kubectl kustomize` of deploy/ with the component.
fn with_component() -> Option<Vec<Json>> {
    kustomize_with(&[COMPONENT])
}

fn seccomp_of(objs: &[Json]) -> Json {
    let ds = objs
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["seccompProfile"].clone()
}

const LOCALHOST: &str = r#"{"type": "Localhost", "localhostProfile": "hairpin/bpf.json"}"#;

#[test]
fn the_component_sets_the_localhost_profile_and_nothing_else() {
    let (Some(mut with), Some(base)) = (with_component(), kustomize("deploy")) else {
        return;
    };
    parse_all(&with, COMPONENT);
    assert_eq!(seccomp_of(&base), json!({"type": "RuntimeDefault"}));
    assert_eq!(
        seccomp_of(&with),
        serde_json::from_str::<Json>(LOCALHOST).expect("json")
    );
    for o in &mut with {
        if o["kind"] == "DaemonSet" {
            o["spec"]["template"]["spec"]["containers"][0]["securityContext"]["seccompProfile"] =
                json!({"type": "RuntimeDefault"});
        }
    }
    assert_eq!(comparable(with), comparable(base));
}

#[test]
fn the_charts_seccomp_value_renders_what_the_component_renders() {
    assert_eq!(
        seccomp_of(&render_chart(&[])),
        json!({"type": "RuntimeDefault"})
    );
    let localhost = yaml_serde::from_str(LOCALHOST).expect("yaml");
    let chart = render_chart(&[("seccompProfile", localhost)]);
    parse_all(&chart, "chart");
    let unconfined = yaml_serde::from_str(r#"{"type": "Unconfined"}"#).expect("yaml");
    assert_eq!(
        seccomp_of(&render_chart(&[("seccompProfile", unconfined)])),
        json!({"type": "Unconfined"})
    );
    let Some(kustomized) = with_component() else {
        return;
    };
    assert_eq!(comparable(chart), comparable(kustomized));
}

fn profile(rel: &str) -> Json {
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn pod_caps() -> Vec<String> {
    daemonset_container("deploy/base/daemonset.yaml").caps
}

fn resolved(rel: &str, arch: &str) -> Resolved {
    resolve_profile(&profile(rel), &pod_caps(), arch, (6, 1))
}

#[test]
fn the_shipped_profile_is_containerds_current_default_for_the_pods_capabilities() {
    let shipped = profile(&format!("{COMPONENT}/bpf.json"));
    // The OCI form runtimes read for Localhost profiles: no conditions left to resolve.
    assert_eq!(shipped["defaultAction"], "SCMP_ACT_ERRNO");
    for r in shipped["syscalls"].as_array().expect("syscalls") {
        assert!(r["includes"].is_null() && r["excludes"].is_null(), "{r}");
    }
    let arches: BTreeSet<&str> = shipped["architectures"]
        .as_array()
        .expect("architectures")
        .iter()
        .map(|a| a.as_str().expect("arch"))
        .collect();
    assert!(arches.contains("SCMP_ARCH_X86_64") && arches.contains("SCMP_ARCH_AARCH64"));
    let ours = resolve_profile(&shipped, &[], "amd64", (6, 1));
    let theirs: Vec<Resolved> = ["amd64", "arm64"]
        .iter()
        .map(|a| resolved("tests/fixtures/seccomp/containerd-v2.3.4.json", a))
        .collect();
    let union: BTreeSet<String> = theirs.iter().flat_map(Resolved::allowed).collect();
    assert_eq!(ours.allowed(), union);
    // The conditional rules (socket families, personality, clone flags, clone3's
    // ENOSYS) are containerd's as they are.
    let conditional = |r: &Resolved| {
        r.rules
            .iter()
            .filter(|r| !r.args.is_empty() || r.errno.is_some())
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(conditional(&ours), conditional(&theirs[0]));
    let allowed = ours.allowed();
    assert!(allowed.contains("bpf"));
    for admin_only in ["mount", "umount2", "unshare", "setns", "perf_event_open"] {
        assert!(!allowed.contains(admin_only), "{admin_only} is allowed");
    }
}

#[test]
fn containerd_1_6_9_added_exactly_bpf_for_cap_bpf() {
    let old = resolved("tests/fixtures/seccomp/containerd-v1.6.8.json", "amd64").allowed();
    let new = resolved("tests/fixtures/seccomp/containerd-v1.6.9.json", "amd64").allowed();
    assert!(!old.contains("bpf"));
    assert_eq!(
        new.difference(&old).collect::<Vec<_>>(),
        ["bpf"],
        "1.6.9 adds bpf for CAP_BPF (perf_event_open needs CAP_PERFMON, not added)"
    );
    assert!(old.is_subset(&new));
    // With CAP_SYS_ADMIN the old profile allowed it: the refusal is the profile's.
    let admin = resolve_profile(
        &profile("tests/fixtures/seccomp/containerd-v1.6.8.json"),
        &["CAP_SYS_ADMIN".to_string()],
        "amd64",
        (6, 1),
    );
    assert!(admin.allowed().contains("bpf"));
    assert!(Path::new(&workspace().join("docs/seccomp.md")).exists());
}
