//! Polling: what a suite waits for (a log line, a counter, a reply) settles a little
//! after the action that causes it.

use std::time::{Duration, Instant};

/// `d` stretched by `HAIRPIN_TEST_SLOWDOWN` (a whole factor, 1 when unset): the
/// kernel matrix runs the suites in emulated VMs (qemu TCG), about 15 times slower
/// than the host, and sets it there. Only for waits on something to settle (an
/// agent ready, a server listening), never for a bound a test asserts.
pub fn slack(d: Duration) -> Duration {
    let factor = std::env::var("HAIRPIN_TEST_SLOWDOWN")
        .ok()
        .and_then(|f| f.parse::<u32>().ok())
        .filter(|f| *f >= 1)
        .unwrap_or(1);
    d * factor
}

/// `read()` once `done` holds for it, or after 3 s whatever it is: servers log a
/// request after answering it, so a log can lag the reply.
pub fn eventually(read: impl Fn() -> String, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + slack(Duration::from_secs(3));
    let mut text = read();
    while !done(&text) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        text = read();
    }
    text
}

/// Polls `probe` every 10 ms until it holds; how long that took, or `None` after
/// `within`.
pub fn wait_until(within: Duration, mut probe: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if probe() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
