//! The retry schedule of failed frontends.

use std::time::Duration;

/// First retry of failed frontends after an apply that left some failed.
pub(crate) const FAILED_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between retries of failed frontends.
pub(crate) const FAILED_RETRY_MAX: Duration = Duration::from_secs(30);

/// Doubling delays with a cap: 1 s, 2 s, 4 s ... 30 s, back to the first on reset
/// (a change from the source, or nothing left to retry).
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, never above `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The delay to wait now; the one after is twice as long, up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the first delay.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}
