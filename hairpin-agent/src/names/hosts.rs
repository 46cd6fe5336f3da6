//! The node's /etc/hosts: one block between marker lines that hairpin owns, every
//! other byte left exactly as it was.
//!
//! The file is handled as bytes (it may not be UTF-8) and the block's shape encodes
//! how it was added, so that removing it restores the original byte for byte:
//! a block appended to a file that did not end with a newline is written with a
//! newline before it and none after its END line.
//!
//! The file is rewritten in place (a single-file bind mount cannot be renamed
//! onto), so [`plan`] orders the writes so that a kill at any byte leaves a file
//! that parses and that the next sync repairs exactly:
//! - A block at the end of the file (where hairpin appends it) is first marked
//!   *pending* by one byte: its BEGIN line's `#` becomes `%` ([`PENDING_MARKER`];
//!   `&`, [`PENDING_JOINED_MARKER`], when a newline was added before it), which
//!   claims everything from that line to the end of the file for hairpin. Then the
//!   new block is written, the file truncated, and one byte turns `%` back into `#`.
//!   A new block is written pending and committed the same way; while its pending
//!   line is itself half written, the file's last line is a prefix of it, which
//!   counts as pending too. Removing a block at the end is one truncate.
//! - A block with other lines after it keeps its length: a shorter block is padded
//!   with one blank line before its END line, so its END line stays at the same
//!   offset and the lines after it never move. Such a same-length overwrite is
//!   valid at every byte: the BEGIN and END lines are the same bytes before and
//!   after, and no mix of old and new lines hairpin writes spells a marker.
//!
//! Growing a block that has lines after it, or removing it, moves those lines:
//! that is one write (then a truncate, with blank lines padding the write so a
//! kill before the truncate leaves only blank lines behind), valid between the
//! two but not at every byte inside the write. Residual case: a kill right after
//! the newline written before a new block, in a file that had none, leaves that
//! newline (harmless; `cleanup` then keeps it).
//!
//! "A kill" is the agent stopping between any two bytes (SIGKILL, OOM). For a power
//! cut, an fdatasync between the pending mark, the rewrite and the commit keeps
//! them in that order on disk. Resolvers read a pending block's lines as usual
//! (the `%` line is not an address, so they skip it); a reader racing a write may
//! see a half-written entry for that instant.

use std::{collections::BTreeSet, fmt, io, net::IpAddr, path::PathBuf};

use thiserror::Error;

use super::hostname::Hostname;

/// First line of the managed block.
pub const BEGIN_MARKER: &str = "# BEGIN hairpin managed block (do not edit)";
/// Last line of the managed block.
pub const END_MARKER: &str = "# END hairpin managed block";
/// First line of a block being written at the end of the file: everything from it
/// to the end of the file is hairpin's. [`BEGIN_MARKER`] with `%` for `#`.
pub const PENDING_MARKER: &str = "% BEGIN hairpin managed block (do not edit)";
/// As [`PENDING_MARKER`], for a block appended to a file that did not end with a
/// newline (removing it also removes the newline written before it).
pub const PENDING_JOINED_MARKER: &str = "& BEGIN hairpin managed block (do not edit)";
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
    /// More than one BEGIN (or END, or pending) marker: we will not guess which
    /// block is ours.
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
    /// The path reaches a file that no longer has a name on the host (nlink 0):
    /// something replaced the host's file by rename (or deleted it), and this
    /// single-file bind mount still shows the old one, which no resolver reads.
    #[error(
        "hosts file {}: the file behind this path was replaced or deleted on the host (it has no links left, nlink 0), \
         so nothing written here reaches a resolver; a tool rewrote the host's hosts file by rename and the \
         single-file mount still shows the old file: restart the pod to mount the new one",
        path.display()
    )]
    Replaced {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Located {
    /// Offset of the BEGIN (or pending) line's first byte.
    start: usize,
    /// Offset just past the END line, its newline included when it has one; the
    /// end of the file for a pending block.
    end: usize,
    /// Whether the END line ends with `\n` (a pending block: whether its marker
    /// is [`PENDING_MARKER`], not [`PENDING_JOINED_MARKER`]).
    end_has_newline: bool,
    /// A block being written: from its line to the end of the file.
    pending: bool,
}

/// Which marker a line is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Marker {
    Begin,
    End,
    /// A pending BEGIN; `true` for [`PENDING_MARKER`], `false` for the joined one.
    Pending(bool),
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
    } else if line == PENDING_MARKER.as_bytes() {
        Some(Marker::Pending(true))
    } else if line == PENDING_JOINED_MARKER.as_bytes() {
        Some(Marker::Pending(false))
    } else {
        None
    }
}

