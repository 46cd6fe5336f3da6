use super::*;

fn server() -> SocketAddr {
    "10.96.0.10:53".parse().expect("addr")
}

#[test]
fn queries_encode_labels_and_type() {
    let q = build_query(0x1234, "ingress.example.com.", TYPE_AAAA).expect("query");
    assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
    assert_eq!(
        &q[12..],
        b"\x07ingress\x07example\x03com\x00\x00\x1c\x00\x01"
    );
    assert!(build_query(1, "a..b", TYPE_A).is_err());
    assert!(build_query(1, &"x".repeat(64), TYPE_A).is_err());
}

/// A recorded-shape answer: CNAME then A, names compressed against the question.
fn answer(id: u16, rcode: u8) -> Vec<u8> {
    let mut a = build_query(id, "www.example.com", TYPE_A).expect("query");
    a[2] = 0x81;
    a[3] = 0x80 | rcode;
    a[7] = 2; // ancount
    // www.example.com CNAME lb.example.com
    a.extend_from_slice(&[
        0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 30, 0, 5, 2, b'l', b'b', 0xc0, 16,
    ]);
    // lb.example.com A 203.0.113.10
    let lb = 12 + 17 + 4 + 2 + 10;
    a.extend_from_slice(&[
        0xc0, lb as u8, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 10,
    ]);
    a
}

#[test]
fn answers_yield_addresses_and_skip_cnames() {
    assert_eq!(
        parse_answer(server(), 7, &answer(7, 0)).expect("answer"),
        vec!["203.0.113.10".parse::<IpAddr>().expect("ip")]
    );
}

#[test]
fn errors_name_what_is_wrong() {
    let e = parse_answer(server(), 7, &answer(7, 3)).expect_err("nxdomain");
    assert_eq!(
        e.to_string(),
        "dns server 10.96.0.10:53 answered rcode 3 (NXDOMAIN)"
    );
    assert!(
        parse_answer(server(), 8, &answer(7, 0)).is_err(),
        "wrong id"
    );
    let mut cut = answer(7, 0);
    cut.truncate(cut.len() - 3);
    assert!(parse_answer(server(), 7, &cut).is_err(), "truncated");
}

#[test]
fn lookup_against_a_local_fake_server() {
    let srv = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = srv.local_addr().expect("addr");
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            let mut buf = [0u8; 512];
            let (n, peer) = srv.recv_from(&mut buf).expect("recv");
            let id = u16::from_be_bytes([buf[0], buf[1]]);
            let mut reply = answer(id, 0);
            if buf[n - 3] == 28 {
                reply[7] = 0; // no AAAA records
                reply.truncate(n);
            }
            srv.send_to(&reply, peer).expect("send");
        }
    });
    let ips = lookup(addr, "www.example.com", Duration::from_secs(2)).expect("lookup");
    t.join().expect("server");
    assert_eq!(ips, vec!["203.0.113.10".parse::<IpAddr>().expect("ip")]);
}
