//! The reliability suite's traffic: a minimal upstream that answers with the PROXY
//! header it received, and clients that hold or burst connections through the relay.
//! Run by the reliability suite (`tests/tests/reliability/`) inside the simulated
//! node's namespaces (the clients in the pod cgroup, so their connects are redirected
//! like a pod's).
//!
//! Upstream protocol: the connection starts with a PROXY v1 or v2 header (else the
//! server answers `no-proxy-header` and closes, as an ingress would refuse it); then
//! each line is a command: `ping` (answer the header, keep open), `once` (answer,
//! then close first, so TIME_WAIT stays on the server side), `stream` (send bytes
//! until the peer goes), `reset` (close with a reset), `want IP:PORT` (as `once`,
//! naming the LB the client dialled: when the header's destination is another, the
//! server prints `misrouted want=IP:PORT dst=IP:PORT` on stdout, so a test counts
//! misrouted connections where they arrive). A line `count` on the server's stdin
//! prints `count wanted=N misrouted=M`: the `want` connections so far.
//! The answer to `ping`, `once` and `want` is `proxy <v1|v2> src=IP:PORT dst=IP:PORT`.

use std::{
    io::{BufRead, BufReader, ErrorKind, Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

// CLOCK_MONOTONIC in nanoseconds: comparable across processes on this machine,
// unlike `Instant`, so the test can time events it did not see itself.
use hairpin_tests::load::monotonic_ns;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "usage: hairpin-load serve ADDR... | burst TARGET TOTAL THREADS SRC_IP DEADLINE_S | \
                     hold TARGET N THREADS SRC_IP | probe TARGET TIMEOUT_MS SRC_IP | \
                     reset TARGET SRC_IP | stream TARGET | \
                     flood TARGET N THREADS SRC_IP HEAD_BYTES HOLD_MS HOST | \
                     each SRC_IP SECONDS TARGET...";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or_default();
    let outcome = match a(0) {
        "serve" => serve(&args[1..]),
        "burst" => burst(a(1), a(2), a(3), a(4), a(5)),
        "hold" => hold(a(1), a(2), a(3), a(4)),
        "probe" => probe(a(1), a(2), a(3)),
        "reset" => reset(a(1), a(2)),
        "stream" => stream(a(1)),
        "flood" => flood(&args[1..]),
        "each" => each(&args[1..]),
        _ => Err(USAGE.to_string()),
    };
    if let Err(e) = outcome {
        eprintln!("hairpin-load {}: {e}", a(0));
        std::process::exit(1);
    }
}

fn parse<T: std::str::FromStr>(what: &str, s: &str) -> Result<T> {
    s.parse().map_err(|_| format!("bad {what}: {s:?}\n{USAGE}"))
}

// ---- upstream ----

fn serve(addrs: &[String]) -> Result<()> {
    let addrs: Vec<SocketAddr> = addrs
        .iter()
        .map(|a| parse("listen address", a))
        .collect::<Result<_>>()?;
    if addrs.is_empty() {
        return Err(USAGE.into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let mut tasks = Vec::new();
        for addr in addrs {
            let socket = match addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
            }
            .map_err(|e| e.to_string())?;
            socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
            socket.bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
            let listener = socket.listen(4096).map_err(|e| e.to_string())?;
            tasks.push(tokio::spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((s, _)) => {
                            tokio::spawn(upstream_conn(s));
                        }
                        Err(e) => {
                            eprintln!("accept: {e}");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            }));
        }
        // `count` on stdin: how many `want` connections came, and how many were misrouted.
        std::thread::spawn(|| {
            for line in std::io::stdin().lines() {
                if line.is_ok_and(|l| l.trim() == "count") {
                    println!(
                        "count wanted={} misrouted={}",
                        WANTED.load(Ordering::Relaxed),
                        MISROUTED.load(Ordering::Relaxed)
                    );
                }
            }
        });
        println!("listening");
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    })
}

/// `want` connections served, and those whose header named another destination.
static WANTED: AtomicU64 = AtomicU64::new(0);
static MISROUTED: AtomicU64 = AtomicU64::new(0);

