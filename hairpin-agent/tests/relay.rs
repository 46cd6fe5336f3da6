//! The relay on loopback: header first, bytes both ways, half-close, failures
//! that close the client at once, and no descriptor kept after a connection ends.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use hairpin_agent::{
    ProxyVersion,
    relay::{
        ClientPolicy, ConnGate, ConnLimits, ListenHook, Relay, RelayConfig, SlotLookup,
        bind_listener, parse_net,
    },
    status::Metrics,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn config(connect_timeout: Duration) -> RelayConfig {
    RelayConfig {
        // Marks need CAP_NET_ADMIN; nothing here is redirected, so none is needed.
        bypass_mark: None,
        connect_timeout,
        node_ipv4: Some(Ipv4Addr::new(192, 0, 2, 1)),
        node_ipv6: None,
        clients: ClientPolicy::any(),
        gate: ConnGate::new(ConnLimits {
            total: 10_000,
            per_source: 10_000,
        }),
        buffer_size: 16 * 1024,
        keepalive: Some(Duration::from_secs(60)),
        splice: hairpin_agent::relay::SpliceConfig::copy(),
    }
}

/// Starts `relay`'s listener on a loopback port, every connection it accepts
/// relayed to `target` (as if its slot named it); its address.
fn listen_for(relay: &mut Relay, target: SocketAddr, version: ProxyVersion) -> SocketAddr {
    let bound = bind_listener(SocketAddr::new(LOCALHOST, 0), None).expect("listen");
    let hook: ListenHook = std::sync::Arc::new(|_, _, _| Ok(()));
    let slots: SlotLookup = std::sync::Arc::new(move |_| Some((target, version)));
    relay.serve(bound, 0, &hook, slots).expect("serve")
}

/// Starts a relay in front of `target`; returns it and its listener address.
fn relay_to(
    target: SocketAddr,
    version: ProxyVersion,
    timeout: Duration,
) -> (Relay, Metrics, SocketAddr) {
    let metrics = Metrics::default();
    let mut relay = Relay::new(config(timeout), metrics.clone());
    let listener = listen_for(&mut relay, target, version);
    (relay, metrics, listener)
}

/// Reads one v1 header line from `s`.
async fn read_v1_line(s: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        s.read_exact(&mut b).await.expect("header byte");
        line.push(b[0]);
    }
    String::from_utf8(line).expect("ascii header")
}

#[tokio::test]
async fn header_first_then_bytes_both_ways_with_half_close() {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    let (_relay, metrics, listener) = relay_to(target, ProxyVersion::V1, Duration::from_secs(2));

    let server = tokio::spawn(async move {
        let (mut s, _) = upstream.accept().await.expect("accept");
        let header = read_v1_line(&mut s).await;
        let mut body = Vec::new();
        // Reading to EOF proves the client's shutdown(Write) was propagated...
        s.read_to_end(&mut body).await.expect("read to EOF");
        // ...while this direction stays open for the reply.
        s.write_all(b"reply after half-close")
            .await
            .expect("write reply");
        (header, body)
    });

    let mut client = TcpStream::connect(listener).await.expect("connect");
    let client_port = client.local_addr().expect("addr").port();
    client.write_all(b"hello upstream").await.expect("write");
    client.shutdown().await.expect("half-close");
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).await.expect("read reply");

    let (header, body) = server.await.expect("server task");
    // A loopback client is a process on the node: the header names the node's IP.
    assert_eq!(
        header,
        format!(
            "PROXY TCP4 192.0.2.1 {} {client_port} {}\r\n",
            target.ip(),
            target.port()
        )
    );
    assert_eq!(body, b"hello upstream");
    assert_eq!(reply, b"reply after half-close");
    let text = metrics.render();
    assert!(text.contains("hairpin_relay_connections_total 1"), "{text}");
}

