//! What is attached: the [`Attachment`] record of each hook's link and what became of
//! the link an earlier agent pinned there ([`Adoption`]), and the kernel ids `status`
//! and `dump` list. The links themselves are made, swapped and detached by the
//! lifecycle's executor (lifecycle/execute.rs).
//!
//! Owns the record. Never changes a link or a map.

use std::{fmt, os::fd::OwnedFd, path::PathBuf};

use super::{Datapath, Role};

/// Where the programs are attached, and through which links.
#[derive(Debug)]
pub struct Attachment {
    /// The cgroup v2 directory.
    pub cgroup: PathBuf,
    pub(super) links: Vec<Link>,
    /// What became of the links found pinned at start: adopted (swapped in place)
    /// or not, per hook.
    pub adopted: Vec<(&'static str, Adoption)>,
}

/// One hook's bpf_link.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) role: Role,
    /// The program it runs (ELF name).
    pub(super) program: &'static str,
    /// The link (None: sk_msg attached to the map the old way).
    pub(super) fd: Option<OwnedFd>,
    /// The link's id, for `status`.
    pub(super) id: Option<u32>,
}

/// What the agent did with a hook's link at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// None was pinned: a new link was made.
    New,
    /// A pinned link ran an earlier agent's program: swapped for this agent's in
    /// place (`BPF_LINK_UPDATE`), so the hook was never without a program.
    Swapped,
    /// A pinned link was not what this hook needs (why): a new link was made and
    /// the old one detached after it.
    Replaced(String),
    /// Another layout's link, handed over (its layout named): this agent's program
    /// swapped into it in place, and pinned as this layout's.
    TakenOver(String),
}

impl fmt::Display for Adoption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Adoption::New => f.write_str("new"),
            Adoption::Swapped => f.write_str("swapped"),
            Adoption::Replaced(why) => write!(f, "replaced: {why}"),
            Adoption::TakenOver(layout) => write!(f, "taken over from layout {layout}"),
        }
    }
}

impl Attachment {
    /// Per hook, what became of its link, as `status` lists it.
    pub fn adopted_status(&self) -> Vec<(String, String)> {
        self.adopted
            .iter()
            .map(|(hook, how)| (hook.to_string(), how.to_string()))
            .collect()
    }
}

impl Datapath {
    /// Where the programs are attached, if they are.
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Kernel ids of the programs, their links and the maps, for `status` and `dump`.
    pub fn kernel_ids(&self) -> crate::status::KernelIds {
        use aya::maps::IterableMap;
        let mut ids = crate::status::KernelIds::default();
        if let Some(att) = &self.attachment {
            // The connect programs first, as `status` has always listed them.
            let (connect, rest): (Vec<&Link>, Vec<&Link>) = att
                .links
                .iter()
                .partition(|l| matches!(l.role, Role::Connect4 | Role::Connect6));
            let order = |r: Role| match r {
                Role::SockOps => 0,
                Role::SetSockopt => 1,
                _ => 2,
            };
            let mut rest = rest;
            rest.sort_by_key(|l| order(l.role));
            for l in connect.into_iter().chain(rest) {
                let Some(info) = self.ebpf.program(l.program).and_then(|p| p.info().ok()) else {
                    continue;
                };
                ids.programs.push(crate::status::ProgramIds {
                    name: l.program.to_string(),
                    program_id: info.id(),
                    link_ids: l.id.into_iter().collect(),
                    map_ids: info.map_ids().ok().flatten().unwrap_or_default(),
                });
            }
        }
        ids.counters_map_id = self.counters.map().info().ok().map(|i| i.id());
        ids.frontends_map_id = self.frontends_id;
        ids
    }
}
