//! Liveness: the dead-man switch's heartbeat (its writer, and how a pinned one
//! stands) and the relay's liveness registry (each listening relay socket in the
//! relays SOCKHASH), which together keep a dead agent's datapath from breaking
//! traffic.
//!
//! Owns the heartbeat and relays maps' entries. Never touches a link, the frontends
//! map or the pin directory.

use std::{fmt, net::SocketAddr, os::fd::BorrowedFd, sync::Arc, time::Duration};

use aya::maps::{Array, MapData, SockMap};
use hairpin_ebpf::{HEARTBEAT_BEAT, HEARTBEAT_TTL, MAP_HEARTBEAT, MAP_RELAYS};

use super::error::{DatapathError, map_error};

/// Default of `--datapath-ttl`: how long the connect programs act after the last
/// heartbeat; long enough for an upgrade that pulls an image.
pub(super) const DEFAULT_TTL: Duration = Duration::from_secs(600);

/// How often a running agent writes the datapath's heartbeat. Its own constant: the
/// run loop's beat for `/healthz` (`status::HEARTBEAT_EVERY`) is another clock.
pub(crate) const BEAT_EVERY: Duration = Duration::from_secs(1);

/// The fewest beats a `--datapath-ttl` must span: a TTL shorter than a few beats
/// would let one late write (a busy node, a paused process) make a running agent's
/// datapath inert.
pub(super) const MIN_TTL_BEATS: u32 = 5;

/// `--datapath-ttl` shorter than [`MIN_TTL_BEATS`] heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}s is shorter than {MIN_TTL_BEATS} heartbeats ({}s; the agent writes one every {}s): \
     one late beat would make the running agent's datapath inert",
    .ttl.as_secs_f64(), .min.as_secs_f64(), BEAT_EVERY.as_secs_f64()
)]
pub(crate) struct TtlTooShort {
    /// The TTL asked for.
    pub ttl: Duration,
    /// The shortest allowed.
    pub min: Duration,
}

/// Refuses a TTL shorter than [`MIN_TTL_BEATS`] beats of [`BEAT_EVERY`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<Duration, TtlTooShort> {
    let min = BEAT_EVERY * MIN_TTL_BEATS;
    if ttl < min {
        Err(TtlTooShort { ttl, min })
    } else {
        Ok(ttl)
    }
}

/// The datapath's liveness: the heartbeat map's writer and the relays map's. Made
/// at load, handed out as clones to the tasks that beat and register.
pub(crate) struct Liveness {
    heartbeat: Heartbeat,
    relays: RelayLiveness,
}

impl Liveness {
    /// Liveness over the heartbeat map (the connect programs act for `ttl` after
    /// each beat) and the relays map (its sockets marked `mark`).
    pub(crate) fn new(
        heartbeat: Array<MapData, u64>,
        ttl: Duration,
        relays: SockMap<MapData>,
        mark: u32,
    ) -> Liveness {
        Liveness {
            heartbeat: Heartbeat {
                map: Arc::new(std::sync::Mutex::new(heartbeat)),
                ttl,
            },
            relays: RelayLiveness {
                map: Arc::new(std::sync::Mutex::new(relays)),
                mark,
            },
        }
    }

    /// The heartbeat writer.
    pub(crate) fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// The relay's liveness registry.
    pub(crate) fn relays(&self) -> &RelayLiveness {
        &self.relays
    }
}

/// How a pinned heartbeat stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeartbeatState {
    /// Younger than its TTL: the connect programs act for this much longer.
    Live(Duration),
    /// Older than its TTL by this much: the connect programs leave traffic alone.
    Expired(Duration),
    /// Never written.
    Never,
    /// The map cannot be read.
    Unreadable,
}

impl fmt::Display for HeartbeatState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeartbeatState::Live(left) => write!(f, "live for {}s more", left.as_secs()),
            HeartbeatState::Expired(ago) => write!(f, "expired {}s ago", ago.as_secs()),
            HeartbeatState::Never => f.write_str("never written"),
            HeartbeatState::Unreadable => f.write_str("unreadable"),
        }
    }
}

