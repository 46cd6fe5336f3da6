//! Writing the hosts file in place: the plan's edits made to the open file, which
//! must still be linked (a file replaced on the host by rename is never written).

use std::{fs::OpenOptions, io, path::Path};

use super::{FileEdit, HostsError, MAX_HOSTS_FILE_BYTES, plan};

/// Overwrites the existing file at `path` with `new`, in place, by [`plan`].
///
/// The node's /etc/hosts is usually a single-file bind mount, where rename(2)
/// onto it fails with EBUSY or EXDEV, so this opens the file itself: O_WRONLY,
/// never O_CREAT (a missing file means a wrong mount, not something to create),
/// runs the plan's writes in order and fsyncs. Nothing is written when the
/// content is already `new`, so an unchanged reconcile does not touch the file.
/// A file with no links left (replaced on the host by rename) is
/// [`HostsError::Replaced`], before anything is written.
///
/// Not atomic for readers: one racing the writes may see a half-written block
/// (resolvers then miss or mismatch a name for that instant); the file on disk
/// is valid between any two bytes written, which is what a killed agent leaves.
pub(crate) fn write_in_place(path: &Path, new: &[u8]) -> Result<(), HostsError> {
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
    let old = if len <= MAX_HOSTS_FILE_BYTES as u64 || len == new.len() as u64 {
        Some(std::fs::read(path).map_err(|e| missing_or("read", e))?)
    } else {
        None
    };
    if old.as_deref() == Some(new) {
        return Ok(());
    }
    let file = OpenOptions::new()
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
    check_linked(path, &file)?;
    // A file too large to read (never one hairpin wrote) is overwritten plainly.
    let edits = match &old {
        Some(old) => plan(old, new),
        None => vec![
            FileEdit::Write {
                at: 0,
                bytes: new.to_vec(),
            },
            FileEdit::Truncate(new.len()),
        ],
    };
    write_edits(path, &file, &edits)?;
    file.sync_all().map_err(|e| missing_or("fsync", e))?;
    Ok(())
}

/// [`HostsError::Replaced`] when the open file has no links left.
pub(crate) fn check_linked(path: &Path, file: &std::fs::File) -> Result<(), HostsError> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|source| HostsError::Io {
        op: "stat",
        path: path.to_owned(),
        source,
    })?;
    if meta.nlink() == 0 {
        return Err(HostsError::Replaced {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// Makes `edits` to the open `file`, in order.
pub(super) fn write_edits(
    path: &Path,
    file: &std::fs::File,
    edits: &[FileEdit],
) -> Result<(), HostsError> {
    use std::os::unix::fs::FileExt;
    let io = |op: &'static str| {
        move |source: io::Error| HostsError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    };
    for edit in edits {
        match edit {
            FileEdit::Write { at, bytes } => {
                file.write_all_at(bytes, *at as u64).map_err(io("write"))?
            }
            FileEdit::Truncate(len) => file.set_len(*len as u64).map_err(io("truncate"))?,
            FileEdit::Sync => file.sync_data().map_err(io("fsync"))?,
        }
    }
    Ok(())
}
