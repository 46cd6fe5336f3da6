//! `hairpin-agent doctor`: can hairpin work on this node, and what stands in the way?
//! Each check reports ok, warn, fail or skip, with a concrete fix when not ok.

use serde::Serialize;

use super::{
    AdminArgs, CliError, OutputFormat, colour_stdout,
    kube_proxy::KubeProxy,
    print_json, print_text,
    table::{Cell, Table, Tone},
};
use crate::status::{FrontendState, KernelPathReason, KernelPathState, Snapshot};

use super::status::KernelTally;
use hairpin_ebpf::Counter;

mod beside;
mod cgroup;
mod checks;
mod relay;
mod servers;
pub(crate) use checks::kernel_version;

/// Options of `doctor`.
#[derive(clap::Args, Debug, Clone)]
#[command(
    long_about = "Checks what hairpin needs on this node: the kernel version and BPF support \
(cgroup sock_addr programs, loading the embedded object through the verifier), the cgroup v2 \
mount, this process's capabilities, the agent's health, kube-proxy's mode and whether it \
short-circuits the proxied LoadBalancer IPs, the cluster-side shape (ipMode, CoreDNS, \
node-local-dns) as the running agent reports it, and the kernel path: whether it runs, what \
this kernel lacks when it cannot, and whether any connection went without its header.",
    after_help = "Exit status: 0 no check failed (warnings allowed); 1 at least one check failed.\n\n\
Examples:\n  hairpin-agent doctor\n  hairpin-agent doctor --output json | jq '.checks[] | select(.status != \"ok\")'"
)]
pub struct DoctorArgs {
    /// Where the agent's admin server is.
    #[command(flatten)]
    pub(crate) admin: AdminArgs,

    /// The bypass mark to load the embedded object with (as the agent would).
    #[arg(long, env = "HAIRPIN_BYPASS_MARK", default_value = crate::agent::args::DEFAULT_BYPASS_MARK_ARG, value_parser = crate::agent::args::parse_mark)]
    pub(crate) bypass_mark: u32,

    /// The cgroup v2 directory the agent attaches at, as its `--cgroup-path` (the
    /// DaemonSet sets HAIRPIN_CGROUP_PATH, so `kubectl exec` in its pod checks the
    /// node's hierarchy it mounts). Default: the cgroup v2 root in /proc/self/mountinfo.
    #[arg(long, env = "HAIRPIN_CGROUP_PATH")]
    pub cgroup_path: Option<std::path::PathBuf>,

    /// Output format.
    #[arg(long, short, env = "HAIRPIN_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) output: OutputFormat,
}

/// A check's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// Fine.
    Ok,
    /// Works, with a caveat.
    Warn,
    /// hairpin cannot work (or not fully) until fixed.
    Fail,
    /// Could not be checked from here.
    Skip,
}

/// One check.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Check {
    /// Stable name: `kernel`, `bpf`, `ebpf_object`, `cgroup2`, `capabilities`, `agent`,
    /// `seccomp`, `kube_proxy_mode`, `kube_proxy_frontends`, `ip_mode`, `coredns`, `clients`, `name_relay`,
    /// `names_scope`, `relay`, `kernel_path`, `link_order`, `mesh`, `skipped_lbs`, `lenient_servers`.
    pub name: &'static str,
    /// The result.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do, when not ok.
    pub fix: Option<String>,
}

impl Check {
    /// A check result.
    pub(crate) fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
        Check {
            name,
            status,
            detail: detail.into(),
            fix: None,
        }
    }

    /// With a fix line.
    pub(crate) fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

#[cfg(test)]
impl Check {
    /// Asserts that the detail names every one of `wants`.
    pub(crate) fn assert_detail_names(&self, wants: &[&str]) {
        for want in wants {
            assert!(
                self.detail.contains(want),
                "{want:?} not in: {}",
                self.detail
            );
        }
    }

