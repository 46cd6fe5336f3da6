//! deploy/uninstall: one `kubectl apply -k` that removes everything its install
//! wrote, in the order that leaves the cluster as it was. The Job (`hairpin-agent
//! uninstall`, as its own ServiceAccount) stops exactly the install's workloads,
//! deletes exactly their Leases and CoreDNS writing, waits for the node cleanup
//! (`cleanup --scope node` per node, after the agents are gone, with the agents'
//! own paths), and deletes the namespace with exactly the objects outside it.

use std::{collections::BTreeSet, path::Path};

use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Container, PodSpec, Volume, VolumeMount},
};
use serde_json::Value as Json;

use hairpin_agent::{
    cli::{Owned, Scope, Step, UninstallArgs, Workload},
    k8s::CorednsMode,
};

use super::{
    VARIANTS,
    flags::{cleanup_args, run_args, uninstall_args, writer_args},
    render::{
        agent, daemonset, env_of, find, host_path, kustomize, parse_all, pod_spec, typed, writer,
    },
};

/// The install whose agents pin the sockets maps the node cleanup removes (every
/// variant runs the kernel path by default).
const KERNEL_PATH: &str = "deploy";

/// hairpin's directory of the host's bpf filesystem.
const BPFFS: &str = "/sys/fs/bpf/hairpin";

/// Where the pods mount [`BPFFS`] (outside the container's sysfs, in which no mount
/// point can be made), their `--bpf-pin-dir`.
const BPFFS_MOUNT: &str = "/host/sys/fs/bpf/hairpin";

/// The agent's mount of the host's bpf filesystem and its volume, as the default
/// install renders them.
fn kernel_path_bpffs() -> Option<(VolumeMount, Volume)> {
    let objs = kustomize(KERNEL_PATH)?;
    let pod = pod_spec(&daemonset(&objs, "hairpin"));
    Some(bpffs_of(&pod, &agent(&objs), KERNEL_PATH))
}

/// `c`'s mount of the host's bpf filesystem and the pod's volume behind it.
fn bpffs_of(pod: &PodSpec, c: &Container, source: &str) -> (VolumeMount, Volume) {
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == BPFFS_MOUNT)
        .unwrap_or_else(|| panic!("{source}: {} mounts nothing at {BPFFS_MOUNT}", c.name))
        .clone();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("{source}: volume {} missing", mount.name))
        .clone();
    (mount, volume)
}

/// The uninstall Job's container and its pod.
pub(crate) fn uninstall_job(objs: &[Json]) -> (PodSpec, Container) {
    let job: Job =
        typed(find(objs, "Job", "hairpin-uninstall").expect("a Job named hairpin-uninstall"));
    let pod = job.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(pod.containers.len(), 1, "one container");
    let c = pod.containers[0].clone();
    (pod, c)
}

/// The Job's settings.
pub(crate) fn uninstall_job_args(objs: &[Json], source: &str) -> UninstallArgs {
    uninstall_args(&env_of(&uninstall_job(objs).1, source), source)
}

fn runs(c: &Container, sub: &str, source: &str) {
    assert_eq!(
        (c.command.as_deref(), c.args.as_deref()),
        (
            Some(&["/usr/local/bin/hairpin-agent".to_string()][..]),
            Some(&[sub.to_string()][..])
        ),
        "{source}: {}",
        c.name
    );
}

