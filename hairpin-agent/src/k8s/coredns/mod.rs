//! The CoreDNS writer's edge: reads and writes the ConfigMaps that
//! [`crate::names::corefile`] renders text for. Corefile mode edits the `Corefile`
//! key of the main ConfigMap (`kube-system/coredns`, RKE2 `rke2-coredns-rke2-coredns`);
//! import mode owns the `hairpin.override` key of `coredns-custom`.
//!
//! Every update carries the resourceVersion read with the object, so a concurrent
//! edit (kubectl, a distribution's reconciler) makes ours fail with 409 instead of
//! overwriting it; the caller re-reads next round. Nothing is written when the
//! text would not change. The loop that calls this, as Lease holder, is in
//! [`task`]; which rewrites the running CoreDNS can take (its version, read from
//! its Deployment) is in [`version`].

pub(crate) mod task;
pub(crate) mod version;

use std::{collections::BTreeMap, fmt, str::FromStr};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    core::v1::ConfigMap,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

use crate::names::{
    corefile::{self as text, CorefileError, IMPORT_KEY, Rewrite},
    hostname::Hostname,
    routes::NameRoute,
};

/// The Corefile's key in the main ConfigMap.
pub(crate) const COREFILE_KEY: &str = "Corefile";

/// `--coredns`: whether and how CoreDNS is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CorednsMode {
    /// Not written.
    Off,
    /// Rewrites in the main ConfigMap's Corefile, each line marked.
    Corefile,
    /// The `hairpin.override` key of `coredns-custom` (k3s, RKE2, AKS import it).
    Import,
}

impl fmt::Display for CorednsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CorednsMode::Off => "off",
            CorednsMode::Corefile => "corefile",
            CorednsMode::Import => "import",
        })
    }
}

/// Which CoreDNS writing `cleanup` and `uninstall` undo, and in which ConfigMaps.
#[derive(clap::Args, Clone, Debug)]
pub struct CorednsUndo {
    /// Which CoreDNS writing to undo: `corefile` removes the marked lines, `import`
    /// our key of coredns-custom; `off` touches neither.
    #[arg(long = "coredns", env = "HAIRPIN_COREDNS", value_enum, default_value_t = CorednsMode::Off)]
    pub mode: CorednsMode,

    /// Which ConfigMaps the CoreDNS writing concerns.
    #[command(flatten)]
    pub objects: CorednsObjects,
}

/// What the cluster-scope steps of `cleanup` and `uninstall` need: the API and
/// the CoreDNS writing to undo.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterCleanup {
    /// kubeconfig; default in-cluster, then $KUBECONFIG. No API: those steps are
    /// skipped.
    #[arg(long, env = "HAIRPIN_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Which CoreDNS writing to undo, in which ConfigMaps.
    #[command(flatten)]
    pub coredns: CorednsUndo,
}

impl CorednsUndo {
    /// What to remove; `None` with `--coredns off`.
    pub(crate) fn config(&self) -> Option<CorednsConfig> {
        (self.mode != CorednsMode::Off).then(|| CorednsConfig {
            mode: self.mode,
            configmap: self.objects.configmap.clone(),
            custom: self.objects.custom_configmap.clone(),
            // Removing renders no rewrite: any exact name does.
            target: Hostname::parse("hairpin.invalid").expect("a valid exact name"),
        })
    }
}

/// The ConfigMaps the CoreDNS writer edits, shared by `run` and `cleanup` so the
/// same settings undo exactly what was written.
#[derive(clap::Args, Clone, Debug)]
pub struct CorednsObjects {
    /// The CoreDNS ConfigMap holding the Corefile (RKE2: kube-system/rke2-coredns-rke2-coredns).
    #[arg(
        long = "coredns-configmap",
        env = "HAIRPIN_COREDNS_CONFIGMAP",
        default_value = "kube-system/coredns"
    )]
    pub configmap: ObjectName,

    /// The ConfigMap CoreDNS imports custom server-block lines from (k3s, RKE2, AKS).
    #[arg(
        long = "coredns-custom-configmap",
        env = "HAIRPIN_COREDNS_CUSTOM_CONFIGMAP",
        default_value = "kube-system/coredns-custom"
    )]
    pub custom_configmap: ObjectName,
}

/// A namespaced object's `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectName {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl FromStr for ObjectName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ObjectName {
                    namespace: ns.into(),
                    name: name.into(),
                })
            }
            _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
        }
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the writer writes, validated once.
#[derive(Clone, Debug)]
pub struct CorednsConfig {
    /// Corefile or import (never `Off` here: off means no writer).
    pub mode: CorednsMode,
    /// The main ConfigMap (Corefile mode).
    pub configmap: ObjectName,
    /// The `coredns-custom` ConfigMap (import mode).
    pub custom: ObjectName,
    /// The hairpin ClusterIP Service's FQDN the names are rewritten to.
    pub target: Hostname,
}

