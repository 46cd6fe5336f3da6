//! The relay's splice on loopback: what the kernel splice (the stream verdict on
//! the relay's own sockets) and splice(2) change against the copy, each checked
//! with exact bytes: half-close each way, a slow reader (the kernel's credit runs
//! out and the relay carries the rest), an upstream reset, a client that vanishes,
//! the sockets leaving the maps when either closes, and the fallback to splice(2)
//! when the verdict cannot be loaded. Root (the program loads); about 5 s.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use hairpin_agent::{
    ProxyVersion,
    datapath::{Datapath, Splice, SpliceHeld, embedded_object},
    relay::{
        ClientPolicy, ConnGate, ConnLimits, KernelSplice, ListenHook, NoKernelSplice, Relay,
        RelayConfig, SlotLookup, SpliceConfig, SpliceMode, bind_listener, resolve_splice,
    },
    status::Metrics,
};
use hairpin_tests::require_privileges;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const MARK: u32 = 0x68;

/// A relay in front of a loopback upstream, spliced as `splice` says.
struct Setup {
    relay: Relay,
    metrics: Metrics,
    listener: SocketAddr,
    upstream: TcpListener,
}

fn relay_config(splice: SpliceConfig) -> RelayConfig {
    RelayConfig {
        // Marks need CAP_NET_ADMIN and nothing here is redirected.
        bypass_mark: None,
        connect_timeout: Duration::from_secs(2),
        node_ipv4: Some(Ipv4Addr::new(192, 0, 2, 1)),
        node_ipv6: None,
        clients: ClientPolicy::any(),
        gate: ConnGate::new(ConnLimits {
            total: 1_000,
            per_source: 1_000,
        }),
        buffer_size: 64 * 1024,
        keepalive: Some(Duration::from_secs(60)),
        splice,
    }
}

async fn setup(splice: SpliceConfig) -> Setup {
    let upstream = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let target = upstream.local_addr().expect("addr");
    let metrics = Metrics::default();
    let mut relay = Relay::new(relay_config(splice), metrics.clone());
    // Every connection relayed to the upstream, as if its slot named it.
    let bound = bind_listener(SocketAddr::new(LOCALHOST, 0), None).expect("listen");
    let hook: ListenHook = Arc::new(|_, _, _| Ok(()));
    let slots: SlotLookup = Arc::new(move |_| Some((target, ProxyVersion::V1)));
    let listener = relay.serve(bound, 0, &hook, slots).expect("serve");
    Setup {
        relay,
        metrics,
        listener,
        upstream,
    }
}

/// A datapath loaded for its splice (kept alive with it), spliced from the first byte.
fn kernel() -> (Datapath, Splice, SpliceConfig) {
    let object = embedded_object()
        .expect("the tests were built without the eBPF object: run them with `cargo xtask test`");
    let datapath = Datapath::load(object, MARK).expect("load the datapath");
    let splice = datapath
        .splice()
        .expect("the kernel splice loads on this kernel");
    let (cfg, status) = resolve_splice(
        SpliceMode::Kernel,
        0,
        Ok(Arc::new(splice.clone()) as Arc<dyn KernelSplice>),
    );
    assert_eq!(status.splicer, "kernel", "{status:?}");
    (datapath, splice, cfg)
}

fn pipe() -> SpliceConfig {
    resolve_splice(SpliceMode::Pipe, 0, Err(NoKernelSplice::NoDatapath)).0
}

/// `n` bytes no two runs of which repeat at a short period: a reordered or
/// dropped chunk shows.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Accepts the relay's upstream connection and reads its v1 header line.
async fn accept_with_header(upstream: &TcpListener) -> (TcpStream, String) {
    let (mut s, _) = upstream.accept().await.expect("accept");
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        s.read_exact(&mut b).await.expect("header byte");
        line.push(b[0]);
    }
    (s, String::from_utf8(line).expect("ascii"))
}

/// Ways spliced by `how` once every connection has ended (the relay counts them as
/// its task ends, just after the last byte).
async fn spliced(metrics: &Metrics, how: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.active_connections() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    metrics
        .relay_counters()
        .spliced_ways
        .get(how)
        .copied()
        .unwrap_or(0)
}

