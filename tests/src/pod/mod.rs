//! The DaemonSet's pod as written in `deploy/base/daemonset.yaml`, run the way a
//! container runtime (containerd's CRI plugin and runc) runs it, on a simulated node:
//!
//! - the container's `command`, `args` and `env`, downward API `fieldRef`s filled from
//!   the simulated node (node name, namespace, pod name, host IPs);
//! - the node's network namespace (`hostNetwork: true`), inside the node's cgroup
//!   subtree, with a cgroup namespace of its own rooted there (mounted read-only at
//!   `/sys/fs/cgroup`, as runc does on cgroup v2);
//! - a private mount namespace whose root is a fresh tmpfs holding the image's content
//!   (the host's `/usr`, `/etc` and library directories, read-only, standing in for the
//!   debian-slim image the Dockerfile builds), the agent binary at the `command` path,
//!   `/proc`, `/dev` and a read-only `/sys`, and every `hostPath` volume bind-mounted
//!   at its `mountPath` from a per-test stand-in, read-only where `readOnly` says so;
//!   the root then remounted read-only (`readOnlyRootFilesystem`) and pivoted into;
//! - `runAsUser`/`runAsGroup`, supplementary groups cleared;
//! - capabilities as containerd's CRI plugin sets them for `drop: [ALL]` plus `add`:
//!   bounding, permitted and effective exactly the added ones; inheritable and ambient
//!   empty (containerd 1.6.2+ and runc 1.1.1+ leave inheritable empty since
//!   CVE-2022-24769; for uid 0 it makes no difference, exec gives root its bounding set);
//! - `no_new_privs` when `allowPrivilegeEscalation: false`;
//! - last, a seccomp filter built from a profile in `tests/fixtures/seccomp/` resolved
//!   for the container's capabilities and this machine's architecture as containerd's
//!   `DefaultProfile` resolves it (`RuntimeDefault`), or a Localhost profile as it is.
//!
//! Not simulated: the pod's own PID, IPC and UTS namespaces, the masked /proc paths, the service
//! account token (the fake API server speaks plain HTTP, so the agent gets a
//! kubeconfig through `KUBECONFIG` instead of the in-cluster files), and AppArmor.
//!
//! The setup runs in `hairpin-pod` (`src/bin/hairpin-pod.rs`), a single-threaded
//! helper that does it step by step and then execs the agent: no work between fork and
//! exec in the multithreaded test process.
//!
//! The parts: `container.rs` (the container as written), `seccomp.rs` (its filter),
//! `launch.rs` (what `hairpin-pod` makes and execs), `caps.rs` (capabilities),
//! `process.rs` (the running pod).

mod caps;
mod container;
mod launch;
mod process;
mod seccomp;

pub use caps::{cap_number, with_only_caps};
pub use container::{Container, Downward, EnvSource, HostMount, daemonset_container};
pub use launch::{Bind, Launch, exec_container};
pub use process::PodProcess;
pub use seccomp::{Resolved, SeccompRule, compile_filters, goarch, kernel, resolve_profile};
