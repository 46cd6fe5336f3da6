//! The agent's side of the datapath's lifecycle: waiting while the lifecycle says
//! to (another agent holds the pin directory, another layout's datapath is live),
//! loading and attaching as it decides, and reporting what came of it (`status`,
//! metrics, the heartbeat task).
//!
//! Owns turning flags into [`LoadOptions`] and the lifecycle's outcome into reports.
//! Never links, swaps or detaches itself: `datapath::lifecycle` does.

use std::{net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use tokio::signal::unix::Signal;
use tracing::{info, warn};

use super::{StartError, chain};
use crate::agent::{
    args::{LinkOrderMode, RunArgs},
    mode::EbpfOutcome,
};
use crate::{
    datapath::{
        self, Datapath, DatapathError, KernelPath, LoadOptions, SlotAddrs, Started, lifecycle::Wait,
    },
    status::{
        AgentState, AttachmentStatus, EbpfFailure, KernelPathState, KernelPathStatus,
        LifecycleStatus, metrics::Metrics,
    },
};

/// Reports the attached datapath (`/status`, metrics), releases the pins earlier
/// releases left, and starts its heartbeat: the dead-man switch, beaten every
/// [`datapath::BEAT_EVERY`] while this agent runs; the connect programs stop acting
/// once no agent has beaten within the TTL. The first beat waits for `applied`
/// (the agent's first apply of what its source listed): until then this agent
/// knows no more than no agent at all of which adopted frontends still exist, so
/// an earlier agent's datapath lives on that agent's last beat, and goes as before
/// hairpin at its TTL if the source (the API server) cannot be read by then. The
/// heartbeat task's handle.
pub(super) fn report_datapath(
    args: &RunArgs,
    d: &Datapath,
    cgroup: Option<PathBuf>,
    state: &AgentState,
    metrics: &Metrics,
    applied: tokio::sync::oneshot::Receiver<()>,
) -> Option<tokio::task::AbortHandle> {
    if let Some(cgroup) = cgroup {
        state.set_attachment(Some(AttachmentStatus {
            cgroup,
            ids: d.kernel_ids(),
        }));
    }
    report_kernel_path(args, d, state, metrics);
    report_link_order(d, state, metrics);
    report_capabilities(d, metrics);
    release_inherited_pins(args);
    let hb = d.heartbeat().clone();
    if let Some(age) = hb.age() {
        let left = hb.ttl().saturating_sub(age);
        info!(
            adopted_heartbeat_age_s = age.as_secs(),
            live_for_s = left.as_secs(),
            "the heartbeat is beaten once this agent has applied what its source lists: until \
             then the adopted datapath lives on its last agent's beat"
        );
    }
    let beating = tokio::spawn(async move {
        // Dropped unsent: the agent stopped before its first apply, never vouched.
        if applied.await.is_ok() {
            hb.beat_every(datapath::BEAT_EVERY).await;
        }
    })
    .abort_handle();
    let hb = d.heartbeat();
    metrics.set_datapath_heartbeat(Arc::new(move || {
        (hb.age().map(|a| a.as_secs_f64()), hb.ttl().as_secs_f64())
    }));
    Some(beating)
}

/// Loads and attaches the programs as `--mode` allows. `auto` turns a failure into
/// [`EbpfOutcome::Failed`] with a warning; `ebpf` and `both` stop on it. While
/// another agent owns the pin directory, or a live datapath of another pin layout
/// is in it, this waits (not ready, and `status` says why): the running datapath
/// is neither broken nor silently taken over (see [`lifecycle`]). The log says why
/// every 30 s. SIGTERM or SIGINT meanwhile (the kubelet stopping a pod that never
/// got its turn, in a rollout) ends the wait at once with [`StartError::Stopped`]:
/// nothing was loaded, attached or pinned, so there is nothing to undo, and waiting
/// on would only end in the kubelet's SIGKILL at the grace period.
pub(super) async fn start_datapath(
    args: &RunArgs,
    state: &AgentState,
    signals: &mut (Signal, Signal),
) -> Result<(Option<Datapath>, EbpfOutcome, Option<PathBuf>), StartError> {
    if !args.mode.tries_ebpf() {
        info!("--mode fallback: no programs loaded");
        return Ok((None, EbpfOutcome::NotTried, None));
    }
    let mut said: Option<std::time::Instant> = None;
    let attached = loop {
        match attach(args) {
            Ok(Attached::Waiting(wait)) => {
                // The admin server already answers: readiness and `status` say why.
                let why = wait.to_string();
                if state.snapshot().datapath_wait.as_ref() != Some(&why) {
                    state.update(|s| s.datapath_wait = Some(why));
                }
                if said.is_none_or(|t| t.elapsed() >= DATAPATH_WAIT_LOG) {
                    warn!(reason = %wait, "waiting to own the datapath");
                    said = Some(std::time::Instant::now());
                }
                let signal = tokio::select! {
                    () = tokio::time::sleep(DATAPATH_WAIT_RETRY) => continue,
                    _ = signals.0.recv() => "SIGTERM",
                    _ = signals.1.recv() => "SIGINT",
                };
                warn!(signal, reason = %wait,
                    "stopped while waiting to own the datapath: nothing was attached or changed");
                return Err(StartError::Stopped { signal });
            }
            Ok(Attached::Ready(datapath, cgroup)) => break Ok((datapath, cgroup)),
            Err(e) => break Err(e),
        }
    };
    if said.is_some() {
        state.update(|s| s.datapath_wait = None);
    }
    match attached {
        Ok((datapath, cgroup)) => {
            info!(cgroup = %cgroup.display(), "programs attached");
            Ok((Some(datapath), EbpfOutcome::Attached, Some(cgroup)))
        }
        Err(e) if args.mode.requires_ebpf() => Err(e),
        Err(e) => {
            let reason = chain(&e);
            warn!(%reason, "eBPF could not be used on this node: falling back to the name relay (/etc/hosts, CoreDNS)");
            let kind = match &e {
                StartError::Datapath(DatapathError::Seccomp { .. }) => EbpfFailure::Seccomp,
                StartError::Datapath(DatapathError::Capabilities { .. }) => {
                    EbpfFailure::Capabilities
                }
                _ => EbpfFailure::Other,
            };
            Ok((None, EbpfOutcome::Failed(reason, kind), None))
        }
    }
}

/// How often a waiting agent tries again to own the datapath, and says so.
pub(super) const DATAPATH_WAIT_RETRY: Duration = Duration::from_secs(1);

pub(super) const DATAPATH_WAIT_LOG: Duration = Duration::from_secs(30);

/// What one attempt to own the datapath came to.
// A Datapath is large and a Wait small, but this is returned once per attempt.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per start attempt, never stored in bulk"
)]
pub(super) enum Attached {
    /// Loaded and attached at the cgroup.
    Ready(Datapath, PathBuf),
    /// The lifecycle waits (see [`Wait`]): nothing was changed.
    Waiting(Wait),
}