/// `namespace/name` of an object (`-` for cluster-scoped).
fn key_of(o: &Json) -> (String, String, String) {
    (
        o["kind"].as_str().unwrap_or_default().to_string(),
        o["metadata"]["namespace"]
            .as_str()
            .unwrap_or("-")
            .to_string(),
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// What `--with-namespace` names, as (kind, namespace, name).
fn owned_key(o: &Owned) -> (String, String, String) {
    match o {
        Owned::ClusterRole(n) => ("ClusterRole".into(), "-".into(), n.clone()),
        Owned::ClusterRoleBinding(n) => ("ClusterRoleBinding".into(), "-".into(), n.clone()),
        Owned::Role(n) => ("Role".into(), n.namespace.clone(), n.name.clone()),
        Owned::RoleBinding(n) => ("RoleBinding".into(), n.namespace.clone(), n.name.clone()),
    }
}

#[test]
fn each_install_has_a_one_command_uninstall_that_stops_and_removes_exactly_what_it_made() {
    for v in VARIANTS {
        let (Some(install), Some(objs)) = (kustomize(v.dir), kustomize(v.uninstall)) else {
            return;
        };
        parse_all(&objs, v.uninstall);
        let u = uninstall_job_args(&objs, v.uninstall);
        let run = run_args(&env_of(&agent(&install), v.dir), v.dir);
        let (pod, job) = uninstall_job(&objs);
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("hairpin-uninstall"),
            "{}",
            v.uninstall
        );
        assert!(
            pod.volumes.is_none() && job.volume_mounts.is_none(),
            "{}: the Job mounts nothing",
            v.uninstall
        );
        runs(&job, "uninstall", v.uninstall);
        assert_eq!(u.step, Step::All, "{}", v.uninstall);

        // Stops the writer first (CoreDNS is restored before the agents go), then
        // the agents: exactly the install's workloads.
        let workloads: Vec<String> = install
            .iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("DaemonSet" | "Deployment")))
            .map(|o| {
                let (k, ns, n) = key_of(o);
                format!("{}/{ns}/{n}", k.to_lowercase())
            })
            .collect();
        let stop: Vec<String> = u.stop.iter().map(Workload::to_string).collect();
        let mut sorted = stop.clone();
        sorted.sort();
        let mut want = workloads.clone();
        want.sort();
        assert_eq!(
            sorted, want,
            "{}: --stop is the install's workloads",
            v.uninstall
        );
        let agents = format!("daemonset/{}", run.daemonset.as_ref().expect("--daemonset"));
        assert_eq!(
            stop.last(),
            Some(&agents),
            "{}: the agents last: {stop:?}",
            v.uninstall
        );

        // The Leases and the CoreDNS writing of exactly those processes.
        let mut leases = vec![format!("{}/{}", run.namespace, run.lease_name)];
        match writer(&install) {
            None => assert_eq!(u.cluster.coredns.mode, CorednsMode::Off, "{}", v.uninstall),
            Some(w) => {
                let w = writer_args(&env_of(&w, v.dir), v.dir);
                leases.insert(0, format!("{}/{}", w.namespace, w.lease_name));
                assert_eq!(u.cluster.coredns.mode, w.coredns, "{}", v.uninstall);
                let written = |mode, o: &hairpin_agent::k8s::CorednsObjects| match mode {
                    CorednsMode::Corefile => o.configmap.to_string(),
                    CorednsMode::Import => o.custom_configmap.to_string(),
                    CorednsMode::Off => String::new(),
                };
                assert_eq!(
                    written(u.cluster.coredns.mode, &u.cluster.coredns.objects),
                    written(w.coredns, &w.coredns_objects),
                    "{}",
                    v.uninstall
                );
                assert_eq!(
                    Some(written(w.coredns, &w.coredns_objects).as_str()),
                    v.written
                );
            }
        }
        let got: Vec<String> = u.leases.iter().map(ToString::to_string).collect();
        assert_eq!(got, leases, "{}: --lease", v.uninstall);

        // Waits for the node cleanup of this same kustomization.
        let nodes = u.nodes.clone().expect("--nodes");
        assert!(
            find(&objs, "DaemonSet", &nodes.name).is_some(),
            "{}: {nodes}",
            v.uninstall
        );

        // Deletes the install's namespace, and with it exactly every object of the
        // install and of this uninstall that lives outside it.
        let ns = u.delete_namespace.clone().expect("--delete-namespace");
        assert!(
            install
                .iter()
                .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == ns.as_str()),
            "{}",
            v.uninstall
        );
        let outside: BTreeSet<(String, String, String)> = install
            .iter()
            .chain(&objs)
            .map(key_of)
            .filter(|(k, o_ns, _)| k != "Namespace" && *o_ns != ns)
            .collect();
        let owned: BTreeSet<(String, String, String)> =
            u.with_namespace.iter().map(owned_key).collect();
        assert_eq!(owned, outside, "{}: --with-namespace", v.uninstall);
    }
}

