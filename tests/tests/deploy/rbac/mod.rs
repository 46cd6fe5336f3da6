//! RBAC: the API calls each ServiceAccount's processes make in a given
//! configuration, each pointing at the code that makes it, against the Roles a
//! kustomization renders and binds to that account: `hairpin` (the DaemonSet's
//! `run`), `hairpin-coredns` (the writer Deployment's `coredns-writer`), and in the
//! uninstall `hairpin-uninstall` (the Job's `uninstall`) and `hairpin-cleanup` (the
//! node cleanup's `uninstall --step await-stopped`).

use std::collections::{BTreeMap, BTreeSet};

use hairpin_agent::{
    agent::{CorednsWriterArgs, RunArgs},
    cli::{Owned, Step, UninstallArgs, WorkloadKind},
    k8s::{CorednsMode, ObjectName},
};
use serde_json::Value as Json;

use super::{
    VARIANTS, chart,
    flags::{run_args, uninstall_args, writer_args},
    render::{agent, daemonset, env_of, kustomize, pod_spec, read, writer},
    uninstall::uninstall_job_args,
};

/// The agents' ServiceAccount.
const AGENT: &str = "hairpin";
/// The CoreDNS writer's ServiceAccount.
const WRITER: &str = "hairpin-coredns";
/// The uninstall Job's ServiceAccount.
const UNINSTALL: &str = "hairpin-uninstall";
/// The node cleanup's ServiceAccount.
const NODE_CLEANUP: &str = "hairpin-cleanup";

/// One permission: (namespace or "*" for cluster-wide, apiGroup, resource, verb,
/// resourceName or "*").
pub(crate) type Grant = (String, String, String, String, String);

/// One API call and where the code makes it: `needle` occurs in
/// `hairpin-agent/src/{file}` (checked by `every_cited_call_is_in_the_code`).
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub grant: Grant,
    pub file: &'static str,
    pub needle: &'static str,
}

fn call(
    (ns, group, resource, verb, name): (&str, &str, &str, &str, &str),
    file: &'static str,
    needle: &'static str,
) -> Call {
    Call {
        grant: (
            ns.into(),
            group.into(),
            resource.into(),
            verb.into(),
            name.into(),
        ),
        file,
        needle,
    }
}

/// k8s/watch.rs: what both `run` and `coredns-writer` watch, cluster-wide, read-only.
fn watch_calls() -> Vec<Call> {
    let mut v = Vec::new();
    // k8s/watch.rs `spawn`: `watcher(Api::<Service>::all(..))` lists then watches,
    // cluster-wide; the same for Ingress; `watch_gateway_api`: Gateway, HTTPRoute and
    // TLSRoute through `Api::<DynamicObject>::all_with` when discovery finds them
    // (discovery is a non-resource URL granted by the built-in system:discovery role).
    // Nodes (issue 22): every Node's addresses and names are refused as LB
    // addresses and names; a kubelet reads every Node too.
    for (group, resource, needle) in [
        ("", "services", "Api::<Service>::all("),
        ("networking.k8s.io", "ingresses", "Api::<Ingress>::all("),
        ("", "nodes", "Api::<Node>::all("),
        (
            "gateway.networking.k8s.io",
            "gateways",
            "(\"v1\", \"Gateway\")",
        ),
        (
            "gateway.networking.k8s.io",
            "httproutes",
            "(\"v1\", \"HTTPRoute\")",
        ),
        (
            "gateway.networking.k8s.io",
            "grpcroutes",
            "(\"v1\", \"GRPCRoute\")",
        ),
        (
            "gateway.networking.k8s.io",
            "tlsroutes",
            "(\"v1alpha2\", \"TLSRoute\")",
        ),
    ] {
        for verb in ["list", "watch"] {
            v.push(call(
                ("*", group, resource, verb, "*"),
                "k8s/watch.rs",
                needle,
            ));
        }
    }
    v.push(call(
        ("*", "gateway.networking.k8s.io", "gateways", "watch", "*"),
        "k8s/watch.rs",
        "Api::<DynamicObject>::all_with(",
    ));
    v
}

/// k8s/lease.rs `attempt`: get_opt and replace of the Lease `name` in `ns`; create
/// when none exists (not limitable by name).
fn lease_calls(ns: &str, name: &str) -> Vec<Call> {
    let lease = |verb, name| (ns, "coordination.k8s.io", "leases", verb, name);
    vec![
        call(lease("get", name), "k8s/lease.rs", "api.get_opt(&cfg.name)"),
        call(
            lease("update", name),
            "k8s/lease.rs",
            "api.replace(&cfg.name",
        ),
        call(
            lease("create", "*"),
            "k8s/lease.rs",
            "api.create(&PostParams::default(), &lease)",
        ),
    ]
}

