//! Property tests: bytes outside hairpin's block survive, removal restores the
//! original exactly, and no hostname can put a newline or brace into a Corefile.

use std::net::IpAddr;

use proptest::prelude::*;

use super::{corefile as coredns, hostname::Hostname, hosts};

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
        let out = coredns::apply(&corefile, &rewrites).unwrap();
        prop_assert_eq!(coredns::remove(&out), corefile.clone());
        prop_assert_eq!(coredns::apply(&out, &rewrites).unwrap(), out.clone());
        for line in out.lines().filter(|l| l.ends_with(coredns::MARKER)) {
            prop_assert!(!line.contains('}') && !line.contains('{'), "{line:?}");
        }
    }
}
