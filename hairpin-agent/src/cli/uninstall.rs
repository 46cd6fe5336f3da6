//! `hairpin-agent uninstall`: the one-command removal that leaves the cluster as it
//! was, run as a Job (a Helm `pre-delete` hook, or `kubectl apply -k
//! deploy/uninstall/<variant>`) while the install's ServiceAccounts and RBAC still
//! exist:
//!
//! 1. the CoreDNS writer and the agents' DaemonSet are deleted with foreground
//!    propagation and awaited until gone: each agent reads its DaemonSet on SIGTERM,
//!    finds it being deleted and removes its node's datapath while its RBAC still
//!    answers (deleting everything in one pass took the RBAC first: the agents got
//!    403 and kept their links and pins);
//! 2. the cluster-wide objects the writer and the agents wrote are removed (the
//!    CoreDNS lines or import key, the Leases), so no rewrite points at a Service
//!    about to be deleted (which answered NXDOMAIN in every pod);
//! 3. the node cleanup DaemonSet (`hairpin-agent cleanup --scope node` in an init
//!    container, after `uninstall --step await-stopped` saw the agents gone) is
//!    awaited until ready on every node: hosts blocks, listen addresses and anything
//!    an agent that was not running left are gone;
//! 4. with `--delete-namespace` (the kustomize uninstall, which has no Helm to
//!    delete the rest): every listed cluster-scoped or kube-system object is given
//!    the namespace as its owner, and the namespace is deleted, so the garbage
//!    collector removes them once the namespace (this Job included) is gone.
//!
//! Every step is idempotent: what is already gone is reported as absent.

use std::{fmt, str::FromStr, time::Duration};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    core::v1::Namespace,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::info;

use super::{
    CliError, OutputFormat,
    cleanup::{
        self, CleanupArgs, CleanupReport, CleanupStep, Outcome, Scope, failed, report, step,
    },
    print_json, print_text,
};
use crate::k8s::coredns::{ClusterCleanup, CorednsMode, CorednsUndo, ObjectName};

/// How often a wait reads the object again.
const POLL: Duration = Duration::from_secs(2);

/// Options of `uninstall`.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Removes hairpin from the cluster in the order that leaves it as it was: \
stops the CoreDNS writer and the agents (foreground deletion, awaited: each agent removes its \
node's datapath while its RBAC still answers), removes the CoreDNS lines and the Leases, \
waits for the node cleanup DaemonSet to have cleaned every node, and with --delete-namespace \
deletes the namespace with every listed object. The chart runs it as a pre-delete hook; \
deploy/uninstall runs it as a Job. `--step await-stopped` only waits until every --stop \
workload is gone (the node cleanup pods' first step); `--step idle` waits for SIGTERM.",
    after_help = "Exit status: 0 everything was removed (or was already gone); 1 a step \
failed or did not finish within --timeout (the report names it); 2 usage.\n\nExamples:\n  \
hairpin-agent uninstall --stop daemonset/hairpin-system/hairpin --lease hairpin-system/hairpin-agent \
--nodes hairpin-system/hairpin-cleanup\n  hairpin-agent uninstall --step await-stopped --stop daemonset/hairpin-system/hairpin"
)]
pub struct UninstallArgs {
    /// `all` (the uninstall Job) or `await-stopped` (only wait until every --stop
    /// workload is gone).
    #[arg(long, env = "HAIRPIN_UNINSTALL_STEP", value_enum, default_value_t = Step::All)]
    pub step: Step,

    /// Workloads to delete (foreground) and await, `daemonset/NS/NAME` or
    /// `deployment/NS/NAME`, comma-separated.
    #[arg(long = "stop", env = "HAIRPIN_UNINSTALL_STOP", value_delimiter = ',')]
    pub stop: Vec<Workload>,

