//! Reading the manifests: `kubectl kustomize` (Debian's kubectl), YAML streams into
//! JSON values, the k8s-openapi round trip, and the agent's env as a pod gets it.

use std::{collections::BTreeMap, path::Path, process::Command};

use hairpin_tests::repo::{workspace, write_kustomization};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    batch::v1::Job,
    core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value as Json;

/// A workspace file's text.
pub(crate) fn read(rel: &str) -> String {
    let p = workspace().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("failed to read {}: {e}", p.display()))
}

/// `kubectl kustomize DIR` as JSON values, or `None` (after saying so loudly) when
/// kubectl is missing and CI is not set. On CI a missing kubectl fails the test.
pub(crate) fn kustomize(dir: &str) -> Option<Vec<Json>> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(workspace().join(dir))
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("kubectl is needed to render {dir} (CI=true): {e}");
            }
            eprintln!("SKIPPED: kubectl not found ({e}); cannot render {dir} with kustomize");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "`kubectl kustomize {dir}` failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(docs(
        &String::from_utf8(out.stdout).expect("kustomize prints UTF-8"),
    ))
}

/// `kubectl kustomize` of deploy/ with `components`, from a kustomization in a
/// scratch directory (kustomize takes only relative paths to other kustomizations).
pub(crate) fn kustomize_with(components: &[&str]) -> Option<Vec<Json>> {
    // One directory per call: tests rendering the same components run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hairpin-components-{}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        components.join("+").replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    write_kustomization(&dir, components);
    let out = kustomize(dir.to_str().expect("utf-8 path"));
    let _ = std::fs::remove_dir_all(&dir);
    out
}

pub(crate) use hairpin_tests::helm::docs;

/// The object of `kind` named `name`.
pub(crate) fn find<'a>(objs: &'a [Json], kind: &str, name: &str) -> Option<&'a Json> {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// `obj` as its k8s-openapi type.
pub(crate) fn typed<T: DeserializeOwned>(obj: &Json) -> T {
    serde_json::from_value(obj.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {} does not parse as its k8s-openapi type: {e}",
            obj["kind"], obj["metadata"]["name"]
        )
    })
}

/// Parses `obj` as `T` and back; a field the type does not know (a typo, a field at
/// the wrong level) is dropped by serde and so shows up as a difference.
fn round_trips<T: DeserializeOwned + Serialize>(obj: &Json) {
    let back = serde_json::to_value(typed::<T>(obj)).expect("serialize");
    assert_eq!(
        normalize(obj.clone()),
        normalize(back),
        "{} {}: some field is not part of the Kubernetes type (misspelt or misplaced)",
        obj["kind"],
        obj["metadata"]["name"]
    );
}

/// Drops nulls and empty maps so that the YAML and the type's serialization compare.
pub(crate) fn normalize(v: Json) -> Json {
    match v {
        Json::Object(m) => Json::Object(
            m.into_iter()
                .map(|(k, v)| (k, normalize(v)))
                .filter(|(_, v)| !v.is_null() && *v != Json::Object(Default::default()))
                .collect(),
        ),
        Json::Array(a) => Json::Array(a.into_iter().map(normalize).collect()),
        v => v,
    }
}