/// The heartbeat's state for a beat and TTL read at `now` (all `CLOCK_MONOTONIC` ns).
pub(super) fn heartbeat_at(beat: u64, ttl: u64, now: u64) -> HeartbeatState {
    if beat == 0 {
        return HeartbeatState::Never;
    }
    let age = now.saturating_sub(beat);
    if age <= ttl {
        HeartbeatState::Live(Duration::from_nanos(ttl - age))
    } else {
        HeartbeatState::Expired(Duration::from_nanos(age - ttl))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists on Linux, so
    // the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The dead-man switch's writer: [`Heartbeat::beat`] stamps the heartbeat map with
/// `CLOCK_MONOTONIC` and the TTL. The agent beats every [`BEAT_EVERY`]; the connect
/// programs act only while the last beat is younger than the TTL.
#[derive(Clone)]
pub(crate) struct Heartbeat {
    map: Arc<std::sync::Mutex<Array<MapData, u64>>>,
    ttl: Duration,
}

impl Heartbeat {
    /// Writes the TTL and a beat of now.
    pub(crate) fn beat(&self) -> Result<(), DatapathError> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX);
        map.set(HEARTBEAT_TTL, ttl, 0)
            .and_then(|()| map.set(HEARTBEAT_BEAT, monotonic_ns(), 0))
            .map_err(map_error("write", MAP_HEARTBEAT, String::new()))
    }

    /// Seconds since the last beat (None: never, or unreadable).
    pub(crate) fn age(&self) -> Option<Duration> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let beat = map.get(&HEARTBEAT_BEAT, 0).ok().filter(|b| *b != 0)?;
        Some(Duration::from_nanos(monotonic_ns().saturating_sub(beat)))
    }

    /// The TTL.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Beats every `every` until the task is dropped; a failed write is logged.
    pub(crate) async fn beat_every(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.beat() {
                tracing::warn!(error = %e, "heartbeat not written: the datapath goes inert once its TTL passes without one");
            }
        }
    }
}

/// The relays' liveness registry: each relay listener's socket in the relays
/// SOCKMAP at its index (the relay's per family, the name relay's per names port).
/// The connect programs send a connect to a slot only while the listener the slot
/// names is there, carrying the bypass mark on a privileged port; the kernel takes a
/// listener out as it closes: a relay that is gone is never a target.
#[derive(Clone)]
pub(crate) struct RelayLiveness {
    map: Arc<std::sync::Mutex<SockMap<MapData>>>,
    /// The bypass mark, which a listener carries to be taken for the agent's own.
    mark: u32,
}

impl RelayLiveness {
    /// Marks the listening socket `fd` (listening on `addr`) with the bypass mark and
    /// registers it at `index`, in place of whatever was there. The map holds no
    /// reference that keeps it open: its owner closing it takes it out.
    pub(crate) fn register(
        &self,
        index: u8,
        addr: SocketAddr,
        fd: BorrowedFd<'_>,
    ) -> Result<(), DatapathError> {
        let what = || format!("listener {index} ({addr})");
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::Mark, &self.mark).map_err(
            |e| {
                map_error("insert", MAP_RELAYS, what())(aya::maps::MapError::SyscallError(
                    aya::sys::SyscallError {
                        call: "setsockopt(SO_MARK)",
                        io_error: e.into(),
                    },
                ))
            },
        )?;
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.set(u32::from(index), &fd, 0)
            .map_err(map_error("insert", MAP_RELAYS, what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_shorter_than_a_few_beats_is_refused_with_why() {
        assert_eq!(
            check_ttl(Duration::from_secs(5)),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(check_ttl(DEFAULT_TTL), Ok(DEFAULT_TTL));
        let e = check_ttl(Duration::from_millis(2500)).expect_err("2.5 s");
        assert_eq!(
            e.to_string(),
            "2.5s is shorter than 5 heartbeats (5s; the agent writes one every 1s): one late \
             beat would make the running agent's datapath inert"
        );
    }

    #[test]
    fn a_heartbeat_is_live_until_its_ttl_then_expired() {
        let s = Duration::from_secs(1).as_nanos() as u64;
        assert_eq!(heartbeat_at(0, 10 * s, 100 * s), HeartbeatState::Never);
        assert_eq!(
            heartbeat_at(95 * s, 10 * s, 100 * s),
            HeartbeatState::Live(Duration::from_secs(5))
        );
        assert_eq!(
            heartbeat_at(80 * s, 10 * s, 100 * s),
            HeartbeatState::Expired(Duration::from_secs(10))
        );
    }
}
