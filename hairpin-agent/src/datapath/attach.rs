//! What is attached: the [`Attachment`] record of each hook's link and what became of
//! the link an earlier agent pinned there ([`Adoption`]), and the kernel ids `status`
//! and `dump` list. The links themselves are made, swapped and detached by the
//! lifecycle's executor (lifecycle/execute.rs).
//!
//! Owns the record. Never changes a link or a map.

use std::{fmt, os::fd::OwnedFd, path::PathBuf};

use super::lifecycle::state::Replace;
use super::role::Role;

/// Where the programs are attached, and through which links.
#[derive(Debug)]
pub(crate) struct Attachment {
    /// The cgroup v2 directory.
    pub cgroup: PathBuf,
    pub(crate) links: Vec<Link>,
    /// What became of the links found pinned at start: adopted (swapped in place)
    /// or not, per hook.
    pub adopted: Vec<(&'static str, Adoption)>,
}

/// One hook's bpf_link.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) role: Role,
    /// The program it runs (ELF name).
    pub(crate) program: &'static str,
    /// The link (None: sk_msg attached to the map the old way).
    pub(crate) fd: Option<OwnedFd>,
    /// The link's id, for `status`.
    pub(crate) id: Option<u32>,
    /// The root's child cgroup it is at (a connect link on a kernel that cannot
    /// order cgroup links, beside another program at the root), `None` at the root.
    pub(crate) child: Option<String>,
}

/// What the agent did with a hook's link at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// None was pinned: a new link was made.
    New,
    /// A pinned link ran an earlier agent's program: swapped for this agent's in
    /// place (`BPF_LINK_UPDATE`), so the hook was never without a program.
    Swapped,
    /// A pinned link was not what this hook needs (why): a new link was made and
    /// the old one detached after it.
    Replaced(Replace),
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
    pub(crate) fn adopted_status(&self) -> Vec<(String, String)> {
        self.adopted
            .iter()
            .map(|(hook, how)| (hook.to_string(), how.to_string()))
            .collect()
    }
}

impl Attachment {
    /// The record of `links` at `cgroup`, and what became of each hook's link.
    pub(crate) fn new(
        cgroup: PathBuf,
        links: Vec<Link>,
        adopted: Vec<(&'static str, Adoption)>,
    ) -> Attachment {
        Attachment {
            cgroup,
            links,
            adopted,
        }
    }

    /// Adds `link`, made at the hook `hook` as `how` says.
    pub(crate) fn push(&mut self, link: Link, hook: &'static str, how: Adoption) {
        self.adopted.push((hook, how));
        self.links.push(link);
    }

    /// The root's child cgroups the connect links are at, when they are there
    /// rather than at the root (sorted, each once).
    pub(crate) fn children(&self) -> Vec<&str> {
        let mut c: Vec<&str> = self
            .links
            .iter()
            .filter_map(|l| l.child.as_deref())
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// The program linked at `role`, if one is.
    pub(crate) fn program(&self, role: Role) -> Option<&'static str> {
        self.links
            .iter()
            .find(|l| l.role == role)
            .map(|l| l.program)
    }

    /// Kernel ids of the linked programs and their links, for `status` and `dump`
    /// (`info` describes a loaded program); the maps' ids are the maps' owner's.
    pub(crate) fn kernel_ids(
        &self,
        info: impl Fn(&str) -> Option<aya::programs::ProgramInfo>,
    ) -> crate::status::KernelIds {
        let mut ids = crate::status::KernelIds::default();
        // The connect programs first, as `status` has always listed them.
        let (connect, rest): (Vec<&Link>, Vec<&Link>) = self
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
            // The same program linked at several child cgroups: one entry, its links.
            if let Some(p) = ids.programs.iter_mut().find(|p| p.name == l.program) {
                p.link_ids.extend(l.id);
                continue;
            }
            let Some(info) = info(l.program) else {
                continue;
            };
            ids.programs.push(crate::status::ProgramIds {
                name: l.program.to_string(),
                program_id: info.id(),
                link_ids: l.id.into_iter().collect(),
                map_ids: info.map_ids().ok().flatten().unwrap_or_default(),
            });
        }
        ids
    }
}