/// Accepts the relay's upstream connection (blocking) and reads its v1 header line.
fn accept_blocking(upstream: &std::net::TcpListener) -> (std::net::TcpStream, String) {
    use std::io::Read;
    let (mut s, _) = upstream.accept().expect("accept");
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        s.read_exact(&mut b).expect("header byte");
        line.push(b[0]);
    }
    (s, String::from_utf8(line).expect("ascii"))
}

/// Reads `s` to its end (blocking), `chunk` bytes at a time, pausing `pause`
/// between reads.
fn read_blocking(s: &mut std::net::TcpStream, chunk: usize, pause: Duration) -> Vec<u8> {
    use std::io::Read;
    let mut all = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            return all;
        }
        all.extend_from_slice(&buf[..n]);
        std::thread::sleep(pause);
    }
}

/// Runs the upstream `server` and the `client` on threads of their own (the relay
/// keeps its runtime to itself, as in the agent) and returns what each read.
async fn exchange(
    s: Setup,
    server: impl FnOnce(std::net::TcpStream) -> Vec<u8> + Send + 'static,
    client: impl FnOnce(std::net::TcpStream) -> Vec<u8> + Send + 'static,
) -> (Vec<u8>, Vec<u8>, Metrics) {
    let upstream = s.upstream.into_std().expect("std listener");
    upstream.set_nonblocking(false).expect("blocking");
    let listener = s.listener;
    let server = tokio::task::spawn_blocking(move || {
        let (conn, header) = accept_blocking(&upstream);
        assert!(header.starts_with("PROXY TCP4 192.0.2.1 "), "{header}");
        server(conn)
    });
    let client = tokio::task::spawn_blocking(move || {
        client(std::net::TcpStream::connect(listener).expect("connect"))
    });
    let (got_server, got_client) = tokio::time::timeout(Duration::from_secs(60), async {
        (server.await.expect("server"), client.await.expect("client"))
    })
    .await
    .expect("the relay hung");
    drop(s.relay);
    (got_server, got_client, s.metrics)
}

/// The client sends and half-closes first; the upstream reads it all to its end,
/// then answers and closes; every byte arrives, in order, on both sides.
async fn client_half_closes_first(cfg: SpliceConfig, up: usize, down: usize) -> Metrics {
    use std::io::Write;
    let (sent_up, sent_down) = (pattern(up, 1), pattern(down, 2));
    let (expect_up, expect_down) = (sent_up.clone(), sent_down.clone());
    let (got_up, got_down, metrics) = exchange(
        setup(cfg).await,
        move |mut conn| {
            let got = read_blocking(&mut conn, 64 * 1024, Duration::ZERO);
            conn.write_all(&sent_down).expect("answer");
            got
        },
        move |mut c| {
            c.write_all(&sent_up).expect("send");
            c.shutdown(std::net::Shutdown::Write).expect("half-close");
            read_blocking(&mut c, 64 * 1024, Duration::ZERO)
        },
    )
    .await;
    assert!(
        got_up == expect_up,
        "client to upstream: {} of {up} bytes, or reordered",
        got_up.len()
    );
    assert!(
        got_down == expect_down,
        "upstream to client: {} of {down} bytes, or reordered",
        got_down.len()
    );
    metrics
}

/// The upstream sends and half-closes first; the client reads it all (slowly:
/// `pause` between 16 KiB reads), then sends and closes; both arrive whole.
async fn upstream_half_closes_first(cfg: SpliceConfig, down: usize, pause: Duration) -> Metrics {
    use std::io::Write;
    let (sent_down, sent_up) = (pattern(down, 3), pattern(100_000, 4));
    let (expect_down, expect_up) = (sent_down.clone(), sent_up.clone());
    let (got_up, got_down, metrics) = exchange(
        setup(cfg).await,
        move |mut conn| {
            conn.write_all(&sent_down).expect("send");
            conn.shutdown(std::net::Shutdown::Write)
                .expect("half-close");
            read_blocking(&mut conn, 64 * 1024, Duration::ZERO)
        },
        move |mut c| {
            let got = read_blocking(&mut c, 16 * 1024, pause);
            c.write_all(&sent_up).expect("answer");
            got
        },
    )
    .await;
    assert!(
        got_down == expect_down,
        "upstream to client: {} of {down} bytes, or reordered",
        got_down.len()
    );
    assert!(
        got_up == expect_up,
        "client to upstream: {} bytes, or reordered",
        got_up.len()
    );
    metrics
}

