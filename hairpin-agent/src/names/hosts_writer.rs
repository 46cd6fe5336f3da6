//! Keeps the node's /etc/hosts pointing the proxied names at the node-local name
//! relay: renders a [`HostsBlock`] from the routes and writes it in place, only when
//! the file would change.
//!
//! [`HostsWriter`] does so from its own task, at most once per
//! `--hosts-min-interval`: the first change after a quiet interval is written at
//! once, the changes arriving within the interval after a write wait for its end,
//! and only the latest of them is written (an Ingress flapping every few
//! milliseconds costs one write per interval on every node, not one per flap).
//! Every [`HostsWriter::set`] syncs the file again, so a block removed by hand is
//! written back on the next change, as before; a sync that finds the file already
//! as wanted writes nothing and does not start an interval. A change still waiting
//! at shutdown is written then, as the block stays for the next agent: it should
//! say what this agent last knew, not what it knew up to an interval before.
//!
//! The block stays on a plain SIGTERM: names keep resolving to the relay address
//! while the next agent starts (a DaemonSet rollout), and a stale entry only costs a
//! refused connect until then. [`cleanup`] (for `hairpin-agent cleanup` and node
//! decommissioning) removes it, restoring the file byte for byte.

use std::{
    io::Read,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{
    hosts::{self, BlockError, HostsBlock, HostsError, MAX_HOSTS_FILE_BYTES, Skipped},
    routes::NameRoute,
};
use crate::status::{AgentState, HostsWriterStatus, metrics::Metrics, rfc3339};

/// What a [`sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsReport {
    /// Whether the file was rewritten (false: it already had this block).
    pub changed: bool,
    /// Number of `address name` lines in the block.
    pub entries: usize,
    /// Names left out: wildcards, which /etc/hosts cannot express.
    pub skipped: Vec<Skipped>,
}

/// The block pointing every exact route name at `relay`, and the wildcards left out.
pub(crate) fn render(routes: &[NameRoute], relay: IpAddr) -> (HostsBlock, Vec<Skipped>) {
    let (block, mut skipped) =
        HostsBlock::from_entries(routes.iter().map(|r| (relay, r.host.clone())));
    // A wildcard on two LBs is one name left out, not two.
    skipped.dedup();
    (block, skipped)
}

/// Makes the managed block of the hosts file at `path` say `routes -> relay`.
///
/// A missing file is an error, never created (a wrong hostPath mount must be
/// noticed, not papered over); a read-only file or mount is
/// [`HostsError::ReadOnly`]. Bytes outside the block are kept. The suites' one-shot
/// write: the agent writes through [`HostsWriter`], which paces and reports.
pub fn sync(path: &Path, routes: &[NameRoute], relay: IpAddr) -> Result<HostsReport, HostsError> {
    let (block, skipped) = render(routes, relay);
    let changed = rewrite(path, &block)?;
    Ok(HostsReport {
        changed,
        entries: block.len(),
        skipped,
    })
}

/// Removes the managed block from the hosts file at `path`; returns whether the
/// file changed. A file without a block is left untouched.
pub fn cleanup(path: &Path) -> Result<bool, HostsError> {
    rewrite(path, &HostsBlock::empty())
}

fn rewrite(path: &Path, block: &HostsBlock) -> Result<bool, HostsError> {
    let original = read(path)?;
    let new = hosts::apply(&original, block).map_err(|source| HostsError::Content {
        path: path.to_owned(),
        source,
    })?;
    if new == original {
        return Ok(false);
    }
    hosts::write_in_place(path, &new)?;
    Ok(true)
}

/// Reads the file, refusing one over [`MAX_HOSTS_FILE_BYTES`] by its size, so a
/// runaway file is never read whole; the read itself is bounded too, in case the
/// file grows between the stat and the read.
fn read(path: &Path) -> Result<Vec<u8>, HostsError> {
    let io_err = |op: &'static str| {
        move |source: std::io::Error| match source.kind() {
            std::io::ErrorKind::NotFound => HostsError::Missing {
                path: path.to_owned(),
            },
            _ => HostsError::Io {
                op,
                path: path.to_owned(),
                source,
            },
        }
    };
    let file = std::fs::File::open(path).map_err(io_err("open"))?;
    // Checked on every sync, written or not: a replaced file is never seen again.
    hosts::check_linked(path, &file)?;
    let len = file.metadata().map_err(io_err("stat"))?.len();
    if len > MAX_HOSTS_FILE_BYTES as u64 {
        return Err(HostsError::Content {
            path: path.to_owned(),
            source: BlockError::TooLarge { len },
        });
    }
    let mut buf = Vec::with_capacity(len as usize);
    file.take(MAX_HOSTS_FILE_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(io_err("read"))?;
    Ok(buf)
}