    /// Leases to delete once the workloads are gone, `NS/NAME`, comma-separated.
    #[arg(
        long = "lease",
        env = "HAIRPIN_UNINSTALL_LEASES",
        value_delimiter = ','
    )]
    pub leases: Vec<ObjectName>,

    /// The node cleanup DaemonSet, `NS/NAME`: awaited until ready on every node.
    #[arg(long, env = "HAIRPIN_UNINSTALL_NODES")]
    pub nodes: Option<ObjectName>,

    /// Deletes this namespace last, after making it the owner of every
    /// --with-namespace object (the kustomize uninstall: nothing else deletes them).
    #[arg(long, env = "HAIRPIN_UNINSTALL_DELETE_NAMESPACE")]
    pub delete_namespace: Option<String>,

    /// Objects outside the namespace that go with it: `clusterrole/NAME`,
    /// `clusterrolebinding/NAME`, `role/NS/NAME`, `rolebinding/NS/NAME`.
    #[arg(
        long = "with-namespace",
        env = "HAIRPIN_UNINSTALL_WITH_NAMESPACE",
        value_delimiter = ',',
        requires = "delete_namespace"
    )]
    pub with_namespace: Vec<Owned>,

    /// How long the waits may take in all (a Helm hook must finish within `helm
    /// uninstall --timeout`, 5m by default).
    #[arg(long, env = "HAIRPIN_UNINSTALL_TIMEOUT", default_value = "4m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// The API, and the CoreDNS writing to undo (as `cleanup --coredns`).
    #[command(flatten)]
    pub cluster: ClusterCleanup,

    /// Output format.
    #[arg(long, short, env = "HAIRPIN_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// `uninstall --step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    /// Every step, in order.
    All,
    /// Only wait until every --stop workload is gone (deletes nothing).
    AwaitStopped,
    /// Wait for SIGTERM and exit 0: the node cleanup pod's container once its init
    /// containers are done, so its readiness says the node is clean (no other
    /// image, such as pause, to pull).
    Idle,
}

/// The kinds of workload `--stop` deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    /// The agents.
    DaemonSet,
    /// The CoreDNS writer.
    Deployment,
}

/// A workload `--stop` deletes and awaits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Its kind.
    pub kind: WorkloadKind,
    /// Its namespace and name.
    pub name: ObjectName,
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, rest) = s.split_once('/').unwrap_or((s, ""));
        let kind = match kind {
            "daemonset" => WorkloadKind::DaemonSet,
            "deployment" => WorkloadKind::Deployment,
            _ => {
                return Err(format!(
                    "expected daemonset/NS/NAME or deployment/NS/NAME, got {s:?}"
                ));
            }
        };
        Ok(Workload {
            kind,
            name: rest.parse()?,
        })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            WorkloadKind::DaemonSet => "daemonset",
            WorkloadKind::Deployment => "deployment",
        };
        write!(f, "{kind}/{}", self.name)
    }
}

/// An object that goes with the deleted namespace (`--with-namespace`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owned {
    /// `clusterrole/NAME`.
    ClusterRole(String),
    /// `clusterrolebinding/NAME`.
    ClusterRoleBinding(String),
    /// `role/NS/NAME`.
    Role(ObjectName),
    /// `rolebinding/NS/NAME`.
    RoleBinding(ObjectName),
}

impl FromStr for Owned {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "expected clusterrole/NAME, clusterrolebinding/NAME, role/NS/NAME or \
                 rolebinding/NS/NAME, got {s:?}"
            )
        };
        let (kind, rest) = s.split_once('/').ok_or_else(bad)?;
        let cluster = |rest: &str| {
            (!rest.is_empty() && !rest.contains('/'))
                .then(|| rest.to_string())
                .ok_or_else(bad)
        };
        match kind {
            "clusterrole" => Ok(Owned::ClusterRole(cluster(rest)?)),
            "clusterrolebinding" => Ok(Owned::ClusterRoleBinding(cluster(rest)?)),
            "role" => Ok(Owned::Role(rest.parse().map_err(|_| bad())?)),
            "rolebinding" => Ok(Owned::RoleBinding(rest.parse().map_err(|_| bad())?)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Owned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owned::ClusterRole(n) => write!(f, "clusterrole/{n}"),
            Owned::ClusterRoleBinding(n) => write!(f, "clusterrolebinding/{n}"),
            Owned::Role(o) => write!(f, "role/{o}"),
            Owned::RoleBinding(o) => write!(f, "rolebinding/{o}"),
        }
    }
}

