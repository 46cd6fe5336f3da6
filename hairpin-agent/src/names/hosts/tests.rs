//! Unit tests for the hosts block (pure) and `write_in_place` (on real files).

use std::{
    net::IpAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::*;

fn host(s: &str) -> Hostname {
    Hostname::parse(s).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn block(entries: &[(&str, &str)]) -> HostsBlock {
    let (block, skipped) = HostsBlock::from_entries(entries.iter().map(|(i, h)| (ip(i), host(h))));
    assert!(skipped.is_empty());
    block
}

const ORIGINAL: &[u8] = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n";

#[test]
fn renders_sorted_deduplicated_and_skips_wildcards() {
    let (b, skipped) = HostsBlock::from_entries([
        (ip("10.0.0.2"), host("b.example.com")),
        (ip("10.0.0.1"), host("a.example.com")),
        (ip("10.0.0.2"), host("B.example.com.")),
        (ip("fd00::1"), host("a.example.com")),
        (ip("10.0.0.9"), host("*.example.com")),
    ]);
    assert_eq!(b.len(), 3);
    assert_eq!(
        skipped,
        vec![Skipped {
            ip: ip("10.0.0.9"),
            hostname: host("*.example.com"),
            reason: SkipReason::Wildcard
        }]
    );
    assert_eq!(
        skipped[0].reason.to_string(),
        "/etc/hosts cannot express wildcard names"
    );
    let out = apply(b"", &b).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "# BEGIN hairpin managed block (do not edit)\n\
         10.0.0.1\ta.example.com\n\
         fd00::1\ta.example.com\n\
         10.0.0.2\tb.example.com\n\
         # END hairpin managed block\n"
    );
}

#[test]
fn appends_then_replaces_in_place_then_removes() {
    let one = block(&[("10.0.0.1", "a.example.com")]);
    let two = block(&[("10.0.0.2", "b.example.com")]);
    let with_one = apply(ORIGINAL, &one).unwrap();
    assert!(with_one.starts_with(ORIGINAL));
    // Lines after the block stay after it when the block is replaced.
    let mut edited = with_one.clone();
    edited.extend_from_slice(b"10.1.1.1\tadded-later\n");
    let with_two = apply(&edited, &two).unwrap();
    let text = String::from_utf8(with_two.clone()).unwrap();
    assert!(
        text.contains(
            "10.0.0.2\tb.example.com\n# END hairpin managed block\n10.1.1.1\tadded-later\n"
        )
    );
    assert!(!text.contains("a.example.com"));
    assert_eq!(
        remove(&with_two).unwrap(),
        [ORIGINAL, b"10.1.1.1\tadded-later\n".as_slice()].concat()
    );
    assert_eq!(remove(&with_one).unwrap(), ORIGINAL);
    assert_eq!(apply(&with_one, &HostsBlock::empty()).unwrap(), ORIGINAL);
}

#[test]
fn round_trips_files_without_final_newline_and_odd_bytes() {
    let b = block(&[("10.0.0.1", "a.example.com")]);
    let cases: [&[u8]; 7] = [
        b"",
        b"no newline",
        b"crlf\r\nfile\r\n",
        b"ends with cr\r",
        b"\xff\xfe binary \x00 bytes\n\x80",
        b"\n\n\n",
        b"# BEGIN hairpin managed block\n# END hairpin\n",
    ];
    for x in cases {
        let applied = apply(x, &b).unwrap();
        assert!(applied.starts_with(x), "{x:?}");
        assert_eq!(remove(&applied).unwrap(), x, "{x:?}");
        assert_eq!(apply(&applied, &b).unwrap(), applied, "idempotent on {x:?}");
        assert_eq!(apply(x, &HostsBlock::empty()).unwrap(), x, "{x:?}");
    }
    let applied = apply(b"no newline", &b).unwrap();
    assert_eq!(
        applied,
        b"no newline\n# BEGIN hairpin managed block (do not edit)\n10.0.0.1\ta.example.com\n# END hairpin managed block"
    );
}

#[test]
fn recognises_markers_with_crlf_and_surrounding_blanks() {
    let file = b"a\r\n  # BEGIN hairpin managed block (do not edit)\r\n1.1.1.1\told\r\n# END hairpin managed block \r\nz\r\n";
    assert_eq!(remove(file).unwrap(), b"a\r\nz\r\n");
}

#[test]
fn ambiguous_files_are_errors_naming_the_lines() {
    let b = block(&[("10.0.0.1", "a.example.com")]);
    let unterminated = format!("x\n{BEGIN_MARKER}\n1.1.1.1 a\n");
    let err = apply(unterminated.as_bytes(), &b).unwrap_err();
    assert!(matches!(err, BlockError::Unterminated { line: 2 }), "{err}");
    assert_eq!(
        err.to_string(),
        "managed block begins at line 2 but has no end: expected a \"# END hairpin managed block\" line after it"
    );

    let stray = format!("x\n{END_MARKER}\n{BEGIN_MARKER}\n{END_MARKER}\n");
    assert!(matches!(
        remove(stray.as_bytes()),
        Err(BlockError::StrayEnd { line: 2 })
    ));
    assert!(matches!(
        remove(format!("{END_MARKER}\n").as_bytes()),
        Err(BlockError::StrayEnd { line: 1 })
    ));

    let two = format!("{BEGIN_MARKER}\n{END_MARKER}\n{BEGIN_MARKER}\n{END_MARKER}\n");
    let err = remove(two.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            BlockError::MultipleBlocks {
                first: 1,
                second: 3
            }
        ),
        "{err}"
    );

    let nested = format!("{BEGIN_MARKER}\n{BEGIN_MARKER}\n{END_MARKER}\n");
    assert!(matches!(
        remove(nested.as_bytes()),
        Err(BlockError::MultipleBlocks {
            first: 1,
            second: 2
        })
    ));

    let huge = vec![b'#'; MAX_HOSTS_FILE_BYTES + 1];
    let err = apply(&huge, &b).unwrap_err();
    assert!(matches!(err, BlockError::TooLarge { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("expected at most 1048576 bytes")
    );
}

/// Regression: a file just under the limit used to get the block appended, and
/// then every later edit, cleanup included, refused the file as too large.
#[test]
fn an_edit_that_would_pass_the_size_limit_is_refused() {
    let b = block(&[("10.0.0.1", "a.example.com")]);
    let mut at_limit = vec![b'#'; MAX_HOSTS_FILE_BYTES - 1];
    at_limit.push(b'\n');
    let err = apply(&at_limit, &b).unwrap_err();
    assert!(
        matches!(err, BlockError::WouldBeTooLarge { len } if len > MAX_HOSTS_FILE_BYTES as u64)
    );
    assert_eq!(
        err.to_string(),
        format!(
            "with the managed block the file would be {} bytes; expected at most 1048576",
            at_limit.len() + 95
        )
    );
    // Removing is always possible, and a file with room takes the block.
    assert_eq!(remove(&at_limit).unwrap(), at_limit);
    let roomy = &at_limit[200..];
    let applied = apply(roomy, &b).unwrap();
    assert_eq!(remove(&applied).unwrap(), roomy);
}

#[test]
fn write_in_place_overwrites_shrinks_and_keeps_the_inode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hosts");
    std::fs::write(
        &path,
        b"a much longer original content\nthat must not leave a tail\n",
    )
    .unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    write_in_place(&path, b"short\n").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"short\n");
    write_in_place(&path, b"longer than before\n").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"longer than before\n");
    // Same inode: a bind mount of the file keeps seeing our writes.
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()),
        inode
    );
}

