//! RBAC: the API calls each ServiceAccount's processes make in a given
//! configuration, each pointing at the code that makes it, against the Roles a
//! kustomization renders and binds to that account: `hairpin` (the DaemonSet's
//! `run`), `hairpin-coredns` (the writer Deployment's `coredns-writer`), and in the
//! uninstall `hairpin-uninstall` (the Job's `uninstall`) and `hairpin-cleanup` (the
//! node cleanup's `uninstall --step await-stopped`).

use std::collections::{BTreeMap, BTreeSet};

use hairpin_agent::{
    agent::{args::RunArgs, coredns_writer::CorednsWriterArgs},
    cli::uninstall::{Owned, Step, UninstallArgs, WorkloadKind},
    k8s::coredns::{CorednsMode, ObjectName},
};
use serde_json::Value as Json;

use super::{
    VARIANTS,
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
pub type Grant = (String, String, String, String, String);

/// One API call and where the code makes it: `needle` occurs in
/// `hairpin-agent/src/{file}` (checked by `every_cited_call_is_in_the_code`).
#[derive(Clone, Debug)]
pub struct Call {
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
pub fn run_calls(run: &RunArgs) -> Vec<Call> {
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
pub fn writer_calls(w: &CorednsWriterArgs) -> Vec<Call> {
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
pub fn uninstall_calls(u: &UninstallArgs) -> Vec<Call> {
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
pub fn rendered_grants(objs: &[Json], source: &str) -> BTreeMap<String, BTreeSet<Grant>> {
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

#[test]
fn rbac_is_exactly_what_the_code_calls_in_each_variant() {
    for v in VARIANTS {
        let (Some(objs), Some(removal)) = (kustomize(v.dir), kustomize(v.uninstall)) else {
            return;
        };
        assert_grants_are_calls(&objs, &expected_calls(&objs, v.dir), v.dir);
        assert_grants_are_calls(
            &removal,
            &expected_uninstall_calls(&removal, v.uninstall),
            v.uninstall,
        );
    }
}

/// The chart's pre-delete hooks grant their accounts exactly the calls of the
/// processes they run, in any namespace.
#[test]
fn the_chart_hooks_grant_exactly_what_the_uninstall_calls() {
    for v in VARIANTS {
        let hooks = super::chart::render_hooks_with(&super::chart::set_flags(v.chart));
        assert_grants_are_calls(
            &hooks,
            &expected_uninstall_calls(&hooks, "chart"),
            &format!("chart hooks {:?}", v.chart),
        );
    }
}

/// The uninstall's accounts exist only during the uninstall and write nothing but
/// what is being removed: the install's workloads and Leases by name, the CoreDNS
/// ConfigMap it wrote, and (without Helm) the namespace and the owners of the
/// objects that go with it. The node cleanup's reads one DaemonSet.
#[test]
fn the_uninstall_accounts_touch_only_what_is_being_removed() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.uninstall) else {
            return;
        };
        let grants = rendered_grants(&objs, v.uninstall);
        for g in &grants[NODE_CLEANUP] {
            assert_eq!(
                (g.2.as_str(), g.3.as_str(), g.4.as_str()),
                ("daemonsets", "get", "hairpin"),
                "{}",
                v.uninstall
            );
        }
        for g in &grants[UNINSTALL] {
            assert_ne!(
                g.4, "*",
                "{}: every grant names its object: {g:?}",
                v.uninstall
            );
            let ok = match (g.2.as_str(), g.3.as_str()) {
                ("daemonsets" | "deployments", "get" | "delete") => true,
                ("leases", "delete") => true,
                ("configmaps", "get" | "update") => {
                    Some(format!("{}/{}", g.0, g.4).as_str()) == v.written
                }
                ("namespaces", "get" | "delete") => g.4 == "hairpin-system",
                ("clusterroles" | "clusterrolebindings" | "roles" | "rolebindings", "patch") => {
                    true
                }
                _ => false,
            };
            assert!(ok, "{}: the uninstall's account may {g:?}", v.uninstall);
        }
    }
}

/// Issue 14: root on one node holds that node's agent token, so the agents' account
/// may write nothing that changes what other nodes or pods do: no access to
/// kube-system at all, and no write anywhere but Events (informational) and its own
/// namespace's Leases.
#[test]
fn the_agents_account_writes_nothing_but_events_and_its_lease() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let grants = rendered_grants(&objs, v.dir);
        let agent = &grants[AGENT];
        for g in agent {
            let (ns, group, resource, verb, _) = g;
            assert_ne!(
                ns, "kube-system",
                "{}: the agents' account in kube-system: {g:?}",
                v.dir
            );
            if !is_write(verb) {
                continue;
            }
            let event = group == "events.k8s.io"
                && resource == "events"
                && (verb == "create" || verb == "patch");
            let own_lease =
                ns == "hairpin-system" && group == "coordination.k8s.io" && resource == "leases";
            assert!(
                event || own_lease,
                "{}: the agents' account may write {g:?}",
                v.dir
            );
        }
        assert!(
            !agent.iter().any(|g| g.2 == "configmaps"),
            "{}: the agents' account touches no ConfigMap",
            v.dir
        );
    }
}

/// Issue 22: root on one node holds that node's agent token, so the agents' account
/// reads nothing a kubelet could not: no Pods (their specs carry env values and
/// commands; this node's pods are read from its own routes, podnet), no Secrets,
/// no wildcard resource, in any kustomize variant and the chart with its values.
#[test]
fn the_agents_account_reads_no_pods_or_secrets() {
    let check = |grants: &BTreeMap<String, BTreeSet<Grant>>, source: &str| {
        let agent = grants
            .get(AGENT)
            .unwrap_or_else(|| panic!("{source}: no grants for {AGENT}"));
        assert!(
            !agent.is_empty(),
            "{source}: the agent's account has grants"
        );
        for g in agent {
            assert!(
                !matches!(g.2.as_str(), "pods" | "pods/log" | "secrets" | "*")
                    && g.1 != "*"
                    && g.3 != "*",
                "{source}: the agents' account may {} {}/{} in {}: {g:?}",
                g.3,
                g.1,
                g.2,
                g.0
            );
        }
    };
    for v in VARIANTS {
        let set: Vec<(&str, yaml_serde::Value)> = v
            .chart
            .iter()
            .map(|(k, val)| (*k, yaml_serde::from_str(val).expect("a YAML value")))
            .collect();
        let chart = super::chart::render_chart(&set);
        check(
            &rendered_grants(&chart, "chart"),
            &format!("chart with {set:?}"),
        );
        if let Some(objs) = kustomize(v.dir) {
            check(&rendered_grants(&objs, v.dir), v.dir);
        }
    }
}

/// The writer's account: writes only the ConfigMap it is configured for (by name),
/// its own Lease, and (corefile mode) Events in kube-system; create of ConfigMaps in
/// kube-system only in import mode (RBAC cannot limit create by name); reads
/// cluster-wide only what it watches.
#[test]
fn the_writers_account_writes_only_its_configmap_and_lease() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let grants = rendered_grants(&objs, v.dir);
        let Some(w) = grants.get(WRITER) else {
            assert_eq!(v.coredns, CorednsMode::Off, "{}: no writer account", v.dir);
            continue;
        };
        let (ns, name) = v
            .written
            .expect("written")
            .split_once('/')
            .expect("ns/name");
        for g in w {
            let (gns, group, resource, verb, gname) = g;
            if gns == "*" {
                assert!(
                    !is_write(verb)
                        && [
                            "services",
                            "ingresses",
                            "nodes",
                            "gateways",
                            "httproutes",
                            "tlsroutes"
                        ]
                        .contains(&resource.as_str()),
                    "{}: the writer's cluster-wide grant {g:?}",
                    v.dir
                );
                continue;
            }
            if !is_write(verb) {
                continue;
            }
            let ours = gns == ns && resource == "configmaps" && gname == name && verb == "update";
            let create = gns == ns
                && resource == "configmaps"
                && gname == "*"
                && verb == "create"
                && v.coredns == CorednsMode::Import;
            let lease = gns == "hairpin-system"
                && group == "coordination.k8s.io"
                && resource == "leases"
                && (gname == "hairpin-coredns" || verb == "create");
            let event = gns == ns && group == "events.k8s.io" && v.coredns == CorednsMode::Corefile;
            assert!(
                ours || create || lease || event,
                "{}: the writer's account may write {g:?}",
                v.dir
            );
        }
    }
}