    /// Asserts that there is a fix and that it names every one of `wants`; the fix.
    pub(crate) fn assert_fix_names(&self, wants: &[&str]) -> &str {
        let fix = self
            .fix
            .as_deref()
            .unwrap_or_else(|| panic!("no fix: {self:?}"));
        for want in wants {
            assert!(fix.contains(want), "{want:?} not in the fix: {fix}");
        }
        fix
    }
}

/// The JSON document `doctor --output json` prints.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DoctorReport {
    /// Every check, in order.
    pub checks: Vec<Check>,
    /// True when none failed.
    pub ok: bool,
}

/// Checks that this node can run hairpin; returns the exit code.
pub fn diagnose(args: &DoctorArgs) -> Result<i32, CliError> {
    let mut list = vec![
        checks::kernel(),
        checks::bpf(),
        checks::ebpf_object(args.bypass_mark),
        cgroup::cgroup2(args.cgroup_path.as_deref()),
        checks::capabilities(),
    ];
    let agent = args.admin.status();
    list.push(match &agent {
        Ok(s) => match s.not_ready_reason() {
            None => Check::new("agent", Status::Ok, format!("pid {} ready", s.agent.pid)),
            Some(r) => Check::new(
                "agent",
                Status::Warn,
                format!("pid {} not ready: {r}", s.agent.pid),
            )
            .fix("see `hairpin-agent status` and the agent's log"),
        },
        Err(e) => Check::new("agent", Status::Warn, e.to_string()).fix(
            "start the agent (the hairpin DaemonSet pod on this node), or pass --admin-socket",
        ),
    });
    let kp = KubeProxy::observe();
    list.push(checks::seccomp(agent.as_ref().ok()));
    list.push(checks::kube_proxy_mode(&kp));
    list.push(kube_proxy_frontends(&kp, agent.as_ref().ok()));
    list.extend(cluster_shape(agent.as_ref().ok()));
    if let Some(c) = agent.as_ref().ok().and_then(|s| s.clients.as_ref()) {
        list.push(clients_check(c));
    }
    if let Some(n) = agent.as_ref().ok().and_then(|s| s.names.as_ref()) {
        list.push(name_relay_check(n));
        list.push(names_scope_check(n));
    }
    let unavailable = agent.as_ref().ok().is_some_and(|s| {
        s.kernel_path
            .as_ref()
            .is_some_and(|k| k.state == KernelPathState::Unavailable)
    });
    // What this kernel lacks is probed here only when the agent could not use it.
    let lacking = if unavailable {
        checks::kernel_path_lacking()
    } else {
        Vec::new()
    };
    list.push(relay::relay_check(agent.as_ref().ok()));
    list.push(kernel_path_check(agent.as_ref().ok(), &lacking));
    list.push(beside::link_order_check(agent.as_ref().ok()));
    list.push(beside::mesh_check(agent.as_ref().ok()));
    list.push(beside::skipped_check(agent.as_ref().ok()));
    list.push(servers::lenient_servers(
        agent.as_ref().ok(),
        args.bypass_mark,
    ));
    let report = DoctorReport {
        ok: list.iter().all(|c| c.status != Status::Fail),
        checks: list,
    };
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text => print_text(&render(&report, colour_stdout()))?,
    }
    Ok(if report.ok { 0 } else { 1 })
}

