//! The TLS SNI parser (`name_relay::sni`) over a connection's first bytes.
//!
//! Invariants:
//! - total: any bytes give an answer, never a panic (names/relay/proptests.rs);
//! - more bytes never change an answer: every prefix of the input answers
//!   `NeedMore` or exactly what the whole input answers;
//! - a name is non-empty text found verbatim in the input;
//! - a ClientHello split into two handshake records answers as in one record;
//! - differential: when rustls's own server-side parser (`Acceptor`) accepts the
//!   input as a ClientHello, hairpin finds a name or "no name" too, and when rustls
//!   reads a server name, hairpin reads the same one.
#![no_main]

use hairpin_agent::names::{Peek, parse_sni};
use libfuzzer_sys::fuzz_target;

/// Where the input is cut to check prefixes: a few spread points, plus every cut
/// near the start, where the record and handshake headers are.
fn cuts(len: usize) -> impl Iterator<Item = usize> {
    let spread = (1..8).map(move |i| len * i / 8);
    (0..len.min(12)).chain(spread)
}

fn rustls_view(data: &[u8]) -> Option<Option<String>> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = data;
    while !rest.is_empty() {
        match acceptor.read_tls(&mut rest) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Some(accepted.client_hello().server_name().map(str::to_owned)),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = parse_sni(data);
    for cut in cuts(data.len()) {
        let part = parse_sni(&data[..cut]);
        assert!(
            part == Peek::NeedMore || part == whole,
            "prefix {cut} says {part:?}, whole input {whole:?}"
        );
    }
    if let Peek::Name(name) = &whole {
        assert!(!name.is_empty());
        assert!(
            data.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name:?} is not in the input"
        );
    }
    if let Peek::Invalid(why) = &whole {
        assert!(!why.is_empty());
    }

    // Re-split the first record's fragment into two records.
    if data.len() >= 5 && data[0] == 22 && data[1] == 3 {
        let len = usize::from(u16::from_be_bytes([data[3], data[4]]));
        // Within one record's limit (2^14), where splitting cannot change validity.
        if (2..=16 * 1024).contains(&len) && data.len() >= 5 + len {
            let fragment = &data[5..5 + len];
            let at = 1 + usize::from(data[2]) % (len - 1);
            let mut split = Vec::with_capacity(data.len() + 5);
            for part in [&fragment[..at], &fragment[at..]] {
                split.extend_from_slice(&data[..3]);
                split.extend_from_slice(&(part.len() as u16).to_be_bytes());
                split.extend_from_slice(part);
            }
            split.extend_from_slice(&data[5 + len..]);
            assert_eq!(parse_sni(&split), whole, "split at {at} of {len}");
        }
    }

    if let Some(theirs) = rustls_view(data) {
        match (&theirs, &whole) {
            (Some(t), Peek::Name(ours)) => assert!(
                t.trim_end_matches('.')
                    .eq_ignore_ascii_case(ours.trim_end_matches('.')),
                "rustls reads {t:?}, hairpin {ours:?}"
            ),
            (Some(t), _) => panic!("rustls reads server name {t:?}, hairpin says {whole:?}"),
            (None, Peek::Name(_) | Peek::NoName) => {}
            (None, _) => panic!("rustls accepts this ClientHello, hairpin says {whole:?}"),
        }
    }
});
