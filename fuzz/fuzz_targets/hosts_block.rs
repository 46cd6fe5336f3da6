//! The /etc/hosts block editor (`fallback::hosts`) over arbitrary file bytes.
//!
//! Invariants (the proptests in names/proptests.rs, over any bytes rather than
//! generated lines):
//! - the editor accepts a file exactly when an independent scan finds at most one
//!   BEGIN and one END marker line, in that order, before any pending line (a
//!   pending BEGIN line, or a last line without newline that is a proper prefix of
//!   one), and no BEGIN at all when there is a pending line; an error names marker
//!   lines;
//! - every byte before the BEGIN line and after the END line survives `apply`; a
//!   pending block runs to the end of the file;
//! - on a file without a block, `remove(apply(x, b)) == x` byte for byte, `apply` is
//!   idempotent, and replacing the block with another then removing still gives `x`;
//! - the written block has exactly one BEGIN and one END line and one `ip\tname`
//!   line per entry (plus, when lines follow a block that shrank, one blank padding
//!   line before END), each name a valid hostname (nothing injected);
//! - `hosts::plan`'s writes, cut after any byte, leave a file the editor accepts
//!   and from which `apply` gives the planned result, except where the plan says
//!   otherwise (growing or removing a block that has lines after it) and the one
//!   residual state (only the newline before a new block written).
#![no_main]

use std::{net::IpAddr, sync::LazyLock};

use hairpin_agent::names::{
    Hostname,
    hosts::{
        self, BEGIN_MARKER, BlockError, END_MARKER, FileEdit, HostsBlock, PENDING_JOINED_MARKER,
        PENDING_MARKER,
    },
};
use libfuzzer_sys::fuzz_target;

/// Blocks every input is edited with: none, one entry, mixed families with a
/// wildcard left out, and a longer one.
static BLOCKS: LazyLock<Vec<HostsBlock>> = LazyLock::new(|| {
    let entry = |ip: &str, name: &str| -> (IpAddr, Hostname) {
        (
            ip.parse().expect("fuzz block address"),
            Hostname::parse(name).expect("fuzz block name"),
        )
    };
    let many = (0..12).map(|i| entry(&format!("10.0.0.{i}"), &format!("host-{i}.example.com")));
    vec![
        HostsBlock::empty(),
        HostsBlock::from_entries([entry("192.0.2.1", "app.example.com")]).0,
        HostsBlock::from_entries([
            entry("192.0.2.1", "App.Example.com."),
            entry("2001:db8::1", "app.example.com"),
            entry("192.0.2.1", "*.example.com"),
            entry("192.0.2.1", "b.example.org"),
        ])
        .0,
        HostsBlock::from_entries(many).0,
    ]
});

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Begin,
    End,
    /// A pending BEGIN line, or the last line cut short inside one.
    Pending,
}

/// A marker line found by the reference scan.
#[derive(Debug, Clone, Copy)]
struct MarkerLine {
    kind: Kind,
    /// 1-based.
    line: usize,
    /// Offset of the line's first byte.
    start: usize,
    /// Offset past the line, its newline included.
    end: usize,
    has_newline: bool,
}

/// The reference scan: a marker is a whole line equal to a marker once its
/// newline and surrounding ASCII blanks (CR included) are dropped.
fn markers(file: &[u8]) -> Vec<MarkerLine> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, line) in file.split_inclusive(|&b| b == b'\n').enumerate() {
        let has_newline = line.last() == Some(&b'\n');
        let body = if has_newline {
            &line[..line.len() - 1]
        } else {
            line
        };
        let trimmed = body.trim_ascii();
        let pending = [PENDING_MARKER, PENDING_JOINED_MARKER];
        let kind = if trimmed == BEGIN_MARKER.as_bytes() {
            Some(Kind::Begin)
        } else if trimmed == END_MARKER.as_bytes() {
            Some(Kind::End)
        } else if pending.iter().any(|m| trimmed == m.as_bytes())
            || (!has_newline
                && !body.is_empty()
                && pending
                    .iter()
                    .any(|m| m.len() > body.len() && m.as_bytes().starts_with(body)))
        {
            Some(Kind::Pending)
        } else {
            None
        };
        if let Some(kind) = kind {
            out.push(MarkerLine {
                kind,
                line: i + 1,
                start,
                end: start + line.len(),
                has_newline,
            });
        }
        start += line.len();
    }
    out
}

