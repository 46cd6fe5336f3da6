//! What can go wrong at the BPF boundary, each error naming the program, map,
//! cgroup or frontend concerned.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

/// Errors at the BPF boundary.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The agent was compiled without the object.
    #[error(
        "this hairpin-agent was built without its eBPF object: run `cargo xtask build` \
         (or `cargo xtask build-ebpf`, then rebuild with HAIRPIN_EBPF_OBJECT set)"
    )]
    NotEmbedded,
    /// The object failed to load (verifier, permissions, kernel support).
    #[error("failed to load the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program or map is missing from the object.
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        /// `program` or `map`.
        kind: &'static str,
        /// Its name.
        name: &'static str,
    },
    /// A program failed to load or attach.
    #[error("failed to {op} {program} (cgroup {cgroup:?}): {source}")]
    Program {
        /// `load` or `attach`.
        op: &'static str,
        /// The program.
        program: &'static str,
        /// The cgroup directory.
        cgroup: PathBuf,
        /// aya's error (boxed: it carries the verifier log).
        source: Box<aya::programs::ProgramError>,
    },
    /// The cgroup directory could not be opened.
    #[error("failed to open cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A map operation failed.
    #[error("failed to {op} {map} entry for {frontend}: {source}")]
    Map {
        /// `insert`, `remove` or `read`.
        op: &'static str,
        /// The map.
        map: &'static str,
        /// The frontend concerned.
        frontend: String,
        /// aya's error (boxed: aya's map errors are large).
        source: Box<aya::maps::MapError>,
    },
    /// The frontends map has no room left (the kernel answered E2BIG).
    #[error(
        "the frontend map is full ({capacity} entries, --max-frontends): {frontend} is not \
         proxied and takes the pre-hairpin path"
    )]
    MapFull {
        /// The frontend that did not fit.
        frontend: SocketAddr,
        /// The map's capacity.
        capacity: u32,
    },
    /// bpf() answered EPERM while the capabilities it needs were effective and a
    /// seccomp filter was installed: the container runtime's default profile refused
    /// it (profiles from before CAP_BPF allow bpf() only with CAP_SYS_ADMIN).
    #[error(
        "a seccomp filter refused bpf() (EPERM although {effective} {is_are} effective; \
         /proc/self/status says Seccomp: 2{nnp}): the container runtime's default seccomp \
         profile predates CAP_BPF and allows bpf() only with CAP_SYS_ADMIN (containerd before \
         1.6.9, 1.7.0 and 2.x). Fix: run the pod with the Localhost profile hairpin/bpf.json \
         (deploy/components/seccomp-localhost, chart seccompProfile.type=Localhost) or \
         seccompProfile: Unconfined, or upgrade the runtime; see docs/seccomp.md. {inner}",
        is_are = if effective.contains(',') { "are" } else { "is" },
        nnp = match no_new_privs {
            Some(true) => ", NoNewPrivs: 1",
            Some(false) => ", NoNewPrivs: 0",
            None => "",
        }
    )]
    Seccomp {
        /// The effective capabilities that should have allowed the call.
        effective: String,
        /// `NoNewPrivs` from /proc/self/status, when present.
        no_new_privs: Option<bool>,
        /// The error as the loader reported it.
        inner: Box<DatapathError>,
    },
    /// bpf() answered EPERM and capabilities it needs are not effective.
    #[error(
        "bpf() was refused (EPERM): {missing} {is_are} not in this process's effective \
         capabilities{also}. Fix: add it in the pod's securityContext.capabilities.add (the \
         DaemonSet in deploy/ adds BPF, NET_ADMIN and NET_BIND_SERVICE), or run as root. {inner}",
        is_are = if missing.contains(',') { "are" } else { "is" },
        also = if *seccomp { " (a seccomp filter is installed as well: see docs/seccomp.md if adding them is not enough)" } else { "" }
    )]
    Capabilities {
        /// The missing capabilities, comma-separated.
        missing: String,
        /// Whether a seccomp filter is installed too.
        seccomp: bool,
        /// The error as the loader reported it.
        inner: Box<DatapathError>,
    },
    /// A bpf_link could not be created, swapped or pinned.
    #[error("failed to {op} the {role} link at cgroup {cgroup:?}: {source}")]
    Link {
        /// `create`, `update`, `pin`, `read` or `detach`.
        op: &'static str,
        /// The hook (`connect4`, `sock_ops`, ...).
        role: &'static str,
        /// The cgroup directory.
        cgroup: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// A hash map refuses a new key with E2BIG once all its (preallocated) entries are used.
pub(super) fn is_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(aya::sys::SyscallError { io_error, .. })
        if io_error.raw_os_error() == Some(nix::errno::Errno::E2BIG as i32))
}

pub(super) fn map_error(
    op: &'static str,
    map: &'static str,
    frontend: String,
) -> impl FnOnce(aya::maps::MapError) -> DatapathError {
    move |source| DatapathError::Map {
        op,
        map,
        frontend,
        source: Box::new(source),
    }
}