#[test]
fn the_node_cleanup_waits_for_the_agents_then_cleans_what_they_wrote_with_their_paths() {
    for v in VARIANTS {
        let (Some(install), Some(objs)) = (kustomize(v.dir), kustomize(v.uninstall)) else {
            return;
        };
        let run = run_args(&env_of(&agent(&install), v.dir), v.dir);
        let ds = daemonset(&objs, "hairpin-cleanup");
        let pod = pod_spec(&ds);
        let init = pod.init_containers.clone().unwrap_or_default();
        let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["await-agents", "cleanup"], "{}", v.uninstall);

        // First: until the agents' DaemonSet is gone (every agent has exited), as
        // an account that can read only that DaemonSet.
        runs(&init[0], "uninstall", v.uninstall);
        let wait = uninstall_args(&env_of(&init[0], v.uninstall), v.uninstall);
        assert_eq!(wait.step, Step::AwaitStopped, "{}", v.uninstall);
        let agents: Vec<String> = wait.stop.iter().map(Workload::to_string).collect();
        assert_eq!(
            agents,
            [format!(
                "daemonset/{}",
                run.daemonset.as_ref().expect("--daemonset")
            )],
            "{}",
            v.uninstall
        );
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("hairpin-cleanup"),
            "{}",
            v.uninstall
        );
        assert!(
            init[0].volume_mounts.is_none(),
            "{}: the waiting step mounts nothing of the node",
            v.uninstall
        );

        // Then the node's files, links and pins, with the agent's own settings.
        runs(&init[1], "cleanup", v.uninstall);
        let node = cleanup_args(&env_of(&init[1], v.uninstall), v.uninstall);
        assert_eq!(node.scope, Scope::Node, "{}", v.uninstall);
        assert_eq!(
            node.bpf_pin_dir, run.bpf_pin_dir,
            "{}: the agents' pin directory",
            v.uninstall
        );
        assert_eq!(
            node.hosts_file.is_some(),
            run.hosts_file.is_some(),
            "{}: --hosts-file",
            v.uninstall
        );
        let mut want = Vec::new();
        if let Some(hosts) = &node.hosts_file {
            let install_pod = pod_spec(&daemonset(&install, "hairpin"));
            let agent_c = agent(&install);
            let agent_hosts = run.hosts_file.as_ref().expect("the agent's hosts file");
            assert_eq!(
                host_path(&pod, &init[1], hosts, v.uninstall).0,
                host_path(&install_pod, &agent_c, agent_hosts, v.dir).0,
                "{}: the file the agent wrote is the one cleaned",
                v.uninstall
            );
            want.push(("hosts", "/host/etc/hosts"));
        }
        want.push(("bpffs", BPFFS_MOUNT));
        let mounts: Vec<(&str, &str)> = init[1]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts, want,
            "{}: the cleanup's mounts, and nothing else of the node",
            v.uninstall
        );
        assert!(
            pod.tolerations
                .iter()
                .flatten()
                .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
            "{}: every node the agent ran on",
            v.uninstall
        );
        // Then idles in the agent's own image (no pause image to pull or mirror),
        // so that readiness tells the Job this node is clean.
        let done = &pod.containers;
        assert_eq!(done.len(), 1, "{}", v.uninstall);
        runs(&done[0], "uninstall", v.uninstall);
        assert_eq!(
            uninstall_args(&env_of(&done[0], v.uninstall), v.uninstall).step,
            Step::Idle
        );
        assert!(done[0].volume_mounts.is_none(), "{}", v.uninstall);
        for c in init.iter().chain(done) {
            assert_eq!(
                c.image,
                agent(&install).image,
                "{}: {}: the installed agent's image",
                v.uninstall,
                c.name
            );
        }
    }
}

#[test]
fn every_node_scope_cleanup_pod_mounts_the_host_bpf_filesystem_as_the_kernel_path_does() {
    let Some((want_mount, want_volume)) = kernel_path_bpffs() else {
        return;
    };
    // The install's shape, which the cleanup must match: hairpin's directory of the
    // host's bpf filesystem, made when missing, at the same mount path, writable
    // (cleanup unlinks the pins).
    assert_eq!(
        (want_mount.name.as_str(), want_mount.mount_path.as_str()),
        ("bpffs", BPFFS_MOUNT)
    );
    let hp = want_volume.host_path.clone().expect("a hostPath");
    assert_eq!(
        (hp.path.as_str(), hp.type_.as_deref(), want_mount.read_only),
        (BPFFS, Some("DirectoryOrCreate"), None),
        "{KERNEL_PATH}"
    );
    let uninstalls: BTreeSet<&str> = VARIANTS.iter().map(|v| v.uninstall).collect();
    for dir in uninstalls {
        let Some(objs) = kustomize(dir) else { return };
        let mut node_pods = 0;
        for obj in objs
            .iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("DaemonSet" | "Job")))
        {
            let source = format!("{dir}: {} {}", obj["kind"], obj["metadata"]["name"]);
            let pod: PodSpec = serde_json::from_value(obj["spec"]["template"]["spec"].clone())
                .unwrap_or_else(|e| panic!("{source}: pod spec: {e}"));
            let cleanups: Vec<&Container> = pod
                .init_containers
                .iter()
                .flatten()
                .chain(&pod.containers)
                .filter(|c| c.args.as_deref() == Some(&["cleanup".to_string()][..]))
                .collect();
            if cleanups.is_empty() {
                assert!(
                    !pod.containers
                        .iter()
                        .chain(pod.init_containers.iter().flatten())
                        .any(|c| c
                            .volume_mounts
                            .iter()
                            .flatten()
                            .any(|m| Path::new(&m.mount_path).starts_with("/host"))),
                    "{source}: only the node cleanup mounts anything of the node"
                );
                continue;
            }
            node_pods += 1;
            for c in cleanups {
                let args = cleanup_args(&env_of(c, &source), &source);
                assert_eq!(args.scope, Scope::Node, "{source}");
                let (mount, volume) = bpffs_of(&pod, c, &source);
                assert_eq!(mount, want_mount, "{source}: the mount, as {KERNEL_PATH}");
                assert_eq!(
                    volume, want_volume,
                    "{source}: the volume, as {KERNEL_PATH}"
                );
                assert_eq!(
                    host_path(&pod, c, Path::new(BPFFS_MOUNT), &source),
                    (BPFFS.into(), "DirectoryOrCreate".into(), false),
                    "{source}: the host's bpf filesystem, writable"
                );
                assert!(
                    args.bpf_pin_dir == Path::new(BPFFS_MOUNT),
                    "{source}: --bpf-pin-dir {} is not the mounted {BPFFS_MOUNT}",
                    args.bpf_pin_dir.display()
                );
            }
        }
        assert_eq!(node_pods, 1, "{dir}: one node-scope cleanup pod");
    }
}