#[test]
fn write_in_place_skips_unchanged_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hosts");
    std::fs::write(&path, ORIGINAL).unwrap();
    let past = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(past)
        .unwrap();
    write_in_place(&path, ORIGINAL).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), past);
}

#[test]
fn write_in_place_never_creates_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent-hosts");
    let err = write_in_place(&path, b"x\n").unwrap_err();
    assert!(matches!(err, HostsError::Missing { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(!path.exists());
}

/// A read-only file: mode 0444 does not stop root (CAP_DAC_OVERRIDE), so as root
/// this bind-mounts the file read-only over itself inside a private mount
/// namespace owned by one short-lived thread; the mount disappears with the
/// thread, even on panic, and never propagates to the host.
#[test]
fn write_in_place_reports_a_read_only_file_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hosts");
    std::fs::write(&path, ORIGINAL).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        assert_read_only(&path);
        return;
    }
    let thread_path = path.clone();
    std::thread::spawn(move || {
        if let Err(e) = read_only_bind_mount(&thread_path) {
            eprintln!(
                "SKIPPED write_in_place read-only test: cannot make a read-only bind mount: {e}"
            );
            return;
        }
        assert_read_only(&thread_path);
    })
    .join()
    .unwrap();
    // Outside the namespace the file is untouched and still writable.
    assert_eq!(std::fs::read(&path).unwrap(), ORIGINAL);
    write_in_place(&path, b"x\n").unwrap();
}

