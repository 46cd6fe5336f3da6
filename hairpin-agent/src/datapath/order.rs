//! Link order at the cgroup: hairpin's connect programs must run before every other
//! connect program there, or a socket load balancer (Cilium's `cil_sock4_connect`,
//! Calico's `calico_connect_v4`) that rewrites the LB address to a backend hides it
//! from them. Where the kernel orders cgroup links (`BPF_F_BEFORE` at
//! `BPF_LINK_CREATE`), the connect links are made before every program already
//! there; where it does not, they go after, and `status` and `doctor` name the
//! program in front.
//!
//! Owns the probe of the kernel's link ordering, the observation of a connect hook's
//! order, and the words for it. Never creates or detaches a link (the lifecycle's
//! executor does).

use std::{fmt, fs::File, io, os::fd::BorrowedFd, path::Path, sync::Arc};

use crate::status::{ChildCgroupsStatus, ForeignProgram, HookOrderStatus, LinkOrderStatus};

use super::role::Role;
use super::sys;

/// Where the connect links are asked to go (`--link-order`): the kernel has the
/// last word ([`LinkOrder`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkOrderWanted {
    /// Before every other program where the kernel orders cgroup links; else at
    /// the root's children when another program is at a connect hook of the root.
    First,
    /// After every program already there, at the root itself (tests: hairpin
    /// before it linked at the children).
    Append,
    /// As on a kernel that does not order cgroup links (tests).
    Children,
}

/// Whether this agent's connect links go before every other program at the cgroup.
#[derive(Clone, Debug)]
pub(crate) enum LinkOrder {
    /// The kernel orders cgroup links: connect links are made with `BPF_F_BEFORE`.
    Before,
    /// The kernel does not order cgroup links (why, as probed): links go after
    /// every program already there.
    Unsupported(Unordered),
    /// Ordering turned off (`--link-order append`, which simulates such a kernel).
    Disabled,
}

/// Why connect links are appended where ordering was asked for: what the probe of
/// `BPF_F_BEFORE` found, or the setting that stands in for such a kernel.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum Unordered {
    /// The kernel refused the flag (EINVAL): it does not order cgroup links.
    #[error("this kernel does not order cgroup links (BPF_F_BEFORE refused: EINVAL)")]
    Refused,
    /// The probe's `BPF_LINK_CREATE` failed otherwise.
    #[error("the probe of BPF_F_BEFORE failed: {0}")]
    ProbeFailed(#[source] Arc<io::Error>),
    /// The probe made a link without a cgroup: not a kernel this code knows.
    #[error("the probe of BPF_F_BEFORE made a link without a cgroup: not trusted")]
    Untrusted,
    /// The connect program the probe uses is not loaded.
    #[error("{0} is not loaded: the probe of cgroup link ordering could not run")]
    NotLoaded(&'static str),
    /// `--link-order children` (tests), which simulates such a kernel.
    #[error("--link-order children, as on a kernel that does not order cgroup links")]
    Children,
}

impl LinkOrder {
    /// The `BPF_LINK_CREATE` flags of a new link at `role`: before every program
    /// already there for the connect hooks, where the kernel orders links. The other
    /// hooks' order does not matter (sock_ops, setsockopt and sk_msg act on sockets
    /// the connect programs marked).
    pub(crate) fn flags(&self, role: Role) -> u32 {
        match (self, role) {
            (LinkOrder::Before, Role::Connect4 | Role::Connect6) => sys::BPF_F_BEFORE,
            _ => 0,
        }
    }

    /// Whether connect links go first.
    pub(crate) fn orders(&self) -> bool {
        matches!(self, LinkOrder::Before)
    }
}

impl fmt::Display for LinkOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkOrder::Before => f.write_str("before every other program (BPF_F_BEFORE)"),
            LinkOrder::Unsupported(why) => write!(f, "appended: {why}"),
            LinkOrder::Disabled => f.write_str("appended: --link-order append"),
        }
    }
}

/// Asks the kernel whether it orders cgroup links, without attaching anything: a
/// `BPF_LINK_CREATE` of `prog` (a loaded connect program) with `BPF_F_BEFORE` and no
/// cgroup. A kernel that orders cgroup links takes the flag and then finds no
/// cgroup (EBADF); one that does not refuses the flag first (EINVAL). Probed, never
/// inferred from the kernel's version.
pub(crate) fn probe(prog: BorrowedFd<'_>, attach: sys::AttachType) -> LinkOrder {
    match sys::link_create_without_target(prog, attach, sys::BPF_F_BEFORE) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => LinkOrder::Before,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            LinkOrder::Unsupported(Unordered::Refused)
        }
        Err(e) => LinkOrder::Unsupported(Unordered::ProbeFailed(Arc::new(e))),
        // A link without a target: not a kernel this code knows. Dropping it
        // releases whatever it is.
        Ok(_) => LinkOrder::Unsupported(Unordered::Untrusted),
    }
}

/// The programs that run before `own` among `ids` (a hook's programs in run order),
/// or `None` when `own` is not there at all.
pub(crate) fn in_front(ids: &[u32], own: u32) -> Option<&[u32]> {
    ids.iter().position(|id| *id == own).map(|at| &ids[..at])
}

