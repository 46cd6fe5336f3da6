//! The raw capture server the header tests read the kernel's bytes with, and the
//! LBs DNATed to it.

use super::*;

/// LBs DNATed to a raw capture server on port 9000 of the ingress namespace: v1 on
/// port 80 and v2 on port 81, over IPv4 and over an IPv6 address with two zero runs
/// of equal length (the first becomes `::`).
pub(crate) const CAPTURE_LB4: &str = "203.0.113.20";
pub(crate) const CAPTURE_LB6: &str = "2001:db8:0:0:1:0:0:20";
pub(crate) const CAPTURE_PORT: u16 = 9000;

/// Accepts `n` connections in `netns` on CAPTURE_PORT, answering each HTTP request
/// with a small response; sends what each connection carried up to the end of its
/// request head. With `fast_open`, the listener takes TCP Fast Open data.
pub(crate) fn capture_server(netns: &str, n: usize, fast_open: bool) -> mpsc::Receiver<Vec<u8>> {
    patient_capture_server(netns, n, fast_open, READ_PATIENCE)
}

/// How long the capture server waits for a connection's request head: clients that
/// write at once are done well within it.
const READ_PATIENCE: Duration = Duration::from_secs(5);

/// As [`capture_server`], waiting up to `patience` from the accept for each request
/// head: a client held back on purpose (a late writer waiting out an agent's exit,
/// which takes seconds in an emulated VM) must not be cut off before it writes.
pub(crate) fn patient_capture_server(
    netns: &str,
    n: usize,
    fast_open: bool,
    patience: Duration,
) -> mpsc::Receiver<Vec<u8>> {
    let counted = segment_capture_server_with(netns, n, fast_open, patience);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for (got, _) in counted {
            if tx.send(got).is_err() {
                return;
            }
        }
    });
    rx
}

/// As [`capture_server`], with the number of data segments each connection had
/// received once its request head was in (`tcpi_data_segs_in`).
pub(crate) fn segment_capture_server(
    netns: &str,
    n: usize,
    fast_open: bool,
) -> mpsc::Receiver<(Vec<u8>, u32)> {
    segment_capture_server_with(netns, n, fast_open, READ_PATIENCE)
}

