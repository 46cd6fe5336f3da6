//! The lifecycle at start: locks the pin directory and reads what is pinned there,
//! decides (decide.rs), and removes another layout's expired datapath (a takeover);
//! what to load is said as the links' pinning and a hand-over under way, which the
//! load hands to the links' owner (`datapath::start`).
//!
//! Owns the start's observation. Never loads or links a program.

use hairpin_ebpf::MAP_HEARTBEAT;

use super::decide;
use super::state::{ForeignLayout, Go, PinDirSeen, Start, StartSeen, Wait};
use super::takeover::Handover;
use crate::datapath::inspect::heartbeat_state;
use crate::datapath::options::LoadOptions;
use crate::datapath::pin::{self, PinDir, Pinning, Unusable};
use crate::datapath::role::Role;

/// What the lifecycle decided at start: what to load and how, or what to wait for.
pub(crate) enum Decided {
    /// Load: how (fresh, adopted, after a takeover, unpinned), the links' pinning,
    /// and a hand-over under way.
    Load {
        /// What the lifecycle decided.
        go: Go,
        /// Whether the links are pinned: the locked directory, or why not.
        pinning: Pinning,
        /// Another layout's live datapath being handed over.
        handover: Option<Handover>,
    },
    /// Nothing was changed: the agent waits, and says why.
    Wait(Wait),
}

/// Observes the node and decides; removes what of other layouts has expired when
/// the decision says so. While waiting, the lock is not held: the next observation
/// takes it again.
pub(crate) fn decide_start(opts: &LoadOptions) -> Decided {
    let (seen, pins) = observe_start(opts);
    let go = match decide::start(&seen) {
        Start::Wait(wait) => return Decided::Wait(wait),
        Start::Go(go) => go,
    };
    take_over(&go);
    let pinning = match (&go, pins) {
        (Go::Unpinned(Some(why)), _) => {
            tracing::warn!(error = %why, "the datapath is not pinned: it goes with this process, and traffic loses hairpin while no agent runs");
            Pinning::Failed(why.clone())
        }
        (Go::Unpinned(None), _) | (_, None) => Pinning::Off,
        (_, Some(dir)) => Pinning::Pinned(dir),
    };
    let handover = match &go {
        Go::HandOver { live, .. } => Some(Handover::of(live)),
        _ => None,
    };
    Decided::Load {
        go,
        pinning,
        handover,
    }
}

/// What a starting agent finds: the pin directory (locked when it can be, the lock
/// returned), this layout's links and the other layouts' datapaths with their
/// heartbeats.
fn observe_start(opts: &LoadOptions) -> (StartSeen, Option<PinDir>) {
    let mut seen = StartSeen {
        pins: PinDirSeen::Off,
        dir: opts.pin_dir.clone(),
        own_links: false,
        foreign: Vec::new(),
    };
    let Some(dir) = &opts.pin_dir else {
        return (seen, None);
    };
    match PinDir::lock(dir, opts.pin_layout, opts.pin_owner) {
        Ok(pins) => {
            seen.pins = PinDirSeen::Locked;
            seen.own_links = Role::ALL.iter().any(|r| pins.link(*r).exists());
            seen.foreign = pins
                .foreign_layouts()
                .into_iter()
                .map(|dir| ForeignLayout {
                    heartbeat: heartbeat_state(&dir.join("maps").join(MAP_HEARTBEAT)),
                    dir,
                })
                .collect();
            (seen, Some(pins))
        }
        Err(pin::PinError::Busy { .. }) => {
            seen.pins = PinDirSeen::Busy;
            (seen, None)
        }
        Err(e) => {
            seen.pins = PinDirSeen::Unusable(Unusable::new(e));
            (seen, None)
        }
    }
}

/// Removes the expired datapaths of other layouts a takeover or a hand-over names.
fn take_over(go: &Go) {
    let (Go::TakeOver { expired, .. } | Go::HandOver { expired, .. }) = go else {
        return;
    };
    for layout in expired {
        tracing::warn!(layout = %layout.dir.display(), heartbeat = %layout.heartbeat, "a datapath of another layout has expired: removing it and taking over");
        for r in pin::remove_layout(&layout.dir) {
            if let Err(e) = r.result {
                tracing::warn!(pin = %r.path.display(), error = %e, "could not remove");
            }
        }
    }
}
