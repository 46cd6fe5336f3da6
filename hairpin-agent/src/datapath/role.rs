//! The hooks the datapath links at ([`Role`]): their pin names, their attach types,
//! which the kernel path alone uses, and the one order they are linked and detached
//! in (consumers first).
//!
//! Owns the hooks' names. Never links (the lifecycle's executor does).

use super::sys;

/// The hooks the datapath links at, in the order an agent attaches or swaps them:
/// consumers first (sk_msg and sock_ops act on sockets the connect programs mark),
/// so a socket marked by a new connect program always meets programs that expect it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// sk_msg on the sockets map.
    SkMsg,
    /// sock_ops at the cgroup.
    SockOps,
    /// cgroup/setsockopt.
    SetSockopt,
    /// cgroup/connect4.
    Connect4,
    /// cgroup/connect6.
    Connect6,
}

impl Role {
    /// Every role, consumers first.
    pub(crate) const ALL: [Role; 5] = [
        Role::SkMsg,
        Role::SockOps,
        Role::SetSockopt,
        Role::Connect4,
        Role::Connect6,
    ];

    /// The pin name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::SkMsg => "sk_msg",
            Role::SockOps => "sock_ops",
            Role::SetSockopt => "setsockopt",
            Role::Connect4 => "connect4",
            Role::Connect6 => "connect6",
        }
    }

    /// The kernel's attach type of the hook.
    pub(crate) fn attach_type(self) -> sys::AttachType {
        match self {
            Role::SkMsg => sys::AttachType::SkMsgVerdict,
            Role::SockOps => sys::AttachType::SockOps,
            Role::SetSockopt => sys::AttachType::SetSockopt,
            Role::Connect4 => sys::AttachType::Connect4,
            Role::Connect6 => sys::AttachType::Connect6,
        }
    }

    /// Whether this is a connect hook (the ones whose order among other programs
    /// matters).
    pub(crate) fn is_connect(self) -> bool {
        matches!(self, Role::Connect4 | Role::Connect6)
    }

    /// Whether the kernel path alone uses this hook.
    pub(crate) fn kernel_path_only(self) -> bool {
        matches!(self, Role::SkMsg | Role::SockOps | Role::SetSockopt)
    }
}

/// The order hooks are linked or swapped in: consumers first (sk_msg and sock_ops
/// act on sockets the connect programs mark, setsockopt serves the marked ones),
/// so a socket a new connect program marks always meets programs that expect it.
/// The one place this order is written; [`detach_order`] is its reverse.
pub(crate) fn attach_order() -> impl Iterator<Item = Role> {
    Role::ALL.into_iter()
}

/// The order hooks are detached in: the connect programs first, so no socket is
/// marked after this that sock_ops or sk_msg would not see.
pub(crate) fn detach_order() -> impl Iterator<Item = Role> {
    Role::ALL.into_iter().rev()
}
