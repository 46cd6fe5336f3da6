//! The executor's connect links at the root's child cgroups: on a kernel that cannot
//! order cgroup links, with another program (a socket load balancer) already at the
//! root's connect hook, the connect programs are linked at each child of the root
//! instead, where they run before every program at the root (the kernel runs a
//! socket's effective programs from its own cgroup up: see datapath/children.rs).
//! Never at the root and a child both: the root's run would follow the socket load
//! balancer's, see its backend, and clear the mark the child's run set for the LB
//! address. Each child's link is pinned (`links/connect4@<child>`), adopted by the
//! next agent (swapped in place, compare-and-swap), and removed with the datapath;
//! children made later are linked by [`Links::rescan_children`], children gone
//! have their pins removed.
//!
//! Owns the choice between the root and its children and the children's links.

use std::{os::fd::AsFd, path::Path};

use super::super::hook::{Target, repin};
use super::super::kernel::{LinkKernel, LoadedPrograms};
use super::Links;
use crate::datapath::attach::{Adoption, Link};
use crate::datapath::order::{self, LinkOrder};
use crate::datapath::pin;
use crate::datapath::role::Role;

/// The connect hooks, in the order they are linked.
const CONNECT: [Role; 2] = [Role::Connect4, Role::Connect6];

impl<K: LinkKernel> Links<K> {
    /// The root's child cgroups to link the connect programs at, when they go there
    /// rather than at `root`: the kernel cannot order cgroup links (probed, or
    /// `--link-order children`), and at one of the root's connect hooks another
    /// program runs, and would run, before this agent's (none of this agent's
    /// layout is pinned there, or the pinned one runs behind it). Without another
    /// program there the root's link is first and reaches every process, also the
    /// root cgroup's own: the children are only worth their cost where it is not.
    pub(super) fn children_to_link(&self, root: &Target<'_>) -> Option<Vec<String>> {
        if !matches!(self.order, LinkOrder::Unsupported(_)) {
            return None;
        }
        let in_front = CONNECT.into_iter().find_map(|role| {
            let ids = match self.kernel.prog_query(root.dir.as_fd(), role.attach_type()) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(hook = role.name(), cgroup = %root.path.display(), error = %e,
                        "the connect programs at the cgroup could not be listed: linked there");
                    return None;
                }
            };
            let own = self.pinned_root_prog(role);
            let front = own
                .and_then(|own| order::in_front(&ids, own))
                .unwrap_or(&ids);
            (!front.is_empty()).then(|| (role, front.to_vec()))
        })?;
        let children = match self.kernel.child_cgroups(root.path) {
            Ok(children) => children,
            Err(e) => {
                tracing::warn!(cgroup = %root.path.display(), error = %e,
                    "the child cgroups could not be listed: the connect programs go at the root, behind the other program");
                return None;
            }
        };
        tracing::warn!(
            hook = in_front.0.name(),
            in_front = ?in_front.1,
            cgroup = %root.path.display(),
            children = ?children,
            "this kernel cannot order cgroup links and another connect program is at the cgroup: \
             hairpin's connect programs go at each child cgroup, where they run first"
        );
        Some(children)
    }

    /// The id of the program this layout's pinned link at the root's `role` runs.
    fn pinned_root_prog(&self, role: Role) -> Option<u32> {
        let pins = self.pins()?;
        let link = self.kernel.open_pinned(&pins.link(role)).ok()?;
        let info = self.kernel.link_info(link.as_fd()).ok()?;
        (info.target_id != 0).then_some(info.prog_id)
    }

    /// Links `program` at `role` of each of `root`'s children `names`, adopting each
    /// one's pinned link as at the root. A child that cannot be linked (gone since
    /// it was listed, or another program there that allows no other) is left out
    /// and said.
    pub(super) fn link_children(
        &mut self,
        programs: &impl LoadedPrograms,
        (role, program): (Role, &'static str),
        root: &Path,
        names: &[String],
    ) -> Vec<(Link, Adoption)> {
        let mut made = Vec::new();
        for name in names {
            let path = root.join(name);
            let linked = Target::open_child(&self.kernel, &path, name).and_then(|target| {
                self.execute_hook(programs, role, Some(program), &target, false)
            });
            match linked {
                Ok(Some(link)) => made.push(link),
                Ok(None) => {}
                Err(e) => tracing::warn!(hook = role.name(), cgroup = %path.display(), error = %e,
                    "hairpin's connect program could not be linked at this child cgroup: its processes meet the root's programs first"),
            }
        }
        // The program the children's links run now, for the next agent's
        // compare-and-swap.
        if let (Some(pins), false) = (self.pins(), made.is_empty()) {
            let pinned = programs
                .program_fd(role, program, root)
                .ok()
                .map(|prog| repin(&self.kernel, &pins.prog(role), &prog));
            if let Some(Err(e)) = pinned {
                tracing::warn!(hook = role.name(), error = %e, "the connect program could not be pinned");
            }
        }
        made
    }

    /// After an attach: the connect links of this layout that no longer serve go,
    /// now that this agent's serve. Linked at the children, the root's link of an
    /// earlier agent (its program's pin stays: it is this agent's now); linked at
    /// the root, or at other children, the pinned links of children not linked now.
    pub(super) fn settle_children(&mut self, links: &[Link]) {
        let Some(pins) = self.pins() else {
            return;
        };
        let pinned = self.kernel.pins_in(&pins.links_dir()).unwrap_or_default();
        for role in CONNECT {
            let at_children: Vec<&str> = links
                .iter()
                .filter(|l| l.role == role)
                .filter_map(|l| l.child.as_deref())
                .collect();
            let stale: Vec<Option<&str>> = pinned
                .iter()
                .filter_map(|n| pin::child_of_pin(n, role))
                .filter(|c| !at_children.contains(c))
                .map(Some)
                .collect();
            if !at_children.is_empty() && self.detach_pinned(role, None) {
                tracing::warn!(
                    hook = role.name(),
                    "the connect link an earlier agent left at the root ran behind another program: re-created in front at each child cgroup, and the root's detached"
                );
            }
            for child in stale {
                self.detach_pinned(role, child);
            }
        }
    }

    /// Detaches and unpins the pinned link of `role` at the root's `child` (`None`:
    /// the root's own); one not there is fine. Whether there was one.
    fn detach_pinned(&self, role: Role, child: Option<&str>) -> bool {
        let Some(pins) = self.pins() else {
            return false;
        };
        let path = pins.link_at(role, child);
        let Ok(link) = self.kernel.open_pinned(&path) else {
            return false;
        };
        match self.kernel.link_detach(link.as_fd()) {
            Ok(()) => {
                tracing::info!(hook = role.name(), child = ?child, "an earlier connect link no longer used: detached")
            }
            // A child cgroup removed took its links with it.
            Err(e) => {
                tracing::debug!(hook = role.name(), child = ?child, error = %e, "an earlier connect link could not be detached (already gone)")
            }
        }
        let _ = self.kernel.unpin(&path);
        true
    }

    /// Looks again at the root's children, when the connect links are there: each
    /// child made since gets them (consumers are at the root already), each child
    /// removed has its links' records and pins dropped (the kernel detached them as
    /// the cgroup went). How many children were linked and dropped.
    pub(crate) fn rescan_children(&mut self, programs: &impl LoadedPrograms) -> (usize, usize) {
        let Some(att) = self.attachment.as_ref() else {
            return (0, 0);
        };
        let linked: Vec<String> = att.children().into_iter().map(str::to_string).collect();
        if linked.is_empty() {
            return (0, 0);
        }
        let root = att.cgroup.clone();
        let now = match self.kernel.child_cgroups(&root) {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(cgroup = %root.display(), error = %e, "the child cgroups could not be listed");
                return (0, 0);
            }
        };
        let new: Vec<String> = now
            .iter()
            .filter(|c| !linked.contains(c))
            .cloned()
            .collect();
        let gone: Vec<String> = linked.into_iter().filter(|c| !now.contains(c)).collect();
        for role in CONNECT {
            let Some(program) = self.attachment.as_ref().and_then(|a| a.program(role)) else {
                continue;
            };
            let made = self.link_children(programs, (role, program), &root, &new);
            if let Some(att) = self.attachment.as_mut() {
                for (link, how) in made {
                    att.push(link, role.name(), how);
                }
            }
        }
        if let Some(att) = self.attachment.as_mut() {
            att.links
                .retain(|l| !l.child.as_ref().is_some_and(|c| gone.contains(c)));
        }
        if let Some(pins) = self.pins() {
            for child in &gone {
                for role in CONNECT {
                    let _ = self.kernel.unpin(&pins.link_at(role, Some(child)));
                }
            }
        }
        if !new.is_empty() || !gone.is_empty() {
            tracing::info!(new = ?new, gone = ?gone, "child cgroups: hairpin's connect links follow them");
        }
        (new.len(), gone.len())
    }
}