/// How one connect hook stands at `cgroup`: the programs that run before this
/// agent's `own` program there, each with its kernel name when it can be read.
pub(crate) fn observe(cgroup: &Path, role: Role, own: u32) -> io::Result<HookOrderStatus> {
    let dir = File::open(cgroup)?;
    let ids = sys::prog_query(std::os::fd::AsFd::as_fd(&dir), role.attach_type())?;
    let front = in_front(&ids, own).unwrap_or(&ids);
    let behind = ids.get(front.len() + 1..).unwrap_or_default();
    Ok(HookOrderStatus {
        hook: role.name().to_string(),
        program_id: own,
        attached: in_front(&ids, own).is_some(),
        in_front: front.iter().map(|id| foreign(*id)).collect(),
        behind: behind.iter().map(|id| foreign(*id)).collect(),
    })
}

/// A program found in front, named when this process may open it by id.
fn foreign(id: u32) -> ForeignProgram {
    match sys::prog_name(id) {
        Ok(name) => ForeignProgram {
            id,
            name: Some(name),
            name_unknown: None,
        },
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => ForeignProgram {
            id,
            name: None,
            name_unknown: Some(
                "its name needs CAP_SYS_ADMIN to open it by id, which the agent does not have: \
                 `bpftool prog show id ID` as root names it"
                    .into(),
            ),
        },
        Err(e) => ForeignProgram {
            id,
            name: None,
            name_unknown: Some(format!("it could not be opened by id: {e}")),
        },
    }
}

/// The order of both connect hooks at `cgroup`, for `status`: `own` gives this
/// agent's program id at each (`None`: not attached there). A hook that cannot be
/// queried says why instead. Linked at the root's `children` instead (a kernel
/// that cannot order cgroup links), those, the programs at the root, and how many
/// processes the root cgroup holds itself.
pub(crate) fn report(
    order: &LinkOrder,
    cgroup: &Path,
    own: impl Fn(Role) -> Option<u32>,
    children: &[&str],
) -> LinkOrderStatus {
    let mut status = LinkOrderStatus {
        ordering: order.to_string(),
        first: order.orders(),
        hooks: Vec::new(),
        error: None,
        children: None,
    };
    if !children.is_empty() {
        let mut at_root: Vec<u32> = Vec::new();
        for role in [Role::Connect4, Role::Connect6] {
            let ids = File::open(cgroup).and_then(|dir| {
                sys::prog_query(std::os::fd::AsFd::as_fd(&dir), role.attach_type())
            });
            match ids {
                Ok(ids) => at_root.extend(
                    ids.iter()
                        .filter(|id| !at_root.contains(id))
                        .collect::<Vec<_>>(),
                ),
                Err(e) => {
                    status.error = Some(format!(
                        "the {} programs at {} could not be listed: {e}",
                        role.name(),
                        cgroup.display()
                    ));
                }
            }
        }
        let root_processes = super::children::own_processes(cgroup).unwrap_or_else(|e| {
            status.error = Some(format!(
                "the processes of {} could not be counted: {e}",
                cgroup.display()
            ));
            0
        });
        status.children = Some(ChildCgroupsStatus {
            cgroups: children.iter().map(|c| c.to_string()).collect(),
            at_root: at_root.into_iter().map(foreign).collect(),
            root_processes: root_processes as u64,
        });
        return status;
    }
    for role in [Role::Connect4, Role::Connect6] {
        let Some(id) = own(role) else { continue };
        match observe(cgroup, role, id) {
            Ok(h) => status.hooks.push(h),
            Err(e) => {
                status.error = Some(format!(
                    "the {} programs at {} could not be listed: {e}",
                    role.name(),
                    cgroup.display()
                ));
            }
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_in_front_are_those_before_ours_in_run_order() {
        assert_eq!(in_front(&[7, 3, 9], 3), Some(&[7][..]));
        assert_eq!(in_front(&[3, 7], 3), Some(&[][..]));
        assert_eq!(in_front(&[7, 9], 3), None);
    }

    #[test]
    fn only_the_connect_hooks_are_linked_before_the_others() {
        let before = LinkOrder::Before;
        assert_eq!(before.flags(Role::Connect4), sys::BPF_F_BEFORE);
        assert_eq!(before.flags(Role::Connect6), sys::BPF_F_BEFORE);
        for role in [Role::SockOps, Role::SetSockopt, Role::SkMsg] {
            assert_eq!(before.flags(role), 0, "{}", role.name());
        }
        for order in [
            LinkOrder::Disabled,
            LinkOrder::Unsupported(Unordered::Refused),
        ] {
            assert_eq!(order.flags(Role::Connect4), 0, "{order}");
            assert!(!order.orders());
        }
    }

    /// Why links are appended reads as it did when it was text, and a failed probe
    /// keeps the kernel's error as its source.
    #[test]
    fn an_unordered_kernel_says_why_with_the_probe_error_as_source() {
        assert_eq!(
            LinkOrder::Unsupported(Unordered::Refused).to_string(),
            "appended: this kernel does not order cgroup links (BPF_F_BEFORE refused: EINVAL)"
        );
        assert_eq!(
            LinkOrder::Unsupported(Unordered::NotLoaded("connect4")).to_string(),
            "appended: connect4 is not loaded: the probe of cgroup link ordering could not run"
        );
        let failed = Unordered::ProbeFailed(Arc::new(io::Error::from_raw_os_error(libc::EPERM)));
        assert!(std::error::Error::source(&failed).is_some());
        assert_eq!(
            failed.to_string(),
            format!(
                "the probe of BPF_F_BEFORE failed: {}",
                io::Error::from_raw_os_error(libc::EPERM)
            )
        );
    }
}