fn segment_capture_server_with(
    netns: &str,
    n: usize,
    fast_open: bool,
    patience: Duration,
) -> mpsc::Receiver<(Vec<u8>, u32)> {
    use std::os::fd::AsRawFd;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let netns = netns.to_string();
    std::thread::spawn(move || {
        enter_netns(&netns);
        let listener = TcpListener::bind(("::", CAPTURE_PORT)).expect("bind capture port");
        if fast_open {
            let queue: libc::c_int = 16;
            // SAFETY: a valid listening socket and a c_int option value.
            let rc = unsafe {
                libc::setsockopt(
                    listener.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_FASTOPEN,
                    (&raw const queue).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "TCP_FASTOPEN: {}", std::io::Error::last_os_error());
        }
        ready_tx.send(()).expect("ready");
        for _ in 0..n {
            let (mut conn, _) = listener.accept().expect("accept");
            conn.set_read_timeout(Some(patience)).expect("timeout");
            let mut got = Vec::new();
            let mut buf = [0u8; 16384];
            // Up to the end of the request head (a v2 header's signature holds a
            // blank line of its own, so look after the request line).
            while !request_head_complete(&got) {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            // SAFETY: tcp_info is plain data; the kernel fills at most `len` bytes.
            let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            // SAFETY: a valid socket, and a buffer of `len` bytes.
            let rc = unsafe {
                libc::getsockopt(
                    conn.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_INFO,
                    (&raw mut info).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
            );
            if tx.send((got, info.tcpi_data_segs_in)).is_err() {
                return;
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("capture server ready");
    rx
}

/// Whether `got` holds a whole request head (after whatever header precedes it).
pub(crate) fn request_head_complete(got: &[u8]) -> bool {
    got.windows(4)
        .position(|w| w == b"GET ")
        .is_some_and(|at| got[at..].windows(4).any(|w| w == b"\r\n\r\n"))
}

/// The source port a header names (v1: the fifth field; v2: after both addresses).
pub(crate) fn header_source_port(got: &[u8], version: ProxyVersion, v6: bool) -> u16 {
    match version {
        ProxyVersion::V1 => {
            let line = got.split(|b| *b == b'\r').next().expect("a line");
            let line = std::str::from_utf8(line).expect("ascii header");
            line.split(' ')
                .nth(4)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no source port in {line:?}"))
        }
        ProxyVersion::V2 => {
            let at = 16 + if v6 { 32 } else { 8 };
            u16::from_be_bytes([got[at], got[at + 1]])
        }
    }
}

/// The default LBs and the capture LBs.
pub(crate) fn capture_node() -> SimNode {
    let mut lbs = default_lbs();
    for (lb_ip, lb_port) in [
        (CAPTURE_LB4, 80),
        (CAPTURE_LB4, 81),
        (CAPTURE_LB6, 80),
        (CAPTURE_LB6, 81),
    ] {
        lbs.push(LbRule {
            lb_ip,
            lb_port,
            backend_port: CAPTURE_PORT,
            name: "capture/raw:http",
        });
    }
    SimNode::with_lbs(&lbs)
}

/// The capture frontends: v1 and v2, over IPv4 and IPv6.
pub(crate) fn capture_specs() -> [FrontendSpec; 4] {
    [
        (CAPTURE_LB4, 80, "v1"),
        (CAPTURE_LB4, 81, "v2"),
        (CAPTURE_LB6, 80, "v1"),
        (CAPTURE_LB6, 81, "v2"),
    ]
    .map(|(ip, port, version)| FrontendSpec {
        ip,
        ports: vec![port],
        version,
    })
}

/// A pod and a host request to each of [`capture_specs`]' frontends: the bytes ahead
/// of each request are exactly the relay's encoder's header, and the kernel wrote
/// every one of them. `log` is the agent's log, for the failure messages.
pub(crate) fn assert_capture_headers_equal_the_relays_encoder(
    node: &SimNode,
    log: impl Fn() -> String,
) {
    let cases = [
        (CAPTURE_LB4, 80, ProxyVersion::V1),
        (CAPTURE_LB4, 81, ProxyVersion::V2),
        (CAPTURE_LB6, 80, ProxyVersion::V1),
        (CAPTURE_LB6, 81, ProxyVersion::V2),
    ];
    let captured = capture_server(&node.ingress_ns, 2 * cases.len(), false);
    for (lb, port, version) in cases {
        let v6 = lb.contains(':');
        let lb_ip: IpAddr = lb.parse().expect("lb ip");
        for (who, client, reply) in [
            (
                "pod",
                if v6 { POD_IP6 } else { POD_IP4 },
                from_pod(node, &url(lb, port, "/")),
            ),
            (
                "node",
                if v6 { NODE_UPLINK6 } else { NODE_UPLINK4 },
                from_host(node, &url(lb, port, "/")),
            ),
        ] {
            assert!(reply.ok(), "{who} -> {lb}:{port}: {reply:?}\n{}", log());
            let got = captured
                .recv_timeout(Duration::from_secs(5))
                .expect("a captured connection");
            let client: IpAddr = client.parse().expect("client ip");
            let want = encoders_header(&got, version, v6, client, SocketAddr::new(lb_ip, port));
            let want = want.as_slice();
            assert!(
                got.starts_with(want) && got[want.len()..].starts_with(b"GET / HTTP/1.1\r\n"),
                "{who} -> {lb}:{port} {version}: the kernel wrote\n  {:?}\nthe relay's encoder writes\n  {:?}",
                got.escape_ascii().to_string(),
                want.escape_ascii().to_string()
            );
        }
    }
}

/// The capture node's v1 IPv4 frontend only.
pub(crate) fn capture_v1() -> [FrontendSpec; 1] {
    [spec(CAPTURE_LB4, "v1")]
}

/// `got` starts with exactly the v1 header the relay's encoder writes for the pod
/// reaching `lb` port 80, then the request.
pub(crate) fn assert_pods_v1_header(got: &[u8], lb: &str) {
    let v6 = lb.contains(':');
    let pod: IpAddr = if v6 { POD_IP6 } else { POD_IP4 }.parse().expect("pod ip");
    let lb_ip: IpAddr = lb.parse().expect("lb ip");
    assert!(
        got.starts_with(b"PROXY "),
        "no header: {}",
        got.escape_ascii()
    );
    let sport = header_source_port(got, ProxyVersion::V1, v6);
    let want = Header::new(
        ProxyVersion::V1,
        SocketAddr::new(pod, sport),
        SocketAddr::new(lb_ip, 80),
    );
    let want = want.as_bytes();
    assert!(
        got.starts_with(want) && got[want.len()..].starts_with(b"GET / HTTP/1.1\r\n"),
        "got\n  {:?}\nwant\n  {:?}",
        got.escape_ascii().to_string(),
        want.escape_ascii().to_string()
    );
}

/// What the relay's encoder writes for a connection from `client` to `lb`, with the
/// source port the captured header `got` carries (the client's ephemeral port).
pub(crate) fn encoders_header(
    got: &[u8],
    version: ProxyVersion,
    v6: bool,
    client: IpAddr,
    lb: SocketAddr,
) -> Vec<u8> {
    let sport = header_source_port(got, version, v6);
    Header::new(version, SocketAddr::new(client, sport), lb)
        .as_bytes()
        .to_vec()
}
