//! Unit tests for the hosts block (pure) and `write_in_place` (on real files).

use std::{net::IpAddr, os::unix::fs::PermissionsExt, time::SystemTime};

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