fn assert_read_only(path: &Path) {
    let err = write_in_place(path, b"changed\n").unwrap_err();
    assert!(matches!(err, HostsError::ReadOnly { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("read-only"),
        "{msg}"
    );
    assert_eq!(std::fs::read(path).unwrap(), ORIGINAL);
    // Unchanged content is not a write, so it succeeds even read-only.
    write_in_place(path, ORIGINAL).unwrap();
}

/// Makes `path` read-only for the calling thread only (see the test above).
fn read_only_bind_mount(path: &Path) -> io::Result<()> {
    use std::{ffi::CString, os::unix::ffi::OsStrExt, ptr::null};
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    let target = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: plain syscalls with valid NUL-terminated strings or null pointers;
    // they only affect this thread's (new, private) mount namespace.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Private first, or the bind mount would propagate back to the host.
        check(libc::mount(
            null(),
            c"/".as_ptr(),
            null(),
            libc::MS_REC | libc::MS_PRIVATE,
            null(),
        ))?;
        check(libc::mount(
            target.as_ptr(),
            target.as_ptr(),
            null(),
            libc::MS_BIND,
            null(),
        ))?;
        let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
        check(libc::mount(null(), target.as_ptr(), null(), flags, null()))?;
    }
    Ok(())
}

/// Runs `steps` on `state` one byte at a time, calling `check` on the file as a
/// kill would leave it: before the first step, after every byte written, after
/// each truncate. Returns the final content.
pub(crate) fn simulate(
    mut state: Vec<u8>,
    steps: &[FileEdit],
    mut check: impl FnMut(&[u8]),
) -> Vec<u8> {
    check(&state);
    for step in steps {
        match step {
            FileEdit::Write { at, bytes } => {
                for (i, b) in bytes.iter().enumerate() {
                    let at = at + i;
                    if at == state.len() {
                        state.push(*b);
                    } else {
                        state[at] = *b;
                    }
                    check(&state);
                }
            }
            FileEdit::Truncate(len) => {
                state.resize(*len, 0);
                check(&state);
            }
            FileEdit::Sync => {}
        }
    }
    state
}

/// Whether `plan` promises a valid file at every byte for this edit: everything
/// but growing or removing a block that has other lines after it.
pub(crate) fn byte_safe(old: &[u8], new: &[u8]) -> bool {
    match locate(old) {
        Ok(Some(l)) if l.end < old.len() => old.len() == new.len(),
        _ => true,
    }
}

/// Every state a kill can leave while `old` becomes `apply(old, b)`: it parses,
/// the next sync turns it into exactly `new`, and removing the block gives what
/// removing it from `new` gives (except the one residual: the newline written
/// before a new block in a file that had none).
pub(crate) fn check_every_byte(old: &[u8], b: &HostsBlock) {
    let new = apply(old, b).unwrap();
    let steps = plan(old, &new);
    let safe = byte_safe(old, &new);
    let residual = [old, b"\n".as_slice()].concat();
    let mut states = 0;
    let end = simulate(old.to_vec(), &steps, |state| {
        states += 1;
        if !safe {
            return;
        }
        let ctx = || {
            format!(
                "old {:?} -> new {:?}, killed at {:?}",
                String::from_utf8_lossy(old),
                String::from_utf8_lossy(&new),
                String::from_utf8_lossy(state)
            )
        };
        assert!(locate(state).is_ok(), "does not parse: {}", ctx());
        if state == residual.as_slice() && !old.ends_with(b"\n") && !old.is_empty() {
            // The residual case: only the newline before the new block was written;
            // the file reads as one that always ended with a newline.
            return;
        }
        assert_eq!(
            apply(state, b).as_deref(),
            Ok(new.as_slice()),
            "not repaired: {}",
            ctx()
        );
        assert_eq!(remove(state), remove(&new), "outside bytes: {}", ctx());
    });
    assert_eq!(end, new, "the plan ends at new");
    assert!(states > 0);
}

#[test]
fn a_kill_at_any_byte_leaves_a_file_that_parses_and_the_next_sync_repairs() {
    let one = block(&[("10.0.0.1", "a.example.com")]);
    let three = block(&[
        ("10.0.0.1", "a.example.com"),
        ("10.0.0.2", "b.example.com"),
        ("fd00::3", "c.example.com"),
    ]);
    let other = block(&[("10.0.0.9", "z.example.com")]);
    let empty = HostsBlock::empty();
    let originals: [&[u8]; 4] = [ORIGINAL, b"", b"no final newline", b"crlf\r\n"];
    for x in originals {
        let with_one = apply(x, &one).unwrap();
        let with_three = apply(x, &three).unwrap();
        // Create, grow, shrink, same length, remove: the block at the end.
        for (old, new) in [
            (x.to_vec(), &one),
            (with_one.clone(), &three),
            (with_three.clone(), &one),
            (with_one.clone(), &other),
            (with_three.clone(), &empty),
        ] {
            check_every_byte(&old, new);
        }
        // Lines after the block (someone appended them): same length and shorter
        // blocks keep them in place; the write is valid at every byte.
        for tail in [b"10.1.1.1\tadded-later\n".as_slice(), b"x"] {
            let mid_three = [with_three.as_slice(), tail].concat();
            let mid_one = [with_one.as_slice(), tail].concat();
            if !with_three.ends_with(b"\n") {
                continue;
            }
            check_every_byte(&mid_three, &one);
            check_every_byte(&mid_one, &other);
            let shrunk = apply(&mid_three, &one).unwrap();
            assert_eq!(shrunk.len(), mid_three.len(), "padded, not moved");
            assert!(shrunk.ends_with(tail));
            // The padded block is stable and removable byte for byte.
            assert_eq!(apply(&shrunk, &one).unwrap(), shrunk);
            assert_eq!(remove(&shrunk).unwrap(), [x, tail].concat());
            // Growing it back reuses the room.
            check_every_byte(&shrunk, &three);
        }
    }
}

#[test]
fn pending_blocks_are_hairpins_to_the_end_of_the_file() {
    let b = block(&[("10.0.0.1", "a.example.com")]);
    // A pending line claims the rest of the file, whatever it holds (a torn block,
    // two END lines, a cut line).
    let file = [
        ORIGINAL,
        format!("{PENDING_MARKER}\n10.0.0.7\tgarb\n{END_MARKER}\n{END_MARKER}\n10.0.0.2 b")
            .as_bytes(),
    ]
    .concat();
    assert_eq!(remove(&file).unwrap(), ORIGINAL);
    let applied = apply(&file, &b).unwrap();
    assert_eq!(applied, apply(ORIGINAL, &b).unwrap());
    // The joined flavour: the newline before it goes too.
    let joined = format!("no newline\n{PENDING_JOINED_MARKER}\n10.0.0.7");
    assert_eq!(remove(joined.as_bytes()).unwrap(), b"no newline");
    assert_eq!(
        apply(joined.as_bytes(), &b).unwrap(),
        apply(b"no newline", &b).unwrap()
    );
    // A pending line half written is the last line, a prefix of the marker.
    for cut in 1..PENDING_MARKER.len() {
        let torn = [ORIGINAL, &PENDING_MARKER.as_bytes()[..cut]].concat();
        assert_eq!(remove(&torn).unwrap(), ORIGINAL, "{cut}");
    }
    // Anything not a prefix, or followed by a newline, is an ordinary line.
    for kept in [&b"%x"[..], b"% BEGIN hairpin managed block (do\n", b"#"] {
        let f = [ORIGINAL, kept].concat();
        assert_eq!(
            remove(&f).unwrap(),
            f,
            "{:?}",
            String::from_utf8_lossy(kept)
        );
    }
    // A pending line after a complete block, or after a BEGIN: ambiguous.
    let two = format!("{BEGIN_MARKER}\n{END_MARKER}\n{PENDING_MARKER}\n");
    assert_eq!(
        remove(two.as_bytes()),
        Err(BlockError::MultipleBlocks {
            first: 1,
            second: 3
        })
    );
    let frag = format!("{BEGIN_MARKER}\n{END_MARKER}\n%");
    assert_eq!(
        remove(frag.as_bytes()),
        Err(BlockError::MultipleBlocks {
            first: 1,
            second: 3
        })
    );
}

/// Issue 14 finding 9, on a real file: the old writer wrote the new content and
/// then truncated; killed in between, a shorter block left the old tail behind,
/// with a second END line, and every later sync and cleanup refused the file. Now
/// the same kill (every write done, the truncate not) leaves a pending block that
/// parses, and the next sync repairs it exactly.
#[test]
fn a_kill_between_the_write_and_the_truncate_is_repaired_by_the_next_sync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hosts");
    let long = block(&[
        ("10.0.0.1", "a.example.com"),
        ("10.0.0.2", "b.example.com"),
        ("10.0.0.3", "c.example.com"),
    ]);
    let short = block(&[("10.0.0.1", "a.example.com")]);
    let old = apply(ORIGINAL, &long).unwrap();
    let new = apply(&old, &short).unwrap();

    // What the old writer left: new content over the old, no truncate.
    let mut torn_before = old.clone();
    torn_before[..new.len()].copy_from_slice(&new);
    assert!(matches!(
        locate(&torn_before),
        Err(BlockError::MultipleBlocks { .. })
    ));

    std::fs::write(&path, &old).unwrap();
    let steps = plan(&old, &new);
    let cut = steps
        .iter()
        .position(|s| matches!(s, FileEdit::Truncate(_)))
        .expect("a shorter block is truncated");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    write_edits(&path, &file, &steps[..cut]).unwrap();
    drop(file);
    let left = std::fs::read(&path).unwrap();
    assert_eq!(left.len(), old.len(), "the truncate did not run");
    let text = String::from_utf8_lossy(&left).into_owned();
    assert!(
        text.contains(&format!("\n{PENDING_MARKER}\n")),
        "pending: {text}"
    );
    assert_eq!(
        remove(&left).unwrap(),
        ORIGINAL,
        "parses, outside bytes kept"
    );

    // The next sync with the same names writes exactly the new file.
    let target = apply(&left, &short).unwrap();
    assert_eq!(target, new);
    write_in_place(&path, &target).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), new);
    // And cleanup restores the original.
    write_in_place(&path, &remove(&new).unwrap()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), ORIGINAL);
}