#[tokio::test]
async fn the_kernel_splice_carries_half_closes_each_way_byte_for_byte() {
    require_privileges!();
    let (_d, splice, cfg) = kernel();
    let m = client_half_closes_first(cfg.clone(), 8 << 20, 3 << 20).await;
    assert_eq!(
        spliced(&m, "kernel").await,
        2,
        "both ways spliced by the kernel"
    );
    let m = upstream_half_closes_first(cfg, 8 << 20, Duration::ZERO).await;
    assert_eq!(
        spliced(&m, "kernel").await,
        2,
        "both ways spliced by the kernel"
    );
    settle(&splice).await;
}

/// A client that reads 16 KiB every 2 ms takes far longer than the upstream needs
/// to send: the kernel's credit runs out, the bytes wait with the upstream socket
/// and the relay carries them itself, in order, then hands back to the kernel.
#[tokio::test]
async fn a_slow_reader_gets_every_byte_in_order_through_the_kernel_splice() {
    require_privileges!();
    let (_d, splice, cfg) = kernel();
    let m = upstream_half_closes_first(cfg, 12 << 20, Duration::from_millis(2)).await;
    assert_eq!(spliced(&m, "kernel").await, 2);
    let c = m.relay_counters();
    assert!(
        c.spliced_pauses > 0 || c.spliced_left_bytes > 0,
        "the kernel's credit never ran low: the test proves nothing"
    );
    eprintln!(
        "slow reader: {} pauses; the relay carried {} of {} bytes itself",
        c.spliced_pauses,
        c.spliced_left_bytes,
        12 << 20
    );
    settle(&splice).await;
}

#[tokio::test]
async fn splice_through_pipes_carries_half_closes_each_way_byte_for_byte() {
    let m = client_half_closes_first(pipe(), 8 << 20, 3 << 20).await;
    assert_eq!(spliced(&m, "pipe").await, 2);
    let m = upstream_half_closes_first(pipe(), 8 << 20, Duration::from_millis(1)).await;
    assert_eq!(spliced(&m, "pipe").await, 2);
}

/// Exchanges shorter than `--relay-splice-after` stay copies; a way that carries
/// more is spliced from there on, with nothing lost or reordered at the switch.
#[tokio::test]
async fn a_way_is_spliced_once_it_has_carried_enough() {
    require_privileges!();
    let (_d, splice, cfg) = kernel();
    let cfg = SpliceConfig {
        after: 64 * 1024,
        ..cfg
    };
    let m = client_half_closes_first(cfg.clone(), 1_000, 2_000).await;
    assert_eq!(
        spliced(&m, "kernel").await,
        0,
        "a short exchange stays a copy"
    );
    // A request, then a long answer while the client still listens: the answer's
    // way is spliced after its first 64 KiB.
    let answer = pattern(4 << 20, 6);
    let expect = answer.clone();
    let (rest, got, metrics) = exchange(
        setup(cfg).await,
        move |mut conn| {
            use std::io::{Read, Write};
            let mut request = [0u8; 5];
            conn.read_exact(&mut request).expect("request");
            conn.write_all(&answer).expect("answer");
            conn.shutdown(std::net::Shutdown::Write).expect("close");
            read_blocking(&mut conn, 4096, Duration::ZERO)
        },
        move |mut c| {
            use std::io::{Read, Write};
            c.write_all(b"hello").expect("request");
            let mut got = vec![0u8; 4 << 20];
            c.read_exact(&mut got).expect("answer");
            got
        },
    )
    .await;
    assert!(
        got == expect,
        "the answer arrived whole and in order across the switch"
    );
    assert!(rest.is_empty());
    assert_eq!(
        spliced(&metrics, "kernel").await,
        1,
        "only the long way is spliced"
    );
    settle(&splice).await;
}

/// Waits for the splice to hold nothing (the relay's tasks end just after the
/// bytes): the sockets left the maps with their close, the records with their way.
async fn settle(splice: &Splice) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while splice.held() != SpliceHeld::default() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        splice.held(),
        SpliceHeld::default(),
        "the splice still holds sockets or records"
    );
}