#[tokio::test]
async fn v2_header_is_binary_and_parses() {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    let (_relay, _m, listener) = relay_to(target, ProxyVersion::V2, Duration::from_secs(2));
    let server = tokio::spawn(async move {
        let (mut s, _) = upstream.accept().await.expect("accept");
        let mut h = [0u8; 28];
        s.read_exact(&mut h).await.expect("v2 header");
        h
    });
    let client = TcpStream::connect(listener).await.expect("connect");
    let h = server.await.expect("server");
    drop(client);
    let parsed = ppp::v2::Header::try_from(&h[..]).expect("valid v2 header");
    match parsed.addresses {
        ppp::v2::Addresses::IPv4(a) => {
            assert_eq!(a.source_address, Ipv4Addr::new(192, 0, 2, 1));
            assert_eq!(a.destination_address, Ipv4Addr::LOCALHOST);
            assert_eq!(a.destination_port, target.port());
        }
        other => panic!("expected IPv4 addresses, got {other:?}"),
    }
}

#[tokio::test]
async fn a_refused_upstream_resets_the_client_at_once() {
    // Bind then drop: nothing listens on this port any more.
    let target = TcpListener::bind((LOCALHOST, 0))
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let (_relay, metrics, listener) = relay_to(target, ProxyVersion::V1, Duration::from_secs(5));
    let started = Instant::now();
    let mut client = TcpStream::connect(listener).await.expect("connect");
    let mut buf = [0u8; 16];
    let r = client.read(&mut buf).await;
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset, got {r:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        metrics.render().contains("kind=\"refused\""),
        "{}",
        metrics.render()
    );
}

#[tokio::test]
async fn a_black_holed_upstream_times_out_and_resets_the_client() {
    // A listener with a full accept queue drops further SYNs: connects to it hang,
    // as they would towards a black-holed LB.
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.bind(&SocketAddr::new(LOCALHOST, 0).into())
        .expect("bind");
    sock.listen(0).expect("listen");
    let target = sock.local_addr().expect("addr").as_socket().expect("inet");
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(target)).await
        {
            fillers.push(s);
        }
    }
    let (_relay, metrics, listener) =
        relay_to(target, ProxyVersion::V1, Duration::from_millis(300));
    let started = Instant::now();
    let mut client = TcpStream::connect(listener).await.expect("connect");
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
        .await
        .expect("the client must not hang past the connect timeout");
    assert!(
        r.is_err() || r.as_ref().is_ok_and(|n| *n == 0),
        "expected the client closed, got {r:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "took {took:?}"
    );
    assert!(
        metrics.render().contains("kind=\"timeout\""),
        "{}",
        metrics.render()
    );
}

fn open_fds() -> BTreeSet<String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("proc fd")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn connections_leave_no_descriptor_behind() {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = upstream.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
                let _ = s.write_all(b"bye").await;
            });
        }
    });
    let (mut relay, metrics, listener) = relay_to(target, ProxyVersion::V1, Duration::from_secs(2));
    // Warm up once so lazily opened runtime descriptors are in the baseline.
    let mut warm = TcpStream::connect(listener).await.expect("connect");
    warm.shutdown().await.expect("shutdown");
    let _ = warm.read_to_end(&mut Vec::new()).await;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = open_fds().len();

    for _ in 0..200 {
        let mut c = TcpStream::connect(listener).await.expect("connect");
        c.write_all(b"x").await.expect("write");
        c.shutdown().await.expect("shutdown");
        let mut reply = Vec::new();
        c.read_to_end(&mut reply).await.expect("read");
        assert_eq!(reply, b"bye");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.active_connections() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metrics.active_connections(), 0);
    // The clients' bytes count once, however many went with the header's write
    // (checked here, not in a test of its own: another test's sockets would be
    // counted in this one's descriptors).
    let c = metrics.relay_counters();
    assert_eq!(
        (c.bytes_upstream, c.bytes_downstream),
        (200, 201 * 3),
        "{c:?}"
    );
    let after = open_fds().len();
    assert!(after <= before, "descriptors grew from {before} to {after}");
    assert_eq!(relay.drain(Duration::from_secs(1)).await, 0);
}

