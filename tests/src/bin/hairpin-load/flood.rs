//! `flood`: connections that each hold an unfinished request head, for the name
//! relay's caps, and what became of each.

use std::{
    io::{ErrorKind, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{Result, USAGE, parse};

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
pub(crate) fn flood(args: &[String]) -> Result<()> {
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
