//! The HTTP Host parser (`name_relay::http_host`) over a connection's first bytes.
//!
//! Invariants:
//! - total, and more bytes never change an answer: every prefix answers `NeedMore`
//!   or exactly what the whole input answers (names/relay/proptests.rs);
//! - a name is non-empty, lowercase, on one line, not an IPv6 literal (the route
//!   lookup validates it as a hostname);
//! - differential: when httparse (hyper's parser) reads a complete HTTP/1.x
//!   request head whose method hairpin's early check admits, hairpin agrees on the
//!   Host: none -> `NoName`, several -> `Invalid`, one valid hostname -> that name;
//! - constructive: a request built around any valid hostname yields that name.
#![no_main]

use hairpin_agent::names::{Hostname, Peek, parse_host};
use libfuzzer_sys::fuzz_target;

fn cuts(len: usize) -> impl Iterator<Item = usize> {
    let spread = (1..8).map(move |i| len * i / 8);
    (0..len.min(24)).chain(spread)
}

/// hairpin's early request-line check: an uppercase token (or '-', '_') of at
/// most 20 characters, then a space.
fn method_admitted(method: &str) -> bool {
    (1..=20).contains(&method.len())
        && method
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
}

fuzz_target!(|data: &[u8]| {
    let whole = parse_host(data);
    for cut in cuts(data.len()) {
        let part = parse_host(&data[..cut]);
        assert!(
            part == Peek::NeedMore || part == whole,
            "prefix {cut} says {part:?}, whole input {whole:?}"
        );
    }
    if let Peek::Name(name) = &whole {
        assert!(!name.is_empty());
        assert_eq!(name, &name.to_ascii_lowercase());
        assert!(!name.contains('\n') && !name.starts_with('['), "{name:?}");
    }

    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    if let Ok(httparse::Status::Complete(_)) = req.parse(data) {
        let admitted = req.method.is_some_and(method_admitted)
            && data.first().is_some_and(u8::is_ascii_uppercase)
            && matches!(req.version, Some(0 | 1));
        if admitted {
            let hosts: Vec<&[u8]> = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"))
                .map(|h| h.value)
                .collect();
            match hosts.as_slice() {
                [] => assert_eq!(whole, Peek::NoName),
                [value] => {
                    let valid = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| Hostname::parse(v.trim()).ok());
                    if let Some(host) = valid {
                        assert_eq!(whole, Peek::Name(host.as_str().to_owned()));
                    }
                }
                _ => assert!(matches!(whole, Peek::Invalid(_)), "{whole:?}"),
            }
        }
    }

    // Built around the input as a name, with a port, in a real-looking head.
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(host) = Hostname::parse(text)
    {
        let req = format!(
            "GET /x HTTP/1.1\r\nUser-Agent: curl/8\r\nHost: {text}:8443\r\nAccept: */*\r\n\r\n"
        );
        assert_eq!(
            parse_host(req.as_bytes()),
            Peek::Name(host.as_str().to_owned())
        );
    }
});
