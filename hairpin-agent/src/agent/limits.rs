//! What the agent asks of its process's resources: descriptors up to the hard limit,
//! and freed relay memory given back to the kernel after a burst of connections.

use std::time::Duration;

use tracing::{info, warn};

use crate::status::metrics::Metrics;

/// Raises the soft RLIMIT_NOFILE to the hard limit, as Go programs do at start.
///
/// Each relayed connection holds two descriptors, and runtimes differ in what they
/// hand a container: containerd 2 and systemd services get a soft limit of 1,024
/// (about 500 connections) under a hard limit hundreds of times higher. Returns the
/// soft limit in force.
pub(crate) fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "could not read RLIMIT_NOFILE");
            return 0;
        }
    };
    if soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!(error = %e, soft, hard, "could not raise RLIMIT_NOFILE to its hard limit");
        return soft;
    }
    let now = soft.max(hard);
    info!(
        limit = now,
        connections = now.saturating_sub(64) / 2,
        "descriptor limit (two per relayed connection)"
    );
    now
}

/// Decides when freed memory is worth returning: after connections closed since the
/// last time, so an idle agent does nothing and a busy one trims once per period.
#[derive(Debug, Default)]
pub(crate) struct TrimTrigger {
    last_closed: u64,
}

impl TrimTrigger {
    /// True when `closed` (connections closed so far) moved since the last `true`.
    pub(crate) fn due(&mut self, closed: u64) -> bool {
        let due = closed != self.last_closed;
        self.last_closed = closed;
        due
    }
}

/// Every `every`, gives freed heap memory back to the kernel if relayed connections
/// closed meanwhile.
///
/// glibc keeps freed chunks in its arenas: after 9,981 connections held at once
/// (two 64 KiB copy buffers each) the agent's RSS stayed at 327 MiB once they had
/// all closed, against 13 MiB before, and so counted against the container's memory
/// limit at the next burst. `malloc_trim(0)` brought it back to 34 MiB
/// (`tests/tests/reliability.rs`, RELIABILITY.md).
pub(crate) fn spawn_trimmer(metrics: Metrics, every: Duration) {
    tokio::spawn(async move {
        let mut trigger = TrimTrigger::default();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if trigger.due(metrics.connections_closed()) {
                release_free_memory();
            }
        }
    });
}

/// Gives the allocator's free pages back to the kernel: after a burst of relayed
/// connections (above), and after each reconcile (a large apply allocates the
/// parsed source, the plan and the status rows once and frees most of it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own arenas under their locks.
    unsafe { libc::malloc_trim(0) };
}

/// Nothing to give back with other allocators.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_connections_closed_since_the_last_trim() {
        let mut t = TrimTrigger::default();
        assert!(
            !t.due(0),
            "an agent that served nothing has nothing to return"
        );
        assert!(t.due(10_000));
        assert!(!t.due(10_000), "nothing closed since");
        assert!(t.due(10_001));
    }

    #[test]
    fn the_soft_descriptor_limit_ends_at_the_hard_one() {
        use nix::sys::resource::{Resource, getrlimit};
        let now = raise_nofile_limit();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        assert_eq!(soft, hard);
        assert_eq!(now, soft);
    }
}