async fn upstream_conn(s: tokio::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let mut r = tokio::io::BufReader::new(s);
    let Ok(Some(header)) = read_proxy_header(&mut r).await else {
        let _ = r.get_mut().write_all(b"no-proxy-header\n").await;
        return;
    };
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let s = r.get_mut();
        match line.trim_end() {
            "ping" => {
                if s.write_all(header.as_bytes()).await.is_err() {
                    return;
                }
            }
            "once" => {
                let _ = s.write_all(header.as_bytes()).await;
                return;
            }
            want if want.starts_with("want ") => {
                let want = want.trim_start_matches("want ");
                let dst = header.trim_end().rsplit("dst=").next().unwrap_or_default();
                WANTED.fetch_add(1, Ordering::Relaxed);
                if dst != want {
                    MISROUTED.fetch_add(1, Ordering::Relaxed);
                    println!("misrouted want={want} dst={dst}");
                }
                let _ = s.write_all(header.as_bytes()).await;
                return;
            }
            "stream" => {
                let chunk = vec![b's'; 64 * 1024];
                while s.write_all(&chunk).await.is_ok() {}
                return;
            }
            "reset" => {
                // Linger 0: close sends a reset instead of a FIN.
                let zero = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                let _ = nix::sys::socket::setsockopt(&*s, nix::sys::socket::sockopt::Linger, &zero);
                return;
            }
            other => {
                let _ = s.write_all(format!("unknown {other}\n").as_bytes()).await;
                return;
            }
        }
    }
}

/// Reads a v1 or v2 header; `None` when the connection does not start with one.
async fn read_proxy_header<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<String>> {
    const V2_SIG: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
    let mut first = [0u8; 12];
    // Decide on the first byte when it can start neither header: a client that sent
    // a short request without one gets its answer now, not after 12 bytes.
    r.read_exact(&mut first[..1]).await?;
    if first[0] != b'P' && first[0] != b'\r' {
        return Ok(None);
    }
    r.read_exact(&mut first[1..]).await?;
    if first == V2_SIG {
        let mut fixed = [0u8; 4];
        r.read_exact(&mut fixed).await?;
        let len = u16::from_be_bytes([fixed[2], fixed[3]]) as usize;
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).await?;
        let (src, dst) = match fixed[1] >> 4 {
            1 if len >= 12 => {
                let ip = |o: usize| IpAddr::from([body[o], body[o + 1], body[o + 2], body[o + 3]]);
                let port = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
                (
                    SocketAddr::new(ip(0), port(8)),
                    SocketAddr::new(ip(4), port(10)),
                )
            }
            2 if len >= 36 => {
                let ip = |o: usize| {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(&body[o..o + 16]);
                    IpAddr::from(b)
                };
                let port = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
                (
                    SocketAddr::new(ip(0), port(32)),
                    SocketAddr::new(ip(16), port(34)),
                )
            }
            _ => return Ok(None),
        };
        return Ok(Some(format!("proxy v2 src={src} dst={dst}\n")));
    }
    if !first.starts_with(b"PROXY ") {
        return Ok(None);
    }
    let mut rest = Vec::new();
    r.read_until(b'\n', &mut rest).await?;
    let mut line = first.to_vec();
    line.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&line);
    let f: Vec<&str> = text.trim_end().split(' ').collect();
    let (Some(src), Some(dst), Some(sport), Some(dport)) = (
        f.get(2).and_then(|s| s.parse::<IpAddr>().ok()),
        f.get(3).and_then(|s| s.parse::<IpAddr>().ok()),
        f.get(4).and_then(|s| s.parse::<u16>().ok()),
        f.get(5).and_then(|s| s.parse::<u16>().ok()),
    ) else {
        return Ok(None);
    };
    Ok(Some(format!(
        "proxy v1 src={} dst={}\n",
        SocketAddr::new(src, sport),
        SocketAddr::new(dst, dport)
    )))
}

// ---- clients ----