/// Mid-stream, while both ways are spliced: the sockets are in the maps; the
/// upstream resets; the client sees the reset at once; and the maps let go of both.
#[tokio::test]
async fn an_upstream_reset_reaches_the_client_at_once_and_the_maps_let_go() {
    require_privileges!();
    let (_d, splice, cfg) = kernel();
    let s = setup(cfg).await;
    let mut c = TcpStream::connect(s.listener).await.expect("connect");
    let (mut conn, _) = accept_with_header(&s.upstream).await;
    c.write_all(b"ping").await.expect("send");
    let mut b = [0u8; 4];
    conn.read_exact(&mut b)
        .await
        .expect("ping through the kernel");
    conn.write_all(b"pong").await.expect("answer");
    c.read_exact(&mut b).await.expect("pong through the kernel");
    let held = splice.held();
    assert_eq!(
        (held.spliced, held.paired),
        (2, 2),
        "both sockets spliced: {held:?}"
    );
    socket2::SockRef::from(&conn)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(conn);
    let reset_at = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
        .await
        .expect("the client must not hang");
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset, got {r:?}"
    );
    assert!(
        reset_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        reset_at.elapsed()
    );
    settle(&splice).await;
    let counters = s.metrics.relay_counters();
    assert_eq!(
        counters.upstream_errors.get("reset"),
        Some(&1),
        "{counters:?}"
    );
}

/// A client that vanishes (reset) mid-stream while the upstream streams to it: the
/// relay closes the upstream at once, counts it on the client's side, and the maps
/// let go of both sockets.
#[tokio::test]
async fn a_client_that_vanishes_closes_the_upstream_and_the_maps_let_go() {
    require_privileges!();
    let (_d, splice, cfg) = kernel();
    let s = setup(cfg).await;
    let c = TcpStream::connect(s.listener).await.expect("connect");
    let (mut conn, _) = accept_with_header(&s.upstream).await;
    let streamer = tokio::spawn(async move {
        let chunk = pattern(64 * 1024, 5);
        let started = Instant::now();
        loop {
            if conn.write_all(&chunk).await.is_err() {
                return started.elapsed();
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    socket2::SockRef::from(&c)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(c);
    let closed = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), streamer)
        .await
        .expect("the upstream kept streaming to a vanished client")
        .expect("streamer");
    assert!(
        closed.elapsed() < Duration::from_secs(2),
        "{:?}",
        closed.elapsed()
    );
    settle(&splice).await;
    let counters = s.metrics.relay_counters();
    assert_eq!(
        counters.client_errors.get("reset"),
        Some(&1),
        "{counters:?}"
    );
    assert!(
        counters.upstream_errors.values().all(|n| *n == 0),
        "{counters:?}"
    );
}

/// An object whose stream verdict the kernel refuses (its first instruction made
/// invalid, as a verifier that rejects it would): the datapath still loads, offers
/// no kernel splice and says why, and `auto` splices through pipes instead.
#[tokio::test]
async fn without_the_verdict_auto_splices_through_pipes() {
    require_privileges!();
    let object = embedded_object().expect("the tests were built without the eBPF object");
    let broken = break_program(object, "sk_skb/stream_verdict");
    let datapath = Datapath::load(&broken, MARK).expect("the rest of the datapath loads");
    let why = datapath
        .splice()
        .err()
        .expect("no kernel splice without its program");
    assert!(why.to_string().contains("hairpin_splice"), "{why}");
    let (cfg, status) = resolve_splice(
        SpliceMode::Auto,
        0,
        Err(NoKernelSplice::Unavailable(why.clone())),
    );
    assert_eq!(status.splicer, "pipe");
    assert_eq!(status.reason, Some(why.to_string()));
    let m = client_half_closes_first(cfg, 2 << 20, 2 << 20).await;
    assert_eq!(spliced(&m, "pipe").await, 2);
    assert_eq!(spliced(&m, "kernel").await, 0);
}

/// A copy of the ELF `object` whose section `name` starts with an invalid opcode.
fn break_program(object: &[u8], name: &str) -> Vec<u8> {
    let u16_at = |o: usize| u16::from_le_bytes([object[o], object[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(object[o..o + 4].try_into().expect("4")) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(object[o..o + 8].try_into().expect("8")) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    let mut out = object.to_vec();
    for i in 0..shnum {
        let h = header(i);
        let at = strtab + u32_at(h);
        let end = at
            + object[at..]
                .iter()
                .position(|b| *b == 0)
                .expect("terminated");
        if &object[at..end] == name.as_bytes() {
            out[u64_at(h + 0x18)] = 0xff;
            return out;
        }
    }
    panic!("no section {name} in the object");
}
