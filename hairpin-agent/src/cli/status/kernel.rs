//! `status`'s `kernel path` lines, and the kernel path's counters as `status` and
//! `doctor` read them ([`KernelTally`]).

use std::collections::BTreeMap;

use hairpin_ebpf::Counter;

use super::{Tone, paint};
use crate::status::{KernelPathState, KernelPathStatus};

/// The kernel path's counters of connects sent to the relay, with what each means.
pub(crate) const KERNEL_FALLBACKS: [(Counter, &str); 5] = [
    (Counter::KernelFallbackRelay, "no socket storage"),
    (Counter::KernelFallbackFull, "sockets map near full"),
    (Counter::KernelFallbackMptcp, "MPTCP subflow"),
    (Counter::KernelFallbackFastOpen, "TCP Fast Open"),
    (Counter::KernelFallbackMesh, "mesh proxy"),
];

/// The kernel path's counters of connections that went without their header (see
/// [`Counter::is_kernel_miss`]), with what each means.
pub(crate) const KERNEL_MISSES: [(Counter, &str); 4] = [
    (
        Counter::KernelMissedDataFirst,
        "data sent before the handshake completed: TCP Fast Open (MSG_FASTOPEN, where the \
         agent has no CAP_PERFMON), or a send() queued while connecting",
    ),
    (
        Counter::KernelMissedInsert,
        "the socket could not enter the sockets map: full, or a socket the map refuses (an \
         MPTCP subflow, where the agent has no CAP_PERFMON)",
    ),
    (
        Counter::KernelMissedPush,
        "no memory to make room for the header",
    ),
    (
        Counter::KernelMissedWrite,
        "the room was made but the header could not be copied into it",
    ),
];

/// The kernel path's counters, as `status` and `doctor` read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelTally {
    /// Connects marked for an in-kernel header.
    pub marked: u64,
    /// Headers the kernel wrote.
    pub written: u64,
    /// Sockets in the sockets map now: entered less left.
    pub in_map: u64,
    /// Connects sent to the relay instead, per counter (in [`KERNEL_FALLBACKS`] order).
    pub fallbacks: Vec<(Counter, &'static str, u64)>,
    /// Connections without their header, per counter (in [`KERNEL_MISSES`] order).
    pub misses: Vec<(Counter, &'static str, u64)>,
}

impl KernelTally {
    /// From `/status`'s `counters.kernel`; a counter the agent does not report is 0.
    pub(crate) fn new(kernel: &BTreeMap<String, u64>) -> KernelTally {
        let get = |c: Counter| kernel.get(c.name()).copied().unwrap_or(0);
        let each = |list: &[(Counter, &'static str)]| {
            list.iter()
                .map(|&(c, what)| (c, what, get(c)))
                .collect::<Vec<_>>()
        };
        KernelTally {
            marked: get(Counter::KernelMarked),
            written: get(Counter::KernelHeadersWritten),
            // Per-CPU sums read one after the other: never below zero.
            in_map: get(Counter::KernelSocketsEntered)
                .saturating_sub(get(Counter::KernelSocketsLeft)),
            fallbacks: each(&KERNEL_FALLBACKS),
            misses: each(&KERNEL_MISSES),
        }
    }

    /// Connections that went without their header.
    pub(crate) fn missed(&self) -> u64 {
        self.misses.iter().map(|m| m.2).sum()
    }

    /// Connects sent to the relay instead.
    pub(crate) fn relayed(&self) -> u64 {
        self.fallbacks.iter().map(|f| f.2).sum()
    }

    /// Whether any counter moved.
    pub(crate) fn any(&self) -> bool {
        self.marked + self.written + self.in_map + self.missed() + self.relayed() > 0
    }

    /// The non-zero misses, `name N (what it means)`, joined by `; `.
    pub(crate) fn describe_misses(&self) -> String {
        self.misses
            .iter()
            .filter(|m| m.2 > 0)
            .map(|(c, what, n)| format!("{} {n} ({what})", c.name()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Every fallback, `what N`, joined by `, `.
    pub(crate) fn describe_fallbacks(&self) -> String {
        self.fallbacks
            .iter()
            .map(|(_, what, n)| format!("{what} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `kernel path` lines: how it stands and, when on, its sockets map, headers
/// written, fallbacks to the relay and misses (a miss is a connection that went
/// without its header: a warning).
pub(super) fn render_kernel_path(
    kp: &KernelPathStatus,
    kernel: &BTreeMap<String, u64>,
    colour: bool,
) -> String {
    let tally = KernelTally::new(kernel);
    let mut out = match kp.state {
        KernelPathState::On => format!(
            "kernel path {} (--kernel-path {}): the kernel writes the header of client-speaks-first \
             frontends on the client's own socket\n",
            paint("on", Tone::Good, colour),
            kp.configured
        ),
        KernelPathState::Off => format!(
            "kernel path off (--kernel-path {}): every frontend takes the relay\n",
            kp.configured
        ),
        // `auto` falls back to the relay as planned; `on` asked for the kernel path
        // as a requirement, so its absence is painted as a failure.
        KernelPathState::Unavailable => format!(
            "kernel path {} (--kernel-path {}{}): every frontend takes the relay\n",
            paint(
                &format!(
                    "unavailable: {}",
                    kp.reason.as_deref().unwrap_or("no reason given")
                ),
                if kp.configured.requires() {
                    Tone::Bad
                } else {
                    Tone::Warn
                },
                colour
            ),
            kp.configured,
            if kp.configured.requires() {
                ", required"
            } else {
                ""
            }
        ),
    };
    if kp.state != KernelPathState::On && !tally.any() {
        return out;
    }
    let map = match kp.sockets_map_id {
        Some(id) => format!("sockets map id {id}"),
        None => "sockets map".to_string(),
    };
    let fill = match kp.sockets_capacity {
        Some(cap) => {
            let limit = hairpin_ebpf::sockets_limit(cap.max(1));
            let text = format!(
                "{} of {cap} in use (new connects go to the relay from {limit})",
                tally.in_map
            );
            if tally.in_map >= u64::from(limit) {
                paint(&text, Tone::Warn, colour)
            } else {
                text
            }
        }
        None => format!("{} in use", tally.in_map),
    };
    out.push_str(&format!("            {map}: {fill}\n"));
    if let Some(pin) = &kp.sockets_map_pin {
        out.push_str(&format!(
            "            pinned at {pin}: the datapath outlives the agent\n"
        ));
    } else if let Some(why) = &kp.sockets_map_pin_error {
        out.push_str(&format!(
            "            {}\n",
            paint(
                &format!(
                    "not pinned ({why}): the datapath goes with the agent, and sockets \
                     established but not yet written when it dies go without their header"
                ),
                Tone::Warn,
                colour
            )
        ));
    }
    if let Some(m) = kp.mptcp_detection {
        out.push_str(&format!("            MPTCP subflows told apart by {m}\n"));
    }
    out.push_str(&format!(
        "            headers written {} of {} sockets marked; to the relay instead: {}\n",
        tally.written,
        tally.marked,
        tally.describe_fallbacks()
    ));
    let missed = tally.missed();
    if missed == 0 {
        out.push_str("            missed none: no connection went without its header\n");
    } else {
        out.push_str(&format!(
            "            {}\n",
            paint(
                &format!(
                    "missed {missed}: connections that went without their header: {}",
                    tally.describe_misses()
                ),
                Tone::Warn,
                colour
            )
        ));
    }
    out
}