/// Connects, sends `cmd` and reads the one-line answer; checks that the header
/// named this socket as the source and `target` as the destination.
fn exchange(
    s: &mut BufReader<TcpStream>,
    cmd: &str,
    target: SocketAddr,
    src: IpAddr,
) -> Result<()> {
    let local = s.get_ref().local_addr().map_err(|e| e.to_string())?;
    s.get_mut()
        .write_all(cmd.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    s.read_line(&mut answer).map_err(|e| format!("read: {e}"))?;
    let want = format!(" src={} dst={target}", SocketAddr::new(src, local.port()));
    if !answer.starts_with("proxy v") || !answer.trim_end().ends_with(&want) {
        return Err(format!("answer {answer:?}, wanted header{want}"));
    }
    Ok(())
}

fn connect(target: SocketAddr) -> Result<BufReader<TcpStream>> {
    let s = TcpStream::connect_timeout(&target, Duration::from_secs(10))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    Ok(BufReader::new(s))
}

/// One short connection: `once`, the answer, then EOF from the server.
fn one_shot(target: SocketAddr, src: IpAddr) -> Result<()> {
    let mut s = connect(target)?;
    exchange(&mut s, "once\n", target, src)?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .map_err(|e| format!("read to EOF: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the answer", rest.len()));
    }
    Ok(())
}

/// One connection to each target in turn (the first again after the last) for
/// `seconds` (0: one round), each naming its target with `want`; prints one
/// summary line: `each total=.. ok=.. misrouted=.. no_header=.. errors=..`, where
/// `misrouted` counts headers naming another destination (the samples on stderr)
/// and `no_header` connections that reached a server without one (no agent: as
/// before hairpin).
fn each(args: &[String]) -> Result<()> {
    let [src, seconds, targets @ ..] = args else {
        return Err(USAGE.into());
    };
    let src: IpAddr = parse("source IP", src)?;
    let seconds: u64 = parse("seconds", seconds)?;
    let targets: Vec<SocketAddr> = targets
        .iter()
        .map(|t| parse("target", t))
        .collect::<Result<_>>()?;
    if targets.is_empty() {
        return Err(USAGE.into());
    }
    let started = Instant::now();
    let (mut total, mut ok, mut misrouted, mut no_header, mut errors) = (0u64, 0, 0, 0, 0);
    for target in targets.iter().cycle() {
        if total >= targets.len() as u64 && started.elapsed() >= Duration::from_secs(seconds) {
            break;
        }
        total += 1;
        let answer = connect(*target).and_then(|mut s| {
            s.get_mut()
                .write_all(format!("want {target}\n").as_bytes())
                .map_err(|e| format!("write: {e}"))?;
            let local = s.get_ref().local_addr().map_err(|e| e.to_string())?;
            let mut answer = String::new();
            s.read_line(&mut answer).map_err(|e| format!("read: {e}"))?;
            Ok((answer, local))
        });
        match answer {
            Ok((a, _)) if a.starts_with("no-proxy-header") => no_header += 1,
            Ok((a, local))
                if a.trim_end().ends_with(&format!(
                    " src={} dst={target}",
                    SocketAddr::new(src, local.port())
                )) =>
            {
                ok += 1
            }
            Ok((a, _)) if a.starts_with("proxy v") => {
                misrouted += 1;
                eprintln!("each: {target} answered {a:?}");
            }
            Ok((a, _)) => {
                errors += 1;
                eprintln!("each: {target} answered {a:?}");
            }
            Err(e) => {
                errors += 1;
                if errors <= 5 {
                    eprintln!("each: {target}: {e}");
                }
            }
        }
    }
    println!(
        "each total={total} ok={ok} misrouted={misrouted} no_header={no_header} errors={errors}"
    );
    Ok(())
}