impl CorednsConfig {
    /// The ConfigMap this mode writes.
    pub(crate) fn written(&self) -> &ObjectName {
        match self.mode {
            CorednsMode::Import => &self.custom,
            CorednsMode::Corefile | CorednsMode::Off => &self.configmap,
        }
    }
}

/// Errors writing CoreDNS's ConfigMaps.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CorednsError {
    /// The main ConfigMap does not exist.
    #[error(
        "configmap {0}: not found (pass --coredns-configmap NAMESPACE/NAME; RKE2: kube-system/rke2-coredns-rke2-coredns)"
    )]
    NotFound(ObjectName),
    /// The main ConfigMap has no `Corefile` key.
    #[error("configmap {0}: data.Corefile: expected a Corefile, found no such key")]
    NoCorefile(ObjectName),
    /// The Corefile has no server block to put the rewrites in.
    #[error("configmap {configmap}: data.Corefile: {source}")]
    Unrecognized {
        /// The ConfigMap.
        configmap: ObjectName,
        /// What the text edit found.
        source: CorefileError,
    },
    /// Someone else wrote between our read and our update: re-read and retry.
    #[error("configmap {0}: changed since it was read (409 Conflict); re-reading next round")]
    Conflict(ObjectName),
    /// Any other API error.
    #[error("configmap {configmap}: failed to {op}: {source}")]
    Api {
        /// `get`, `update`, `create`.
        op: &'static str,
        /// The ConfigMap.
        configmap: ObjectName,
        /// kube's error.
        source: kube::Error,
    },
}

/// What a sync did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// The text already said this.
    Unchanged,
    /// The ConfigMap was updated.
    Updated,
    /// The ConfigMap was created (import mode).
    Created,
}

/// Parses a rewrite target (`--coredns-target`): one exact DNS name, the hairpin
/// Service's FQDN.
pub(crate) fn parse_target(s: &str) -> Result<Hostname, String> {
    let h = Hostname::parse(s).map_err(|e| e.to_string())?;
    if h.is_wildcard() {
        return Err(format!(
            "expected an exact service name, got the wildcard {s:?}"
        ));
    }
    Ok(h)
}

/// One rewrite per distinct routed hostname (exact and wildcard) to `target`.
pub fn rewrites(routes: &[NameRoute], target: &Hostname) -> Vec<Rewrite> {
    let mut hosts: Vec<&Hostname> = routes.iter().map(|r| &r.host).collect();
    hosts.sort();
    hosts.dedup();
    hosts
        .into_iter()
        // The target was validated exact at startup, so `new` cannot fail here.
        .filter_map(|h| Rewrite::new(h.clone(), target.clone()).ok())
        .collect()
}

fn api(client: &Client, o: &ObjectName) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), &o.namespace)
}

fn api_err(op: &'static str, o: &ObjectName) -> impl FnOnce(kube::Error) -> CorednsError {
    let configmap = o.clone();
    move |source| match source {
        kube::Error::Api(ref s) if s.code == 409 => CorednsError::Conflict(configmap),
        source => CorednsError::Api {
            op,
            configmap,
            source,
        },
    }
}

/// The field manager of every write to CoreDNS's ConfigMaps: without one the API
/// server records the writer as "unknown", and an operator's `kubectl apply
/// --server-side` of the ConfigMap then reports a conflict with "unknown" instead
/// of naming hairpin (seen against kube-apiserver 1.37).
pub(crate) const FIELD_MANAGER: &str = "hairpin-coredns-writer";

fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Replaces `cm` (carrying the resourceVersion it was read with) with `key = value`.
async fn update_key(
    client: &Client,
    o: &ObjectName,
    mut cm: ConfigMap,
    key: &str,
    value: String,
) -> Result<Written, CorednsError> {
    cm.data
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_string(), value);
    api(client, o)
        .replace(&o.name, &write_params(), &cm)
        .await
        .map_err(api_err("update", o))?;
    Ok(Written::Updated)
}

/// Makes CoreDNS's ConfigMap say exactly `rewrites` (empty removes ours).
pub(crate) async fn sync(
    client: &Client,
    cfg: &CorednsConfig,
    rewrites: &[Rewrite],
) -> Result<Written, CorednsError> {
    match cfg.mode {
        CorednsMode::Off => Ok(Written::Unchanged),
        CorednsMode::Corefile => {
            edit_corefile(client, &cfg.configmap, |t| text::apply(t, rewrites)).await
        }
        CorednsMode::Import => {
            write_import(client, &cfg.custom, Some(text::render_import(rewrites))).await
        }
    }
}

/// Removes what hairpin wrote in `mode`: its marked Corefile lines, or its key.
/// Returns whether anything was removed.
pub(crate) async fn remove(client: &Client, cfg: &CorednsConfig) -> Result<Written, CorednsError> {
    match cfg.mode {
        CorednsMode::Off => Ok(Written::Unchanged),
        CorednsMode::Corefile => {
            edit_corefile(client, &cfg.configmap, |t| Ok(text::remove(t))).await
        }
        CorednsMode::Import => write_import(client, &cfg.custom, None).await,
    }
}