/// The hosts file's writer task and the handle that feeds it.
pub(crate) struct HostsWriter {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    /// The wildcards left out last time: a change is said once.
    skipped: Vec<Skipped>,
}

/// What the handle and the task share.
struct Shared {
    path: PathBuf,
    relay: IpAddr,
    min_interval: Duration,
    metrics: Metrics,
    state: Option<AgentState>,
    wake: Notify,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The latest block asked for and not yet synced.
    pending: Option<HostsBlock>,
    /// Why the last sync failed, `None` when it did not.
    error: Option<String>,
    status: HostsWriterStatus,
}

impl HostsWriter {
    /// Starts the task keeping `path`'s block pointing names at `relay`, writing at
    /// most once per `min_interval`; it reports into `state`'s names status (when
    /// given) and `metrics`. Nothing is written before the first [`set`](Self::set).
    pub(crate) fn spawn(
        path: PathBuf,
        relay: IpAddr,
        min_interval: Duration,
        metrics: Metrics,
        state: Option<AgentState>,
    ) -> HostsWriter {
        let shared = Arc::new(Shared {
            path,
            relay,
            min_interval,
            metrics,
            state,
            wake: Notify::new(),
            inner: Mutex::new(Inner {
                status: HostsWriterStatus {
                    min_interval_ms: u64::try_from(min_interval.as_millis()).unwrap_or(u64::MAX),
                    ..HostsWriterStatus::default()
                },
                ..Inner::default()
            }),
        });
        shared.publish();
        let stop = CancellationToken::new();
        let task = tokio::spawn(pace_writes(shared.clone(), stop.clone()));
        HostsWriter {
            shared,
            stop,
            task: Some(task),
            skipped: Vec::new(),
        }
    }

    /// Asks for the block of `routes` (the latest call wins); returns at once.
    pub(crate) fn set(&mut self, routes: &[NameRoute]) {
        let (block, skipped) = render(routes, self.shared.relay);
        if skipped != self.skipped {
            for s in &skipped {
                warn!(host = %s.hostname, reason = %s.reason, "hosts file: name left out");
            }
            self.skipped = skipped;
        }
        {
            let mut inner = self.shared.lock();
            if inner.pending.as_ref().is_some_and(|p| *p != block) {
                inner.status.coalesced += 1;
                self.shared.metrics.hosts_coalesced();
            }
            inner.pending = Some(block);
            inner.status.pending = true;
        }
        self.shared.metrics.set_hosts_pending(true);
        self.shared.publish();
        self.shared.wake.notify_one();
    }

    /// Why the last sync failed, `None` when it did not (or none ran yet).
    pub(crate) fn error(&self) -> Option<String> {
        self.shared.lock().error.clone()
    }

    /// The writer's counters and pace, as `/status` shows them.
    #[cfg(test)]
    pub(crate) fn status(&self) -> HostsWriterStatus {
        self.shared.lock().status.clone()
    }

    /// Stops the task, writing a block still waiting for the interval first.
    pub(crate) async fn shutdown(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            error!(error = %e, "hosts file writer ended abnormally");
        }
    }
}

impl Drop for HostsWriter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Copies the writer's status and error into `/status`.
    fn publish(&self) {
        let Some(state) = &self.state else {
            return;
        };
        let (status, error) = {
            let inner = self.lock();
            (inner.status.clone(), inner.error.clone())
        };
        state.update(|s| {
            if let Some(n) = s.names.as_mut() {
                n.hosts_writer = Some(status);
                n.hosts_error = error;
            }
        });
    }

    /// Syncs the pending block, if any; returns whether the file was written.
    fn sync_pending(&self) -> bool {
        let Some(block) = self.lock().pending.take() else {
            return false;
        };
        let result = rewrite(&self.path, &block);
        let written = matches!(result, Ok(true));
        {
            let mut inner = self.lock();
            inner.status.pending = inner.pending.is_some();
            match result {
                Ok(changed) => {
                    inner.error = None;
                    if changed {
                        inner.status.writes += 1;
                        inner.status.last_write = Some(rfc3339(SystemTime::now()));
                        info!(path = %self.path.display(), entries = block.len(), "hosts file updated");
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    if inner.error.as_ref() != Some(&message) {
                        error!(error = %message, "hosts file not managed");
                    }
                    inner.error = Some(message);
                }
            }
            self.metrics.set_hosts_pending(inner.status.pending);
        }
        if written {
            self.metrics.hosts_written();
        }
        self.publish();
        written
    }
}