/// Whether kube-proxy short-circuits each frontend the agent proxies.
pub(crate) fn kube_proxy_frontends(kp: &KubeProxy, agent: Option<&Snapshot>) -> Check {
    let name = "kube_proxy_frontends";
    if !kp.read {
        return checks::unreadable_rules(name, kp);
    }
    let Some(s) = agent else {
        return Check::new(
            name,
            Status::Skip,
            "needs the running agent (its frontends)",
        );
    };
    let active: Vec<_> = s
        .frontends
        .iter()
        .filter(|f| f.state == FrontendState::Active)
        .collect();
    if active.is_empty() {
        return Check::new(name, Status::Skip, "the agent proxies no frontend");
    }
    let missing: Vec<String> = active
        .iter()
        .filter(|f| kp.matching(f.ip, f.port).is_empty())
        .map(|f| std::net::SocketAddr::new(f.ip, f.port).to_string())
        .collect();
    if missing.is_empty() {
        Check::new(
            name,
            Status::Ok,
            format!(
                "kube-proxy short-circuits all {} proxied frontends: hairpin is needed and in place",
                active.len()
            ),
        )
    } else {
        Check::new(
            name,
            Status::Warn,
            format!("no kube-proxy rule for {}: in-cluster traffic to them leaves the node", missing.join(", ")),
        )
        .fix("if their Services say ipMode: Proxy, hairpin is harmless there; if kube-proxy is replaced (Cilium, Calico eBPF), their socket load balancer serves them and the link_order check says whether hairpin's programs run before it; otherwise check the Service's status.loadBalancer")
    }
}

/// ipMode and CoreDNS shape, from the agent's Kubernetes decisions.
fn cluster_shape(agent: Option<&Snapshot>) -> Vec<Check> {
    let mut out = Vec::new();
    for (name, words) in [
        ("ip_mode", &["ipmode"][..]),
        ("coredns", &["coredns", "nodelocal", "node-local"][..]),
    ] {
        let check = match agent {
            None => Check::new(
                name,
                Status::Skip,
                "needs the running agent (it reads the API server)",
            ),
            // The CoreDNS writer's own findings come first: node-local-dns bypasses it.
            Some(s) if name == "coredns" && s.coredns.is_some() => coredns_check(s),
            Some(s) => {
                let hits: Vec<String> = s
                    .decisions
                    .iter()
                    .filter(|d| {
                        let text =
                            format!("{} {} {}", d.object, d.reason, d.message).to_lowercase();
                        words.iter().any(|w| text.contains(w))
                    })
                    .map(|d| format!("{}: {} ({})", d.object, d.message, d.reason))
                    .collect();
                if hits.is_empty() {
                    Check::new(
                        name,
                        Status::Skip,
                        "the agent reported no Kubernetes decision about it",
                    )
                } else {
                    Check::new(name, Status::Ok, hits.join("; "))
                }
            }
        };
        out.push(check);
    }
    out
}

/// Whether the relays are limited to this node's pods and processes, and serve
/// the pods at all.
fn clients_check(c: &crate::status::ClientsStatus) -> Check {
    let open = c.allowed == "any"
        || c.allowed
            .split(',')
            .any(|n| n == "0.0.0.0/0" || n == "::/0");
    if open {
        return Check::new(
            "clients",
            Status::Warn,
            format!("relays serve any peer that reaches them: {}", c.source),
        )
        .fix("set --allowed-clients (HAIRPIN_ALLOWED_CLIENTS) to this node's pod CIDR(s)");
    }
    if let Some(l) = &c.learned {
        if let Some(e) = &l.error {
            return Check::new(
                "clients",
                Status::Warn,
                format!(
                    "this node's routes cannot be read ({e}): pods not known are refused \
                     ({} pods, {} ranges known)",
                    l.pods, l.ranges
                ),
            )
            .fix("run the agent in the host network namespace, or set --allowed-clients");
        }
        if !l.synced {
            return Check::new(
                "clients",
                Status::Warn,
                "this node's routes are not read yet: pods are refused".to_string(),
            );
        }
        if l.pods == 0 && l.ranges == 0 {
            return Check::new(
                "clients",
                Status::Warn,
                format!(
                    "no pod network found in this node's links and routes (a CNI shape \
                     hairpin does not read): pods are refused ({})",
                    c.source
                ),
            )
            .fix("set --allowed-clients (HAIRPIN_ALLOWED_CLIENTS) to this node's pod CIDR(s)");
        }
        return Check::new(
            "clients",
            Status::Ok,
            format!(
                "{} ({}; {} pods, {} ranges: {})",
                c.allowed, c.source, l.pods, l.ranges, l.shapes
            ),
        );
    }
    Check::new(
        "clients",
        Status::Ok,
        format!("{} ({})", c.allowed, c.source),
    )
}

