//! deploy/uninstall: `hairpin-agent cleanup` once per node (a DaemonSet with the
//! node's /etc/hosts and its bpf filesystem, mounted as the agents' DaemonSet mounts
//! it) and once per cluster (a Job as the agent's ServiceAccount, and for the CoreDNS
//! overlays one as the writer's), with the settings of the install it undoes.

use std::{collections::BTreeSet, path::Path};

use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Container, PodSpec, Volume, VolumeMount},
};
use serde_json::Value as Json;

use super::{
    VARIANTS,
    flags::{cleanup_args, run_args, writer_args},
    render::{
        agent, daemonset, env_of, find, host_path, kind_names, kustomize, parse_all, pod_spec,
        typed, writer,
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

/// Whether `pod` mounts the host's /sys/fs/bpf anywhere, or has it as a volume.
fn touches_bpffs(pod: &PodSpec) -> bool {
    let containers = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten());
    containers
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .any(|m| {
            let p = Path::new(&m.mount_path);
            p.starts_with("/sys/fs/bpf") || p.starts_with("/host/sys/fs/bpf")
        })
        || pod.volumes.iter().flatten().any(|v| {
            v.host_path
                .as_ref()
                .is_some_and(|h| Path::new(&h.path).starts_with("/sys/fs/bpf"))
        })
}

/// The cleanup Job's container.
pub fn cleanup_job(objs: &[Json]) -> Container {
    let job: Job =
        typed(find(objs, "Job", "hairpin-cleanup").expect("a Job named hairpin-cleanup"));
    let pod = job.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(pod.containers.len(), 1, "one container");
    pod.containers[0].clone()
}

/// The CoreDNS cleanup Job's container (uninstalls of the CoreDNS overlays).
pub fn coredns_cleanup_job(objs: &[Json]) -> Option<Container> {
    let pod = job_pod(objs, "hairpin-cleanup-coredns")?;
    assert_eq!(pod.containers.len(), 1, "one container");
    Some(pod.containers[0].clone())
}

fn job_pod(objs: &[Json], name: &str) -> Option<k8s_openapi::api::core::v1::PodSpec> {
    let job: Job = typed(find(objs, "Job", name)?);
    Some(job.spec.expect("spec").template.spec.expect("pod spec"))
}

fn runs_cleanup(c: &Container, source: &str) {
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/hairpin-agent".to_string()][..]),
        "{source}: {}",
        c.name
    );
    assert_eq!(
        c.args.as_deref(),
        Some(&["cleanup".to_string()][..]),
        "{source}"
    );
}

