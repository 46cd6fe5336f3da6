//! The programs' diagnostic events: aya-log's ring buffer read into the agent's log
//! while the datapath lives, at the level the agent's `--log` filter lets through.
//!
//! Owns the reading task. Never touches a map the programs share.

use aya::Ebpf;

/// aya-log's level for the programs' events: the most verbose level the agent's
/// `--log` filter lets through for any target (0: none). It is a read-only global of
/// the object, so the verifier drops the events below it; finer per-target filtering
/// (`hairpin_ebpf=debug`) happens in the subscriber, as for the agent's own events.
pub(crate) fn events_level() -> u8 {
    use aya_log::Level;
    let level = match tracing::level_filters::LevelFilter::current().into_level() {
        None => return 0,
        Some(tracing::Level::ERROR) => Level::Error,
        Some(tracing::Level::WARN) => Level::Warn,
        Some(tracing::Level::INFO) => Level::Info,
        Some(tracing::Level::DEBUG) => Level::Debug,
        Some(_) => Level::Trace,
    };
    level.into()
}

/// The task reading the programs' aya-log ring buffer into the agent's log (through
/// the `log` crate, which the subscriber bridges to tracing); aborted on drop.
pub(crate) struct EventsReader(tokio::task::AbortHandle);

impl EventsReader {
    /// Takes the ring buffer out of `ebpf` and reads it on `rt`; None (and a debug
    /// line) when it cannot, which the datapath does without.
    pub(crate) fn start(ebpf: &mut Ebpf, rt: &tokio::runtime::Handle) -> Option<EventsReader> {
        let logger = match aya_log::EbpfLogger::init(ebpf) {
            Ok(logger) => logger,
            Err(e) => {
                tracing::debug!(error = %e, "the programs' events are not read (aya-log)");
                return None;
            }
        };
        let _entered = rt.enter();
        // SAFETY: the logger owns the ring buffer's descriptor and keeps it, open
        // and the same, for as long as it lives, which is as long as the AsyncFd.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        };
        let mut fd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                tracing::debug!(error = %e, "the programs' events are not read (aya-log)");
                return None;
            }
        };
        let task = rt.spawn(async move {
            loop {
                let Ok(mut ready) = fd.readable_mut().await else {
                    return;
                };
                ready.get_inner_mut().flush();
                ready.clear_ready();
            }
        });
        Some(EventsReader(task.abort_handle()))
    }
}

impl Drop for EventsReader {
    fn drop(&mut self) {
        self.0.abort();
    }
}