/// How far a DaemonSet's rollout is: `(ready, desired)` once the controller has seen
/// its current spec and every scheduled pod runs it and is ready; `None` before.
pub(crate) fn rollout_done(ds: &DaemonSet) -> Option<(i32, i32)> {
    let status = ds.status.as_ref()?;
    let seen = status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0);
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    (seen && status.number_ready >= desired && updated >= desired)
        .then_some((status.number_ready, desired))
}

/// Runs `uninstall` and prints its report; the exit code.
pub fn uninstall(args: &UninstallArgs) -> Result<i32, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if args.step == Step::Idle {
        rt.block_on(wait_for_termination())?;
        return Ok(0);
    }
    let report = rt.block_on(run(args));
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text => print_text(&cleanup::render(&report))?,
    }
    Ok(if report.ok { 0 } else { 1 })
}

/// Does every step of `args.step` in order and reports each; a failed step ends
/// the run (the next would undo what the failed one protects).
pub(crate) async fn run(args: &UninstallArgs) -> CleanupReport {
    let mut steps = Vec::new();
    let deadline = Instant::now() + args.timeout;
    let client = match crate::k8s::client::client(args.cluster.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            steps.push(step(
                "api",
                String::new(),
                Outcome::Failed,
                Some(e.to_string()),
            ));
            return report(steps);
        }
    };
    if args.step == Step::All {
        for w in &args.stop {
            steps.push(delete_workload(&client, w).await);
        }
        if failed(&steps) {
            return report(steps);
        }
    }
    for w in &args.stop {
        steps.push(await_gone(&client, w, deadline).await);
    }
    if args.step != Step::All || failed(&steps) {
        return report(steps);
    }
    for (i, lease) in args.leases.iter().enumerate() {
        // The CoreDNS lines go with the first Lease's run: one edit, whatever the count.
        let coredns = if i == 0 {
            args.cluster.coredns.mode
        } else {
            CorednsMode::Off
        };
        steps.extend(cluster_cleanup(args, lease, coredns).await.steps);
    }
    if let Some(nodes) = &args.nodes {
        steps.push(await_nodes(&client, nodes, deadline).await);
    }
    if let (Some(ns), false) = (&args.delete_namespace, failed(&steps)) {
        for o in &args.with_namespace {
            steps.push(own_by_namespace(&client, ns, o).await);
        }
        if !failed(&steps) {
            steps.push(delete_namespace(&client, ns).await);
        }
    }
    report(steps)
}

/// Returns on SIGTERM or SIGINT.
async fn wait_for_termination() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// `cleanup --scope cluster` for one Lease (and the CoreDNS writing, when given).
async fn cluster_cleanup(
    args: &UninstallArgs,
    lease: &ObjectName,
    coredns: CorednsMode,
) -> CleanupReport {
    let none = std::path::PathBuf::from("none");
    cleanup::remove_all(&CleanupArgs {
        hosts_file: None,
        names_link: None,
        names_address: None,
        names_redirect: crate::agent::args::NamesRedirect::Off,
        listen_link: "none".into(),
        listen_addresses: Vec::new(),
        cluster: ClusterCleanup {
            coredns: CorednsUndo {
                mode: coredns,
                ..args.cluster.coredns.clone()
            },
            ..args.cluster.clone()
        },
        lease: lease.clone(),
        bpf_pin_dir: none,
        pin_lock_wait: std::time::Duration::ZERO,
        scope: Scope::Cluster,
        output: args.output,
    })
    .await
}

/// Deletes `w` with foreground propagation: the controller deletes its pods first
/// and the object last, so its agents find it "being deleted" on SIGTERM.
async fn delete_workload(client: &Client, w: &Workload) -> CleanupStep {
    let dp = DeleteParams::foreground();
    let result = match w.kind {
        WorkloadKind::DaemonSet => ns_api::<DaemonSet>(client, &w.name)
            .delete(&w.name.name, &dp)
            .await
            .map(|_| ()),
        WorkloadKind::Deployment => ns_api::<Deployment>(client, &w.name)
            .delete(&w.name.name, &dp)
            .await
            .map(|_| ()),
    };
    deleted("stop", w.to_string(), result)
}