/// What `hairpin-agent run` calls with `run`'s settings (the Kubernetes source).
/// Whatever its --coredns, `run` writes nothing in CoreDNS (k8s/source.rs `spawn`
/// starts no CoreDNS loop): --coredns only keeps the name relay running.
pub(crate) fn run_calls(run: &RunArgs) -> Vec<Call> {
    assert!(run.frontends.is_none(), "the DaemonSet watches the cluster");
    let mut v = watch_calls();
    // k8s/node.rs `pod_cidrs`: this node's Node, read once for the default
    // --allowed-clients (its pod CIDRs); not needed when they are given.
    if run.allowed_clients.is_empty() {
        v.push(call(
            ("*", "", "nodes", "get", "*"),
            "k8s/node.rs",
            "Api::<Node>::all(",
        ));
    }
    // k8s/source.rs `spawn`: the Lease election runs when Events are on.
    if run.events {
        v.extend(lease_calls(&run.namespace, &run.lease_name));
        // kube_runtime's Recorder::publish creates an events.k8s.io Event in the
        // object's namespace and patches it when the Event repeats: k8s/events.rs
        // (Services, and Ingresses / Gateway routes whose hostname was refused).
        for verb in ["create", "patch"] {
            v.push(call(
                ("*", "events.k8s.io", "events", verb, "*"),
                "k8s/events.rs",
                "recorder.publish(",
            ));
        }
    }
    // k8s/owner.rs `daemonset_state`: on SIGTERM, the agent's own DaemonSet
    // (--daemonset), one `get` by name, to tell an uninstall from a restart.
    if let Some(ds) = &run.daemonset {
        v.push(call(
            (&ds.namespace, "apps", "daemonsets", "get", &ds.name),
            "k8s/owner.rs",
            "Api::<DaemonSet>::namespaced(",
        ));
    }
    v
}

/// What `hairpin-agent coredns-writer` calls with `w`'s settings.
pub(crate) fn writer_calls(w: &CorednsWriterArgs) -> Vec<Call> {
    let mut v = watch_calls();
    // k8s/source.rs `spawn_coredns_writer`: its own Lease, always.
    v.extend(lease_calls(&w.namespace, &w.lease_name));
    let objects = &w.coredns_objects;
    match w.coredns {
        CorednsMode::Off => panic!("coredns-writer refuses --coredns off"),
        CorednsMode::Corefile => {
            let o = &objects.configmap;
            v.extend(configmap_edit_calls(o));
            // k8s/coredns/task.rs `publish`: the ConfigMap the Warning Event is about,
            // and the Event, in that ConfigMap's namespace (kube's Recorder).
            v.push(call(
                (&o.namespace, "", "configmaps", "get", &o.name),
                "k8s/coredns/task.rs",
                ".get(&o.name)",
            ));
            for verb in ["create", "patch"] {
                v.push(call(
                    (&o.namespace, "events.k8s.io", "events", verb, "*"),
                    "k8s/coredns/task.rs",
                    "recorder.publish(",
                ));
            }
        }
        CorednsMode::Import => {
            let o = &objects.custom_configmap;
            v.extend(configmap_edit_calls(o));
            // k8s/coredns/mod.rs `write_import`: creates coredns-custom when missing; RBAC
            // cannot limit create by name.
            v.push(call(
                (&o.namespace, "", "configmaps", "create", "*"),
                "k8s/coredns/mod.rs",
                "create(&write_params(), &cm)",
            ));
        }
    }
    // k8s/coredns/mod.rs `coredns_version` (each round): the CoreDNS Deployment named
    // like the main ConfigMap (--coredns-configmap, also in import mode).
    let o = &objects.configmap;
    v.push(call(
        (&o.namespace, "apps", "deployments", "get", &o.name),
        "k8s/coredns/mod.rs",
        "Api::<Deployment>::namespaced(",
    ));
    // k8s/coredns/mod.rs `node_local_dns` (at start): its DaemonSet, else its ConfigMap.
    v.push(call(
        ("kube-system", "apps", "daemonsets", "get", "node-local-dns"),
        "k8s/coredns/mod.rs",
        "ds.get_opt(\"node-local-dns\")",
    ));
    v.push(call(
        ("kube-system", "", "configmaps", "get", "node-local-dns"),
        "k8s/coredns/mod.rs",
        "cm.get_opt(\"node-local-dns\")",
    ));
    v
}

