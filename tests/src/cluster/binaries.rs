//! Where the real components' binaries are: the variables `cargo xtask test` sets
//! (`cargo xtask k8s` builds them), else the newest build in the cache.

use std::path::PathBuf;

use crate::helm::cache_dir;

/// The binaries a [`super::Cluster`] runs, and their versions.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// kube-apiserver.
    pub apiserver: PathBuf,
    /// kube-controller-manager.
    pub controller_manager: PathBuf,
    /// kube-proxy.
    pub proxy: PathBuf,
    /// etcd.
    pub etcd: PathBuf,
    /// CoreDNS.
    pub coredns: PathBuf,
    /// The directory of the Gateway API's standard CRDs (one YAML file a kind).
    pub gateway_api_crds: PathBuf,
    /// What `kube-apiserver --version` prints after "Kubernetes ".
    pub k8s_version: String,
    /// What `etcd --version` prints after "etcd Version: ".
    pub etcd_version: String,
}

/// The Kubernetes release `cargo xtask k8s` builds unless `HAIRPIN_K8S_VERSION`
/// names another (xtask/src/k8s.rs).
pub const DEFAULT_K8S_VERSION: &str = "v1.37.2";

/// (variable, cache entry prefix, file name); `{k8s}` is the Kubernetes release.
const WANTED: [(&str, &str, &str); 6] = [
    (
        "HAIRPIN_KUBE_APISERVER_BIN",
        "kubernetes-{k8s}-",
        "kube-apiserver",
    ),
    (
        "HAIRPIN_KUBE_CONTROLLER_MANAGER_BIN",
        "kubernetes-{k8s}-",
        "kube-controller-manager",
    ),
    ("HAIRPIN_KUBE_PROXY_BIN", "kubernetes-{k8s}-", "kube-proxy"),
    ("HAIRPIN_ETCD_BIN", "etcd-", "etcd"),
    ("HAIRPIN_COREDNS_BIN", "coredns-", "coredns"),
    (
        "HAIRPIN_GATEWAY_API_CRDS",
        "gateway-api-",
        "gateway.networking.k8s.io_httproutes.yaml",
    ),
];

/// `HAIRPIN_K8S_VERSION` as `vX.Y.Z`, else the default.
fn k8s_version() -> String {
    match std::env::var("HAIRPIN_K8S_VERSION") {
        Ok(v) if v.starts_with('v') => v,
        Ok(v) if !v.is_empty() => format!("v{v}"),
        _ => DEFAULT_K8S_VERSION.to_string(),
    }
}

impl Binaries {
    /// Every binary, or `None` when one is missing and this is not CI (the suite
    /// then skips, saying how to build them). Under `CI=true` a missing binary
    /// fails: the suite never passes by skipping there.
    pub fn find() -> Option<Binaries> {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        let k8s = k8s_version();
        for (var, prefix, name) in WANTED {
            match locate(var, &prefix.replace("{k8s}", &k8s), name) {
                Some(p) => found.push(p),
                None => missing.push(format!("{name} (${var})")),
            }
        }
        if !missing.is_empty() {
            let msg = format!(
                "the real Kubernetes components are not built: missing {}; run `cargo xtask k8s` \
                 (or `cargo xtask test`, which builds them)",
                missing.join(", ")
            );
            assert!(std::env::var_os("CI").is_none(), "{msg}");
            eprintln!("skipped: {msg}");
            return None;
        }
        let [
            apiserver,
            controller_manager,
            proxy,
            etcd,
            coredns,
            httproutes,
        ]: [PathBuf; 6] = found.try_into().expect("six components");
        let gateway_api_crds = httproutes
            .parent()
            .expect("the CRD file is in a directory")
            .to_path_buf();
        let k8s_version = version_of(&apiserver, "--version", "Kubernetes ");
        let etcd_version = version_of(&etcd, "--version", "etcd Version: ");
        Some(Binaries {
            apiserver,
            controller_manager,
            proxy,
            etcd,
            coredns,
            gateway_api_crds,
            k8s_version,
            etcd_version,
        })
    }
}

/// `$var`, else `<cache>/k8s/<prefix>*/<name>` (the newest entry: a changed pin
/// makes a new one).
fn locate(var: &str, prefix: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        // A binary, or a directory holding `name` (the CRDs).
        let p = PathBuf::from(p);
        let p = if p.is_dir() { p.join(name) } else { p };
        return p.exists().then_some(p);
    }
    let dir = cache_dir().join("k8s");
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path().join(name))
        .filter(|p| p.exists())
        .filter_map(|p| Some((p.symlink_metadata().ok()?.modified().ok()?, p)))
        .collect();
    entries.sort();
    entries.pop().map(|(_, p)| p)
}

/// The first line of `bin FLAG`'s output after `marker`, trimmed.
fn version_of(bin: &std::path::Path, flag: &str, marker: &str) -> String {
    let out = std::process::Command::new(bin)
        .arg(flag)
        .output()
        .unwrap_or_else(|e| panic!("run {} {flag}: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(marker))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("{} {flag} printed no {marker:?}: {text}", bin.display()))
}