pub(super) fn program_error(
    program: &'static str,
    op: &'static str,
    cgroup: &Path,
) -> impl FnOnce(aya::programs::ProgramError) -> DatapathError {
    let cgroup = cgroup.to_path_buf();
    move |source| {
        denied(DatapathError::Program {
            op,
            program,
            cgroup,
            source: Box::new(source),
        })
    }
}

/// The object failed to load: [`DatapathError::Load`], or the seccomp or capability
/// variant when the kernel answered EPERM (see [`denied`]).
pub(super) fn load_error(e: aya::EbpfError) -> DatapathError {
    denied(DatapathError::Load(Box::new(e)))
}

/// The errno of the first OS error in `e`'s source chain.
pub(super) fn errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(n) = io.raw_os_error()
        {
            return Some(n);
        }
        next = e.source();
    }
    None
}

/// Turns an EPERM from bpf() into [`DatapathError::Seccomp`] or
/// [`DatapathError::Capabilities`] when /proc/self/status says which; any other error
/// is returned as it is.
pub(super) fn denied(e: DatapathError) -> DatapathError {
    let Some(n) = errno(&e) else { return e };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    match classify_denial(&status, n) {
        Some(Denial::Seccomp {
            effective,
            no_new_privs,
        }) => DatapathError::Seccomp {
            effective: effective.join(", "),
            no_new_privs,
            inner: Box::new(e),
        },
        Some(Denial::Capabilities { missing, seccomp }) => DatapathError::Capabilities {
            missing: missing.join(", "),
            seccomp,
            inner: Box::new(e),
        },
        None => e,
    }
}

/// Why bpf() answered EPERM, as far as /proc/self/status tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Denial {
    /// The capabilities were effective and a seccomp filter is installed
    /// (`Seccomp: 2`): the filter is the likely cause.
    Seccomp {
        /// The effective capabilities that allow the calls (CAP_BPF or CAP_SYS_ADMIN,
        /// and CAP_NET_ADMIN).
        effective: Vec<&'static str>,
        /// `NoNewPrivs`, when the field is present.
        no_new_privs: Option<bool>,
    },
    /// Capabilities the calls need are missing from the effective set.
    Capabilities {
        /// `CAP_BPF` (when neither it nor CAP_SYS_ADMIN is effective) and/or `CAP_NET_ADMIN`.
        missing: Vec<&'static str>,
        /// Whether a seccomp filter is installed as well.
        seccomp: bool,
    },
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Classifies an error number from a bpf() call with the text of /proc/self/status:
/// `None` unless it is EPERM and the status says something about why. Loading the
/// object needs CAP_BPF (or CAP_SYS_ADMIN) for the maps and programs, and CAP_NET_ADMIN
/// (or CAP_SYS_ADMIN) for the cgroup sock_addr program type; with those effective, an
/// EPERM under a seccomp filter (`Seccomp: 2`) is the filter's.
pub(super) fn classify_denial(status: &str, errno: i32) -> Option<Denial> {
    if errno != nix::errno::Errno::EPERM as i32 {
        return None;
    }
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let caps = u64::from_str_radix(field("CapEff")?, 16).ok()?;
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    let seccomp = field("Seccomp") == Some("2");
    let no_new_privs = field("NoNewPrivs").map(|v| v == "1");
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_NET_ADMIN) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !missing.is_empty() {
        return Some(Denial::Capabilities { missing, seccomp });
    }
    if !seccomp {
        return None;
    }
    let effective = [
        ("CAP_BPF", CAP_BPF),
        ("CAP_SYS_ADMIN", CAP_SYS_ADMIN),
        ("CAP_NET_ADMIN", CAP_NET_ADMIN),
    ]
    .into_iter()
    .filter(|(_, b)| has(*b))
    .map(|(n, _)| n)
    .collect();
    Some(Denial::Seccomp {
        effective,
        no_new_privs,
    })
}