fn is_marker(found: &[MarkerLine], line: usize, kind: Kind) -> bool {
    found.iter().any(|m| m.line == line && m.kind == kind)
}

/// The block written into `out` has one line per entry, each `ip\tname` with a
/// valid name, between exactly one BEGIN and one END line (a blank padding line
/// aside).
fn check_written_block(out: &[u8], block: &HostsBlock) {
    let found = markers(out);
    if block.is_empty() {
        assert!(found.is_empty(), "an empty block leaves no marker: {out:?}");
        return;
    }
    assert_eq!(found.len(), 2, "one BEGIN and one END: {out:?}");
    assert_eq!((found[0].kind, found[1].kind), (Kind::Begin, Kind::End));
    let inner = &out[found[0].end..found[1].start];
    let lines: Vec<&[u8]> = inner
        .split_inclusive(|&b| b == b'\n')
        .filter(|l| !l.trim_ascii().is_empty())
        .collect();
    assert_eq!(lines.len(), block.len(), "one line per entry: {inner:?}");
    for (line, (ip, name)) in lines.iter().zip(block.iter()) {
        let text = std::str::from_utf8(line).expect("rendered lines are ASCII");
        let (got_ip, got_name) = text
            .strip_suffix('\n')
            .and_then(|l| l.split_once('\t'))
            .expect("`ip\\tname\\n`");
        assert_eq!(got_ip.parse::<IpAddr>().ok(), Some(*ip), "{text:?}");
        let parsed = Hostname::parse(got_name).expect("a written name is a valid hostname");
        assert_eq!(&parsed, name);
        assert!(!parsed.is_wildcard(), "/etc/hosts has no wildcards");
    }
}

fuzz_target!(|x: &[u8]| {
    let all = markers(x);
    // A pending line claims the rest of the file: markers after it do not count.
    let pending = all.iter().find(|m| m.kind == Kind::Pending);
    let found: Vec<MarkerLine> = all
        .iter()
        .filter(|m| pending.is_none_or(|p| m.line < p.line))
        .copied()
        .collect();
    let begins: Vec<&MarkerLine> = found.iter().filter(|m| m.kind == Kind::Begin).collect();
    let ends: Vec<&MarkerLine> = found.iter().filter(|m| m.kind == Kind::End).collect();
    let acceptable = begins.len() <= 1
        && ends.len() <= 1
        && begins.len() == ends.len()
        && begins
            .first()
            .zip(ends.first())
            .is_none_or(|(b, e)| b.line < e.line)
        && (pending.is_none() || begins.is_empty());

    let removed = match hosts::remove(x) {
        Err(e) => {
            assert!(!acceptable, "rejected an unambiguous file ({e}): {x:?}");
            match e {
                BlockError::Unterminated { line } => assert!(is_marker(&found, line, Kind::Begin)),
                BlockError::StrayEnd { line } => assert!(is_marker(&found, line, Kind::End)),
                BlockError::MultipleBlocks { first, second } => {
                    assert!(first < second);
                    assert!(
                        (is_marker(&found, first, Kind::Begin)
                            && (is_marker(&found, second, Kind::Begin)
                                || is_marker(&all, second, Kind::Pending)))
                            || (is_marker(&found, first, Kind::End)
                                && is_marker(&found, second, Kind::End))
                    );
                }
                BlockError::TooLarge { len } => assert_eq!(len, x.len() as u64),
                BlockError::WouldBeTooLarge { .. } => panic!("removing never grows a file"),
            }
            // Whatever the block, an ambiguous file is refused the same way.
            for b in BLOCKS.iter() {
                assert_eq!(hosts::apply(x, b), Err(e.clone()));
            }
            return;
        }
        Ok(removed) => {
            assert!(acceptable, "accepted an ambiguous file: {found:?} in {x:?}");
            removed
        }
    };

    match (begins.first(), ends.first()) {
        _ if pending.is_some() => {
            // A pending block: everything from its line is hairpin's.
            let p = pending.expect("checked");
            let before = &x[..p.start];
            // Marker lines are recognised with surrounding blanks (as BEGIN and END),
            // so the flavour is the first byte after them.
            let joined = x[p.start..]
                .trim_ascii_start()
                .starts_with(&PENDING_JOINED_MARKER.as_bytes()[..1]);
            let want = if joined {
                before.strip_suffix(b"\n").unwrap_or(before)
            } else {
                before
            };
            assert_eq!(removed, want, "a pending block runs to the end of the file");
            for b in BLOCKS.iter().filter(|b| !b.is_empty()) {
                let out = hosts::apply(x, b).expect("accepted above");
                assert!(out.starts_with(before));
                check_written_block(&out, b);
                assert_eq!(hosts::remove(&out).as_ref(), Ok(&removed));
            }
            round_trips(&removed);
        }
        (Some(begin), Some(end)) => {
            // A file with a block: bytes before and after it survive every edit.
            let before = &x[..begin.start];
            let after = &x[end.end..];
            let want = if !end.has_newline && after.is_empty() {
                // A block appended to a file without a final newline took one with it.
                [before.strip_suffix(b"\n").unwrap_or(before), after].concat()
            } else {
                [before, after].concat()
            };
            assert_eq!(removed, want, "remove keeps every byte outside the block");
            assert!(markers(&removed).is_empty());
            for b in BLOCKS.iter().filter(|b| !b.is_empty()) {
                let out = hosts::apply(x, b).expect("accepted above");
                assert!(out.starts_with(before) && out.ends_with(after));
                check_written_block(&out, b);
                assert_eq!(hosts::remove(&out).as_ref(), Ok(&removed));
                assert_eq!(hosts::apply(&out, b).as_ref(), Ok(&out), "idempotent");
            }
            round_trips(&removed);
        }
        _ => {
            assert_eq!(removed, x, "a file without a block is not changed");
            round_trips(x);
        }
    }
});

