//! The TLS SNI of a connection's first bytes: the `server_name` extension of the
//! ClientHello (RFC 8446 4.1.2 and 4.2, RFC 6066 3), read without terminating TLS.
//!
//! Pure and total over any byte slice: every length is checked before it is used, so
//! hostile or truncated input yields [`Peek::NeedMore`] or [`Peek::Invalid`], never a panic.

use super::Peek;

/// TLS record content type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Extension number of `server_name`.
const SERVER_NAME: u16 = 0;
/// `NameType` of a DNS host name inside `server_name`.
const HOST_NAME: u8 = 0;
/// Largest TLS record payload a peer may send (RFC 8446 5.1: 2^14).
const MAX_RECORD: usize = 16 * 1024;
/// Most records one ClientHello may be spread over. Clients send one (a ClientHello
/// fits a 16 KiB record); a hostile one sending a record per byte must not make the
/// relay walk thousands of headers per read.
pub(crate) const MAX_HELLO_RECORDS: usize = 32;

/// Walks the record headers of a ClientHello as its bytes arrive, each header
/// once, and says when the message can be whole: the caller parses then (once),
/// not on every read. Linear in the bytes received, whatever the record sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HelloScan {
    /// Where the next record header starts.
    next: usize,
    /// Handshake bytes in the records complete so far.
    fragments: usize,
    /// The handshake message's first four bytes (type, 24-bit length).
    header: [u8; 4],
    /// Records complete so far.
    records: usize,
}

/// What [`HelloScan::advance`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The message cannot be whole yet: read more before parsing.
    NeedMore,
    /// Parse now: the message can be whole, or the bytes are not a ClientHello's
    /// (the parser says why), or it spans more than [`MAX_HELLO_RECORDS`].
    Parse,
}

impl HelloScan {
    /// Walks the records of `buf` (the whole buffer so far, which only grows) not
    /// walked yet.
    pub(crate) fn advance(&mut self, buf: &[u8]) -> Scan {
        loop {
            let at = self.next;
            let Some(h) = buf.get(at..at + 5) else {
                return Scan::NeedMore;
            };
            let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
            if h[0] != HANDSHAKE || h[1] != 3 || len == 0 || len > MAX_RECORD {
                return Scan::Parse;
            }
            let Some(fragment) = buf.get(at + 5..at + 5 + len) else {
                return Scan::NeedMore;
            };
            self.records += 1;
            if self.records > MAX_HELLO_RECORDS {
                return Scan::Parse;
            }
            for (i, b) in fragment
                .iter()
                .take(4usize.saturating_sub(self.fragments))
                .enumerate()
            {
                self.header[self.fragments + i] = *b;
            }
            self.fragments += len;
            self.next = at + 5 + len;
            if self.header[0] != CLIENT_HELLO {
                return Scan::Parse;
            }
            if self.fragments >= 4 {
                let body = usize::from(self.header[1]) << 16
                    | usize::from(self.header[2]) << 8
                    | usize::from(self.header[3]);
                if self.fragments >= 4 + body {
                    return Scan::Parse;
                }
            }
        }
    }
}

/// Whether `first` can start a TLS connection (a handshake record); HTTP methods
/// start with a letter, so one byte tells the two apart.
pub(crate) fn looks_like_tls(first: u8) -> bool {
    first == HANDSHAKE
}

/// Reads the SNI from the start of a TLS connection.
///
/// The ClientHello may arrive in several TCP segments (call again with more bytes
/// after [`Peek::NeedMore`]) and, rarely, across several handshake records, whose
/// fragments are joined here. The caller bounds how much it buffers.
pub fn parse_sni(buf: &[u8]) -> Peek {
    match client_hello(buf) {
        Ok(body) => match server_name(&body) {
            Ok(Some(name)) => Peek::Name(name),
            Ok(None) => Peek::NoName,
            Err(why) => Peek::Invalid(why),
        },
        Err(peek) => peek,
    }
}

