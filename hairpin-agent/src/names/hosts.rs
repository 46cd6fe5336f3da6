//! The node's /etc/hosts: one block between marker lines that hairpin owns, every
//! other byte left exactly as it was.
//!
//! The file is handled as bytes (it may not be UTF-8) and the block's shape encodes
//! how it was added, so that removing it restores the original byte for byte:
//! a block appended to a file that did not end with a newline is written with a
//! newline before it and none after its END line.

use std::{
    collections::BTreeSet,
    fmt,
    fs::OpenOptions,
    io::{self, Write},
    net::IpAddr,
    path::{Path, PathBuf},
};

use thiserror::Error;

use super::hostname::Hostname;

/// First line of the managed block.
pub const BEGIN_MARKER: &str = "# BEGIN hairpin managed block (do not edit)";
/// Last line of the managed block.
pub const END_MARKER: &str = "# END hairpin managed block";
/// Larger files are refused: a real /etc/hosts is a few KiB, and a runaway
/// file should not be slurped and rewritten on every reconcile.
pub const MAX_HOSTS_FILE_BYTES: usize = 1024 * 1024;

/// Why a hosts file's content cannot be edited: its markers are ambiguous or it
/// is too large. Such a file is never written; the caller names the file
/// ([`HostsError::Content`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BlockError {
    /// A BEGIN marker line with no END marker after it (a half-written block).
    #[error(
        "managed block begins at line {line} but has no end: expected a {END_MARKER:?} line after it"
    )]
    Unterminated {
        /// 1-based line of the BEGIN marker.
        line: usize,
    },
    /// An END marker line with no BEGIN marker before it.
    #[error("{END_MARKER:?} at line {line}: expected a {BEGIN_MARKER:?} line before it")]
    StrayEnd {
        /// 1-based line of the END marker.
        line: usize,
    },
    /// More than one BEGIN (or END) marker: we will not guess which block is ours.
    #[error("expected at most one managed block, found markers at lines {first} and {second}")]
    MultipleBlocks {
        /// 1-based line of the first marker of that kind.
        first: usize,
        /// 1-based line of the repeated marker.
        second: usize,
    },
    /// The file is larger than [`MAX_HOSTS_FILE_BYTES`].
    #[error("expected at most {MAX_HOSTS_FILE_BYTES} bytes, got {len}")]
    TooLarge {
        /// Its size in bytes.
        len: u64,
    },
    /// With the managed block the file would exceed [`MAX_HOSTS_FILE_BYTES`]: it
    /// is not written, or the next edit (and cleanup) would refuse our own file.
    #[error(
        "with the managed block the file would be {len} bytes; expected at most {MAX_HOSTS_FILE_BYTES}"
    )]
    WouldBeTooLarge {
        /// The size it would have.
        len: u64,
    },
}

/// Why a hosts file could not be edited or written.
#[derive(Debug, Error)]
pub enum HostsError {
    /// The file's content is not something hairpin edits; it was left unchanged.
    #[error("hosts file {}: {source} (file left unchanged)", path.display())]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content.
        source: BlockError,
    },
    /// The file does not exist; it is never created (see [`write_in_place`]).
    #[error("hosts file {}: does not exist (expected the node's hosts file mounted there)", path.display())]
    Missing {
        /// The path that was opened.
        path: PathBuf,
    },
    /// The file or its mount is read-only, or we lack permission to write it.
    #[error("hosts file {}: is read-only or not writable (expected a writable hostPath mount): {source}", path.display())]
    ReadOnly {
        /// The path that was opened.
        path: PathBuf,
        /// The underlying error (EROFS, EACCES or EPERM).
        source: io::Error,
    },
    /// Any other I/O failure.
    #[error("hosts file {}: failed to {op}: {source}", path.display())]
    Io {
        /// What was being done: `stat`, `read`, `open`, `write`, `truncate`, `fsync`.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// An entry left out of the block, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The address it would have mapped to.
    pub ip: IpAddr,
    /// The name that was left out.
    pub hostname: Hostname,
    /// Why it was left out.
    pub reason: SkipReason,
}