/// Finds the cgroup, and starts the datapath as the lifecycle decides: loaded and
/// attached, or waiting.
pub(super) fn attach(args: &RunArgs) -> Result<Attached, StartError> {
    let object = datapath::embedded_object().ok_or(DatapathError::NotEmbedded)?;
    let cgroup = match &args.cgroup_path {
        Some(p) => p.clone(),
        None => {
            let mountinfo =
                std::fs::read_to_string("/proc/self/mountinfo").map_err(StartError::Mountinfo)?;
            datapath::find_cgroup2_root(&mountinfo).ok_or(StartError::NoCgroup2)?
        }
    };
    let opts = load_options(args, &cgroup);
    if opts.kernel_path {
        info!(
            on = opts.mesh_cache,
            mode = ?args.mesh_listener_cache,
            cgroup = %cgroup.display(),
            "mesh listener cache (off: every kernel-path connect probes for a mesh proxy)"
        );
    }
    match datapath::start(object, &opts)? {
        Started::Waiting(wait) => Ok(Attached::Waiting(wait)),
        Started::Loaded { mut datapath, go } => {
            info!(start = %go, "datapath loaded");
            datapath.attach(&cgroup)?;
            Ok(Attached::Ready(datapath, cgroup))
        }
    }
}

/// What the datapath loads: `--max-frontends`, `--bypass-mark`, and the kernel path
/// unless `--kernel-path off` (its header names the node for host sockets as the relay does),
/// with the mesh cache where the programs attached at `cgroup` can keep it true.
pub(super) fn load_options(args: &RunArgs, cgroup: &std::path::Path) -> LoadOptions {
    LoadOptions {
        bypass_mark: args.bypass_mark,
        max_frontends: args.max_frontends,
        kernel_path: args.kernel_path.loads(),
        max_kernel_sockets: args.kernel_path_sockets,
        node_ipv4: args.node_ips.iter().find_map(|ip| match ip {
            IpAddr::V4(v) => Some(*v),
            IpAddr::V6(_) => None,
        }),
        node_ipv6: args.node_ips.iter().find_map(|ip| match ip {
            IpAddr::V6(v) => Some(*v),
            IpAddr::V4(_) => None,
        }),
        pin_dir: args.pin_dir().map(PathBuf::from),
        pin_layout: args.pin_layout,
        pin_owner: args.pin_owner,
        ttl: args.datapath_ttl,
        // Two sockets per relayed connection, each way spliced at most once.
        splice_sockets: u32::try_from(args.max_connections.saturating_mul(2))
            .unwrap_or(u32::MAX)
            .clamp(2, 1 << 20),
        link_order: match args.link_order {
            LinkOrderMode::First => datapath::LinkOrderWanted::First,
            LinkOrderMode::Append => datapath::LinkOrderWanted::Append,
            LinkOrderMode::Children => datapath::LinkOrderWanted::Children,
        },
        mesh_ports: args.mesh_capture_ports.slots(),
        mesh_cache: args.mesh_listener_cache.on_at(cgroup),
        slot_addrs: SlotAddrs::of(&super::names::relay_addresses(args)),
    }
}