/// `total` one-shot connections from `threads` threads, none started after
/// `deadline_s`; prints one summary line: `burst total=.. ok=.. errors=.. secs=..
/// rate=..` (total counts the connections made) and up to 5 error samples on stderr.
fn burst(target: &str, total: &str, threads: &str, src: &str, deadline_s: &str) -> Result<()> {
    let target: SocketAddr = parse("target", target)?;
    let total: u64 = parse("total", total)?;
    let threads: usize = parse("threads", threads)?;
    let src: IpAddr = parse("source IP", src)?;
    let deadline = Duration::from_secs(parse("deadline", deadline_s)?);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, errors, samples) = (next.clone(), errors.clone(), samples.clone());
            std::thread::spawn(move || {
                loop {
                    if started.elapsed() > deadline {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    if i > 0 && i % 100_000 == 0 {
                        eprintln!(
                            "burst: {i} connections, {:.1} s",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    if let Err(e) = one_shot(target, src) {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let mut s = samples.lock().unwrap_or_else(|p| p.into_inner());
                        if s.len() < 5 {
                            s.push(format!("connection {i}: {e}"));
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "worker panicked")?;
    }
    let secs = started.elapsed().as_secs_f64();
    let errors = errors.load(Ordering::Relaxed);
    let total = next.load(Ordering::Relaxed).min(total);
    for s in samples.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        eprintln!("error sample: {s}");
    }
    println!(
        "burst total={total} ok={} errors={errors} secs={secs:.1} rate={:.0}",
        total - errors,
        total as f64 / secs
    );
    Ok(())
}

/// Opens `n` connections (each answered with its own header) and holds them all;
/// prints `open N secs=..`, waits for a line on stdin, checks every connection once
/// more, prints `verified N`, closes them all and prints `closed`.
fn hold(target: &str, n: &str, threads: &str, src: &str) -> Result<()> {
    let target: SocketAddr = parse("target", target)?;
    let n: usize = parse("count", n)?;
    let threads: usize = parse::<usize>("threads", threads)?.max(1);
    let src: IpAddr = parse("source IP", src)?;
    let started = Instant::now();
    let per = n.div_ceil(threads);
    let openers: Vec<_> = (0..threads)
        .map(|t| {
            let count = per.min(n.saturating_sub(t * per));
            std::thread::spawn(move || -> Result<Vec<BufReader<TcpStream>>> {
                (0..count)
                    .map(|_| {
                        let mut s = connect(target)?;
                        exchange(&mut s, "ping\n", target, src)?;
                        Ok(s)
                    })
                    .collect()
            })
        })
        .collect();
    let mut conns = Vec::with_capacity(n);
    for o in openers {
        conns.extend(o.join().map_err(|_| "opener panicked")??);
    }
    println!(
        "open {} secs={:.1}",
        conns.len(),
        started.elapsed().as_secs_f64()
    );
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .map_err(|e| e.to_string())?;
    for (i, c) in conns.iter_mut().enumerate() {
        exchange(c, "ping\n", target, src)
            .map_err(|e| format!("connection {i} after hold: {e}"))?;
    }
    println!("verified {}", conns.len());
    drop(conns);
    println!("closed");
    Ok(())
}

/// Tries a proxied one-shot every 5 ms until one succeeds; prints `ok AT_NS`
/// (CLOCK_MONOTONIC of the success) or fails after `timeout_ms`.
fn probe(target: &str, timeout_ms: &str, src: &str) -> Result<()> {
    let target: SocketAddr = parse("target", target)?;
    let timeout = Duration::from_millis(parse("timeout", timeout_ms)?);
    let src: IpAddr = parse("source IP", src)?;
    println!("probing");
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < timeout {
        let tried = TcpStream::connect_timeout(&target, Duration::from_millis(500))
            .map_err(|e| format!("connect: {e}"))
            .and_then(|s| {
                s.set_read_timeout(Some(Duration::from_millis(500)))
                    .map_err(|e| e.to_string())?;
                let mut s = BufReader::new(s);
                exchange(&mut s, "once\n", target, src)
            });
        match tried {
            Ok(()) => {
                println!("ok {}", monotonic_ns());
                return Ok(());
            }
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(format!(
        "no proxied answer within {timeout:?}; last: {last}"
    ))
}

/// One connection, two exchanges, then asks the upstream to reset it; prints
/// `ended KIND after_ms=..` for how the client saw the end (`reset` or `eof`).
fn reset(target: &str, src: &str) -> Result<()> {
    let target: SocketAddr = parse("target", target)?;
    let src: IpAddr = parse("source IP", src)?;
    let mut s = connect(target)?;
    exchange(&mut s, "ping\n", target, src)?;
    exchange(&mut s, "ping\n", target, src)?;
    let asked = Instant::now();
    s.get_mut()
        .write_all(b"reset\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 64];
    let kind = match s.read(&mut buf) {
        Ok(0) => "eof",
        Ok(n) => return Err(format!("{n} unexpected bytes")),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => "reset",
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => "hung",
        Err(e) => return Err(format!("read: {e}")),
    };
    println!("ended {kind} after_ms={}", asked.elapsed().as_millis());
    Ok(())
}

/// One connection receiving a stream: prints `receiving` after the first MiB, then
/// reads until the connection ends and prints `ended KIND bytes=.. at_ns=..`.
fn stream(target: &str) -> Result<()> {
    let target: SocketAddr = parse("target", target)?;
    let mut s = connect(target)?;
    s.get_mut()
        .write_all(b"stream\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut announced = false;
    let kind = loop {
        match s.read(&mut buf) {
            Ok(0) => break "eof",
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break "reset",
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break "hung";
            }
            Err(e) => return Err(format!("read: {e}")),
        }
        if !announced && total >= 1 << 20 {
            println!("receiving");
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            announced = true;
        }
        // A reader slower than the upstream keeps data in flight in every buffer.
        std::thread::sleep(Duration::from_millis(1));
    };
    println!("ended {kind} bytes={total} at_ns={}", monotonic_ns());
    Ok(())
}

// ---- flood ----

/// Most connections one `flood` opens, and the longest it holds them: a flood is a
/// test's, bounded in count and time.
const FLOOD_MAX_CONNECTIONS: usize = 5_000;
const FLOOD_MAX_HOLD: Duration = Duration::from_secs(60);

/// What a flood connection came to, as its client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Open, nothing received: held by the peer (or still in its accept queue).
    Held,
    /// Reset by the peer (on the write, or a read returned ECONNRESET).
    Reset,
    /// The peer closed it (FIN) without a byte.
    Eof,
    /// The peer answered (the name relay's 408 once its read timeout passed).
    Answered,
}

/// The start of an HTTP/1.1 request head for `host`, padded with one header field
/// to `bytes` and never finished: no blank line ends it, so a relay reading for the
/// name waits for more.
fn unfinished_head(host: &str, bytes: usize) -> Vec<u8> {
    let mut head = format!("GET / HTTP/1.1\r\nHost: {host}\r\nX-Pad: ").into_bytes();
    head.resize(bytes.max(head.len()), b'a');
    head
}

/// One flood connection from `src` (port chosen by the kernel) to `target`, with
/// `head` written on it. `Err` when the connect fails; a reset on the write (the
/// peer shed it before the bytes were out) is `Ok(None)`.
fn flood_one(target: SocketAddr, src: IpAddr, head: &[u8]) -> Result<Option<TcpStream>> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, setsockopt, socket,
        sockopt,
    };
    use std::os::fd::AsRawFd;
    let family = match target {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| format!("socket: {e}"))?;
    // Bounds the connect and the write (Linux applies SO_SNDTIMEO to connect).
    let limit = nix::sys::time::TimeVal::new(10, 0);
    setsockopt(&fd, sockopt::SendTimeout, &limit).map_err(|e| format!("SO_SNDTIMEO: {e}"))?;
    let _ = setsockopt(&fd, sockopt::IpBindAddressNoPort, &true);
    bind(
        fd.as_raw_fd(),
        &SockaddrStorage::from(SocketAddr::new(src, 0)),
    )
    .map_err(|e| format!("bind {src}: {e}"))?;
    let shed = |e: &std::io::Error| {
        matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
        )
    };
    if let Err(e) = connect(fd.as_raw_fd(), &SockaddrStorage::from(target)) {
        let e = std::io::Error::from(e);
        return if shed(&e) {
            Ok(None)
        } else {
            Err(format!("connect: {e}"))
        };
    }
    let mut s = TcpStream::from(fd);
    match s.write_all(head) {
        Ok(()) => Ok(Some(s)),
        Err(e) if shed(&e) => Ok(None),
        Err(e) => Err(format!("write: {e}")),
    }
}

/// What `s` has come to, without blocking.
fn fate(s: &TcpStream) -> Fate {
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => Fate::Eof,
        Ok(_) => Fate::Answered,
        Err(e) if e.kind() == ErrorKind::WouldBlock => Fate::Held,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Fate::Reset,
        // Any other error ends the connection as a reset would.
        Err(_) => Fate::Reset,
    }
}

/// Counts of `fates` as `held=.. reset=.. eof=.. answered=..`.
fn fate_counts(fates: &[Fate]) -> String {
    let n = |f: Fate| fates.iter().filter(|x| **x == f).count();
    format!(
        "held={} reset={} eof={} answered={}",
        n(Fate::Held),
        n(Fate::Reset),
        n(Fate::Eof),
        n(Fate::Answered)
    )
}

/// `flood TARGET N THREADS SRC_IP HEAD_BYTES HOLD_MS HOST`: opens `n` connections
/// from `src` to `target` on `threads` threads, writes an unfinished request head of
/// `head_bytes` for `host` on each, and once all are written sorts them by what they
/// came to: held (open, nothing received), reset (shed), closed or answered. Sorting
/// waits for the counts to stay the same for 200 ms (at most 2 s), so resets sent
/// just after a write are seen. Prints
/// `flood attempted=N held=.. reset=.. eof=.. answered=.. failed=.. secs=..` (failed:
/// connects that failed; secs: time to open and write all), holds them `hold_ms`,
/// printing `flood now held=.. reset=.. eof=.. answered=..` for each line read on
/// stdin meanwhile, then prints `flood end ...` likewise and exits (closing them).
fn flood(args: &[String]) -> Result<()> {
    let [target, n, threads, src, head_bytes, hold_ms, host] = args else {
        return Err(USAGE.into());
    };
    let target: SocketAddr = parse("target", target)?;
    let n: usize = parse("count", n)?;
    let threads: usize = parse::<usize>("threads", threads)?.clamp(1, 64);
    let src: IpAddr = parse("source IP", src)?;
    let head_bytes: usize = parse("head bytes", head_bytes)?;
    let hold = Duration::from_millis(parse("hold ms", hold_ms)?);
    if n > FLOOD_MAX_CONNECTIONS || hold > FLOOD_MAX_HOLD || head_bytes > 1 << 20 {
        return Err(format!(
            "a flood is at most {FLOOD_MAX_CONNECTIONS} connections, 1 MiB heads and \
             {FLOOD_MAX_HOLD:?} of hold"
        ));
    }
    let head = Arc::new(unfinished_head(host, head_bytes));
    let started = Instant::now();
    let per = n.div_ceil(threads);
    let openers: Vec<_> = (0..threads)
        .map(|t| {
            let count = per.min(n.saturating_sub(t * per));
            let head = head.clone();
            std::thread::spawn(move || {
                let mut opened = Vec::with_capacity(count);
                let mut failed = Vec::new();
                for _ in 0..count {
                    match flood_one(target, src, &head) {
                        Ok(s) => opened.push(s),
                        Err(e) => failed.push(e),
                    }
                }
                (opened, failed)
            })
        })
        .collect();
    let mut conns: Vec<Option<TcpStream>> = Vec::with_capacity(n);
    let mut failed = Vec::new();
    for o in openers {
        let (opened, f) = o.join().map_err(|_| "opener panicked")?;
        conns.extend(opened);
        failed.extend(f);
    }
    let secs = started.elapsed().as_secs_f64();
    for s in conns.iter().flatten() {
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
    }
    // A reset is final: once seen (and so consumed) it is kept.
    let sort = |fates: &mut Vec<Fate>| {
        for (f, s) in fates.iter_mut().zip(&conns) {
            *f = match (*f, s) {
                (Fate::Reset, _) | (_, None) => Fate::Reset,
                (_, Some(s)) => fate(s),
            };
        }
    };
    let mut fates = vec![Fate::Held; conns.len()];
    sort(&mut fates);
    let settle = Instant::now();
    loop {
        let before = fates.clone();
        std::thread::sleep(Duration::from_millis(200));
        sort(&mut fates);
        if fates == before || settle.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    for e in failed.iter().take(5) {
        eprintln!("flood from {src}: {e}");
    }
    println!(
        "flood attempted={n} {} failed={} secs={secs:.2}",
        fate_counts(&fates),
        failed.len()
    );
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // Each line on stdin asks for the counts again (the peer may not have accepted
    // every connection yet when the first line was printed).
    let (asked, asks) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            if line.is_err() || asked.send(()).is_err() {
                return;
            }
        }
    });
    let until = Instant::now() + hold;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match asks.recv_timeout(left) {
            Ok(()) => {
                sort(&mut fates);
                println!("flood now {}", fate_counts(&fates));
                std::io::stdout().flush().map_err(|e| e.to_string())?;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
            // Stdin closed: hold out the time.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(left);
                break;
            }
        }
    }
    sort(&mut fates);
    println!("flood end {}", fate_counts(&fates));
    Ok(())
}