#[test]
fn each_install_has_an_uninstall_that_undoes_what_its_agent_wrote() {
    for v in VARIANTS {
        let Some(install) = kustomize(v.dir) else {
            return;
        };
        let Some(objs) = kustomize(v.uninstall) else {
            return;
        };
        parse_all(&objs, v.uninstall);
        let kinds = kind_names(&objs);
        // Only these: `kubectl delete -k` of the uninstall must leave the ServiceAccounts
        // and RBAC, which the Jobs use, to the install's own delete.
        let mut want = vec!["DaemonSet/hairpin-cleanup", "Job/hairpin-cleanup"];
        if v.coredns != hairpin_agent::k8s::coredns::CorednsMode::Off {
            want.push("Job/hairpin-cleanup-coredns");
        }
        assert_eq!(kinds, want, "{}", v.uninstall);
        let agent_c = agent(&install);
        let run = run_args(&env_of(&agent_c, v.dir), v.dir);

        // Per node: the hosts block, through the same hostPath the agent wrote.
        let ds = daemonset(&objs, "hairpin-cleanup");
        let pod = pod_spec(&ds);
        let init = pod.init_containers.clone().unwrap_or_default();
        assert_eq!(
            init.len(),
            1,
            "{}: one init container, the cleanup",
            v.uninstall
        );
        runs_cleanup(&init[0], v.uninstall);
        let node = cleanup_args(&env_of(&init[0], v.uninstall), v.uninstall);
        let hosts = node
            .hosts_file
            .clone()
            .expect("the node step cleans the hosts file");
        assert_eq!(
            host_path(&pod, &init[0], &hosts, v.uninstall),
            ("/etc/hosts".into(), "File".into(), false),
            "{}: the node's /etc/hosts, writable",
            v.uninstall
        );
        if let Some(agent_hosts) = &run.hosts_file {
            let install_pod = pod_spec(&daemonset(&install, "hairpin"));
            assert_eq!(
                host_path(&install_pod, &agent_c, agent_hosts, v.dir).0,
                "/etc/hosts",
                "{}: the file the agent wrote is the one cleaned",
                v.dir
            );
        }
        // And the kernel path's pins, through the host's bpf filesystem (as the
        // agents' DaemonSet mounts it: the next test). Nothing else of the node.
        let mounts: Vec<(&str, &str)> = init[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [("hosts", "/host/etc/hosts"), ("bpffs", BPFFS_MOUNT)],
            "{}: the cleanup's mounts",
            v.uninstall
        );
        let volumes: Vec<&str> = pod
            .volumes
            .iter()
            .flatten()
            .map(|vol| vol.name.as_str())
            .collect();
        assert_eq!(volumes, ["hosts", "bpffs"], "{}: the volumes", v.uninstall);
        assert_eq!(
            node.bpf_pin_dir, run.bpf_pin_dir,
            "{}: the directory the agents of {} pin in",
            v.uninstall, v.dir
        );
        assert_eq!(
            node.scope,
            hairpin_agent::cli::cleanup::Scope::Node,
            "{}: the node step leaves the API steps to the Job",
            v.uninstall
        );
        assert_eq!(
            pod.automount_service_account_token,
            Some(false),
            "{}: the node step needs no API token",
            v.uninstall
        );
        assert_eq!(
            node.coredns,
            hairpin_agent::k8s::coredns::CorednsMode::Off,
            "{}: CoreDNS is the Job's",
            v.uninstall
        );
        let tol = pod.tolerations.clone().unwrap_or_default();
        assert!(
            tol.iter()
                .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
            "{}: every node the agent ran on",
            v.uninstall
        );
        let pause = &pod.containers;
        assert!(
            pause.len() == 1
                && pause[0]
                    .image
                    .as_deref()
                    .is_some_and(|i| i.starts_with("registry.k8s.io/pause:")),
            "{}: the pod idles once clean, so rollout status says every node is done",
            v.uninstall
        );
        assert!(
            pause[0].volume_mounts.is_none(),
            "{}: the pause container mounts nothing of the node",
            v.uninstall
        );

        // Once per cluster: the Lease and the CoreDNS lines, as the agent's
        // ServiceAccount (rbac.rs checks those Roles grant exactly these calls).
        let cluster_pod = job_pod(&objs, "hairpin-cleanup").expect("the Job");
        assert_eq!(
            cluster_pod.service_account_name.as_deref(),
            Some("hairpin"),
            "{}",
            v.uninstall
        );
        let job = cleanup_job(&objs);
        runs_cleanup(&job, v.uninstall);
        let cluster = cleanup_args(&env_of(&job, v.uninstall), v.uninstall);
        assert_eq!(
            cluster.scope,
            hairpin_agent::cli::cleanup::Scope::Cluster,
            "{}: the Job cleans the cluster-wide objects only",
            v.uninstall
        );
        assert!(
            cluster.hosts_file.is_none(),
            "{}: no host access in the Job",
            v.uninstall
        );
        assert!(
            cluster_pod.volumes.is_none() && job.volume_mounts.is_none(),
            "{}: the Job mounts nothing",
            v.uninstall
        );
        assert_eq!(
            cluster.lease.to_string(),
            format!("{}/{}", run.namespace, run.lease_name),
            "{}: the Lease the agents of {} elect",
            v.uninstall,
            v.dir
        );
        assert_eq!(
            cluster.coredns,
            hairpin_agent::k8s::coredns::CorednsMode::Off,
            "{}: the agents wrote no CoreDNS, and their account may not touch it",
            v.uninstall
        );
        let written = |mode, objects: &hairpin_agent::k8s::coredns::CorednsObjects| match mode {
            hairpin_agent::k8s::coredns::CorednsMode::Off => None,
            hairpin_agent::k8s::coredns::CorednsMode::Corefile => {
                Some(objects.configmap.to_string())
            }
            hairpin_agent::k8s::coredns::CorednsMode::Import => {
                Some(objects.custom_configmap.to_string())
            }
        };
        // Once per cluster, as the writer's ServiceAccount: its lines and its Lease.
        match (writer(&install), coredns_cleanup_job(&objs)) {
            (None, None) => {}
            (Some(w), Some(job)) => {
                let w = writer_args(&env_of(&w, v.dir), v.dir);
                let pod = job_pod(&objs, "hairpin-cleanup-coredns").expect("the Job");
                assert_eq!(
                    pod.service_account_name.as_deref(),
                    Some("hairpin-coredns"),
                    "{}",
                    v.uninstall
                );
                runs_cleanup(&job, v.uninstall);
                let c = cleanup_args(&env_of(&job, v.uninstall), v.uninstall);
                assert_eq!(
                    c.scope,
                    hairpin_agent::cli::cleanup::Scope::Cluster,
                    "{}",
                    v.uninstall
                );
                assert!(c.hosts_file.is_none(), "{}", v.uninstall);
                assert!(
                    pod.volumes.is_none() && job.volume_mounts.is_none(),
                    "{}: the Job mounts nothing",
                    v.uninstall
                );
                assert_eq!(
                    c.lease.to_string(),
                    format!("{}/{}", w.namespace, w.lease_name),
                    "{}: the writers' Lease",
                    v.uninstall
                );
                assert_eq!(c.coredns, w.coredns, "{}", v.uninstall);
                assert_eq!(
                    written(c.coredns, &c.coredns_objects),
                    written(w.coredns, &w.coredns_objects),
                    "{}: the ConfigMap the writer of {} wrote",
                    v.uninstall,
                    v.dir
                );
                assert_eq!(job.image, agent_c.image, "{}", v.uninstall);
            }
            (w, j) => panic!(
                "{}: a writer ({}) needs a CoreDNS cleanup Job ({})",
                v.uninstall,
                w.is_some(),
                j.is_some()
            ),
        }
        let image = |c: &Container| c.image.clone().expect("image");
        assert_eq!(
            image(&job),
            image(&agent_c),
            "{}: the installed agent's image",
            v.uninstall
        );
        assert_eq!(image(&init[0]), image(&agent_c), "{}", v.uninstall);
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
        for obj in &objs {
            let kind = obj["kind"].as_str().unwrap_or_default();
            if !matches!(kind, "DaemonSet" | "Job" | "Deployment") {
                continue;
            }
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            let source = format!("{dir}: {kind} {name}");
            let pod: PodSpec = serde_json::from_value(obj["spec"]["template"]["spec"].clone())
                .unwrap_or_else(|e| panic!("{source}: pod spec: {e}"));
            let cleanups: Vec<&Container> = pod
                .init_containers
                .iter()
                .flatten()
                .chain(&pod.containers)
                .filter(|c| c.args.as_deref() == Some(&["cleanup".to_string()][..]))
                .collect();
            assert!(!cleanups.is_empty(), "{source}: runs no cleanup");
            let mut node_scope = false;
            for c in cleanups {
                let args = cleanup_args(&env_of(c, &source), &source);
                if args.scope == hairpin_agent::cli::cleanup::Scope::Cluster {
                    continue;
                }
                node_scope = true;
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
            if node_scope {
                node_pods += 1;
            } else {
                assert!(
                    !touches_bpffs(&pod),
                    "{source}: a cluster-scope cleanup needs no bpf filesystem"
                );
            }
        }
        assert_eq!(node_pods, 1, "{dir}: one node-scope cleanup pod");
    }
}