/// `Kind/name` of each object, in order.
pub(crate) fn kind_names(objs: &[Json]) -> Vec<String> {
    objs.iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// Every object round-trips through its type; an unexpected kind fails.
pub(crate) fn parse_all(objs: &[Json], source: &str) {
    for o in objs {
        match o["kind"].as_str().unwrap_or_default() {
            "Namespace" => round_trips::<Namespace>(o),
            "ServiceAccount" => round_trips::<ServiceAccount>(o),
            "ClusterRole" => round_trips::<ClusterRole>(o),
            "ClusterRoleBinding" => round_trips::<ClusterRoleBinding>(o),
            "Role" => round_trips::<Role>(o),
            "RoleBinding" => round_trips::<RoleBinding>(o),
            "DaemonSet" => round_trips::<DaemonSet>(o),
            "Deployment" => round_trips::<Deployment>(o),
            "Service" => round_trips::<Service>(o),
            "Job" => round_trips::<Job>(o),
            other => panic!("{source}: unexpected kind {other:?}: add it to this test"),
        }
    }
}

/// The DaemonSet `name`.
pub(crate) fn daemonset(objs: &[Json], name: &str) -> DaemonSet {
    typed(find(objs, "DaemonSet", name).unwrap_or_else(|| panic!("a DaemonSet named {name}")))
}

/// A DaemonSet's pod spec.
pub(crate) fn pod_spec(ds: &DaemonSet) -> PodSpec {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec")
}

/// The pod's one container.
pub(crate) fn only_container(pod: &PodSpec) -> Container {
    assert_eq!(pod.containers.len(), 1, "one container");
    pod.containers[0].clone()
}

/// The agent DaemonSet's container.
pub(crate) fn agent(objs: &[Json]) -> Container {
    only_container(&pod_spec(&daemonset(objs, "hairpin")))
}

/// The CoreDNS writer Deployment's container, when the variant has one.
pub(crate) fn writer(objs: &[Json]) -> Option<Container> {
    let d: Deployment = typed(find(objs, "Deployment", "hairpin-coredns")?);
    let pod = d.spec.expect("spec").template.spec.expect("pod spec");
    Some(only_container(&pod))
}

/// A container's environment as the process sees it: `value`s as written, downward
/// API fields given plausible values for a dual-stack node, in hairpin-system.
pub(crate) fn env_of(c: &Container, source: &str) -> BTreeMap<String, String> {
    env_in(c, source, "hairpin-system")
}

/// [`env_of`] for a pod in `namespace`.
pub(crate) fn env_in(c: &Container, source: &str, namespace: &str) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            let value = match (&e.value, field) {
                (Some(v), _) => v.clone(),
                (None, Some(f)) => match f.field_path.as_str() {
                    "spec.nodeName" => "node-a".into(),
                    "status.hostIPs" => "192.0.2.1,2001:db8::1".into(),
                    "status.hostIP" => "192.0.2.1".into(),
                    "metadata.namespace" => namespace.into(),
                    "metadata.name" => "hairpin-coredns-5d8f7-x2x9q".into(),
                    other => panic!("{source}: {}: add a value for fieldPath {other}", e.name),
                },
                (None, None) => panic!("{source}: {} has neither value nor fieldRef", e.name),
            };
            (e.name.clone(), value)
        })
        .collect()
}

/// The downward API field an env entry reads, if any.
pub(crate) fn field_of(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
        .map(|f| f.field_path.clone())
}

/// `(hostPath, type, readOnly)` of the volume mounted at `mount_path`.
pub(crate) fn host_path(
    pod: &PodSpec,
    c: &Container,
    mount_path: &Path,
    source: &str,
) -> (String, String, bool) {
    let mount_path = mount_path.to_str().expect("utf-8 path");
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == mount_path)
        .unwrap_or_else(|| panic!("{source}: nothing is mounted at {mount_path}"));
    let v = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == m.name)
        .unwrap_or_else(|| panic!("{source}: volume {} missing", m.name));
    let hp = v
        .host_path
        .clone()
        .unwrap_or_else(|| panic!("{source}: {} is not a hostPath", m.name));
    (
        hp.path,
        hp.type_.unwrap_or_default(),
        m.read_only.unwrap_or(false),
    )
}

/// Kubernetes quantity in MiB (`48Mi`, `256Mi`, `1Gi`): the forms the manifests use.
pub(crate) fn mebibytes(q: &str) -> f64 {
    let (n, unit) = q.split_at(q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len()));
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
    match unit {
        "Mi" => n,
        "Gi" => n * 1024.0,
        "Ki" => n / 1024.0,
        other => panic!("quantity {q:?}: unit {other:?} not handled here"),
    }
}