/// k8s/coredns/mod.rs `edit_corefile` and `write_import` alike: get_opt, then replace
/// carrying the resourceVersion (the Corefile, or our key of the import ConfigMap).
fn configmap_edit_calls(o: &ObjectName) -> Vec<Call> {
    let cm = |verb| {
        (
            o.namespace.as_str(),
            "",
            "configmaps",
            verb,
            o.name.as_str(),
        )
    };
    vec![
        call(cm("get"), "k8s/coredns/mod.rs", ".get_opt(&o.name)"),
        call(
            cm("update"),
            "k8s/coredns/mod.rs",
            ".replace(&o.name, &write_params(), &cm)",
        ),
    ]
}

/// What `hairpin-agent uninstall` calls with `u`'s settings.
pub(crate) fn uninstall_calls(u: &UninstallArgs) -> Vec<Call> {
    let mut v = Vec::new();
    for w in &u.stop {
        let (resource, delete_needle, get_needle) = match w.kind {
            WorkloadKind::DaemonSet => (
                "daemonsets",
                "ns_api::<DaemonSet>(client, &w.name)",
                "await_absent(ns_api::<DaemonSet>",
            ),
            WorkloadKind::Deployment => (
                "deployments",
                "ns_api::<Deployment>(client, &w.name)",
                "await_absent(ns_api::<Deployment>",
            ),
        };
        let o = &w.name;
        // cli/uninstall.rs `await_gone`: read until 404, in every step.
        v.push(call(
            (&o.namespace, "apps", resource, "get", &o.name),
            "cli/uninstall.rs",
            get_needle,
        ));
        // `delete_workload`: foreground deletion, only in the Job.
        if u.step == Step::All {
            v.push(call(
                (&o.namespace, "apps", resource, "delete", &o.name),
                "cli/uninstall.rs",
                delete_needle,
            ));
        }
    }
    if u.step != Step::All {
        return v;
    }
    // cli/cleanup.rs `cluster_steps` (through `cluster_cleanup`): each Lease by name
    // (404 = absent), and k8s/coredns/mod.rs `remove`: the writer's edit with our
    // lines taken out (in import mode a missing coredns-custom stays missing).
    for l in &u.leases {
        v.push(call(
            (
                &l.namespace,
                "coordination.k8s.io",
                "leases",
                "delete",
                &l.name,
            ),
            "cli/cleanup.rs",
            ".delete(&args.lease.name",
        ));
    }
    match u.cluster.coredns.mode {
        CorednsMode::Off => {}
        CorednsMode::Corefile => {
            v.extend(configmap_edit_calls(&u.cluster.coredns.objects.configmap))
        }
        CorednsMode::Import => v.extend(configmap_edit_calls(
            &u.cluster.coredns.objects.custom_configmap,
        )),
    }
    // `await_nodes`: the node cleanup's rollout.
    if let Some(n) = &u.nodes {
        v.push(call(
            (&n.namespace, "apps", "daemonsets", "get", &n.name),
            "cli/uninstall.rs",
            "ns_api::<DaemonSet>(client, nodes)",
        ));
    }
    // `own_by_namespace`: the namespace's uid, then a patch of each object's
    // ownerReferences; `delete_namespace`.
    if let Some(ns) = &u.delete_namespace {
        for (verb, needle) in [
            ("get", "Api::<Namespace>::all(client.clone()).get(ns)"),
            ("delete", ".delete(ns, &DeleteParams::background())"),
        ] {
            v.push(call(
                ("*", "", "namespaces", verb, ns),
                "cli/uninstall.rs",
                needle,
            ));
        }
        for o in &u.with_namespace {
            let (ns, resource, name, needle) = match o {
                Owned::ClusterRole(n) => {
                    ("*", "clusterroles", n.as_str(), "Api::<ClusterRole>::all(")
                }
                Owned::ClusterRoleBinding(n) => (
                    "*",
                    "clusterrolebindings",
                    n.as_str(),
                    "Api::<ClusterRoleBinding>::all(",
                ),
                Owned::Role(n) => (
                    n.namespace.as_str(),
                    "roles",
                    n.name.as_str(),
                    "ns_api::<Role>(client, n)",
                ),
                Owned::RoleBinding(n) => (
                    n.namespace.as_str(),
                    "rolebindings",
                    n.name.as_str(),
                    "ns_api::<RoleBinding>(client, n)",
                ),
            };
            v.push(call(
                (ns, "rbac.authorization.k8s.io", resource, "patch", name),
                "cli/uninstall.rs",
                needle,
            ));
        }
    }
    v
}

fn grants(calls: &[Call]) -> BTreeSet<Grant> {
    calls.iter().map(|c| c.grant.clone()).collect()
}