/// Waits (at most 2 s) for `client` to be reset.
async fn assert_reset(client: &mut TcpStream) {
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(Duration::from_secs(2), client.read(&mut buf))
        .await
        .expect("not hung");
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset, got {r:?}"
    );
}

/// A connection whose slot names no frontend (retired past its quarantine, or dialled
/// by hand) is reset at once: the relay never guesses a target.
#[tokio::test]
async fn a_connection_to_a_slot_no_frontend_holds_is_reset() {
    let metrics = Metrics::default();
    let mut relay = Relay::new(config(Duration::from_secs(2)), metrics.clone());
    let bound = bind_listener(SocketAddr::new(LOCALHOST, 0), None).expect("listen");
    let hook: ListenHook = std::sync::Arc::new(|_, _, _| Ok(()));
    let slots: SlotLookup = std::sync::Arc::new(|_| None);
    let at = relay.serve(bound, 0, &hook, slots).expect("serve");
    let mut client = TcpStream::connect(at).await.expect("connect");
    assert_reset(&mut client).await;
    assert!(metrics.render().contains("no_slot"), "{}", metrics.render());
}

#[tokio::test]
async fn peers_outside_the_client_policy_are_reset_and_never_relayed() {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    let metrics = Metrics::default();
    let mut cfg = config(Duration::from_secs(2));
    // Only a pod network: loopback clients (this test) are outside it.
    cfg.clients = ClientPolicy::new(vec![parse_net("10.244.0.0/16").expect("net")]);
    let mut relay = Relay::new(cfg, metrics.clone());
    let listener = listen_for(&mut relay, target, ProxyVersion::V1);

    let mut client = TcpStream::connect(listener).await.expect("connect");
    assert_reset(&mut client).await;
    let reached = tokio::time::timeout(Duration::from_millis(300), upstream.accept()).await;
    assert!(reached.is_err(), "the upstream must not be contacted");
    assert!(
        metrics
            .render()
            .contains("hairpin_relay_refused_clients_total 1"),
        "{}",
        metrics.render()
    );
}

/// Closes `s` with a reset (SO_LINGER 0) instead of a FIN.
fn reset(s: TcpStream) {
    let std = s.into_std().expect("std stream");
    socket2::SockRef::from(&std)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(std);
}

