//! The node-local checks of `doctor`: kernel, BPF, cgroup v2, capabilities, kube-proxy.

use aya::programs::ProgramType;

use super::{Check, Status};
use crate::{cli::kube_proxy::KubeProxy, datapath, status::EbpfFailure};

/// The kernel release's (major, minor), from `uname -r` text such as `6.18.0-1-amd64`.
pub(crate) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

pub(super) fn kernel() -> Check {
    let release = match nix::sys::utsname::uname() {
        Ok(u) => u.release().to_string_lossy().into_owned(),
        Err(e) => return Check::new("kernel", Status::Fail, format!("uname failed: {e}")),
    };
    match kernel_version(&release) {
        // cgroup bpf_links (the attachment that vanishes with the agent) came in 5.7.
        Some(v) if v >= (5, 7) => Check::new("kernel", Status::Ok, format!("Linux {release}")),
        Some(_) => Check::new(
            "kernel",
            Status::Fail,
            format!("Linux {release}: cgroup bpf_links need 5.7 or newer"),
        )
        .fix("upgrade the node's kernel, or use the /etc/hosts and CoreDNS fallbacks only"),
        None => Check::new(
            "kernel",
            Status::Warn,
            format!("unrecognised release {release:?}"),
        ),
    }
}

pub(super) fn bpf() -> Check {
    match aya::sys::is_program_supported(ProgramType::CgroupSockAddr) {
        Ok(true) => {
            let f = aya::features();
            let detail = format!(
                "cgroup sock_addr programs loadable; global data {}, object names {}",
                yes(f.bpf_global_data()),
                yes(f.bpf_name())
            );
            // The bypass mark is a global the loader sets: without global data the
            // object cannot load.
            if f.bpf_global_data() {
                Check::new("bpf", Status::Ok, detail)
            } else {
                Check::new("bpf", Status::Fail, detail).fix("a kernel with BPF global data (5.2+) is needed")
            }
        }
        Ok(false) => Check::new("bpf", Status::Fail, "this kernel cannot load cgroup sock_addr programs")
            .fix("enable CONFIG_CGROUP_BPF and CONFIG_BPF_SYSCALL"),
        Err(e) => Check::new("bpf", Status::Fail, format!("the bpf syscall failed: {e}"))
            .fix("run as root, or with CAP_BPF and CAP_SYS_ADMIN; check kernel.unprivileged_bpf_disabled and seccomp"),
    }
}

/// What the kernel path needs that this kernel lacks: Linux 5.19 (the dynptr
/// helpers its sock_ops program formats the header with), sock_ops and sk_msg
/// programs (or that could not be probed, with the error).
pub(super) fn kernel_path_lacking() -> Vec<String> {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out: Vec<String> = kernel_path_release(&release).into_iter().collect();
    out.extend(
        [
            (ProgramType::SockOps, "sock_ops"),
            (ProgramType::SkMsg, "sk_msg"),
        ]
        .into_iter()
        .filter_map(|(kind, name)| match aya::sys::is_program_supported(kind) {
            Ok(true) => None,
            Ok(false) => Some(format!("{name} programs")),
            Err(e) => Some(format!("{name} programs (the probe failed: {e})")),
        }),
    );
    out
}

/// What a kernel `release` older than the kernel path's 5.19 lacks, if it is.
fn kernel_path_release(release: &str) -> Option<String> {
    match kernel_version(release) {
        Some(v) if v < (5, 19) => Some(format!(
            "Linux 5.19 (this is {release}; the dynptr helpers came in 5.19)"
        )),
        _ => None,
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

pub(super) fn ebpf_object(bypass_mark: u32) -> Check {
    let Some(object) = datapath::embedded_object() else {
        return Check::new(
            "ebpf_object",
            Status::Warn,
            "this binary was built without its eBPF object",
        )
        .fix("build with `cargo xtask build`");
    };
    // The relay's splice watches its refill ring on a tokio runtime, as in the agent:
    // without one entered, the load would report the splice missing for want of a
    // reactor, not of anything the kernel lacks.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Check::new(
                "ebpf_object",
                Status::Fail,
                format!("cannot start a tokio runtime to load the object in: {e}"),
            );
        }
    };
    let _entered = rt.enter();
    // Load (and so verify) both programs without attaching; dropping unloads them.
    match datapath::Datapath::load(object, bypass_mark) {
        Ok(_) => Check::new(
            "ebpf_object",
            Status::Ok,
            "connect4 and connect6 pass the verifier (loaded, not attached)",
        ),
        Err(e) => Check::new("ebpf_object", Status::Fail, e.to_string())
            .fix("see the verifier log above; report it with `uname -r`"),
    }
}