/// Whether every name relay listener is bound: one that is not leaves the names
/// on its port unrouted (and the hosts file without them, for the names address).
fn name_relay_check(n: &crate::status::NamesStatus) -> Check {
    if let Some(e) = &n.hosts_error {
        return Check::new("name_relay", Status::Fail, e.clone()).fix(
            "the error says what to fix (a file replaced on the host: restart the pod; \
             a refused block: fix or remove the marker lines named)",
        );
    }
    if n.failed_listeners.is_empty() {
        let detail = if n.listeners.is_empty() {
            "no listener yet (no hostname routed)".to_string()
        } else {
            let l: Vec<String> = n.listeners.iter().map(|a| a.to_string()).collect();
            let r: Vec<String> = n
                .redirects
                .iter()
                .map(|r| format!("{} -> {}", r.dialled, r.listener))
                .collect();
            if r.is_empty() {
                format!(
                    "listening on {} (the names ports bound as they are: a host process \
                     cannot bind 0.0.0.0 on them while the relay runs)",
                    l.join(", ")
                )
            } else {
                format!(
                    "listening on {}; {}: {}",
                    l.join(", "),
                    n.redirect.as_deref().unwrap_or("redirected"),
                    r.join(", ")
                )
            }
        };
        if let Some(e) = &n.redirect_error {
            return Check::new(
                "name_relay",
                Status::Warn,
                format!("{detail}; the names ports are bound as they are because {e}"),
            )
            .fix("give the agent CAP_NET_ADMIN in the host network namespace (it writes only its own `hairpin` table), or move the name relay with --names-address / --names-ports");
        }
        return Check::new("name_relay", Status::Ok, detail);
    }
    let failed: Vec<String> = n
        .failed_listeners
        .iter()
        .map(|f| format!("{}: {}", f.address, f.error))
        .collect();
    Check::new(
        "name_relay",
        Status::Fail,
        format!("cannot listen on {} (the agent keeps retrying)", failed.join("; ")),
    )
    .fix("find what holds the port (`ss -ltnp`) and stop it, or move the name relay with --names-address / --names-ports")
}

/// Which hostnames the agent may publish: a warning while `--names-domains` is empty
/// (no name reaches /etc/hosts or CoreDNS), else the domains and how many names were
/// left out.
fn names_scope_check(n: &crate::status::NamesStatus) -> Check {
    if n.domains.is_empty() {
        return Check::new(
            "names_scope",
            Status::Warn,
            "none: --names-domains is empty, no names are published",
        )
        .fix(
            "list the domains hostnames may be published under in --names-domains \
             (HAIRPIN_NAMES_DOMAINS; chart value names.domains), e.g. example.com",
        );
    }
    let left_out = match n.skips.len() {
        0 => String::new(),
        k => format!("; {k} hostname(s) left out, each with its rule in `hairpin-agent status`"),
    };
    Check::new(
        "names_scope",
        Status::Ok,
        format!(
            "names under {} are published{left_out}",
            n.domains.join(", ")
        ),
    )
}

