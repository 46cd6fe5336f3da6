//! The kernel path's hostPath (`/sys/fs/bpf/hairpin`, `DirectoryOrCreate`) on a node
//! without a bpf filesystem at `/sys/fs/bpf`: the kubelet makes the directory with
//! mkdir, which sysfs refuses, so the volume never mounts and the pod stays in
//! ContainerCreating. docs/troubleshooting.md must say so (it once called it fine).
//!
//! The node is a fresh sysfs mounted in a mount namespace of the test's own (what the
//! host's /sys is before bpffs is mounted over /sys/fs/bpf); the machine's /sys/fs/bpf
//! is never touched.

use std::process::Command;

use hairpin_tests::{helm::render_workspace_chart, repo::workspace};

/// The bpffs volume's host path and type, as the chart renders them by default.
fn bpffs_host_path() -> (String, String) {
    let objects = render_workspace_chart("hairpin-system", "hairpin", &[]);
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let volume = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "bpffs")
        .expect("the bpffs volume");
    let host = &volume["hostPath"];
    (
        host["path"].as_str().expect("path").to_string(),
        host["type"].as_str().expect("type").to_string(),
    )
}

/// `mkdir -p` of `path` (under /sys) on a fresh sysfs, with bpffs mounted over its
/// fs/bpf first when `bpffs`; returns mkdir's error, if any.
fn mkdir_on_fresh_sysfs(path: &str, bpffs: bool) -> Option<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().display().to_string();
    let inside = path.strip_prefix("/sys/").expect("a path under /sys");
    let mount_bpffs = if bpffs {
        format!("mount -t bpf bpf {root}/fs/bpf && ")
    } else {
        String::new()
    };
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t sysfs sysfs {root} && {mount_bpffs}mkdir -p {root}/{inside}"
        ))
        .output()
        .expect("run unshare");
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn without_bpffs_the_kernel_paths_host_path_cannot_be_made_and_the_doc_says_so() {
    if !hairpin_tests::privileges::datapath_tests_can_run(module_path!()) {
        return;
    }
    let (path, kind) = bpffs_host_path();
    assert_eq!(kind, "DirectoryOrCreate", "the kubelet makes {path} itself");
    // With bpffs over /sys/fs/bpf (systemd's mount, the doc's remedy): made.
    assert_eq!(mkdir_on_fresh_sysfs(&path, true), None);
    // Without: sysfs refuses the directory; the kubelet's MkdirAll fails alike.
    let err = mkdir_on_fresh_sysfs(&path, false).expect("sysfs refuses the directory");
    assert!(err.contains("No such file or directory"), "{err}");

    let doc = std::fs::read_to_string(workspace().join("docs/troubleshooting.md"))
        .expect("docs/troubleshooting.md");
    let entry: String = doc
        .split("\n- ")
        .find(|e| e.starts_with(&format!("`{path}`")))
        .unwrap_or_else(|| panic!("docs/troubleshooting.md has no entry for `{path}`"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for said in [
        "ContainerCreating",
        "MountVolume.SetUp failed for volume \"bpffs\"",
        &format!("mkdir {path}: no such file or directory"),
        "kernelPath.mode=off",
    ] {
        assert!(
            entry.contains(said),
            "the entry for {path} does not say {said:?}: {entry}"
        );
    }
    assert!(
        !entry.contains("fine"),
        "the entry for {path} calls it fine: {entry}"
    );
}
