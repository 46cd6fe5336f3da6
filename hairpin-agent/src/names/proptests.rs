//! Property tests: bytes outside hairpin's block survive, removal restores the
//! original exactly, and no hostname can put a newline or brace into a Corefile.

use std::net::IpAddr;

use proptest::prelude::*;

use super::{
    corefile::{self as coredns, reference_depths},
    hostname::Hostname,
    hosts,
};

/// Lines that stress the marker matcher and line handling without being a
/// complete marker.
fn tricky_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"# BEGIN hairpin managed block".to_vec()),
        Just(b"# BEGIN hairpin managed block (do not edit".to_vec()),
        Just(b"BEGIN hairpin managed block (do not edit)".to_vec()),
        Just(b"# END hairpin managed".to_vec()),
        Just(b"# END hairpin managed block!".to_vec()),
        Just(b"x # END hairpin managed block".to_vec()),
        Just(b"127.0.0.1\tlocalhost".to_vec()),
        Just(b"::1 ip6-localhost ip6-loopback".to_vec()),
        Just(Vec::new()),
        proptest::collection::vec(any::<u8>(), 0..40),
    ]
}

/// Files of tricky lines joined by LF or CRLF, maybe without a final newline.
fn hosts_file() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(
            (
                tricky_line(),
                prop_oneof![Just(&b"\n"[..]), Just(&b"\r\n"[..])],
            ),
            0..12,
        ),
        any::<bool>(),
    )
        .prop_map(|(lines, final_newline)| {
            let mut out = Vec::new();
            for (line, eol) in &lines {
                out.extend_from_slice(line);
                out.extend_from_slice(eol);
            }
            if !final_newline && !lines.is_empty() {
                let trimmed = out.len() - lines.last().map_or(0, |(_, eol)| eol.len());
                out.truncate(trimmed);
            }
            out
        })
        // Random bytes may spell a whole marker line; such files have a block.
        .prop_filter("file must not already contain markers", |f| {
            hosts::remove(f).is_ok_and(|r| &r == f)
        })
}

fn label() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?"
}

fn hostname() -> impl Strategy<Value = Hostname> {
    (
        any::<bool>(),
        proptest::collection::vec(label(), 1..4),
        "[a-z]{2,6}",
    )
        .prop_filter_map("valid hostname", |(wild, labels, tld)| {
            let prefix = if wild { "*." } else { "" };
            Hostname::parse(&format!("{prefix}{}.{tld}", labels.join("."))).ok()
        })
}

fn block() -> impl Strategy<Value = hosts::HostsBlock> {
    proptest::collection::vec((any::<IpAddr>(), hostname()), 0..6)
        .prop_map(|entries| hosts::HostsBlock::from_entries(entries).0)
}