/// A tool on the host that replaces /etc/hosts by rename leaves the agent's
/// single-file bind mount on the old inode, now without a name (nlink 0). Simulated
/// with a file unlinked while open, reached through /proc/self/fd as the mount
/// reaches it: the error names the path and the cause, and nothing is written.
#[test]
fn a_replaced_hosts_file_is_a_clear_error_naming_the_path_and_the_cause() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("hosts");
    std::fs::write(&real, ORIGINAL).unwrap();
    let held = std::fs::File::open(&real).unwrap();
    std::fs::remove_file(&real).unwrap();
    let path = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));

    let err = write_in_place(&path, b"changed\n").unwrap_err();
    assert!(matches!(err, HostsError::Replaced { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("hosts file {}: ", path.display()))
            && msg.contains("nlink 0")
            && msg.contains("replaced")
            && msg.contains("restart the pod"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), ORIGINAL, "nothing written");
}

/// The one write that moves lines after the block (removing it, here) is padded
/// with newlines to the old length: killed before the truncate, the file parses,
/// holds no block, and only blank lines follow what was there.
#[test]
fn removing_a_block_with_lines_after_it_leaves_only_blank_lines_if_killed() {
    let b = block(&[("10.0.0.1", "a.example.com")]);
    let tail = b"10.1.1.1\tadded-later\n";
    let old = [apply(ORIGINAL, &b).unwrap().as_slice(), tail].concat();
    let new = remove(&old).unwrap();
    assert_eq!(new, [ORIGINAL, tail].concat());
    let steps = plan(&old, &new);
    let [FileEdit::Write { .. }, FileEdit::Truncate(len)] = steps.as_slice() else {
        panic!("{steps:?}");
    };
    assert_eq!(*len, new.len());
    let killed = simulate(old.clone(), &steps[..1], |_| {});
    assert_eq!(killed.len(), old.len());
    assert!(killed.starts_with(&new));
    assert!(killed[new.len()..].iter().all(|&c| c == b'\n'));
    assert_eq!(locate(&killed), Ok(None));
    assert_eq!(simulate(old, &steps, |_| {}), new);
}
