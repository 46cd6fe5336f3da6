//! The loaded programs: the BPF object once loaded, which connect programs it runs
//! (the kernel path's or the relay path's, and why), how MPTCP subflows are told
//! apart, whether the relay's sk_lookup program loaded, and the task reading their
//! events. Handed to the links' executor as what it links ([`LoadedPrograms`]).
//!
//! Owns the [`Ebpf`] value and the kernel path's state. Never links a cgroup
//! program (the executor does) and never writes a map entry.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::Arc,
};

use aya::Ebpf;
use hairpin_ebpf::{PROG_SETSOCKOPT, PROG_SK_LOOKUP, PROG_SK_MSG, PROG_SOCK_OPS};

use super::error::{DatapathError, SteeringError, program_error};
use super::events::EventsReader;
use super::kernel_path::{KernelPath, KernelPathUnavailable};
use super::lifecycle::hook::link_error;
use super::lifecycle::kernel::LoadedPrograms;
use super::role::Role;
use crate::status::MptcpDetection as Mptcp;

/// The programs loaded into the kernel, and what they are.
pub(crate) struct Programs {
    ebpf: Ebpf,
    /// The connect programs loaded: the marking ones when the kernel path loaded.
    connect: [&'static str; 2],
    kernel_path: KernelPath,
    /// How MPTCP subflows are told apart at connect.
    mptcp: Mptcp,
    /// Why the relay's sk_lookup program did not load, if it did not: then no
    /// connection reaches a slot, and the relay path is down on this node.
    steering: Result<(), SteeringError>,
    /// Reads the programs' aya-log events into the agent's log while they live.
    _events: Option<EventsReader>,
}

impl Programs {
    /// The loaded `ebpf`, its connect programs `connect`, the kernel path and MPTCP
    /// as loaded, whether sk_lookup loaded, and the events' reader.
    pub(crate) fn new(
        ebpf: Ebpf,
        connect: [&'static str; 2],
        (kernel_path, mptcp): (KernelPath, Mptcp),
        steering: Result<(), SteeringError>,
        events: Option<EventsReader>,
    ) -> Programs {
        Programs {
            ebpf,
            connect,
            kernel_path,
            mptcp,
            steering,
            _events: events,
        }
    }

    /// How the kernel path stands: off, unavailable (why), or on.
    pub(crate) fn kernel_path(&self) -> &KernelPath {
        &self.kernel_path
    }

    /// How MPTCP subflows are told apart (`off` without the kernel path).
    pub(crate) fn mptcp(&self) -> Mptcp {
        self.mptcp
    }

    /// Whether connections aimed at the relay's slots can reach its listeners: why
    /// not, when the sk_lookup program did not load.
    pub(crate) fn steering(&self) -> Result<(), &SteeringError> {
        self.steering.as_ref().map(|_| ())
    }

    /// The kernel's description of the loaded program `name`.
    pub(crate) fn info(&self, name: &str) -> Option<aya::programs::ProgramInfo> {
        self.ebpf.program(name).and_then(|p| p.info().ok())
    }

    /// Links the sk_lookup program to this process's network namespace, where the
    /// relay listens: from now on a connection aimed at a bound slot reaches the
    /// listener its slot names. The link is this process's: it goes when the
    /// process does, as the relay's listeners do.
    pub(crate) fn steer_slots(&mut self) -> Result<(), DatapathError> {
        let netns = Path::new("/proc/self/ns/net");
        let error = |op| program_error(PROG_SK_LOOKUP, op, netns);
        let file = std::fs::File::open(netns)
            .map_err(|e| error("attach")(aya::programs::ProgramError::IOError(e)))?;
        let program: &mut aya::programs::SkLookup = self
            .ebpf
            .program_mut(PROG_SK_LOOKUP)
            .ok_or(DatapathError::Missing {
                kind: "program",
                name: PROG_SK_LOOKUP,
            })?
            .try_into()
            .map_err(error("attach"))?;
        program.attach(file).map_err(error("attach"))?;
        Ok(())
    }
}

impl LoadedPrograms for Programs {
    fn program_for(&self, role: Role) -> Option<&'static str> {
        let kernel_path = self.kernel_path.is_on();
        match role {
            Role::SkMsg => kernel_path.then_some(PROG_SK_MSG),
            Role::SockOps => kernel_path.then_some(PROG_SOCK_OPS),
            Role::SetSockopt => kernel_path.then_some(PROG_SETSOCKOPT),
            Role::Connect4 => Some(self.connect[0]),
            Role::Connect6 => Some(self.connect[1]),
        }
    }

    fn program_fd(
        &self,
        role: Role,
        name: &'static str,
        cgroup: &Path,
    ) -> Result<OwnedFd, DatapathError> {
        self.ebpf
            .program(name)
            .ok_or(DatapathError::Missing {
                kind: "program",
                name,
            })?
            .fd()
            .map_err(program_error(name, "attach", cgroup))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(link_error(role, cgroup, "read"))
    }

    fn lose_kernel_path(&mut self, why: DatapathError) {
        self.kernel_path =
            KernelPath::Unavailable(Arc::new(KernelPathUnavailable::LinkFailed(why)));
        self.mptcp = Mptcp::Off;
    }
}