async fn edit_corefile(
    client: &Client,
    o: &ObjectName,
    edit: impl FnOnce(&str) -> Result<String, CorefileError>,
) -> Result<Written, CorednsError> {
    let cm = api(client, o)
        .get_opt(&o.name)
        .await
        .map_err(api_err("get", o))?
        .ok_or_else(|| CorednsError::NotFound(o.clone()))?;
    let current = cm
        .data
        .as_ref()
        .and_then(|d| d.get(COREFILE_KEY))
        .ok_or_else(|| CorednsError::NoCorefile(o.clone()))?;
    let new = edit(current).map_err(|source| CorednsError::Unrecognized {
        configmap: o.clone(),
        source,
    })?;
    if new == *current {
        return Ok(Written::Unchanged);
    }
    update_key(client, o, cm, COREFILE_KEY, new).await
}

/// Sets (Some) or removes (None) our key in `coredns-custom`, creating the
/// ConfigMap when it is missing and there is something to write.
async fn write_import(
    client: &Client,
    o: &ObjectName,
    value: Option<String>,
) -> Result<Written, CorednsError> {
    let current = api(client, o)
        .get_opt(&o.name)
        .await
        .map_err(api_err("get", o))?;
    let Some(mut cm) = current else {
        let Some(value) = value else {
            return Ok(Written::Unchanged);
        };
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(o.name.clone()),
                namespace: Some(o.namespace.clone()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(IMPORT_KEY.to_string(), value)])),
            ..ConfigMap::default()
        };
        api(client, o)
            .create(&write_params(), &cm)
            .await
            .map_err(api_err("create", o))?;
        return Ok(Written::Created);
    };
    let existing = cm.data.as_ref().and_then(|d| d.get(IMPORT_KEY)).cloned();
    match value {
        Some(v) if existing.as_ref() == Some(&v) => Ok(Written::Unchanged),
        Some(v) => update_key(client, o, cm, IMPORT_KEY, v).await,
        None if existing.is_none() => Ok(Written::Unchanged),
        None => {
            if let Some(d) = cm.data.as_mut() {
                d.remove(IMPORT_KEY);
            }
            api(client, o)
                .replace(&o.name, &write_params(), &cm)
                .await
                .map_err(api_err("update", o))?;
            Ok(Written::Updated)
        }
    }
}

/// What the CoreDNS Deployment with the same namespace/name as the main ConfigMap
/// (`--coredns-configmap`: kube-system/coredns, RKE2 rke2-coredns-rke2-coredns)
/// says about the CoreDNS version; API errors (RBAC) make it unknown, naming them.
/// Read every round, so an upgrade is seen within one resync.
pub(crate) async fn coredns_version(client: &Client, o: &ObjectName) -> version::Found {
    match Api::<Deployment>::namespaced(client.clone(), &o.namespace)
        .get_opt(&o.name)
        .await
    {
        Ok(d) => version::from_deployment(o, d.as_ref()),
        Err(e) => version::Found::Unknown(format!("Deployment {o}: failed to get: {e}")),
    }
}

/// A warning when node-local-dns is installed (a DaemonSet or ConfigMap
/// `kube-system/node-local-dns`), else `None`. API errors (RBAC) count as absent.
///
/// Its stock Corefile (kubernetes/kubernetes cluster/addons/dns/nodelocaldns) has a
/// `.:53` block that forwards every name outside the cluster domain to
/// `__PILLAR__UPSTREAM__SERVERS__`, the node's own resolv.conf upstreams, not to
/// CoreDNS; only the cluster domain and reverse zones go to CoreDNS (through
/// kube-dns-upstream), cached up to 30 s. It also answers on the kube-dns ClusterIP.
pub(crate) async fn node_local_dns(client: &Client) -> Option<String> {
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let cm: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let found = if matches!(ds.get_opt("node-local-dns").await, Ok(Some(_))) {
        "DaemonSet kube-system/node-local-dns"
    } else if matches!(cm.get_opt("node-local-dns").await, Ok(Some(_))) {
        "ConfigMap kube-system/node-local-dns"
    } else {
        return None;
    };
    Some(format!(
        "node-local-dns is installed ({found}): pods using it get names outside the cluster domain from \
         the node's upstream resolvers (its `.:53` block forwards to __PILLAR__UPSTREAM__SERVERS__), not \
         from CoreDNS, so CoreDNS rewrites do not reach them; forward the proxied zones to kube-dns-upstream \
         in node-local-dns's Corefile, or rely on the eBPF path (cluster-domain answers are also cached up to 30 s)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_parse_namespace_slash_name_only() {
        let o: ObjectName = "kube-system/rke2-coredns-rke2-coredns"
            .parse()
            .expect("name");
        assert_eq!(o.namespace, "kube-system");
        assert_eq!(o.to_string(), "kube-system/rke2-coredns-rke2-coredns");
        for bad in ["coredns", "/coredns", "kube-system/", "a/b/c"] {
            assert!(bad.parse::<ObjectName>().is_err(), "{bad}");
        }
    }
}
