//! The container as `deploy/base/daemonset.yaml` writes it: command, args, env
//! (downward API fields filled from the simulated node), volumes and security context.

use std::{collections::BTreeMap, fs};

use serde_json::Value;

/// One variable of the container's env, as written.
#[derive(Clone, Debug, PartialEq)]
pub enum EnvSource {
    /// `value:`.
    Value(String),
    /// `valueFrom.fieldRef.fieldPath`.
    Field(String),
}

/// A volume mount with the hostPath volume behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMount {
    /// The volume's name.
    pub name: String,
    /// Where the container sees it.
    pub mount_path: String,
    /// `readOnly`.
    pub read_only: bool,
    /// `hostPath.path`.
    pub host_path: String,
    /// `hostPath.type` (`Directory`, `File`, `DirectoryOrCreate`, ...).
    pub host_type: String,
}

/// The agent container of the DaemonSet, as written.
#[derive(Clone, Debug)]
pub struct Container {
    /// `command` then `args`.
    pub argv: Vec<String>,
    /// `env`, in order.
    pub env: Vec<(String, EnvSource)>,
    /// `volumeMounts` joined with their hostPath volumes.
    pub mounts: Vec<HostMount>,
    /// `securityContext.readOnlyRootFilesystem`.
    pub read_only_root: bool,
    /// `securityContext.runAsUser` (the image's user 0 when absent).
    pub uid: u32,
    /// `securityContext.runAsGroup`.
    pub gid: u32,
    /// The pod's `securityContext.supplementalGroups`.
    pub groups: Vec<u32>,
    /// `!allowPrivilegeEscalation`.
    pub no_new_privs: bool,
    /// `capabilities.add`, as `CAP_` names.
    pub caps: Vec<String>,
    /// `capabilities.drop` contains `ALL`.
    pub drop_all: bool,
    /// `seccompProfile.type`.
    pub seccomp: String,
    /// `privileged`.
    pub privileged: bool,
}

/// The first container of the DaemonSet in `path` (relative to the workspace).
pub fn daemonset_container(path: &str) -> Container {
    let text = fs::read_to_string(crate::repo::workspace().join(path)).expect("read the DaemonSet");
    let yaml: yaml_serde::Value = yaml_serde::from_str(&text).expect("DaemonSet YAML");
    let ds = serde_json::to_value(yaml).expect("YAML as JSON");
    assert_eq!(ds["kind"], "DaemonSet", "{path}");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        spec["hostNetwork"], true,
        "the agent runs in the host network"
    );
    let c = &spec["containers"][0];
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().expect("string").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut argv = strs(&c["command"]);
    argv.extend(strs(&c["args"]));
    let env = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_string();
            let src = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some(f) => EnvSource::Field(f.to_string()),
                None => EnvSource::Value(match &e["value"] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                }),
            };
            (name, src)
        })
        .collect();
    let volumes: BTreeMap<&str, &Value> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| (v["name"].as_str().expect("volume name"), v))
        .collect();
    let mounts = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let name = m["name"].as_str().expect("mount name");
            let vol = volumes
                .get(name)
                .unwrap_or_else(|| panic!("no volume {name}"));
            HostMount {
                name: name.to_string(),
                mount_path: m["mountPath"].as_str().expect("mountPath").to_string(),
                read_only: m["readOnly"].as_bool().unwrap_or(false),
                host_path: vol["hostPath"]["path"]
                    .as_str()
                    .unwrap_or_else(|| panic!("volume {name} is not a hostPath"))
                    .to_string(),
                host_type: vol["hostPath"]["type"].as_str().unwrap_or("").to_string(),
            }
        })
        .collect();
    let sc = &c["securityContext"];
    let caps = strs(&sc["capabilities"]["add"])
        .into_iter()
        .map(|c| format!("CAP_{}", c.trim_start_matches("CAP_")))
        .collect();
    Container {
        argv,
        env,
        mounts,
        read_only_root: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        uid: sc["runAsUser"].as_u64().unwrap_or(0) as u32,
        gid: sc["runAsGroup"].as_u64().unwrap_or(0) as u32,
        groups: spec["securityContext"]["supplementalGroups"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|g| g.as_u64().expect("a group id") as u32)
                    .collect()
            })
            .unwrap_or_default(),
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
        caps,
        drop_all: strs(&sc["capabilities"]["drop"]).iter().any(|d| d == "ALL"),
        seccomp: sc["seccompProfile"]["type"]
            .as_str()
            .unwrap_or("Unconfined")
            .to_string(),
        privileged: sc["privileged"].as_bool().unwrap_or(false),
    }
}

/// What the kubelet fills downward API fields from.
pub struct Downward {
    /// `spec.nodeName`.
    pub node_name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub pod_name: String,
    /// `status.hostIPs` (and `status.podIPs` of a hostNetwork pod).
    pub host_ips: Vec<String>,
}

impl Container {
    /// The env as the kubelet resolves it: `NAME=value` lines.
    pub fn resolved_env(&self, d: &Downward) -> Vec<(String, String)> {
        self.env
            .iter()
            .map(|(name, src)| {
                let value = match src {
                    EnvSource::Value(v) => v.clone(),
                    EnvSource::Field(f) => match f.as_str() {
                        "spec.nodeName" => d.node_name.clone(),
                        "metadata.namespace" => d.namespace.clone(),
                        "metadata.name" => d.pod_name.clone(),
                        "status.hostIP" | "status.podIP" => d.host_ips[0].clone(),
                        "status.hostIPs" | "status.podIPs" => d.host_ips.join(","),
                        other => panic!("downward API field {other} is not simulated"),
                    },
                };
                (name.clone(), value)
            })
            .collect()
    }
}
