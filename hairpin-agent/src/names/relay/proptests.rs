//! The first-bytes parsers face whatever a client sends: they must never panic, and
//! cutting input short must never turn an answer into a different answer.

use proptest::prelude::*;

use super::{Peek, http_host::parse_host, sni::parse_sni};

const HELLO: &[u8] = include_bytes!("../../../tests/fixtures/tls/clienthello-curl-sni.bin");

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse_sni(&bytes);
        let _ = parse_host(&bytes);
    }

    #[test]
    fn random_bytes_after_a_handshake_header_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..600),
        len in 0u16..700,
    ) {
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&len.to_be_bytes());
        rec.push(1);
        rec.extend_from_slice(&body);
        let _ = parse_sni(&rec);
    }

    #[test]
    fn a_mutated_real_clienthello_never_panics(at in 0usize..HELLO.len(), byte in any::<u8>()) {
        let mut hello = HELLO.to_vec();
        hello[at] = byte;
        let _ = parse_sni(&hello);
    }

    #[test]
    fn http_heads_with_random_headers_find_the_host(
        junk in "[A-Za-z-]{1,12}: [ -~]{0,40}",
        host in "[a-z]{1,10}\\.example\\.com",
    ) {
        prop_assume!(!junk.to_ascii_lowercase().starts_with("host:"));
        let req = format!("GET / HTTP/1.1\r\n{junk}\r\nHost: {host}\r\n\r\n");
        prop_assert_eq!(parse_host(req.as_bytes()), Peek::Name(host));
    }
}