/// How the kernel path stands: skipped when off, ok when on and no connection went
/// without its header, a warning naming each miss counter when some did, and the
/// reason and the fix when this kernel (or the agent's privileges) cannot run it: a
/// warning with `--kernel-path auto` (the relay takes over, as planned), a failure
/// with `on` (it was required). `lacking`: what this kernel was found to lack
/// (program types), probed by the caller when unavailable.
fn kernel_path_check(agent: Option<&Snapshot>, lacking: &[String]) -> Check {
    let name = "kernel_path";
    let Some(s) = agent else {
        return Check::new(
            name,
            Status::Skip,
            "needs the running agent (its --kernel-path and counters)",
        );
    };
    let Some(kp) = &s.kernel_path else {
        return Check::new(
            name,
            Status::Skip,
            "the agent reports no kernel path (its programs are not loaded)",
        );
    };
    let tally = KernelTally::new(&s.counters.kernel);
    match kp.state {
        KernelPathState::Off => Check::new(
            name,
            Status::Skip,
            format!(
                "off (--kernel-path {}): every frontend takes the relay path",
                kp.configured
            ),
        ),
        KernelPathState::Unavailable => {
            let reason = kp.reason.as_deref().unwrap_or("no reason given");
            let mut detail = if kp.configured.requires() {
                format!(
                    "required (--kernel-path {}) but unavailable: {reason}; every frontend \
                     takes the relay path (headers are still written)",
                    kp.configured
                )
            } else {
                format!(
                    "unavailable on this node (--kernel-path {}): {reason}; every frontend \
                     takes the relay path (headers are still written)",
                    kp.configured
                )
            };
            if !lacking.is_empty() {
                detail.push_str(&format!("; this kernel lacks {}", lacking.join(" and ")));
            }
            let fix =
                if !lacking.is_empty() || kp.reason_kind == Some(KernelPathReason::NoProgramType) {
                    "run Linux 5.19 or newer with sock_ops and sk_msg BPF programs (sockmap \
                 support), or set --kernel-path off"
                } else if kp.reason_kind == Some(KernelPathReason::Refused) {
                    "the kernel path needs Linux 5.19 or newer and verifies with the DaemonSet's \
                 capabilities (CAP_BPF, CAP_NET_ADMIN): a refusal on such a kernel is a bug to \
                 report with `uname -r` and the agent's debug log (the verifier's words); \
                 meanwhile set --kernel-path off"
                } else {
                    "see the agent's log for the error above, or set --kernel-path off"
                };
            let status = if kp.configured.requires() {
                Status::Fail
            } else {
                Status::Warn
            };
            Check::new(name, status, detail).fix(fix)
        }
        KernelPathState::On => {
            let fill = match kp.sockets_capacity {
                Some(cap) => format!("sockets map {} of {cap} in use", tally.in_map),
                None => format!("sockets map {} in use", tally.in_map),
            };
            let relayed = format!(
                "{} connects sent to the relay instead ({})",
                tally.relayed(),
                tally.describe_fallbacks()
            );
            // An unpinned sockets map goes with the agent's process: say so beside
            // the counters, since nothing has been missed yet.
            let unpinned = kp.sockets_map_pin_error.as_ref().map(|why| {
                format!(
                    "; the datapath is not pinned ({why}): it goes with the agent, so every \
                     restart, upgrade or crash leaves traffic without hairpin until the next \
                     agent attaches, and sockets established but not yet written go without \
                     their header"
                )
            });
            let missed = tally.missed();
            if missed == 0 {
                let detail = format!(
                    "on: {} headers written by the kernel, none missed; {relayed}; {fill}{}",
                    tally.written,
                    unpinned.as_deref().unwrap_or("")
                );
                return match unpinned {
                    None => Check::new(name, Status::Ok, detail),
                    Some(_) => Check::new(name, Status::Warn, detail).fix(PIN_FIX),
                };
            }
            let mut fixes: Vec<&str> = tally
                .misses
                .iter()
                .filter(|m| m.2 > 0)
                .map(|(c, _, _)| miss_fix(*c))
                .collect();
            if unpinned.is_some() {
                fixes.push(PIN_FIX);
            }
            Check::new(
                name,
                Status::Warn,
                format!(
                    "on, but {missed} connections went without their PROXY header since the \
                     agent started: {}; {} headers written by the kernel; {relayed}; {fill}{}",
                    tally.describe_misses(),
                    tally.written,
                    unpinned.as_deref().unwrap_or("")
                ),
            )
            .fix(fixes.join("; "))
        }
    }
}