fn ns_api<K>(client: &Client, o: &ObjectName) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    Api::namespaced(client.clone(), &o.namespace)
}

/// The step for a delete: 404 is absent.
fn deleted(name: &'static str, object: String, r: Result<(), kube::Error>) -> CleanupStep {
    match r {
        Ok(()) => step(name, object, Outcome::Removed, None),
        Err(kube::Error::Api(s)) if s.code == 404 => step(name, object, Outcome::Absent, None),
        Err(e) => step(name, object, Outcome::Failed, Some(e.to_string())),
    }
}

/// Why a workload was not seen gone.
#[derive(Debug, thiserror::Error)]
enum NotGone {
    /// Still there at the deadline.
    #[error("{what} still exists: its pods have not all exited")]
    Deadline {
        /// The workload.
        what: String,
    },
    /// The API server could not be asked.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Reads `name` until the API server says 404, or the deadline.
async fn await_absent<K>(
    api: Api<K>,
    name: &str,
    what: &str,
    deadline: Instant,
) -> Result<(), NotGone>
where
    K: Clone + DeserializeOwned + fmt::Debug,
{
    loop {
        match api.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) if Instant::now() >= deadline => {
                return Err(NotGone::Deadline {
                    what: what.to_string(),
                });
            }
            Ok(Some(_)) => info!(object = what, "waiting for its pods to exit"),
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn await_gone(client: &Client, w: &Workload, deadline: Instant) -> CleanupStep {
    let (what, name) = (w.to_string(), &w.name.name);
    let r = match w.kind {
        WorkloadKind::DaemonSet => {
            await_absent(ns_api::<DaemonSet>(client, &w.name), name, &what, deadline).await
        }
        WorkloadKind::Deployment => {
            await_absent(ns_api::<Deployment>(client, &w.name), name, &what, deadline).await
        }
    };
    match r {
        Ok(()) => step("stopped", what, Outcome::Removed, None),
        Err(e) => step("stopped", what, Outcome::Failed, Some(e.to_string())),
    }
}

/// Waits until the node cleanup DaemonSet is ready on every node it covers.
async fn await_nodes(client: &Client, nodes: &ObjectName, deadline: Instant) -> CleanupStep {
    let api = ns_api::<DaemonSet>(client, nodes);
    let object = format!("daemonset/{nodes}");
    loop {
        let ds = match api.get_opt(&nodes.name).await {
            Ok(Some(ds)) => ds,
            Ok(None) => {
                let d = "not found: no node was cleaned (it is created with this Job)";
                return step("nodes", object, Outcome::Failed, Some(d.into()));
            }
            Err(e) => return step("nodes", object, Outcome::Failed, Some(e.to_string())),
        };
        if let Some((ready, desired)) = rollout_done(&ds) {
            let d = format!("{ready} of {desired} nodes cleaned");
            return step("nodes", object, Outcome::Removed, Some(d));
        }
        let (ready, desired) = ds
            .status
            .as_ref()
            .map_or((0, 0), |s| (s.number_ready, s.desired_number_scheduled));
        if Instant::now() >= deadline {
            let d = format!(
                "{ready} of {desired} nodes cleaned in time; on the others (not ready, or \
                 unschedulable) run `hairpin-agent cleanup --scope node` when they are back"
            );
            return step("nodes", object, Outcome::Failed, Some(d));
        }
        info!(ready, desired, "waiting for the node cleanup");
        tokio::time::sleep(POLL).await;
    }
}

/// Makes namespace `ns` the owner of `o` (a merge patch of its ownerReferences,
/// which RBAC lets through without the escalation check: it only concerns garbage
/// collection), so the collector deletes `o` once the namespace is gone.
async fn own_by_namespace(client: &Client, ns: &str, o: &Owned) -> CleanupStep {
    let object = o.to_string();
    let uid = match Api::<Namespace>::all(client.clone()).get(ns).await {
        Ok(n) => n.metadata.uid.unwrap_or_default(),
        Err(e) => {
            return step(
                "with-namespace",
                object,
                Outcome::Failed,
                Some(e.to_string()),
            );
        }
    };
    let patch = Patch::Merge(serde_json::json!({"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": uid}
    ]}}));
    let pp = PatchParams::default();
    let r = match o {
        Owned::ClusterRole(n) => Api::<ClusterRole>::all(client.clone())
            .patch(n, &pp, &patch)
            .await
            .map(|_| ()),
        Owned::ClusterRoleBinding(n) => Api::<ClusterRoleBinding>::all(client.clone())
            .patch(n, &pp, &patch)
            .await
            .map(|_| ()),
        Owned::Role(n) => ns_api::<Role>(client, n)
            .patch(&n.name, &pp, &patch)
            .await
            .map(|_| ()),
        Owned::RoleBinding(n) => ns_api::<RoleBinding>(client, n)
            .patch(&n.name, &pp, &patch)
            .await
            .map(|_| ()),
    };
    match r {
        Ok(()) => step(
            "with-namespace",
            object,
            Outcome::Removed,
            Some(format!("goes with namespace {ns}")),
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            step("with-namespace", object, Outcome::Absent, None)
        }
        Err(e) => step(
            "with-namespace",
            object,
            Outcome::Failed,
            Some(e.to_string()),
        ),
    }
}