/// Why an entry cannot go into /etc/hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// /etc/hosts has no wildcard syntax; use the CoreDNS fallback for these.
    Wildcard,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Wildcard => f.write_str("/etc/hosts cannot express wildcard names"),
        }
    }
}

/// The desired content of the managed block: exact names and their addresses,
/// deduplicated and ordered by hostname, then address, so rendering is stable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostsBlock {
    entries: BTreeSet<(Hostname, IpAddr)>,
}

impl HostsBlock {
    /// A block with no entries: applying it removes the managed block.
    pub fn empty() -> HostsBlock {
        HostsBlock::default()
    }

    /// Builds a block from `(address, name)` pairs, returning the wildcard names
    /// it had to leave out so the caller can report them.
    pub fn from_entries(
        entries: impl IntoIterator<Item = (IpAddr, Hostname)>,
    ) -> (HostsBlock, Vec<Skipped>) {
        let mut block = HostsBlock::default();
        let mut skipped = Vec::new();
        for (ip, hostname) in entries {
            if hostname.is_wildcard() {
                skipped.push(Skipped {
                    ip,
                    hostname,
                    reason: SkipReason::Wildcard,
                });
            } else {
                block.entries.insert((hostname, ip));
            }
        }
        (block, skipped)
    }

    /// Whether the block has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of `address name` lines.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries in rendering order.
    pub fn iter(&self) -> impl Iterator<Item = (&IpAddr, &Hostname)> {
        self.entries.iter().map(|(h, ip)| (ip, h))
    }

    /// The block's lines, markers included, each ending in `\n` except that the
    /// END line's newline is left to the caller.
    fn render_without_final_newline(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.entries.len() * 40);
        out.extend_from_slice(BEGIN_MARKER.as_bytes());
        out.push(b'\n');
        for (hostname, ip) in &self.entries {
            out.extend_from_slice(format!("{ip}\t{hostname}\n").as_bytes());
        }
        out.extend_from_slice(END_MARKER.as_bytes());
        out
    }
}

/// Where the managed block sits in a file.
struct Located {
    /// Offset of the BEGIN line's first byte.
    start: usize,
    /// Offset just past the END line, its newline included when it has one.
    end: usize,
    /// Whether the END line ends with `\n`.
    end_has_newline: bool,
}

/// Which marker a line is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Marker {
    Begin,
    End,
}

/// The marker a line holds, ignoring surrounding blanks and a CRLF ending, so a
/// block edited on another system is still found; partial markers are not markers.
fn marker_of(line: &[u8]) -> Option<Marker> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.trim_ascii();
    if line == BEGIN_MARKER.as_bytes() {
        Some(Marker::Begin)
    } else if line == END_MARKER.as_bytes() {
        Some(Marker::End)
    } else {
        None
    }
}

/// Finds the managed block, if any, rejecting anything ambiguous.
fn locate(file: &[u8]) -> Result<Option<Located>, BlockError> {
    if file.len() > MAX_HOSTS_FILE_BYTES {
        return Err(BlockError::TooLarge {
            len: file.len() as u64,
        });
    }
    // (line number, offset of the line's start) of the BEGIN marker, and
    // (line number, offset past the line, has a newline) of the END marker.
    let mut begin: Option<(usize, usize)> = None;
    let mut end: Option<(usize, usize, bool)> = None;
    let mut offset = 0;
    for (idx, line) in file.split_inclusive(|&b| b == b'\n').enumerate() {
        let lineno = idx + 1;
        match marker_of(line) {
            Some(Marker::Begin) => {
                if let Some((first, _)) = begin {
                    return Err(BlockError::MultipleBlocks {
                        first,
                        second: lineno,
                    });
                }
                begin = Some((lineno, offset));
            }
            Some(Marker::End) => {
                if let Some((first, ..)) = end {
                    return Err(BlockError::MultipleBlocks {
                        first,
                        second: lineno,
                    });
                }
                if begin.is_none() {
                    return Err(BlockError::StrayEnd { line: lineno });
                }
                end = Some((lineno, offset + line.len(), line.ends_with(b"\n")));
            }
            None => {}
        }
        offset += line.len();
    }
    match (begin, end) {
        (None, None) => Ok(None),
        (Some((line, _)), None) => Err(BlockError::Unterminated { line }),
        (None, Some((line, ..))) => Err(BlockError::StrayEnd { line }),
        (Some((_, start)), Some((_, end, end_has_newline))) => Ok(Some(Located {
            start,
            end,
            end_has_newline,
        })),
    }
}

