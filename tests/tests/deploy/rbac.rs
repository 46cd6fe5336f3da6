//! RBAC: the API calls the agent makes in a given configuration, each pointing at
//! the code that makes it, against the Roles a kustomization renders.

use std::collections::BTreeSet;

use hairpin_agent::{
    agent::args::RunArgs,
    cli::cleanup::CleanupArgs,
    k8s::coredns::{CorednsMode, ObjectName},
};
use serde_json::Value as Json;

use super::{
    VARIANTS,
    flags::{cleanup_args, run_args},
    render::{agent, env_of, kustomize, read},
    uninstall::cleanup_job,
};

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

/// What `hairpin-agent run` calls with `run`'s settings (the Kubernetes source).
pub fn run_calls(run: &RunArgs) -> Vec<Call> {
    assert!(run.frontends.is_none(), "the DaemonSet watches the cluster");
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
    // k8s/node.rs `pod_cidrs`: this node's Node, read once for the default
    // --allowed-clients (its pod CIDRs); not needed when they are given.
    if run.allowed_clients.is_empty() {
        v.push(call(
            ("*", "", "nodes", "get", "*"),
            "k8s/node.rs",
            "Api::<Node>::all(",
        ));
    }
    let coredns = run.coredns != CorednsMode::Off;
    // k8s/source.rs `spawn`: the Lease election runs when Events or the
    // CoreDNS writer are on. k8s/lease.rs `attempt`: get_opt and replace of the Lease
    // (--lease-name) in --namespace; create when none exists (not limitable by name).
    if run.events || coredns {
        let (ns, name) = (run.namespace.as_str(), run.lease_name.as_str());
        let lease = |verb, name| (ns, "coordination.k8s.io", "leases", verb, name);
        v.push(call(
            lease("get", name),
            "k8s/lease.rs",
            "api.get_opt(&cfg.name)",
        ));
        v.push(call(
            lease("update", name),
            "k8s/lease.rs",
            "api.replace(&cfg.name",
        ));
        v.push(call(
            lease("create", "*"),
            "k8s/lease.rs",
            "api.create(&PostParams::default(), &lease)",
        ));
    }
    // kube_runtime's Recorder::publish creates an events.k8s.io Event in the object's
    // namespace and patches it when the Event repeats: k8s/events.rs (Services, and
    // Ingresses / Gateway routes whose hostname was refused, with --events),
    // k8s/coredns/task.rs (CorefileUnrecognized on the Corefile ConfigMap).
    let mut events = Vec::new();
    if run.events {
        events.push("k8s/events.rs");
    }
    if run.coredns == CorednsMode::Corefile {
        events.push("k8s/coredns/task.rs");
    }
    for file in events {
        for verb in ["create", "patch"] {
            v.push(call(
                ("*", "events.k8s.io", "events", verb, "*"),
                file,
                "recorder.publish(",
            ));
        }
    }
    let objects = &run.coredns_objects;
    match run.coredns {
        CorednsMode::Off => {}
        CorednsMode::Corefile => {
            v.extend(configmap_edit_calls(&objects.configmap));
            // k8s/coredns/task.rs `publish`: the ConfigMap the Warning Event is about.
            let o = &objects.configmap;
            v.push(call(
                (&o.namespace, "", "configmaps", "get", &o.name),
                "k8s/coredns/task.rs",
                ".get(&o.name)",
            ));
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
    // k8s/coredns/mod.rs `coredns_version` (from the CoreDNS loop, each round): the
    // CoreDNS Deployment named like the main ConfigMap (--coredns-configmap, also in
    // import mode), for the image tag that says whether `answer auto` is understood.
    if coredns {
        let o = &objects.configmap;
        v.push(call(
            (&o.namespace, "apps", "deployments", "get", &o.name),
            "k8s/coredns/mod.rs",
            "Api::<Deployment>::namespaced(",
        ));
    }
    // k8s/coredns/mod.rs `node_local_dns` (from the CoreDNS loop): its DaemonSet, else its
    // ConfigMap, in kube-system.
    if coredns {
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
    }
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

/// The grants the rendered Roles and ClusterRoles give, after checking that each is
/// bound to exactly the agent's ServiceAccount.
pub fn rendered_grants(objs: &[Json], source: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
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
        let binding = objs.iter().find(|b| {
            b["kind"] == format!("{kind}Binding")
                && b["roleRef"]["name"] == name
                && b["roleRef"]["kind"] == kind
                && (kind == "ClusterRole" || b["metadata"]["namespace"] == ns.as_str())
        });
        let binding =
            binding.unwrap_or_else(|| panic!("{source}: {kind} {name} is bound to nothing"));
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": "hairpin", "namespace": "hairpin-system"}]),
            "{source}: {kind}Binding for {name} must bind exactly the agent's ServiceAccount"
        );
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
                            out.insert((
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

/// Every call of every variant: the agent's with its DaemonSet's env, and cleanup's
/// with its uninstall Job's env (the Job runs as the agent's ServiceAccount).
fn expected_calls(objs: &[Json], dir: &str, uninstall: &str) -> Option<Vec<Call>> {
    let run = run_args(&env_of(&agent(objs), dir), dir);
    let job = cleanup_job(&kustomize(uninstall)?);
    let cleanup = cleanup_args(&env_of(&job, uninstall), uninstall);
    Some(
        run_calls(&run)
            .into_iter()
            .chain(cleanup_calls(&cleanup))
            .collect(),
    )
}

#[test]
fn rbac_is_exactly_what_the_code_calls_in_each_variant() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        let Some(calls) = expected_calls(&objs, v.dir, v.uninstall) else {
            return;
        };
        let (rendered, expected) = (rendered_grants(&objs, v.dir), grants(&calls));
        let extra: Vec<_> = rendered.difference(&expected).collect();
        let missing: Vec<_> = expected.difference(&rendered).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{}: RBAC differs from the calls the code makes with this variant's settings\n  \
             granted, not called: {extra:?}\n  called, not granted: {missing:?}",
            v.dir
        );
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
        calls.extend(c);
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
    assert_eq!(
        configmaps(&of(&[("HAIRPIN_COREDNS", "corefile")])),
        ["get coredns", "get node-local-dns", "update coredns"]
            .map(String::from)
            .into()
    );
    assert_eq!(
        configmaps(&of(&[("HAIRPIN_COREDNS", "import")])),
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
        quiet
            .iter()
            .all(|g| g.2 == "services" || g.2 == "ingresses" || g.1.starts_with("gateway")),
        "no Events, no CoreDNS: no Lease; allowed clients given: no Node: {quiet:?}"
    );
}