/// Why connections aimed at the relay's slots cannot reach its listeners: the
/// relay's sk_lookup program did not load.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SteeringError {
    /// The object has no such program (a build without it).
    #[error("the eBPF object has no program {}", hairpin_ebpf::PROG_SK_LOOKUP)]
    Missing,
    /// The program is not an sk_lookup program.
    #[error("{0}")]
    Type(#[source] aya::programs::ProgramError),
    /// The kernel refused it.
    #[error("{prog} did not load (sk_lookup programs need Linux 5.9): {0}", prog = hairpin_ebpf::PROG_SK_LOOKUP)]
    Load(#[source] aya::programs::ProgramError),
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPERM: i32 = nix::errno::Errno::EPERM as i32;

    /// /proc/self/status of the DaemonSet's container: uid 0 with CAP_BPF,
    /// CAP_NET_ADMIN and CAP_NET_BIND_SERVICE only (bits 39, 12, 10), no_new_privs, and
    /// the runtime's seccomp filter.
    fn status(cap_eff: &str, seccomp: &str, nnp: &str) -> String {
        format!(
            "Name:\thairpin-agent\nUid:\t0\t0\t0\t0\nCapInh:\t0000000000000000\n\
             CapPrm:\t{cap_eff}\nCapEff:\t{cap_eff}\nCapBnd:\t{cap_eff}\n\
             CapAmb:\t0000000000000000\nNoNewPrivs:\t{nnp}\nSeccomp:\t{seccomp}\n\
             Seccomp_filters:\t1\n"
        )
    }
    const POD_CAPS: &str = "0000008000001400";

    #[test]
    fn eperm_with_cap_bpf_under_a_seccomp_filter_is_the_filter() {
        assert_eq!(
            classify_denial(&status(POD_CAPS, "2", "1"), EPERM),
            Some(Denial::Seccomp {
                effective: vec!["CAP_BPF", "CAP_NET_ADMIN"],
                no_new_privs: Some(true),
            })
        );
        // CAP_SYS_ADMIN instead of CAP_BPF loads as well.
        assert_eq!(
            classify_denial(&status("0000000000201000", "2", "0"), EPERM),
            Some(Denial::Seccomp {
                effective: vec!["CAP_SYS_ADMIN", "CAP_NET_ADMIN"],
                no_new_privs: Some(false),
            })
        );
    }

    #[test]
    fn eperm_without_the_capabilities_names_them_first() {
        // CAP_NET_BIND_SERVICE only.
        assert_eq!(
            classify_denial(&status("0000000000000400", "2", "1"), EPERM),
            Some(Denial::Capabilities {
                missing: vec!["CAP_BPF", "CAP_NET_ADMIN"],
                seccomp: true,
            })
        );
        assert_eq!(
            classify_denial(&status("0000008000000400", "0", "0"), EPERM),
            Some(Denial::Capabilities {
                missing: vec!["CAP_NET_ADMIN"],
                seccomp: false,
            })
        );
    }

    #[test]
    fn other_errors_and_unfiltered_processes_are_left_alone() {
        // Capabilities there, no filter: something else (an LSM) refused it.
        assert_eq!(classify_denial(&status(POD_CAPS, "0", "0"), EPERM), None);
        // Not EPERM: a verifier rejection, a missing kernel feature.
        let einval = nix::errno::Errno::EINVAL as i32;
        assert_eq!(classify_denial(&status(POD_CAPS, "2", "1"), einval), None);
        // No CapEff (not Linux's /proc): nothing to say.
        assert_eq!(classify_denial("Name:\tx\nSeccomp:\t2\n", EPERM), None);
    }

    #[test]
    fn the_errno_is_found_through_aya_errors() {
        let load = aya::EbpfError::MapError(aya::maps::MapError::CreateError {
            name: "HAIRPIN_FRONTENDS".into(),
            io_error: std::io::Error::from_raw_os_error(EPERM),
        });
        let e = DatapathError::Load(Box::new(load));
        assert_eq!(errno(&e), Some(EPERM));
        assert_eq!(errno(&DatapathError::NotEmbedded), None);
    }

    #[test]
    fn the_seccomp_error_names_the_cause_and_the_fix() {
        let inner = DatapathError::Load(Box::new(aya::EbpfError::MapError(
            aya::maps::MapError::CreateError {
                name: "HAIRPIN_FRONTENDS".into(),
                io_error: std::io::Error::from_raw_os_error(EPERM),
            },
        )));
        let text = DatapathError::Seccomp {
            effective: "CAP_BPF, CAP_NET_ADMIN".into(),
            no_new_privs: Some(true),
            inner: Box::new(inner),
        }
        .to_string();
        for part in [
            "a seccomp filter refused bpf()",
            "CAP_BPF, CAP_NET_ADMIN are effective",
            "Seccomp: 2, NoNewPrivs: 1",
            "containerd before 1.6.9",
            "hairpin/bpf.json",
            "deploy/components/seccomp-localhost",
            "Unconfined",
            "docs/seccomp.md",
            "failed to load the eBPF object",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        let text = DatapathError::Capabilities {
            missing: "CAP_BPF".into(),
            seccomp: false,
            inner: Box::new(DatapathError::NotEmbedded),
        }
        .to_string();
        assert!(
            text.contains("CAP_BPF is not in this process's effective capabilities"),
            "{text}"
        );
    }

    #[test]
    fn a_full_map_is_told_apart_from_other_insert_failures() {
        let syscall = |errno: nix::errno::Errno| {
            aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_update_elem",
                io_error: std::io::Error::from_raw_os_error(errno as i32),
            })
        };
        assert!(is_full(&syscall(nix::errno::Errno::E2BIG)));
        assert!(!is_full(&syscall(nix::errno::Errno::EPERM)));
        assert!(!is_full(&aya::maps::MapError::KeyNotFound));
        let e = DatapathError::MapFull {
            frontend: "203.0.113.10:443".parse().expect("addr"),
            capacity: 64,
        };
        assert_eq!(
            e.to_string(),
            "the frontend map is full (64 entries, --max-frontends): 203.0.113.10:443 is not \
             proxied and takes the pre-hairpin path"
        );
    }
}
