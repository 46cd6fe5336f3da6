use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
};

use super::*;

/// An ingress requiring the PROXY protocol, like nginx `listen ... proxy_protocol`:
/// answers 200 after a header, closes the connection without one.
fn proxy_protocol_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming().take(2) {
            let mut conn = conn.expect("accept");
            let mut first = String::new();
            BufReader::new(&conn).read_line(&mut first).expect("read");
            if first.starts_with("PROXY TCP4 127.0.0.1 127.0.0.1 ") {
                conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .expect("write");
            }
        }
    });
    addr
}

fn probe(addr: SocketAddr, header: bool, tls: bool) -> Probe {
    Probe {
        addr,
        host: "ingress.example".into(),
        tls,
        header,
        mark: None,
        timeout: Duration::from_secs(2),
    }
}

#[test]
fn a_proxy_protocol_server_answers_only_the_probe_with_a_header() {
    let addr = proxy_protocol_server();
    let without = send(&probe(addr, false, false));
    assert_eq!(without.outcome, Outcome::NoAnswer, "{without:?}");
    assert_eq!(
        without.detail,
        "empty reply: the server closed the connection"
    );
    let with = send(&probe(addr, true, false));
    assert_eq!(with, ProbeResult::new(Outcome::Answered, "HTTP/1.1 200 OK"));
}

#[test]
fn a_closed_port_fails_to_connect() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    // The listener is dropped: nothing listens there now.
    let r = send(&probe(addr, false, false));
    assert_eq!(r.outcome, Outcome::ConnectFailed);
    assert!(r.detail.contains("refused"), "{r:?}");
}

#[test]
fn a_tls_probe_to_a_server_that_hangs_up_gets_no_answer() {
    let addr = proxy_protocol_server();
    let r = send(&probe(addr, false, true));
    assert_eq!(r.outcome, Outcome::NoAnswer, "{r:?}");
}

/// A server whose status line carries terminal escapes (clear the screen, set the
/// title): `check` shows them escaped, never as bytes the terminal would obey.
#[test]
fn a_status_line_with_terminal_escapes_is_printed_escaped() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        if let Some(Ok(mut conn)) = l.incoming().next() {
            let mut first = String::new();
            let _ = BufReader::new(&conn).read_line(&mut first);
            let _ = conn.write_all(b"HTTP/1.1 200 \x1b[2J\x1b]0;owned\x07OK\r\n\r\n");
        }
    });
    let r = send(&probe(addr, false, false));
    assert_eq!(r.outcome, Outcome::Answered, "{r:?}");
    assert!(!r.detail.chars().any(char::is_control), "{:?}", r.detail);
    assert!(r.detail.contains("\\u{1b}[2J"), "{:?}", r.detail);
}
