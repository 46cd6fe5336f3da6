//! Relaying bytes between two TCP sockets with splice(2) through a pipe per
//! direction, so the payload never crosses into user space.
//!
//! Profiling the relay with `copy_bidirectional` (`cargo xtask bench --profile`)
//! showed ~98% of its CPU in the kernel, with the two user-space copies
//! (`_copy_to_iter` / `_copy_from_iter`) the part a relay can remove. Half-close
//! behaves as in `copy_bidirectional`: when one side reaches EOF, the other
//! side's write half is shut down and the opposite direction keeps flowing.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
};

use nix::{
    fcntl::{OFlag, SpliceFFlags, splice},
    sys::socket::{Shutdown, shutdown},
    unistd::pipe2,
};
use tokio::{io::Interest, net::TcpStream};

/// Bytes moved per splice call, at most: the default pipe capacity.
const CHUNK: usize = 64 * 1024;

/// Relays both ways until both directions reached EOF, like
/// `tokio::io::copy_bidirectional`; returns (a→b, b→a) byte counts.
pub async fn splice_bidirectional(a: &TcpStream, b: &TcpStream) -> io::Result<(u64, u64)> {
    let (ab, ba) = tokio::try_join!(one_way(a, b), one_way(b, a))?;
    Ok((ab, ba))
}

/// Moves bytes from `src` to `dst` until `src` reaches EOF, then shuts down
/// `dst`'s write half.
async fn one_way(src: &TcpStream, dst: &TcpStream) -> io::Result<u64> {
    let (pipe_r, pipe_w): (OwnedFd, OwnedFd) =
        pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut total = 0u64;
    loop {
        // Socket -> pipe. The pipe is always empty here, so EAGAIN means the socket has
        // no data yet: try_io clears the readiness and we wait again.
        let n = loop {
            src.readable().await?;
            match src.try_io(Interest::READABLE, || {
                splice(src.as_fd(), None, pipe_w.as_fd(), None, CHUNK, flags)
                    .map_err(io::Error::from)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            // EOF from src: pass the half-close on; ENOTCONN means dst is already gone.
            match shutdown(dst_fd(dst), Shutdown::Write) {
                Ok(()) | Err(nix::errno::Errno::ENOTCONN) => return Ok(total),
                Err(e) => return Err(e.into()),
            }
        }
        // Pipe -> socket, until the pipe is empty again.
        let mut pending = n;
        while pending > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || {
                splice(pipe_r.as_fd(), None, dst.as_fd(), None, pending, flags)
                    .map_err(io::Error::from)
            }) {
                Ok(m) => pending -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        total += n as u64;
    }
}

fn dst_fd(s: &TcpStream) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    s.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };

    /// A connected pair on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
        (c.expect("connect"), s.expect("accept").0)
    }

    #[tokio::test]
    async fn moves_bytes_both_ways_and_propagates_half_close() {
        // client <-> (a, b relay) <-> server
        let (mut client, a) = pair().await;
        let (b, mut server) = pair().await;
        let relay = tokio::spawn(async move { splice_bidirectional(&a, &b).await });

        let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let expect = payload.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&payload).await.expect("write");
            client.shutdown().await.expect("half-close");
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.expect("read back");
            back
        });
        let mut got = Vec::new();
        server
            .read_to_end(&mut got)
            .await
            .expect("server reads to EOF");
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "payload corrupted");
        server.write_all(b"after half-close").await.expect("reply");
        server.shutdown().await.expect("server close");
        assert_eq!(writer.await.expect("writer"), b"after half-close");
        let (up, down) = relay.await.expect("relay task").expect("relay");
        assert_eq!((up, down), (3_000_000, 16));
    }

    #[tokio::test]
    async fn a_reset_side_ends_the_relay_with_an_error() {
        let (client, a) = pair().await;
        let (b, _server) = pair().await;
        let relay = tokio::spawn(async move { splice_bidirectional(&a, &b).await });
        // RST instead of FIN.
        socket2::SockRef::from(&client)
            .set_linger(Some(std::time::Duration::ZERO))
            .expect("linger");
        drop(client);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), relay)
            .await
            .expect("the relay must not hang")
            .expect("task");
        assert!(r.is_err(), "expected the reset to surface: {r:?}");
    }
}