/// Whether the file's last line, without a newline, is the start of a pending
/// line being written: a non-empty proper prefix of either pending marker.
/// Returns the flavour as [`Marker::Pending`] does.
fn pending_fragment(last_line: &[u8]) -> Option<bool> {
    if last_line.is_empty() || last_line.ends_with(b"\n") {
        return None;
    }
    [(PENDING_MARKER, true), (PENDING_JOINED_MARKER, false)]
        .into_iter()
        .find(|(m, _)| m.len() > last_line.len() && m.as_bytes().starts_with(last_line))
        .map(|(_, kept)| kept)
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
    let mut last: Option<(usize, usize, &[u8])> = None;
    for (idx, line) in file.split_inclusive(|&b| b == b'\n').enumerate() {
        let lineno = idx + 1;
        last = Some((lineno, offset, line));
        match marker_of(line) {
            Some(Marker::Pending(kept)) => {
                // Everything from here on is the block being written.
                if let Some((first, _)) = begin {
                    return Err(BlockError::MultipleBlocks {
                        first,
                        second: lineno,
                    });
                }
                return Ok(Some(Located {
                    start: offset,
                    end: file.len(),
                    end_has_newline: kept,
                    pending: true,
                }));
            }
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
    let fragment = last.and_then(|(lineno, offset, line)| {
        pending_fragment(line).map(|kept| (lineno, offset, kept))
    });
    match (begin, end, fragment) {
        (None, None, None) => Ok(None),
        (Some((line, _)), None, _) => Err(BlockError::Unterminated { line }),
        (None, Some((line, ..)), _) => Err(BlockError::StrayEnd { line }),
        (None, None, Some((_, start, kept))) => Ok(Some(Located {
            start,
            end: file.len(),
            end_has_newline: kept,
            pending: true,
        })),
        (Some((first, _)), Some(_), Some((second, ..))) => {
            Err(BlockError::MultipleBlocks { first, second })
        }
        (Some((_, start)), Some((_, end, end_has_newline)), None) => Ok(Some(Located {
            start,
            end,
            end_has_newline,
            pending: false,
        })),
    }
}

/// Returns `original` with its managed block replaced by `block` (or appended at
/// the end when it has none); an empty `block` removes the managed block.
/// Bytes outside the block are kept exactly. A pending block (one a killed write
/// left, see the module docs) is replaced or removed like any other. When lines
/// follow the block and the new one is shorter, it is padded with a blank line
/// before its END line to the old block's length, so those lines stay where they
/// are (see [`plan`]). A result over [`MAX_HOSTS_FILE_BYTES`] is refused, so
/// hairpin never writes a file it would then refuse to edit or clean up.
pub fn apply(original: &[u8], block: &HostsBlock) -> Result<Vec<u8>, BlockError> {
    let located = locate(original)?;
    let mut out = Vec::with_capacity(original.len() + 64 + block.len() * 40);
    match located {
        Some(Located {
            start,
            end,
            end_has_newline,
            ..
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
                let mut rendered = block.render_without_final_newline();
                if end_has_newline {
                    rendered.push(b'\n');
                }
                let old_len = end - start;
                if !after.is_empty() && rendered.len() < old_len {
                    // Keep the lines after the block where they are: one blank line
                    // (spaces, then a newline) before END takes up the difference.
                    let pad = old_len - rendered.len();
                    let at = rendered.len() - END_MARKER.len() - 1;
                    let mut line = vec![b' '; pad - 1];
                    line.push(b'\n');
                    rendered.splice(at..at, line);
                }
                out.extend_from_slice(before);
                out.extend_from_slice(&rendered);
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

/// One write of [`plan`]: bytes at an offset, or the file cut (or grown) to a length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileEdit {
    /// `bytes` written at offset `at`, in order.
    Write {
        /// Offset of the first byte.
        at: usize,
        /// What is written there.
        bytes: Vec<u8>,
    },
    /// The file's length set to this (ftruncate).
    Truncate(usize),
    /// Everything written so far is made durable (fdatasync) before what follows,
    /// so a power cut cannot persist a later edit without an earlier one.
    Sync,
}

/// The writes that turn the file `old` into `new` in place such that a kill
/// between any two bytes leaves a file that parses and from which [`apply`] gives
/// `new` again (see the module docs for the scheme and its one residual case).
/// `new` is expected to be `apply(old, block)`; anything else is written plainly:
/// the changed tail at once, padded with newlines to the old length when shorter,
/// then a truncate.
pub fn plan(old: &[u8], new: &[u8]) -> Vec<FileEdit> {
    let same = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let (Ok(before), Ok(after)) = (locate(old), locate(new)) else {
        return plain(old, new, same);
    };
    let at_end = |l: &Located, file: &[u8]| l.end == file.len();
    match (before, after) {
        // Removing a block at the end of the file: one truncate.
        (Some(b), None) if at_end(&b, old) && old.starts_with(new) => {
            vec![FileEdit::Truncate(new.len())]
        }
        // A new block appended: written pending, then committed.
        (None, Some(a)) if !a.pending && at_end(&a, new) && new.starts_with(old) => {
            let mut bytes = new[old.len()..].to_vec();
            bytes[a.start - old.len()] = pending_byte(a.end_has_newline);
            vec![
                FileEdit::Write {
                    at: old.len(),
                    bytes,
                },
                FileEdit::Sync,
                FileEdit::Write {
                    at: a.start,
                    bytes: vec![b'#'],
                },
            ]
        }
        // A block at the end replaced: marked pending, rewritten, cut, committed.
        (Some(b), Some(a))
            if !a.pending && b.start == a.start && at_end(&b, old) && at_end(&a, new) =>
        {
            let mut edits = vec![
                FileEdit::Write {
                    at: a.start,
                    bytes: vec![pending_byte(a.end_has_newline)],
                },
                FileEdit::Sync,
            ];
            let from = same.max(a.start + 1);
            if from < new.len() {
                edits.push(FileEdit::Write {
                    at: from,
                    bytes: new[from..].to_vec(),
                });
            }
            if new.len() < old.len() {
                edits.push(FileEdit::Truncate(new.len()));
            }
            edits.extend([
                FileEdit::Sync,
                FileEdit::Write {
                    at: a.start,
                    bytes: vec![b'#'],
                },
            ]);
            edits
        }
        // A block with lines after it, same length (padded by `apply`): overwrite
        // the bytes that differ; BEGIN and END stay the same bytes at the same place.
        (Some(b), Some(a))
            if !b.pending
                && (b.start, b.end) == (a.start, a.end)
                && old.len() == new.len()
                && !at_end(&a, new) =>
        {
            let last = (0..new.len()).rev().find(|&i| old[i] != new[i]);
            match last {
                Some(last) if same <= last => vec![FileEdit::Write {
                    at: same,
                    bytes: new[same..=last].to_vec(),
                }],
                _ => Vec::new(),
            }
        }
        _ => plain(old, new, same),
    }
}

/// The first byte of a pending block's line.
fn pending_byte(kept_newline: bool) -> u8 {
    if kept_newline {
        PENDING_MARKER.as_bytes()[0]
    } else {
        PENDING_JOINED_MARKER.as_bytes()[0]
    }
}

/// The changed tail in one write; when shorter, padded with newlines to the old
/// length before the truncate, so a kill in between leaves blank lines, never the
/// old file's tail (a second END line).
fn plain(old: &[u8], new: &[u8], same: usize) -> Vec<FileEdit> {
    let mut bytes = new[same.min(new.len())..].to_vec();
    let mut edits = Vec::new();
    if new.len() < old.len() {
        bytes.resize(bytes.len() + old.len() - new.len(), b'\n');
    }
    if !bytes.is_empty() {
        edits.push(FileEdit::Write { at: same, bytes });
    }
    if new.len() < old.len() {
        edits.push(FileEdit::Truncate(new.len()));
    }
    edits
}

mod write;
pub(crate) use write::check_linked;
#[cfg(test)]
use write::write_edits;
pub(crate) use write::write_in_place;

#[cfg(test)]
pub(crate) mod tests;