/// What to do when the datapath could not be pinned.
const PIN_FIX: &str = "mount the host's /sys/fs/bpf/hairpin into the agent so --bpf-pin-dir is \
     on a bpf filesystem (the DaemonSet in deploy/ and the chart do, unless the kernel path is \
     off), or point --bpf-pin-dir at one";

/// What to do about the connections one miss counter counts.
fn miss_fix(counter: Counter) -> &'static str {
    match counter {
        Counter::KernelMissedDataFirst => {
            "kernel_missed_data_first: clients send data before their handshake completes \
             (TCP Fast Open that the connect programs could not see: MSG_FASTOPEN, or \
             TCP_FASTOPEN_CONNECT set before the agent attached, both seen only where the \
             agent holds CAP_PERFMON; or a blocking send() while connecting), which the kernel \
             path cannot put a header ahead of (each such connection fails as it would \
             without hairpin): annotate the Service `hairpin.dev/path: relay` (or `path: \
             relay` in the frontends file) so its connections take the relay, add \
             CAP_PERFMON to the container's capabilities (deploy/components/kernel-path-perfmon) \
             so MSG_FASTOPEN is seen, or turn Fast Open off in those clients \
             (net.ipv4.tcp_fastopen)"
        }
        Counter::KernelMissedInsert => {
            "kernel_missed_insert: more sockets finished their handshake at once than the \
             sockets map holds (raise --kernel-path-sockets), or the map refused a socket: an \
             MPTCP subflow the connect programs could not tell (they read its \
             TCP_NOTSENT_LOWAT, which needs Linux 6.7; before it, only with CAP_PERFMON): \
             annotate the Service `hairpin.dev/path: relay`, or add CAP_PERFMON"
        }
        Counter::KernelMissedPush | Counter::KernelMissedWrite => {
            "kernel_missed_push / kernel_missed_write: the node was short of socket memory \
             when the header was written (see net.ipv4.tcp_mem and the node's memory); if it \
             repeats, annotate the Service `hairpin.dev/path: relay`"
        }
        _ => "see the counter's meaning in docs/architecture.md, \"The kernel path\"",
    }
}

/// What the agent's CoreDNS writer reports: its error, or node-local-dns in the way.
fn coredns_check(s: &Snapshot) -> Check {
    let Some(c) = &s.coredns else {
        return Check::new("coredns", Status::Skip, "the CoreDNS writer is off");
    };
    if let Some(e) = &c.last_error {
        return Check::new("coredns", Status::Fail, e.clone()).fix(
            "fix the Corefile's main server block, or use --coredns import with coredns-custom",
        );
    }
    if let Some(w) = &c.node_local_dns {
        return Check::new("coredns", Status::Warn, w.clone());
    }
    if let Some(w) = &c.held_back {
        return Check::new("coredns", Status::Warn, w.clone());
    }
    Check::new(
        "coredns",
        Status::Ok,
        format!(
            "{} {}: {} rewrites to {}",
            c.mode, c.configmap, c.rewrites, c.target
        ),
    )
}

/// The human rendering.
pub(crate) fn render(r: &DoctorReport, colour: bool) -> String {
    let mut t = Table::new(&["CHECK", "STATUS", "DETAIL"]);
    for c in &r.checks {
        let tone = match c.status {
            Status::Ok => Tone::Good,
            Status::Warn | Status::Skip => Tone::Warn,
            Status::Fail => Tone::Bad,
        };
        let status = format!("{:?}", c.status).to_lowercase();
        t.row(vec![
            c.name.into(),
            Cell::toned(status, tone),
            c.detail.as_str().into(),
        ]);
        if let Some(fix) = &c.fix {
            t.row(vec!["".into(), "".into(), format!("fix: {fix}").into()]);
        }
    }
    let mut out = t.render(0, colour);
    out.push_str(if r.ok {
        "\nno check failed\n"
    } else {
        "\nsome checks failed\n"
    });
    out
}

#[cfg(test)]
mod tests;