/// Returns `original` with its managed block replaced by `block` (or appended at
/// the end when it has none); an empty `block` removes the managed block.
/// Bytes outside the block are kept exactly. A result over
/// [`MAX_HOSTS_FILE_BYTES`] is refused, so hairpin never writes a file it would
/// then refuse to edit or clean up.
pub fn apply(original: &[u8], block: &HostsBlock) -> Result<Vec<u8>, BlockError> {
    let located = locate(original)?;
    let mut out = Vec::with_capacity(original.len() + 64 + block.len() * 40);
    match located {
        Some(Located {
            start,
            end,
            end_has_newline,
        }) => {
            let before = &original[..start];
            let after = &original[end..];
            if block.is_empty() {
                // A block at the very end whose END line lacks a newline was appended
                // to a file that lacked one: drop the newline we put before it.
                let before = if !end_has_newline && after.is_empty() {
                    before.strip_suffix(b"\n").unwrap_or(before)
                } else {
                    before
                };
                out.extend_from_slice(before);
                out.extend_from_slice(after);
            } else {
                out.extend_from_slice(before);
                out.extend_from_slice(&block.render_without_final_newline());
                if end_has_newline {
                    out.push(b'\n');
                }
                out.extend_from_slice(after);
            }
        }
        None => {
            out.extend_from_slice(original);
            if block.is_empty() {
                return Ok(out);
            }
            let had_final_newline = original.is_empty() || original.ends_with(b"\n");
            if !had_final_newline {
                out.push(b'\n');
            }
            out.extend_from_slice(&block.render_without_final_newline());
            if had_final_newline {
                out.push(b'\n');
            }
        }
    }
    if out.len() > MAX_HOSTS_FILE_BYTES {
        return Err(BlockError::WouldBeTooLarge {
            len: out.len() as u64,
        });
    }
    Ok(out)
}

/// Returns `original` without its managed block: the inverse of [`apply`] on a
/// file that had none.
pub fn remove(original: &[u8]) -> Result<Vec<u8>, BlockError> {
    apply(original, &HostsBlock::empty())
}

/// Overwrites the existing file at `path` with `new`, in place.
///
/// The node's /etc/hosts is usually a single-file bind mount, where rename(2)
/// onto it fails with EBUSY or EXDEV, so this opens the file itself: O_WRONLY,
/// never O_CREAT (a missing file means a wrong mount, not something to create),
/// writes, truncates to the new length and fsyncs. Nothing is written when the
/// content is already `new`, so an unchanged reconcile does not touch the file.
///
/// Not atomic: a reader racing the write may see the new content followed by the
/// tail of the old one until the truncate. Writing before truncating keeps the
/// window to a longer file rather than an empty one, which would break every
/// lookup on the node.
pub fn write_in_place(path: &Path, new: &[u8]) -> Result<(), HostsError> {
    let missing_or = |op: &'static str, source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => HostsError::Missing {
            path: path.to_owned(),
        },
        _ => HostsError::Io {
            op,
            path: path.to_owned(),
            source,
        },
    };
    // Compare sizes first so an unrelated huge file is never read whole.
    let len = std::fs::metadata(path)
        .map_err(|e| missing_or("stat", e))?
        .len();
    if len == new.len() as u64 && std::fs::read(path).map_err(|e| missing_or("read", e))? == new {
        return Ok(());
    }
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|source| {
            if matches!(
                source.raw_os_error(),
                Some(libc::EROFS | libc::EACCES | libc::EPERM)
            ) {
                HostsError::ReadOnly {
                    path: path.to_owned(),
                    source,
                }
            } else {
                missing_or("open", source)
            }
        })?;
    file.write_all(new).map_err(|e| missing_or("write", e))?;
    file.set_len(new.len() as u64)
        .map_err(|e| missing_or("truncate", e))?;
    file.sync_all().map_err(|e| missing_or("fsync", e))?;
    Ok(())
}

#[cfg(test)]
mod tests;