async fn delete_namespace(client: &Client, ns: &str) -> CleanupStep {
    let r = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::background())
        .await
        .map(|_| ());
    deleted("namespace", format!("namespace/{ns}"), r)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DaemonSetStatus;

    use super::*;

    #[test]
    fn workloads_and_owned_objects_parse_and_print_back() {
        for s in [
            "daemonset/hairpin-system/hairpin",
            "deployment/x/hairpin-coredns",
        ] {
            assert_eq!(s.parse::<Workload>().expect(s).to_string(), s);
        }
        for s in [
            "clusterrole/hairpin",
            "clusterrolebinding/hairpin-uninstall",
            "role/kube-system/hairpin-coredns",
            "rolebinding/kube-system/hairpin-uninstall",
        ] {
            assert_eq!(s.parse::<Owned>().expect(s).to_string(), s);
        }
        for bad in ["pod/ns/x", "daemonset/hairpin", "daemonset"] {
            let e = bad.parse::<Workload>().expect_err(bad);
            assert!(e.contains("expected"), "{e}");
        }
        for bad in ["clusterrole/a/b", "role/x", "namespace/x", "clusterrole/"] {
            let e = bad.parse::<Owned>().expect_err(bad);
            assert!(e.contains("expected clusterrole/NAME"), "{e}");
        }
    }

    fn ds(generation: i64, observed: i64, desired: i32, ready: i32, updated: i32) -> DaemonSet {
        let mut ds = DaemonSet::default();
        ds.metadata.generation = Some(generation);
        ds.status = Some(DaemonSetStatus {
            observed_generation: Some(observed),
            desired_number_scheduled: desired,
            number_ready: ready,
            updated_number_scheduled: Some(updated),
            ..DaemonSetStatus::default()
        });
        ds
    }

    #[test]
    fn the_node_cleanup_is_done_when_every_scheduled_pod_of_its_spec_is_ready() {
        assert_eq!(rollout_done(&ds(1, 1, 3, 3, 3)), Some((3, 3)));
        // No node at all is done at once.
        assert_eq!(rollout_done(&ds(1, 1, 0, 0, 0)), Some((0, 0)));
        assert_eq!(
            rollout_done(&ds(1, 1, 3, 2, 3)),
            None,
            "a node not cleaned yet"
        );
        assert_eq!(
            rollout_done(&ds(2, 1, 3, 3, 3)),
            None,
            "the controller has not seen it"
        );
        assert_eq!(rollout_done(&ds(1, 1, 3, 3, 2)), None, "an old pod");
        assert_eq!(rollout_done(&DaemonSet::default()), None, "no status yet");
    }
}
