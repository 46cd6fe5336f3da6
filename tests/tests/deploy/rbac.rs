//! RBAC: the API calls each ServiceAccount's processes make in a given
//! configuration, each pointing at the code that makes it, against the Roles a
//! kustomization renders and binds to that account: `hairpin` (the DaemonSet's
//! `run` and the uninstall Job's `cleanup`) and `hairpin-coredns` (the writer
//! Deployment's `coredns-writer` and the hairpin-cleanup-coredns Job's `cleanup`).

use std::collections::{BTreeMap, BTreeSet};

use hairpin_agent::{
    agent::{args::RunArgs, coredns_writer::CorednsWriterArgs},
    cli::cleanup::CleanupArgs,
    k8s::coredns::{CorednsMode, ObjectName},
};
use serde_json::Value as Json;

use super::{
    VARIANTS,
    flags::{cleanup_args, run_args, writer_args},
    render::{agent, env_of, kustomize, read, writer},
    uninstall::{cleanup_job, coredns_cleanup_job},
};

/// The agents' ServiceAccount.
const AGENT: &str = "hairpin";
/// The CoreDNS writer's ServiceAccount.
const WRITER: &str = "hairpin-coredns";

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
    for (group, resource, needle) in [
        ("", "services", "Api::<Service>::all("),
        ("networking.k8s.io", "ingresses", "Api::<Ingress>::all("),
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
    // k8s/pods.rs `watch`: this node's pods (field selector spec.nodeName), for the
    // client policy's addresses.
    for verb in ["list", "watch"] {
        v.push(call(
            ("*", "", "pods", verb, "*"),
            "k8s/pods.rs",
            "Api::<Pod>::all(",
        ));
    }
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
                "create(&PostParams::default(), &cm)",
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
            ".replace(&o.name, &PostParams::default(), &cm)",
        ),
    ]
}

/// What `hairpin-agent cleanup` calls with `c`'s settings when it reaches the API.
pub fn cleanup_calls(c: &CleanupArgs) -> Vec<Call> {
    // cli/cleanup.rs `cluster_steps`: deletes the Lease by name (404 = absent).
    let l = &c.lease;
    let mut v = vec![call(
        (
            &l.namespace,
            "coordination.k8s.io",
            "leases",
            "delete",
            &l.name,
        ),
        "cli/cleanup.rs",
        ".delete(&args.lease.name",
    )];
    // k8s/coredns/mod.rs `remove`: the same edit as the writer's, with our lines taken out;
    // in import mode a missing coredns-custom is left missing (no create).
    match c.coredns {
        CorednsMode::Off => {}
        CorednsMode::Corefile => v.extend(configmap_edit_calls(&c.coredns_objects.configmap)),
        CorednsMode::Import => v.extend(configmap_edit_calls(&c.coredns_objects.custom_configmap)),
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

/// Every call of every variant, by ServiceAccount: the agent's with its DaemonSet's
/// env and cleanup's with its uninstall Job's env (as `hairpin`); the writer's with
/// its Deployment's env and cleanup's with the hairpin-cleanup-coredns Job's env (as
/// `hairpin-coredns`).
fn expected_calls(
    objs: &[Json],
    dir: &str,
    uninstall: &str,
) -> Option<BTreeMap<String, Vec<Call>>> {
    let run = run_args(&env_of(&agent(objs), dir), dir);
    let removal = kustomize(uninstall)?;
    let job = cleanup_job(&removal);
    let cleanup = cleanup_args(&env_of(&job, uninstall), uninstall);
    let mut out = BTreeMap::new();
    out.insert(
        AGENT.to_string(),
        run_calls(&run)
            .into_iter()
            .chain(cleanup_calls(&cleanup))
            .collect(),
    );
    if let Some(c) = writer(objs) {
        let w = writer_args(&env_of(&c, dir), dir);
        let job = coredns_cleanup_job(&removal)
            .unwrap_or_else(|| panic!("{uninstall}: no hairpin-cleanup-coredns Job"));
        let cleanup = cleanup_args(&env_of(&job, uninstall), uninstall);
        out.insert(
            WRITER.to_string(),
            writer_calls(&w)
                .into_iter()
                .chain(cleanup_calls(&cleanup))
                .collect(),
        );
    }
    Some(out)
}

fn is_write(verb: &str) -> bool {
    !matches!(verb, "get" | "list" | "watch")
}

#[test]
fn rbac_is_exactly_what_the_code_calls_in_each_variant() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let Some(calls) = expected_calls(&objs, v.dir, v.uninstall) else {
            return;
        };
        let rendered = rendered_grants(&objs, v.dir);
        assert_eq!(
            rendered.keys().collect::<Vec<_>>(),
            calls.keys().collect::<Vec<_>>(),
            "{}: the ServiceAccounts granted anything",
            v.dir
        );
        for (sa, calls) in &calls {
            let (rendered, expected) = (&rendered[sa], grants(calls));
            let extra: Vec<_> = rendered.difference(&expected).collect();
            let missing: Vec<_> = expected.difference(rendered).collect();
            assert!(
                extra.is_empty() && missing.is_empty(),
                "{}: {sa}: RBAC differs from the calls the code makes with this variant's settings\n  \
                 granted, not called: {extra:?}\n  called, not granted: {missing:?}",
                v.dir
            );
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
        let Some(c) = expected_calls(&objs, v.dir, v.uninstall) else {
            return;
        };
        calls.extend(c.into_values().flatten());
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
            || g.2 == "pods"
            || g.1.starts_with("gateway")),
        "no Events, no CoreDNS: no Lease; allowed clients given: no Node: {quiet:?}"
    );
}