/// The ClientHello body (after its 4-byte handshake header), joined from records.
fn client_hello(buf: &[u8]) -> Result<Vec<u8>, Peek> {
    let mut message = Vec::new();
    let mut rest = buf;
    let mut records = 0;
    loop {
        records += 1;
        if records > MAX_HELLO_RECORDS {
            return Err(Peek::Invalid(
                "clienthello spread over too many tls records",
            ));
        }
        if rest.is_empty() {
            return Err(Peek::NeedMore);
        }
        if rest[0] != HANDSHAKE {
            return Err(Peek::Invalid("expected a tls handshake record"));
        }
        if rest.len() < 5 {
            return Err(Peek::NeedMore);
        }
        if rest[1] != 3 {
            return Err(Peek::Invalid("expected tls record version 3.x"));
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(Peek::Invalid("tls record length out of range"));
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            return Err(Peek::NeedMore);
        };
        message.extend_from_slice(fragment);
        rest = &rest[5 + len..];
        if message[0] != CLIENT_HELLO {
            return Err(Peek::Invalid("expected a clienthello handshake message"));
        }
        if message.len() < 4 {
            continue;
        }
        let body_len =
            usize::from(message[1]) << 16 | usize::from(message[2]) << 8 | usize::from(message[3]);
        if body_len > MAX_RECORD * 4 {
            return Err(Peek::Invalid("clienthello length out of range"));
        }
        if message.len() >= 4 + body_len {
            message.truncate(4 + body_len);
            return Ok(message.split_off(4));
        }
    }
}

/// A bounds-checked reader over a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("clienthello field runs past its end");
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }
    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

