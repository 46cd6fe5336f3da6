//! The `Host` of a plain HTTP/1.x request, read from the request head (RFC 9112 3.2).
//!
//! Pure and total over any byte slice: hostile or truncated input yields
//! [`Peek::NeedMore`] or [`Peek::Invalid`], never a panic.

use super::Peek;

/// Reads the Host header from the start of an HTTP/1.x connection.
///
/// Looks only at the head, up to the first blank line; the value is lowercased,
/// its port and a trailing dot stripped. A request line that cannot be HTTP is
/// rejected at once rather than after the read timeout.
pub fn parse_host(buf: &[u8]) -> Peek {
    if let Some(why) = not_a_request_line(buf) {
        return Peek::Invalid(why);
    }
    let Some(head_len) = head_end(buf) else {
        return Peek::NeedMore;
    };
    let head = &buf[..head_len];
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    if !request_line.ends_with(b" HTTP/1.1") && !request_line.ends_with(b" HTTP/1.0") {
        return Peek::Invalid("expected an http/1.x request line");
    }
    let mut host: Option<&[u8]> = None;
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if !name.eq_ignore_ascii_case(b"host") {
            continue;
        }
        if host.is_some() {
            // RFC 9112 3.2: a request with two Host fields must be rejected.
            return Peek::Invalid("expected one host header, got several");
        }
        host = Some(value.trim_ascii());
    }
    match host {
        None => Peek::NoName,
        Some(value) => match normalize(value) {
            Some(name) => Peek::Name(name),
            None => Peek::Invalid("host header is not a name"),
        },
    }
}

/// Where the head ends (just before the blank line), if it is complete.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
        let line = &buf[at..at + nl];
        if line.is_empty() || line == b"\r" {
            return Some(at);
        }
        at += nl + 1;
    }
    None
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
