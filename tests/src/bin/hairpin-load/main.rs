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

mod flood;
mod serve;

use flood::flood;
use serve::serve;

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