/// Exports what the kernel gives hairpin (`hairpin_kernel_capability`): the kernel
/// path (unless `--kernel-path off` left it untried), the connect links' order, MPTCP
/// detection and the relay's kernel splice.
fn report_capabilities(d: &Datapath, metrics: &Metrics) {
    use crate::status::capabilities::KernelCapability as Cap;
    match d.kernel_path() {
        KernelPath::On => metrics.set_kernel_capability(Cap::KernelPath, true),
        KernelPath::Unavailable(_) => metrics.set_kernel_capability(Cap::KernelPath, false),
        KernelPath::Off => {}
    }
    metrics.set_kernel_capability(Cap::LinkOrder, d.link_order().orders());
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mptcp = match d.mptcp() {
        crate::status::MptcpDetection::Off => None,
        crate::status::MptcpDetection::MptcpSock => Some(true),
        // The subflow's TCP_NOTSENT_LOWAT reads u32::MAX from Linux 6.7 on; before,
        // an MPTCP subflow looks like any TCP socket to the connect programs.
        crate::status::MptcpDetection::NotsentLowat => {
            Some(crate::cli::doctor::kernel_version(&release).is_some_and(|v| v >= (6, 7)))
        }
    };
    if let Some(on) = mptcp {
        metrics.set_kernel_capability(Cap::MptcpDetection, on);
    }
    metrics.set_kernel_capability(Cap::KernelSplice, d.splice().is_ok());
}

/// Watches the sockets maps earlier releases pinned one per agent in
/// `--bpf-pin-dir` (their sockets still get their header from them) and removes
/// each pin once its map is empty.
pub(super) fn release_inherited_pins(args: &RunArgs) {
    let Some(dir) = args.pin_dir().filter(|d| d.is_dir()) else {
        return;
    };
    let (maps, failed) = datapath::pin::inherited(dir);
    for (path, why) in failed {
        warn!(pin = %path.display(), error = %why, "an earlier agent's pinned sockets map cannot be opened: left in place");
    }
    if !maps.is_empty() {
        tokio::spawn(datapath::pin::release_when_empty(
            maps,
            std::time::Duration::from_secs(2),
        ));
    }
}

