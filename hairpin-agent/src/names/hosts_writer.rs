//! Keeps the node's /etc/hosts pointing the proxied names at the node-local name
//! relay: renders a [`HostsBlock`] from the routes and writes it in place, only when
//! the file would change.
//!
//! The block stays on a plain SIGTERM: names keep resolving to the relay address
//! while the next agent starts (a DaemonSet rollout), and a stale entry only costs a
//! refused connect until then. [`cleanup`] (for `hairpin-agent cleanup` and node
//! decommissioning) removes it, restoring the file byte for byte.

use std::{io::Read, net::IpAddr, path::Path};

use super::{
    hosts::{self, BlockError, HostsBlock, HostsError, MAX_HOSTS_FILE_BYTES, Skipped},
    routes::NameRoute,
};

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
pub fn render(routes: &[NameRoute], relay: IpAddr) -> (HostsBlock, Vec<Skipped>) {
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
/// [`HostsError::ReadOnly`]. Bytes outside the block are kept.
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
}