/// The task: waits for a block, for the interval since the last write, then syncs.
async fn pace_writes(shared: Arc<Shared>, stop: CancellationToken) {
    let mut last_write: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shared.wake.notified() => {}
            () = stop.cancelled() => break,
        }
        if let Some(at) = last_write {
            tokio::select! {
                () = tokio::time::sleep_until(at + shared.min_interval) => {}
                () = stop.cancelled() => break,
            }
        }
        if shared.sync_pending() {
            last_write = Some(Instant::now());
        }
    }
    // A block still waiting is written now (see the module's documentation).
    shared.sync_pending();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::ProxyVersion, names::hostname::Hostname};

    fn route(host: &str, lb: &str) -> NameRoute {
        NameRoute {
            host: Hostname::parse(host).expect("name"),
            lb: lb.parse().expect("ip"),
            ports: vec![80, 443],
            version: ProxyVersion::V1,
            source: "test".into(),
        }
    }

    const ORIGINAL: &[u8] = b"127.0.0.1\tlocalhost\n# keep me\n10.0.0.5 node-1 \xff\n";

    #[test]
    fn writes_exact_names_once_and_cleanup_restores_every_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        std::fs::write(&path, ORIGINAL).expect("write");
        let relay: IpAddr = "192.0.2.1".parse().expect("ip");
        let routes = [
            route("b.example.com", "203.0.113.11"),
            route("a.example.com", "203.0.113.10"),
            route("*.example.com", "203.0.113.10"),
            route("*.example.com", "2001:db8::10"),
        ];
        let report = sync(&path, &routes, relay).expect("sync");
        assert!(report.changed);
        assert_eq!(report.entries, 2);
        assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
        let text = std::fs::read(&path).expect("read");
        assert!(text.starts_with(ORIGINAL));
        let tail = String::from_utf8_lossy(&text[ORIGINAL.len()..]).into_owned();
        assert_eq!(
            tail,
            format!(
                "{}\n192.0.2.1\ta.example.com\n192.0.2.1\tb.example.com\n{}\n",
                hosts::BEGIN_MARKER,
                hosts::END_MARKER
            )
        );
        let again = sync(&path, &routes, relay).expect("sync again");
        assert!(
            !again.changed,
            "an unchanged block must not rewrite the file"
        );
        assert!(cleanup(&path).expect("cleanup"));
        assert_eq!(std::fs::read(&path).expect("read"), ORIGINAL);
        assert!(!cleanup(&path).expect("cleanup twice"));
    }

    /// A hosts file replaced on the host (nlink 0 behind the mount) is an error on
    /// every sync, even one that would write nothing, and for cleanup.
    #[test]
    fn a_replaced_file_is_reported_by_every_sync_and_cleanup() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("hosts");
        std::fs::write(&real, ORIGINAL).expect("write");
        let relay: IpAddr = "192.0.2.1".parse().expect("ip");
        let routes = [route("a.example.com", "203.0.113.10")];
        sync(&real, &routes, relay).expect("first sync");
        let held = std::fs::File::open(&real).expect("open");
        std::fs::remove_file(&real).expect("unlink");
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        for err in [
            sync(&path, &routes, relay).expect_err("unchanged sync"),
            sync(&path, &[], relay).expect_err("changing sync"),
            cleanup(&path).expect_err("cleanup"),
        ] {
            assert!(matches!(err, HostsError::Replaced { .. }), "{err}");
            assert!(err.to_string().contains("restart the pod"), "{err}");
        }
    }

    #[test]
    fn a_missing_file_is_a_clear_error_and_is_not_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("absent");
        let err = sync(
            &path,
            &[route("a.example.com", "203.0.113.10")],
            "192.0.2.1".parse().expect("ip"),
        )
        .expect_err("missing");
        assert!(matches!(err, HostsError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(!path.exists());
    }

    fn writer(path: &Path, metrics: &Metrics, state: Option<AgentState>) -> HostsWriter {
        HostsWriter::spawn(
            path.to_owned(),
            "192.0.2.1".parse().expect("ip"),
            Duration::from_secs(2),
            metrics.clone(),
            state,
        )
    }

    fn block_of(path: &Path) -> String {
        let text = std::fs::read(path).expect("read");
        String::from_utf8_lossy(&text[ORIGINAL.len()..]).into_owned()
    }

    /// Issue 14: an Ingress flapping 100 times within the interval costs one write
    /// at once and one at the interval's end, of the last block asked for.
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_changes_within_the_interval_is_one_more_write_of_the_last_block() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        std::fs::write(&path, ORIGINAL).expect("write");
        let metrics = Metrics::default();
        let mut w = writer(&path, &metrics, None);
        let started = Instant::now();
        for i in 0..100 {
            w.set(&[route(&format!("n{i}.example.com"), "203.0.113.10")]);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The first change was written at once; the rest wait for the interval.
        assert_eq!(w.status().writes, 1);
        assert!(w.status().pending);
        assert!(block_of(&path).contains("\tn0.example.com\n"));
        tokio::time::sleep_until(started + Duration::from_millis(1990)).await;
        assert_eq!(w.status().writes, 1, "not before the interval's end");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let status = w.status();
        assert_eq!(status.writes, 2);
        assert_eq!(status.coalesced, 98, "n1..n98 were replaced before a write");
        assert!(!status.pending);
        assert!(status.last_write.is_some());
        assert_eq!(
            block_of(&path),
            format!(
                "{}\n192.0.2.1\tn99.example.com\n{}\n",
                hosts::BEGIN_MARKER,
                hosts::END_MARKER
            )
        );
        let rendered = metrics.render();
        for line in [
            "hairpin_hosts_writes_total 2",
            "hairpin_hosts_coalesced_changes_total 98",
            "hairpin_hosts_write_pending 0",
        ] {
            assert!(rendered.contains(line), "{line}: {rendered}");
        }
        assert_eq!(metrics.hosts_counts(), (2, 98));
        w.shutdown().await;
    }

    /// An unchanged block is never written again, and starts no interval: the next
    /// real change is written at once. A block removed by hand is written back.
    #[tokio::test(start_paused = true)]
    async fn an_unchanged_block_is_not_rewritten_and_a_removed_one_is_written_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        std::fs::write(&path, ORIGINAL).expect("write");
        let metrics = Metrics::default();
        let mut w = writer(&path, &metrics, None);
        let a = [route("a.example.com", "203.0.113.10")];
        w.set(&a);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let written = std::fs::read(&path).expect("read");
        let modified = std::fs::metadata(&path)
            .expect("stat")
            .modified()
            .expect("mtime");
        for _ in 0..10 {
            w.set(&a);
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        assert_eq!(w.status().writes, 1);
        assert_eq!(w.status().coalesced, 0);
        assert_eq!(std::fs::read(&path).expect("read"), written);
        assert_eq!(
            std::fs::metadata(&path)
                .expect("stat")
                .modified()
                .expect("mtime"),
            modified
        );
        // Removed by hand: the next sync puts it back.
        assert!(cleanup(&path).expect("cleanup"));
        w.set(&a);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(std::fs::read(&path).expect("read"), written);
        assert_eq!(w.status().writes, 2);
        w.shutdown().await;
    }

    /// A change waiting for the interval at shutdown is written then, without
    /// waiting for the interval.
    #[tokio::test(start_paused = true)]
    async fn a_change_pending_at_shutdown_is_written_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        std::fs::write(&path, ORIGINAL).expect("write");
        let metrics = Metrics::default();
        let mut w = writer(&path, &metrics, None);
        w.set(&[route("a.example.com", "203.0.113.10")]);
        tokio::time::sleep(Duration::from_millis(1)).await;
        w.set(&[route("b.example.com", "203.0.113.10")]);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(w.status().pending);
        assert!(block_of(&path).contains("a.example.com"));
        let before = Instant::now();
        w.shutdown().await;
        assert!(before.elapsed() < Duration::from_secs(1));
        assert!(
            block_of(&path).contains("\tb.example.com\n"),
            "{}",
            block_of(&path)
        );
        assert!(!block_of(&path).contains("a.example.com"));
        assert_eq!(w.status().writes, 2);
        assert!(!w.status().pending);
    }

    /// The writer reports into the names status: its pace and counters, and why
    /// the file could not be written.
    #[tokio::test(start_paused = true)]
    async fn the_writer_reports_its_error_and_counters_in_the_names_status() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("absent");
        let state = AgentState::default();
        state.update(|s| s.names = Some(crate::status::NamesStatus::default()));
        let mut w = writer(&path, &Metrics::default(), Some(state.clone()));
        w.set(&[route("a.example.com", "203.0.113.10")]);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let names = state.snapshot().names.expect("names");
        assert!(
            names
                .hosts_error
                .as_deref()
                .is_some_and(|e| e.contains("does not exist")),
            "{names:?}"
        );
        assert_eq!(w.error(), names.hosts_error);
        let status = names.hosts_writer.expect("writer status");
        assert_eq!((status.min_interval_ms, status.writes), (2000, 0));
        assert!(!status.pending);
        std::fs::write(&path, ORIGINAL).expect("write");
        w.set(&[route("a.example.com", "203.0.113.10")]);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let names = state.snapshot().names.expect("names");
        assert_eq!(names.hosts_error, None);
        assert_eq!(names.hosts_writer.map(|w| w.writes), Some(1));
        w.shutdown().await;
    }
}