/// Runs `hosts::plan(old, new)` one byte at a time; every state a kill could leave
/// is accepted and `apply` gives `new` from it, where the plan promises that.
fn kill_anywhere(old: &[u8], new: &[u8], block: &HostsBlock) {
    let steps = hosts::plan(old, new);
    // Not promised: growing or removing a block that has lines after its END.
    let lines_after = markers(old)
        .iter()
        .any(|m| m.kind == Kind::End && m.end < old.len());
    let promised = !lines_after || old.len() == new.len();
    let residual = [old, b"\n".as_slice()].concat();
    let mut state = old.to_vec();
    let check = |state: &[u8]| {
        if !promised || (state == residual.as_slice() && !old.is_empty() && !old.ends_with(b"\n")) {
            return;
        }
        assert_eq!(
            hosts::apply(state, block).as_deref(),
            Ok(new),
            "killed at {state:?}"
        );
    };
    for step in &steps {
        match step {
            FileEdit::Write { at, bytes } => {
                for (i, b) in bytes.iter().enumerate() {
                    if at + i == state.len() {
                        state.push(*b);
                    } else {
                        state[at + i] = *b;
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
    assert_eq!(state, new, "the plan ends at the result");
}

/// On a file without a block, applying any block then removing it (or replacing
/// it first) gives back the original byte for byte.
fn round_trips(x: &[u8]) {
    for (i, b) in BLOCKS.iter().enumerate() {
        let applied = hosts::apply(x, b).expect("a file without a block is editable");
        assert!(
            applied.starts_with(x),
            "appending keeps the original as a prefix"
        );
        check_written_block(&applied, b);
        assert_eq!(hosts::remove(&applied).as_deref(), Ok(x), "remove restores");
        assert_eq!(
            hosts::apply(&applied, b).as_ref(),
            Ok(&applied),
            "idempotent"
        );
        kill_anywhere(x, &applied, b);
        let other = &BLOCKS[(i + 1) % BLOCKS.len()];
        let replaced = hosts::apply(&applied, other).expect("our own block is editable");
        kill_anywhere(&applied, &replaced, other);
        check_written_block(&replaced, other);
        assert_eq!(
            hosts::remove(&replaced).as_deref(),
            Ok(x),
            "replace then remove"
        );
    }
}