/// Walks a complete ClientHello body to its `server_name` host name.
fn server_name(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        // A ClientHello may end here (SSL 3.0 style): no extensions, so no SNI.
        return Ok(None);
    }
    let mut exts = Reader(r.vec16()?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != SERVER_NAME {
            continue;
        }
        let mut list = Reader(Reader(data).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == HOST_NAME {
                return match std::str::from_utf8(name) {
                    Ok(s) if !s.is_empty() => Ok(Some(s.to_owned())),
                    _ => Err("server_name is not a non-empty ascii name"),
                };
            }
        }
        return Ok(None);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENSSL_SNI: &[u8] =
        include_bytes!("../../../tests/fixtures/tls/clienthello-openssl-sni.bin");
    const OPENSSL_NO_SNI: &[u8] =
        include_bytes!("../../../tests/fixtures/tls/clienthello-openssl-nosni.bin");
    const CURL_SNI: &[u8] = include_bytes!("../../../tests/fixtures/tls/clienthello-curl-sni.bin");

    #[test]
    fn real_clienthellos_give_their_names() {
        assert_eq!(parse_sni(OPENSSL_SNI), Peek::Name("app.example.com".into()));
        assert_eq!(
            parse_sni(CURL_SNI),
            Peek::Name("www.shop.example.org".into())
        );
        assert_eq!(parse_sni(OPENSSL_NO_SNI), Peek::NoName);
    }

    #[test]
    fn every_truncation_asks_for_more() {
        for hello in [OPENSSL_SNI, CURL_SNI, OPENSSL_NO_SNI] {
            for cut in 0..hello.len() {
                assert_eq!(parse_sni(&hello[..cut]), Peek::NeedMore, "cut at {cut}");
            }
        }
    }

    #[test]
    fn a_clienthello_split_across_two_records_is_joined() {
        let body = &OPENSSL_SNI[5..];
        let (a, b) = body.split_at(40);
        let mut split = Vec::new();
        for part in [a, b] {
            split.extend_from_slice(&[HANDSHAKE, 3, 1]);
            split.extend_from_slice(&(part.len() as u16).to_be_bytes());
            split.extend_from_slice(part);
        }
        assert_eq!(parse_sni(&split), Peek::Name("app.example.com".into()));
        assert_eq!(parse_sni(&split[..split.len() - 1]), Peek::NeedMore);
    }

    #[test]
    fn trailing_application_bytes_are_ignored() {
        let mut more = OPENSSL_SNI.to_vec();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(parse_sni(&more), Peek::Name("app.example.com".into()));
    }

    #[test]
    fn garbage_and_lies_are_invalid() {
        assert!(matches!(parse_sni(b"GET / HTTP/1.1\r\n"), Peek::Invalid(_)));
        assert!(matches!(parse_sni(&[22, 2, 0, 0, 5]), Peek::Invalid(_)));
        assert!(matches!(
            parse_sni(&[22, 3, 1, 0xff, 0xff]),
            Peek::Invalid(_)
        ));
        assert!(matches!(parse_sni(&[22, 3, 1, 0, 0]), Peek::Invalid(_)));
        // A ServerHello (type 2) is not what a client sends first.
        assert!(matches!(
            parse_sni(&[22, 3, 1, 0, 4, 2, 0, 0, 0]),
            Peek::Invalid(_)
        ));
        // A complete ClientHello whose server_name list claims more than it holds.
        let lying = hello(&[0, 0, 0, 5, 0, 0xff, 0, 0, 1]);
        assert!(matches!(parse_sni(&lying), Peek::Invalid(_)));
        // A non-UTF-8 host name.
        let bad = hello(&[0, 0, 0, 6, 0, 4, 0, 0, 1, 0xff]);
        assert!(matches!(parse_sni(&bad), Peek::Invalid(_)));
        // The same shape with a real name parses, so the two above fail for their lie.
        let good = hello(&[0, 0, 0, 6, 0, 4, 0, 0, 1, b'a']);
        assert_eq!(parse_sni(&good), Peek::Name("a".into()));
    }

    /// A minimal ClientHello record carrying `extensions`.
    fn hello(extensions: &[u8]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0; 32]); // random
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]); // no session, one suite, null
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(extensions);
        let mut msg = vec![CLIENT_HELLO, 0];
        msg.extend_from_slice(&(body.len() as u16).to_be_bytes());
        msg.extend_from_slice(&body);
        let mut rec = vec![HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    #[test]
    fn an_oversized_clienthello_is_invalid() {
        // Claims 16 MiB in the handshake header.
        let hello = [22, 3, 1, 0, 8, 1, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        assert!(matches!(parse_sni(&hello), Peek::Invalid(_)));
    }

    /// `body` cut into records of `size` bytes.
    fn in_records(body: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in body.chunks(size) {
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    #[test]
    fn the_scan_says_parse_once_the_hello_can_be_whole() {
        for size in [16, 64, OPENSSL_SNI.len()] {
            let records = in_records(&OPENSSL_SNI[5..], size);
            if records.len() / (5 + size) >= MAX_HELLO_RECORDS {
                continue;
            }
            let mut scan = HelloScan::default();
            let mut first = None;
            for end in 1..=records.len() {
                if scan.advance(&records[..end]) == Scan::Parse {
                    first = Some(end);
                    break;
                }
            }
            assert_eq!(first, Some(records.len()), "records of {size}");
            assert_eq!(parse_sni(&records), Peek::Name("app.example.com".into()));
        }
        // Not a handshake: parse at once, and the parser says why.
        assert_eq!(HelloScan::default().advance(b"GET / HTTP/1.1"), Scan::Parse);
    }

    #[test]
    fn a_hello_over_too_many_records_is_invalid_after_the_cap() {
        let records = in_records(&OPENSSL_SNI[5..], 1);
        let mut scan = HelloScan::default();
        let at_cap = (MAX_HELLO_RECORDS + 1) * 6;
        assert_eq!(scan.advance(&records[..at_cap - 1]), Scan::NeedMore);
        assert_eq!(scan.advance(&records[..at_cap]), Scan::Parse);
        assert_eq!(
            parse_sni(&records[..at_cap]),
            Peek::Invalid("clienthello spread over too many tls records")
        );
        assert_eq!(
            parse_sni(&in_records(&OPENSSL_SNI[5..], 16)),
            Peek::Name("app.example.com".into()),
            "{} records of 16 bytes are within the cap",
            (OPENSSL_SNI.len() - 5).div_ceil(16)
        );
    }
}