/// Issue 21: the one read the agents gained is `get` on their own DaemonSet, by
/// name, in their own namespace, through a Role bound to their ServiceAccount (never
/// a ClusterRole: no other namespace's DaemonSets), and it names the DaemonSet the
/// manifests install and the agent is told to read.
#[test]
fn the_agents_read_their_own_daemonset_and_no_other() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let run = run_args(&env_of(&agent(&objs), v.dir), v.dir);
        let own = run
            .daemonset
            .unwrap_or_else(|| panic!("{}: HAIRPIN_DAEMONSET is not set", v.dir));
        let installed: Vec<String> = objs
            .iter()
            .filter(|o| o["kind"] == "DaemonSet")
            .map(|o| {
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(
            installed,
            [own.to_string()],
            "{}: --daemonset names the agents' DaemonSet",
            v.dir
        );
        let grants = rendered_grants(&objs, v.dir);
        let daemonsets: Vec<&Grant> = grants[AGENT]
            .iter()
            .filter(|g| g.2 == "daemonsets")
            .collect();
        let expected: Grant = (
            own.namespace.clone(),
            "apps".into(),
            "daemonsets".into(),
            "get".into(),
            own.name.clone(),
        );
        assert_eq!(daemonsets, [&expected], "{}", v.dir);
        let role = objs
            .iter()
            .find(|o| {
                o["kind"] == "Role"
                    && o["metadata"]["namespace"] == own.namespace.as_str()
                    && o["rules"].as_array().is_some_and(|rules| {
                        rules
                            .iter()
                            .any(|r| r["resources"] == serde_json::json!(["daemonsets"]))
                    })
            })
            .unwrap_or_else(|| panic!("{}: no Role in {} grants it", v.dir, own.namespace));
        assert_eq!(role["metadata"]["name"], "hairpin", "{}", v.dir);
    }
}