/// Says in `status` where the connect programs run among the other connect programs
/// at the cgroup, and warns when another runs before them (a socket load balancer
/// there hides the LB address from them).
pub(crate) fn report_link_order(d: &Datapath, state: &AgentState, metrics: &Metrics) {
    let Some(order) = d.link_order_status() else {
        return;
    };
    info!(order = %order.ordering, "connect links");
    for hook in ["connect4", "connect6"] {
        metrics.set_connect_hook_behind(hook, order.behind(hook));
    }
    if let Some(c) = order.children.as_ref().filter(|c| c.root_processes > 0) {
        warn!(
            root_processes = c.root_processes,
            children = %c.cgroups.join(", "),
            "hairpin's connect programs are at the child cgroups: the processes in the root cgroup itself meet the other program at the root first"
        );
    }
    for hook in order.blocked() {
        let front: Vec<String> = hook.in_front.iter().map(ToString::to_string).collect();
        warn!(
            hook = %hook.hook,
            in_front = %front.join(", "),
            remedy = order.remedy(),
            "another connect program runs before hairpin's: a socket load balancer there rewrites the LB address before hairpin sees it"
        );
    }
    if let Some(e) = &order.error {
        warn!(error = %e, "the order of the connect programs is not known");
    }
    state.update(|s| s.link_order = Some(order));
}

/// Says in `status` and the log how the kernel path stands, and exports the
/// programs' counters on `/metrics`.
pub(super) fn report_kernel_path(
    args: &RunArgs,
    d: &Datapath,
    state: &AgentState,
    metrics: &Metrics,
) {
    let (kernel_state, reason, reason_kind) = match d.kernel_path() {
        KernelPath::On => (KernelPathState::On, None, None),
        KernelPath::Off => (KernelPathState::Off, None, None),
        KernelPath::Unavailable(why) => (
            KernelPathState::Unavailable,
            Some(why.to_string()),
            Some(why.kind()),
        ),
    };
    info!(configured = %args.kernel_path, state = %d.kernel_path(), "kernel path");
    let ids = d.kernel_ids();
    state.update(|s| {
        s.kernel_path = Some(KernelPathStatus {
            configured: args.kernel_path,
            state: kernel_state,
            reason,
            reason_kind,
            sockets_map_id: d
                .kernel_path()
                .is_on()
                .then(|| d.sockets_map_id())
                .flatten(),
            sockets_capacity: d.kernel_path().is_on().then_some(args.kernel_path_sockets),
            sockets_map_pin: d.sockets_pin().map(|p| p.display().to_string()),
            sockets_map_pin_error: match d.pin() {
                datapath::Pin::Failed(why) => Some(why.to_string()),
                _ => None,
            },
            mptcp_detection: Some(d.mptcp()),
        })
    });
    state.update(|s| {
        s.lifecycle = Some(LifecycleStatus {
            pin_dir: match d.pin() {
                datapath::Pin::Pinned(p) => Some(p.display().to_string()),
                _ => None,
            },
            pin_error: match d.pin() {
                datapath::Pin::Failed(why) => Some(why.to_string()),
                _ => None,
            },
            layout: args.pin_layout,
            ttl_seconds: args.datapath_ttl.as_secs(),
            heartbeat_age_seconds: None,
            adopted: d
                .attachment()
                .map(|a| a.adopted_status())
                .unwrap_or_default(),
        })
    });
    // Until the agent's own reader replaces it (see `Agent::start`): by id.
    if let Some(id) = ids.counters_map_id {
        metrics.set_kernel_counters(Arc::new(move || {
            datapath::kernel_objects::read_counters(id)
                .map(|c| c.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
                .unwrap_or_default()
        }));
    }
}