/// The grants the rendered Roles and ClusterRoles give, by the ServiceAccount (in
/// hairpin-system) each is bound to; a binding of anything else, or of more than one
/// subject, fails.
pub(crate) fn rendered_grants(objs: &[Json], source: &str) -> BTreeMap<String, BTreeSet<Grant>> {
    let mut out: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for o in objs {
        let (kind, ns) = match o["kind"].as_str() {
            Some("ClusterRole") => ("ClusterRole", "*".to_string()),
            Some("Role") => (
                "Role",
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{source}: a Role without a namespace"))
                    .to_string(),
            ),
            _ => continue,
        };
        let name = o["metadata"]["name"].as_str().expect("name");
        let bindings: Vec<&Json> = objs
            .iter()
            .filter(|b| {
                b["kind"] == format!("{kind}Binding")
                    && b["roleRef"]["name"] == name
                    && b["roleRef"]["kind"] == kind
                    && (kind == "ClusterRole" || b["metadata"]["namespace"] == ns.as_str())
            })
            .collect();
        assert_eq!(
            bindings.len(),
            1,
            "{source}: {kind} {name} must be bound exactly once"
        );
        let subjects = bindings[0]["subjects"].as_array().expect("subjects");
        assert_eq!(subjects.len(), 1, "{source}: {kind} {name}: one subject");
        let sa = subjects[0]["name"]
            .as_str()
            .expect("subject name")
            .to_string();
        assert_eq!(
            subjects[0],
            serde_json::json!({"kind": "ServiceAccount", "name": sa, "namespace": "hairpin-system"}),
            "{source}: {kind}Binding for {name} binds a ServiceAccount of hairpin-system"
        );
        let into = out.entry(sa).or_default();
        for rule in o["rules"].as_array().expect("rules") {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|s| s.as_str().expect("string").to_string())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "{source}: no non-resource URLs needed"
            );
            let names = list("resourceNames");
            let names = if names.is_empty() {
                vec!["*".to_string()]
            } else {
                names
            };
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        assert!(
                            group != "*" && resource != "*" && verb != "*",
                            "{source}: wildcard in {kind} {name}"
                        );
                        for n in &names {
                            into.insert((
                                ns.clone(),
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                n.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Every call of an install, by ServiceAccount: the agent's with its DaemonSet's env
/// (as `hairpin`), the writer's with its Deployment's env (as `hairpin-coredns`).
fn expected_calls(objs: &[Json], dir: &str) -> BTreeMap<String, Vec<Call>> {
    let run = run_args(&env_of(&agent(objs), dir), dir);
    let mut out = BTreeMap::new();
    out.insert(AGENT.to_string(), run_calls(&run));
    if let Some(c) = writer(objs) {
        let w = writer_args(&env_of(&c, dir), dir);
        out.insert(WRITER.to_string(), writer_calls(&w));
    }
    out
}

/// Every call of an uninstall: the Job's (as `hairpin-uninstall`) and the node
/// cleanup's first step (as `hairpin-cleanup`).
fn expected_uninstall_calls(objs: &[Json], dir: &str) -> BTreeMap<String, Vec<Call>> {
    let mut out = BTreeMap::new();
    out.insert(
        UNINSTALL.to_string(),
        uninstall_calls(&uninstall_job_args(objs, dir)),
    );
    let pod = pod_spec(&daemonset(objs, "hairpin-cleanup"));
    let waits: Vec<Call> = pod
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.args.as_deref() == Some(&["uninstall".to_string()][..]))
        .flat_map(|c| uninstall_calls(&uninstall_args(&env_of(c, dir), dir)))
        .collect();
    out.insert(NODE_CLEANUP.to_string(), waits);
    out
}

/// The rendered grants of `objs` equal `calls`, account by account.
fn assert_grants_are_calls(objs: &[Json], calls: &BTreeMap<String, Vec<Call>>, source: &str) {
    let rendered = rendered_grants(objs, source);
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        calls.keys().collect::<Vec<_>>(),
        "{source}: the ServiceAccounts granted anything"
    );
    for (sa, calls) in calls {
        let (rendered, expected) = (&rendered[sa], grants(calls));
        let extra: Vec<_> = rendered.difference(&expected).collect();
        let missing: Vec<_> = expected.difference(rendered).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{source}: {sa}: RBAC differs from the calls the code makes with these settings\n  \
             granted, not called: {extra:?}\n  called, not granted: {missing:?}"
        );
    }
}

fn is_write(verb: &str) -> bool {
    !matches!(verb, "get" | "list" | "watch")
}

mod tests;