/// Bits of the effective capability set, from /proc/self/status text.
pub(crate) fn effective_caps(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

const CAPS: [(&str, u32); 3] = [
    ("CAP_NET_ADMIN", 12),
    ("CAP_SYS_ADMIN", 21),
    ("CAP_BPF", 39),
];

pub(super) fn capabilities() -> Check {
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .as_deref()
        .and_then(effective_caps);
    let Some(caps) = caps else {
        return Check::new(
            "capabilities",
            Status::Warn,
            "cannot read CapEff from /proc/self/status",
        );
    };
    capabilities_of(caps)
}

/// The verdict on the effective set `caps`. Loading needs CAP_BPF or CAP_SYS_ADMIN;
/// attaching at a cgroup and SO_MARK need CAP_NET_ADMIN: with those hairpin works,
/// as the DaemonSet runs it (CAP_SYS_ADMIN is not in its set). CAP_SYS_ADMIN only
/// opens other processes' programs by id, to name them.
pub(super) fn capabilities_of(caps: u64) -> Check {
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    let present: Vec<&str> = CAPS
        .iter()
        .filter(|(_, b)| has(*b))
        .map(|(n, _)| *n)
        .collect();
    let missing: Vec<&str> = CAPS
        .iter()
        .filter(|(_, b)| !has(*b))
        .map(|(n, _)| *n)
        .collect();
    let can_load = has(39) || has(21);
    if !(can_load && has(12)) {
        return Check::new(
            "capabilities",
            Status::Fail,
            format!("missing: {}", missing.join(", ")),
        )
        .fix("run as root, or add them in the pod's securityContext.capabilities.add");
    }
    let mut detail = format!("effective: {}", present.join(", "));
    if !has(21) {
        detail.push_str(
            "; without CAP_SYS_ADMIN (as the DaemonSet runs), another program in front of \
             hairpin's is named by id only",
        );
    }
    Check::new("capabilities", Status::Ok, detail)
}

pub(super) fn seccomp(agent: Option<&crate::status::Snapshot>) -> Check {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let failure = agent
        .and_then(|s| s.mode.as_ref())
        .and_then(|m| m.ebpf_failure);
    seccomp_check(&status, failure)
}

/// The `seccomp` check from this process's /proc/self/status text (inside the pod,
/// `kubectl exec` runs under the container's filter) and why the agent could not use
/// its programs: a fail when a seccomp filter refused them
/// ([`crate::datapath::DatapathError::Seccomp`]).
pub(crate) fn seccomp_check(status: &str, agent_failure: Option<EbpfFailure>) -> Check {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let here = match (field("Seccomp"), field("NoNewPrivs")) {
        (Some(mode), nnp) => format!(
            "this process: Seccomp {mode} ({}), NoNewPrivs {}",
            match mode {
                "0" => "no filter",
                "1" => "strict",
                "2" => "filter",
                _ => "unknown",
            },
            nnp.unwrap_or("?")
        ),
        (None, _) => "this process: no Seccomp field in /proc/self/status".to_string(),
    };
    match agent_failure {
        Some(EbpfFailure::Seccomp) => Check::new(
            "seccomp",
            Status::Fail,
            format!(
                "the agent's programs were refused by a seccomp filter (the runtime's default \
                 profile allows bpf() only with CAP_SYS_ADMIN); {here}"
            ),
        )
        .fix(
            "run the pod with the Localhost profile hairpin/bpf.json (deploy/components/seccomp-localhost, \
             or the chart's seccompProfile.type=Localhost) or seccompProfile: Unconfined, or upgrade \
             containerd to 1.6.9, 1.7.0 or later; see docs/seccomp.md",
        ),
        _ => Check::new("seccomp", Status::Ok, here),
    }
}

pub(super) fn kube_proxy_mode(kp: &KubeProxy) -> Check {
    let name = "kube_proxy_mode";
    if !kp.read {
        return unreadable_rules(name, kp);
    }
    if kp.modes.is_empty() {
        let mut c = Check::new(
            name,
            Status::Warn,
            "no kube-proxy rules found (iptables KUBE-SERVICES, nftables kube-proxy table, kube-ipvs0): \
             kube-proxy may be replaced by Cilium or Calico eBPF",
        )
        .fix("with an eBPF service LB, check that hairpin's connect hooks run before its root programs");
        if !kp.notes.is_empty() {
            c.detail.push_str(&format!(" ({})", kp.notes.join("; ")));
        }
        return c;
    }
    let modes: Vec<&str> = kp.modes.iter().map(|m| m.name()).collect();
    let lbs = kp.rules.len();
    Check::new(
        name,
        Status::Ok,
        format!("{} ({lbs} service destinations)", modes.join(" + ")),
    )
}

/// A skip for a kube-proxy check where no tool that lists rules could run: `kubectl
/// exec` into the agent's pod (its image holds the agent alone) says nothing of
/// kube-proxy, rather than suggesting it was replaced.
pub(super) fn unreadable_rules(name: &'static str, kp: &KubeProxy) -> Check {
    Check::new(
        name,
        Status::Skip,
        format!(
            "cannot read kube-proxy's rules from here ({}): the agent's image has no \
             iptables-save or nft",
            kp.notes.join("; ")
        ),
    )
    .fix("run `hairpin-agent doctor` on the node itself, where iptables-save or nft is installed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_checks_skip_where_no_tool_can_list_rules() {
        let kp = KubeProxy {
            notes: vec!["could not run nft: No such file or directory (os error 2)".into()],
            ..KubeProxy::default()
        };
        let c = kube_proxy_mode(&kp);
        assert_eq!(c.status, Status::Skip, "{c:?}");
        c.assert_detail_names(&["could not run nft", "no iptables-save or nft"]);
        c.assert_fix_names(&["on the node"]);
        let c = kube_proxy_mode(&KubeProxy {
            read: true,
            ..KubeProxy::default()
        });
        assert_eq!(
            c.status,
            Status::Warn,
            "rules read, none of kube-proxy's: {c:?}"
        );
    }

    #[test]
    fn bpf_and_net_admin_are_enough_and_sys_admin_only_adds_names() {
        // The DaemonSet's set: CAP_NET_ADMIN (12), CAP_NET_BIND_SERVICE (10), CAP_BPF (39).
        let c = capabilities_of((1 << 12) | (1 << 10) | (1 << 39));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        c.assert_detail_names(&["CAP_NET_ADMIN, CAP_BPF", "without CAP_SYS_ADMIN", "by id"]);
        let c = capabilities_of((1 << 12) | (1 << 21) | (1 << 39));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(c.detail, "effective: CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF");
        let c = capabilities_of(1 << 39);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        c.assert_detail_names(&["CAP_NET_ADMIN"]);
    }

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(kernel_version("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0-150-generic"), Some((5, 4)));
        assert!(kernel_version("5.4.0") < Some((5, 7)));
        assert_eq!(kernel_version("weird"), None);
    }

    #[test]
    fn seccomp_fails_when_the_agent_says_its_programs_were_filtered() {
        let status = "Name:\tx\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        let c = seccomp_check(status, Some(EbpfFailure::Seccomp));
        assert_eq!(c.status, Status::Fail);
        c.assert_detail_names(&["Seccomp 2 (filter), NoNewPrivs 1"]);
        c.assert_fix_names(&["hairpin/bpf.json", "Unconfined"]);
        let c = seccomp_check(status, Some(EbpfFailure::Capabilities));
        assert_eq!(c.status, Status::Ok);
        let c = seccomp_check(status, None);
        assert_eq!(c.status, Status::Ok);
        assert_eq!(c.detail, "this process: Seccomp 2 (filter), NoNewPrivs 1");
        let c = seccomp_check("Name:\tx\nNoNewPrivs:\t0\nSeccomp:\t0\n", None);
        assert_eq!(
            c.detail,
            "this process: Seccomp 0 (no filter), NoNewPrivs 0"
        );
    }

    #[test]
    fn the_kernel_path_needs_5_19() {
        assert_eq!(
            kernel_path_release("5.15.0-91-generic").as_deref(),
            Some("Linux 5.19 (this is 5.15.0-91-generic; the dynptr helpers came in 5.19)")
        );
        assert_eq!(kernel_path_release("5.19.0"), None);
        assert_eq!(kernel_path_release("6.18.0-1-amd64"), None);
        assert_eq!(kernel_path_release("weird"), None);
    }

    #[test]
    fn capabilities_parse_from_proc_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ff_ffff_ffff));
        assert_eq!(effective_caps("Name:\tx\n"), None);
    }
}
