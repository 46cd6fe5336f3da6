//! The `Host` of a plain HTTP/1.x request, read from the request head (RFC 9112 3.2).
//!
//! The head is parsed by httparse, hyper's parser; this module adds the early
//! method check (so a TLS or binary client is refused at once rather than after the
//! read timeout), the one-Host rule, and the name normalization. Pure and total over
//! any byte slice: hostile or truncated input yields [`Peek::NeedMore`] or
//! [`Peek::Invalid`], never a panic.

use super::Peek;

/// Header fields one request head may carry: hyper's default limit. A head with
/// more is refused, not read further ([`MAX_PEEK`](super::MAX_PEEK) bounds its
/// bytes anyway).
const MAX_HEADERS: usize = 100;

/// Reads the Host header from the start of an HTTP/1.x connection.
///
/// Looks only at the head, up to the first blank line; the value is lowercased,
/// its port and a trailing dot stripped. A request line that cannot be HTTP is
/// rejected at once rather than after the read timeout.
pub fn parse_host(buf: &[u8]) -> Peek {
    if let Some(why) = not_a_request_line(buf) {
        return Peek::Invalid(why);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Peek::NeedMore,
        Err(e) => return Peek::Invalid(why_not(e)),
    }
    let mut host: Option<&[u8]> = None;
    for h in req.headers.iter() {
        if !h.name.eq_ignore_ascii_case("host") {
            continue;
        }
        if host.is_some() {
            // RFC 9112 3.2: a request with two Host fields must be rejected.
            return Peek::Invalid("expected one host header, got several");
        }
        host = Some(h.value.trim_ascii());
    }
    match host {
        None => Peek::NoName,
        Some(value) => match normalize(value) {
            Some(name) => Peek::Name(name),
            None => Peek::Invalid("host header is not a name"),
        },
    }
}

/// What a request head httparse refuses was expected to be.
fn why_not(e: httparse::Error) -> &'static str {
    match e {
        // The method was admitted by `not_a_request_line`: what follows is the
        // target (Token) or the version (Version: HTTP/2.0, HTTP/3 and the like).
        httparse::Error::Token
        | httparse::Error::Version
        | httparse::Error::Status
        | httparse::Error::NewLine => "expected an http/1.x request line",
        httparse::Error::HeaderName => "expected a header field name",
        httparse::Error::HeaderValue => "expected a header field value",
        httparse::Error::TooManyHeaders => "expected at most 100 header fields",
    }
}

/// Why the bytes so far cannot start a request line, if they cannot: the method is
/// a token of uppercase letters followed by one space.
fn not_a_request_line(buf: &[u8]) -> Option<&'static str> {
    for (i, &b) in buf.iter().enumerate() {
        match b {
            b'A'..=b'Z' | b'-' | b'_' => {}
            b' ' if i > 0 => return None,
            _ => return Some("expected an http method"),
        }
        if i >= 20 {
            return Some("expected an http method of at most 20 characters");
        }
    }
    None
}

/// The name in a Host value: lowercase, without port or trailing dot. IPv6
/// literals (`[::1]:80`) and empty values give `None`: no route names them.
fn normalize(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    if text.starts_with('[') {
        return None;
    }
    let name = match text.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        Some(_) => return None,
        None => text,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Peek {
        Peek::Name(s.into())
    }

    #[test]
    fn finds_host_case_insensitively_and_normalizes_it() {
        let req = b"GET /x HTTP/1.1\r\nUser-Agent: curl/8\r\nhOsT:  App.Example.COM.:8080 \r\nAccept: */*\r\n\r\n";
        assert_eq!(parse_host(req), name("app.example.com"));
        assert_eq!(
            parse_host(b"POST / HTTP/1.0\nHost: a.io\n\nbody"),
            name("a.io")
        );
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        let req = b"GET / HTTP/1.1\r\nHost: a.io\r\n\r\n";
        for cut in 0..req.len() - 1 {
            assert_eq!(parse_host(&req[..cut]), Peek::NeedMore, "cut at {cut}");
        }
        assert_eq!(parse_host(req), name("a.io"));
    }

    #[test]
    fn missing_duplicate_and_odd_hosts() {
        assert_eq!(parse_host(b"GET / HTTP/1.0\r\n\r\n"), Peek::NoName);
        assert!(matches!(
            parse_host(b"GET / HTTP/1.1\r\nHost: a.io\r\nHost: b.io\r\n\r\n"),
            Peek::Invalid(_)
        ));
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.io:http\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n",
        ] {
            assert!(matches!(parse_host(bad), Peek::Invalid(_)), "{bad:?}");
        }
    }

    #[test]
    fn a_head_with_more_fields_than_the_header_array_is_refused() {
        let head = |fields: usize| {
            let mut req = String::from("GET / HTTP/1.1\r\nHost: a.io\r\n");
            for i in 1..fields {
                req.push_str(&format!("X-Filler-{i}: {}\r\n", "v".repeat(100)));
            }
            req + "\r\n"
        };
        assert_eq!(parse_host(head(MAX_HEADERS).as_bytes()), name("a.io"));
        let too_many = head(MAX_HEADERS + 1);
        assert_eq!(
            parse_host(too_many.as_bytes()),
            Peek::Invalid("expected at most 100 header fields")
        );
        assert!(
            why_not(httparse::Error::TooManyHeaders).contains(&MAX_HEADERS.to_string()),
            "the message names the limit"
        );
    }

    #[test]
    fn malformed_header_lines_are_invalid() {
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: a.io\r\nno colon here\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost : a.io\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\x00.io\r\n\r\n",
            b"GET /a b HTTP/1.1\r\nHost: a.io\r\n\r\n",
        ] {
            assert!(matches!(parse_host(bad), Peek::Invalid(_)), "{bad:?}");
        }
    }

    #[test]
    fn non_http_is_rejected_early() {
        assert!(matches!(parse_host(&[22, 3, 1]), Peek::Invalid(_)));
        assert!(matches!(parse_host(b"get / HTTP/1.1"), Peek::Invalid(_)));
        assert!(matches!(parse_host(b" GET"), Peek::Invalid(_)));
        assert!(matches!(
            parse_host(b"GET / HTTP/2.0\r\n\r\n"),
            Peek::Invalid(_)
        ));
        assert!(matches!(
            parse_host(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Peek::Invalid(_)
        ));
    }
}