#[test]
fn every_cited_call_is_in_the_code() {
    let mut calls = Vec::new();
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        calls.extend(expected_calls(&objs, v.dir).into_values().flatten());
        let Some(removal) = kustomize(v.uninstall) else {
            return;
        };
        calls.extend(
            expected_uninstall_calls(&removal, v.uninstall)
                .into_values()
                .flatten(),
        );
    }
    let mut seen = BTreeSet::new();
    for c in calls {
        if !seen.insert((c.file, c.needle)) {
            continue;
        }
        let path = format!("hairpin-agent/src/{}", c.file);
        assert!(
            read(&path).contains(c.needle),
            "{:?}: the table says {path} makes this call with {:?}, and it does not: update the \
             table (and the RBAC) to what the code calls",
            c.grant,
            c.needle
        );
    }
}

#[test]
fn the_call_table_follows_the_settings() {
    use std::collections::BTreeMap;
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let of = |pairs: &[(&str, &str)]| grants(&run_calls(&run_args(&env(pairs), "test")));
    let configmaps = |g: &BTreeSet<Grant>| -> BTreeSet<String> {
        g.iter()
            .filter(|g| g.2 == "configmaps")
            .map(|g| format!("{} {}", g.3, g.4))
            .collect()
    };
    assert!(configmaps(&of(&[])).is_empty(), "CoreDNS off: no ConfigMap");
    assert!(
        configmaps(&of(&[("HAIRPIN_COREDNS", "corefile")])).is_empty(),
        "run --coredns corefile writes no CoreDNS: the writer does"
    );
    let writer_of =
        |pairs: &[(&str, &str)]| grants(&writer_calls(&writer_args(&env(pairs), "test")));
    assert_eq!(
        configmaps(&writer_of(&[("HAIRPIN_COREDNS", "corefile")])),
        ["get coredns", "get node-local-dns", "update coredns"]
            .map(String::from)
            .into()
    );
    assert_eq!(
        configmaps(&writer_of(&[("HAIRPIN_COREDNS", "import")])),
        [
            "create *",
            "get coredns-custom",
            "get node-local-dns",
            "update coredns-custom"
        ]
        .map(String::from)
        .into()
    );
    let quiet = of(&[
        ("HAIRPIN_EVENTS", "false"),
        ("HAIRPIN_ALLOWED_CLIENTS", "10.0.0.0/24"),
    ]);
    assert!(
        quiet.iter().all(|g| g.2 == "services"
            || g.2 == "ingresses"
            || (g.2 == "nodes" && g.3 != "get")
            || g.1.starts_with("gateway")),
        "no Events, no CoreDNS: no Lease; allowed clients given: no Node get (the Nodes' \
         list and watch stay): {quiet:?}"
    );
}