/// Waits (2 s at most) until `metrics.relay_counters()` satisfies `done`.
async fn counters_when(
    metrics: &Metrics,
    done: impl Fn(&hairpin_agent::status::RelayCounters) -> bool,
) -> hairpin_agent::status::RelayCounters {
    for _ in 0..200 {
        let c = metrics.relay_counters();
        if done(&c) {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    metrics.relay_counters()
}

#[tokio::test]
async fn a_reset_is_counted_against_the_side_that_sent_it() {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    let (_relay, metrics, listener) = relay_to(target, ProxyVersion::V1, Duration::from_secs(2));

    // The client resets: a client error, not an upstream one.
    let mut client = TcpStream::connect(listener).await.expect("connect");
    let (mut up, _) = upstream.accept().await.expect("accept");
    read_v1_line(&mut up).await;
    client.write_all(b"ping").await.expect("write");
    let mut ping = [0u8; 4];
    up.read_exact(&mut ping).await.expect("relayed");
    reset(client);
    let c = counters_when(&metrics, |c| c.active_connections == 0).await;
    assert_eq!(c.client_errors.get("reset"), Some(&1), "{c:?}");
    assert!(c.upstream_errors.values().all(|n| *n == 0), "{c:?}");
    drop(up);

    // The upstream resets: an upstream error, and the client is reset too.
    let mut client = TcpStream::connect(listener).await.expect("connect");
    let (mut up, _) = upstream.accept().await.expect("accept");
    read_v1_line(&mut up).await;
    reset(up);
    let mut rest = Vec::new();
    let seen = client.read_to_end(&mut rest).await;
    assert_eq!(
        seen.expect_err("the client sees the reset").kind(),
        std::io::ErrorKind::ConnectionReset
    );
    let c = counters_when(&metrics, |c| c.active_connections == 0).await;
    assert_eq!(c.upstream_errors.get("reset"), Some(&1), "{c:?}");
    assert_eq!(c.client_errors.get("reset"), Some(&1), "{c:?}");
    let text = metrics.render();
    assert!(
        text.contains("hairpin_relay_client_errors_total{kind=\"reset\"} 1"),
        "{text}"
    );
}

/// A connection to `to` from a socket uid 65534 owns, as another process on the
/// node: made on a thread of its own after the raw `setresuid` system call, which
/// changes that thread's credentials alone (libc's wrapper would change every
/// thread's). `None` when this process may not change uid (not root).
fn connect_as_nobody(to: SocketAddr) -> Option<std::net::TcpStream> {
    std::thread::spawn(move || {
        // SAFETY: a plain system call on this thread's own credentials; the thread
        // ends right after and owns nothing else.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
        if rc != 0 {
            return None;
        }
        let s = std::net::TcpStream::connect(to).expect("connect as nobody");
        s.set_nonblocking(true).expect("nonblocking");
        Some(s)
    })
    .join()
    .expect("the thread ran")
}

/// A client holding more connections than its cap gets the extra ones reset at
/// accept, while another client is still served; closing its connections gives the
/// places back. The clients are processes of the node (loopback peers), which the
/// relay keys by the uid owning the socket: the flood is root's, the other client
/// nobody's.
#[tokio::test]
async fn a_flood_past_the_per_source_cap_is_shed_while_another_client_is_served() {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    // The upstream holds every connection until its client closes, as an ingress would.
    let held = tokio::spawn(async move {
        while let Ok((mut s, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
            });
        }
    });
    let metrics = Metrics::default();
    let mut cfg = config(Duration::from_secs(2));
    cfg.gate = ConnGate::new(ConnLimits {
        total: 100,
        per_source: 5,
    });
    let gate = cfg.gate.clone();
    let mut relay = Relay::new(cfg, metrics.clone());
    let listener = listen_for(&mut relay, target, ProxyVersion::V1);
    let from = |ip: [u8; 4]| async move {
        let s = tokio::net::TcpSocket::new_v4().expect("socket");
        s.bind(SocketAddr::from((ip, 0))).expect("bind source");
        s.connect(listener).await.expect("connect")
    };
    let mut flood = Vec::new();
    for _ in 0..5 {
        flood.push(from([127, 0, 0, 2]).await);
    }
    // Wait until the relay holds all five.
    let started = Instant::now();
    while gate.open() < 5 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gate.open(), 5);

    // The sixth from the same client is reset without a byte.
    let mut extra = from([127, 0, 0, 2]).await;
    let mut buf = [0u8; 1];
    let shed = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf))
        .await
        .expect("the relay answers at once");
    assert!(
        matches!(shed, Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset)
            || matches!(shed, Ok(0)),
        "{shed:?}"
    );
    assert!(
        metrics
            .render()
            .contains("hairpin_relay_shed_total{reason=\"per_source\"} 1"),
        "{}",
        metrics.render()
    );

    // Another client is served meanwhile: another uid on the node.
    let Some(other) = connect_as_nobody(listener) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the second client needs another uid: run as root"
        );
        eprintln!("skipped the second client: not root, so no other uid to connect as");
        return;
    };
    let mut other = TcpStream::from_std(other).expect("tokio stream");
    other.write_all(b"x").await.expect("write");
    let started = Instant::now();
    while gate.open() < 6 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gate.open(), 6, "the other client holds a place");

    // The flood ends: its places come back.
    drop(flood);
    drop(extra);
    let started = Instant::now();
    while gate.open() > 1 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gate.open(), 1, "only the other client's connection is held");
    drop(other);
    held.abort();
}
