//! `serve`: the upstream in the ingress namespace that reads each connection's PROXY
//! header and counts what reached it, and what did not belong there.

use std::{
    net::{IpAddr, SocketAddr},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::{Result, USAGE, parse};

pub(crate) fn serve(addrs: &[String]) -> Result<()> {
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
