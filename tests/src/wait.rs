//! Polling: what a suite waits for (a log line, a counter, a reply) settles a little
//! after the action that causes it.

use std::time::{Duration, Instant};

/// `read()` once `done` holds for it, or after 3 s whatever it is: servers log a
/// request after answering it, so a log can lag the reply.
pub fn eventually(read: impl Fn() -> String, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(3);
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
