//! The Corefile editor (`names::corefile`, whose text `k8s::coredns` writes into
//! the ConfigMap) over arbitrary text.
//!
//! Input: a Corefile, optionally followed by a NUL byte and one hostname per line
//! (a plain Corefile seed uses a fixed list). Invariants (names/proptests.rs,
//! over any text):
//! - `remove` is idempotent and leaves no hairpin line; every other line is kept;
//! - `apply` then `remove` gives back `remove(x)` (so `x` itself when it had no
//!   hairpin lines), `apply` is idempotent and ignores hairpin lines already there;
//! - `apply` adds exactly one line per distinct rewrite, contiguous, right after a
//!   line opening a block, each a single `rewrite name ...` directive with no
//!   brace, quote or second comment (nothing injected), with the file's line ending;
//! - for input without quotes, CR or BOM (read by a much simpler reference: words
//!   split on whitespace, `#` to the end of the line a comment, `{`/`}` words and a
//!   word ending in `{` last on its line as braces): `apply` succeeds only on a
//!   balanced Corefile, with our lines at depth 1 right after a depth-0 line; an
//!   unbalanced one is refused (`UnexpectedClose` / `UnclosedBlock`);
//! - the import file has one directive line per distinct rewrite.
#![no_main]

use std::collections::BTreeSet;

use hairpin_agent::names::{
    Hostname,
    corefile::{self, CorefileError, MARKER, Rewrite},
};
use libfuzzer_sys::fuzz_target;

const TARGET: &str = "hairpin.hairpin-system.svc.cluster.local";
const DEFAULT_HOSTS: [&str; 3] = ["app.example.com", "*.apps.example.com", "API.example.com."];

// The simple reference reading of the braces, the one the property tests use.
use hairpin_agent::names::corefile::reference_depths;

fn is_ours(line: &str) -> bool {
    line.trim_end().ends_with(MARKER)
}

fn check_directive(line: &str) {
    let body = line.trim_start_matches([' ', '\t']);
    let directive = body
        .trim_end()
        .strip_suffix(MARKER)
        .unwrap_or(body.trim_end())
        .trim_end();
    assert!(directive.starts_with("rewrite name "), "{line:?}");
    for bad in ['{', '}', '#', '"', '\'', '\0', '\t', '\r', '\n', '\\'] {
        if bad == '\\' && directive.starts_with("rewrite name regex ") {
            continue;
        }
        assert!(!directive.contains(bad), "{bad:?} in {line:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let (text, hosts) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], Some(&data[nul + 1..])),
        None => (data, None),
    };
    // ConfigMap data is UTF-8; lossy keeps every input useful.
    let corefile = String::from_utf8_lossy(text);
    let hosts: Vec<String> = match hosts {
        Some(h) => String::from_utf8_lossy(h)
            .lines()
            .map(str::to_owned)
            .collect(),
        None => DEFAULT_HOSTS.iter().map(|h| h.to_string()).collect(),
    };
    let target = Hostname::parse(TARGET).expect("valid target");
    let rewrites: Vec<Rewrite> = hosts
        .iter()
        .filter_map(|h| Hostname::parse(h).ok())
        .map(|h| Rewrite::new(h, target.clone()).expect("exact target"))
        .collect();
    let distinct: BTreeSet<String> = rewrites.iter().map(Rewrite::directive).collect();

    // remove: idempotent, drops exactly our lines and keeps the rest in order.
    let removed = corefile::remove(&corefile);
    assert_eq!(corefile::remove(&removed), removed);
    let kept: String = corefile
        .split_inclusive('\n')
        .filter(|l| !is_ours(l))
        .collect();
    assert_eq!(removed, kept);
    assert!(!removed.split_inclusive('\n').any(is_ours));

    let simple = !corefile.contains(['"', '\r', '\u{feff}']);
    match corefile::apply(&corefile, &rewrites) {
        Ok(out) if simple && !rewrites.is_empty() => {
            assert!(
                reference_depths(&removed).is_some(),
                "edited an unbalanced Corefile"
            );
            let depths = reference_depths(&out).expect("the edit is balanced");
            let lines: Vec<&str> = out.split('\n').collect();
            for (i, line) in lines.iter().enumerate().filter(|(_, l)| is_ours(l)) {
                assert_eq!(depths[i], 1, "{line:?} at depth {}", depths[i]);
                if !is_ours(lines[i - 1]) {
                    assert_eq!(depths[i - 1], 0, "after a depth-0 opener");
                }
            }
            check_ok(&removed, &out, &rewrites, &distinct);
        }
        Ok(out) => check_ok(&removed, &out, &rewrites, &distinct),
        Err(e @ (CorefileError::UnexpectedClose { .. } | CorefileError::UnclosedBlock { .. }))
            if simple =>
        {
            assert!(
                reference_depths(&removed).is_none(),
                "refused a balanced Corefile: {e}"
            );
            assert_eq!(corefile::apply(&removed, &rewrites).err(), Some(e));
        }
        Err(e) => {
            assert!(e.to_string().starts_with("corefile: "), "{e}");
            assert!(
                !matches!(e, CorefileError::InvalidEdit { .. }),
                "apply built an edit its own check refused: {e}"
            );
            if matches!(e, CorefileError::TooLarge { .. }) {
                assert!(corefile.len() > corefile::MAX_COREFILE_BYTES);
            } else {
                assert!(!rewrites.is_empty(), "nothing to add needs no server block");
                assert_eq!(corefile::apply(&removed, &rewrites).err(), Some(e));
            }
        }
    }

    let import = corefile::render_import(&rewrites);
    let lines: Vec<&str> = import.lines().collect();
    assert_eq!(lines.len(), 1 + distinct.len(), "{import:?}");
    assert!(lines[0].starts_with("# "));
    for line in &lines[1..] {
        check_directive(line);
        assert!(!line.contains('#'));
    }
});

/// The invariants of a successful edit (see the module docs).
fn check_ok(removed: &str, out: &str, rewrites: &[Rewrite], distinct: &BTreeSet<String>) {
    assert_eq!(corefile::remove(out), removed, "apply then remove");
    assert_eq!(
        corefile::apply(out, rewrites).as_deref(),
        Ok(out),
        "idempotent"
    );
    assert_eq!(
        corefile::apply(removed, rewrites).as_deref(),
        Ok(out),
        "old hairpin lines do not change the result"
    );
    let lines: Vec<&str> = out.split_inclusive('\n').collect();
    let ours: Vec<usize> = (0..lines.len()).filter(|&i| is_ours(lines[i])).collect();
    assert_eq!(ours.len(), distinct.len(), "one line per rewrite: {out:?}");
    if let (Some(&first), Some(&last)) = (ours.first(), ours.last()) {
        assert_eq!(last - first + 1, ours.len(), "contiguous");
        let opener = lines[first - 1];
        assert!(opener.contains('{'), "after a block opener: {opener:?}");
        let eol = if opener.ends_with("\r\n") {
            "\r\n"
        } else {
            "\n"
        };
        for &i in &ours {
            check_directive(lines[i]);
            assert!(lines[i].ends_with(eol), "{:?} after {opener:?}", lines[i]);
            assert_eq!(lines[i].matches('#').count(), 1, "{:?}", lines[i]);
        }
    }
}
