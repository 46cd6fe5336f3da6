//! What the Roles grant against what the code calls: per variant, in the chart hooks,
//! per account (the agent, the writer, the uninstall), and the call table itself.

use super::*;

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
                            "grpcroutes",
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