proptest! {
    #[test]
    fn hosts_apply_keeps_outside_bytes_and_remove_restores(x in hosts_file(), b in block(), b2 in block()) {
        let applied = hosts::apply(&x, &b).unwrap();
        // Appending: the original is a prefix, byte for byte.
        prop_assert!(applied.starts_with(&x));
        prop_assert_eq!(hosts::remove(&applied).unwrap(), x.clone());
        // Replacing an existing block keeps the same outside bytes.
        let replaced = hosts::apply(&applied, &b2).unwrap();
        prop_assert_eq!(hosts::remove(&replaced).unwrap(), x.clone());
        prop_assert_eq!(hosts::apply(&applied, &b).unwrap(), applied);
    }

    #[test]
    fn hosts_block_in_the_middle_keeps_both_sides(x in hosts_file(), tail in hosts_file(), b in block()) {
        let mut middle = hosts::apply(&x, &b).unwrap();
        // Only a block that ends with a newline can have lines after it.
        prop_assume!(middle.ends_with(b"\n"));
        middle.extend_from_slice(&tail);
        let replaced = hosts::apply(&middle, &b).unwrap();
        prop_assert_eq!(&replaced, &middle);
        let removed = hosts::remove(&middle).unwrap();
        prop_assert_eq!(removed, [x.as_slice(), tail.as_slice()].concat());
    }

    /// Issue 14 finding 9: whatever the file and the blocks, a kill at any byte of
    /// the writes leaves a file that parses and that the next sync repairs
    /// (`hosts::tests::check_every_byte`), wherever `plan` promises it.
    #[test]
    fn hosts_writes_are_valid_at_every_byte(x in hosts_file(), tail in hosts_file(),
                                            b1 in block(), b2 in block(), middle in any::<bool>()) {
        let mut old = hosts::apply(&x, &b1).unwrap();
        if middle && old.ends_with(b"\n") {
            old.extend_from_slice(&tail);
        }
        hosts::tests::check_every_byte(&old, &b2);
        hosts::tests::check_every_byte(&x, &b2);
    }

    #[test]
    fn arbitrary_strings_never_inject_into_rewrite_lines(s in "\\PC{0,40}|[a-z0-9.*{}#\"\n -]{0,40}") {
        let Ok(host) = Hostname::parse(&s) else { return Ok(()) };
        let target = Hostname::parse("hairpin.hairpin-system.svc.cluster.local").unwrap();
        let rewrite = coredns::Rewrite::new(host, target).unwrap();
        let line = rewrite.directive();
        for bad in ['\n', '\r', '{', '}', '#', '"', '\'', '\0', '\t'] {
            prop_assert!(!line.contains(bad), "{line:?} contains {bad:?}");
        }
    }

    #[test]
    fn corefile_round_trips(hosts in proptest::collection::vec(hostname(), 1..5),
                            before in "[a-z# {}\n]{0,40}", after in "[a-z# }\n]{0,60}") {
        let corefile = format!("{before}\n.:53 {{\n{after}");
        prop_assume!(coredns::remove(&corefile) == corefile);
        let target = Hostname::parse("hairpin.hairpin-system.svc.cluster.local").unwrap();
        let rewrites: Vec<_> = hosts.into_iter().map(|h| coredns::Rewrite::new(h, target.clone()).unwrap()).collect();
        // Random braces are mostly unbalanced: CoreDNS refuses those, and so does
        // `apply`, exactly when the reference reading below does.
        let opener = before.matches('\n').count() + 1;
        let editable = reference_depths(&corefile).is_some_and(|d| d[opener] == 0);
        let out = match coredns::apply(&corefile, &rewrites) {
            Ok(out) => out,
            Err(e) => {
                prop_assert!(!editable, "refused a balanced Corefile ({e}): {corefile:?}");
                return Ok(());
            }
        };
        prop_assert!(editable, "edited an unbalanced Corefile: {corefile:?}");
        prop_assert_eq!(coredns::remove(&out), corefile.clone());
        prop_assert_eq!(coredns::apply(&out, &rewrites).unwrap(), out.clone());
        for line in out.lines().filter(|l| l.ends_with(coredns::MARKER)) {
            prop_assert!(!line.contains('}') && !line.contains('{'), "{line:?}");
        }
        // Ours at depth 1, right after the only root opener.
        let depths = reference_depths(&out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        prop_assert_eq!(lines[opener], ".:53 {");
        for (i, line) in lines.iter().enumerate().filter(|(_, l)| l.ends_with(coredns::MARKER)) {
            prop_assert!(i > opener && i <= opener + rewrites.len() && depths[i] == 1, "{i}: {line:?}");
        }
    }

    #[test]
    fn corefile_lines_go_into_the_first_root_server_block_and_nowhere_else(
        blocks in proptest::collection::vec(server_block(), 1..5),
        hosts in proptest::collection::vec(hostname(), 1..4),
    ) {
        let corefile: String = blocks.iter().map(|(_, text)| text.as_str()).collect();
        let target = Hostname::parse("hairpin.hairpin-system.svc.cluster.local").unwrap();
        let rewrites: Vec<_> = hosts.into_iter().map(|h| coredns::Rewrite::new(h, target.clone()).unwrap()).collect();
        let result = coredns::apply(&corefile, &rewrites);
        let Some(main) = blocks.iter().position(|(root, _)| *root) else {
            prop_assert_eq!(result, Err(coredns::CorefileError::NoMainServerBlock));
            return Ok(());
        };
        let out = result.unwrap();
        prop_assert_eq!(coredns::remove(&out), corefile.clone());
        // Our lines sit right after the main block's first line (its opener).
        let opener_line: usize = blocks[..main].iter().map(|(_, t)| t.lines().count()).sum();
        let opener_text = blocks[main].1.lines().next().unwrap();
        let lines: Vec<&str> = out.lines().collect();
        prop_assert_eq!(lines[opener_line], opener_text);
        let ours: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].ends_with(coredns::MARKER)).collect();
        prop_assert!(!ours.is_empty());
        prop_assert_eq!(ours[0], opener_line + 1, "{}", out);
        prop_assert_eq!(*ours.last().unwrap() - ours[0] + 1, ours.len());
        let depths = reference_depths(&out).unwrap();
        for &i in &ours {
            prop_assert_eq!(depths[i], 1, "{}", out);
        }
    }
}

/// A plugin line for a server block body: plain directives, comments holding
/// braces, quoted arguments holding braces (read by CoreDNS as text), and nested
/// blocks, among them `forward . ADDR {` whose `.` is not a server key.
fn body_line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("    errors\n".to_string()),
        Just("    cache 30\n".to_string()),
        Just("    # .:53 { not an opener }\n".to_string()),
        Just("    template IN A example.org {\n        answer \"{{ .Name }} 60 IN A 10.0.0.1\"\n    }\n".to_string()),
        Just("    forward . 10.150.0.1 {\n        force_tcp\n    }\n".to_string()),
        Just("    forward . /etc/resolv.conf {\n       max_concurrent 1000\n    }\n".to_string()),
        Just("    health {\n       lameduck 5s\n    }\n".to_string()),
        Just("    hosts {\n        10.0.0.1 \"{a}\"\n        fallthrough\n    }\n".to_string()),
    ]
}

/// A server block: (whether its keys hold the root zone, its text).
fn server_block() -> impl Strategy<Value = (bool, String)> {
    (
        prop_oneof![
            Just((false, "consul.local:53 {")),
            Just((false, "example.org {")),
            Just((false, ".:5353 {")),
            Just((true, ".:53 {")),
            Just((true, ". {")),
            Just((true, "dns://.:53 {")),
            Just((true, ".:53 , example.org:53 {")),
        ],
        proptest::collection::vec(body_line(), 0..5),
    )
        .prop_map(|((root, opener), body)| (root, format!("{opener}\n{}}}\n", body.concat())))
}
