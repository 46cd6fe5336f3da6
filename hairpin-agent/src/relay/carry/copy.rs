//! One way copied through the relay's own buffer: read what the source has, write
//! all of it to the destination, and at the source's end-of-stream shut the
//! destination for writing (half-close). It can stop at a clean point, holding
//! nothing, once it has carried enough for the way to be spliced.

use tokio::{io::Interest, net::TcpStream};

use super::{Ends, Fault, Way};

/// How a copy ended.
pub(super) enum Copied {
    /// The source ended; the destination was shut for writing. Bytes carried.
    Ended(u64),
    /// At least the asked-for bytes were carried and none is held: the way can go
    /// on another way from here. Bytes carried.
    Reached(u64),
}

/// Copies `way` from `src` to `dst` through `buf`'s capacity until the source
/// ends, or, with `until`, until that many bytes have gone.
pub(super) async fn copy(
    src: &TcpStream,
    dst: &TcpStream,
    way: Way,
    buf: &mut Vec<u8>,
    until: Option<u64>,
    ends: &Ends,
) -> Result<Copied, Fault> {
    let mut carried = 0u64;
    loop {
        if until.is_some_and(|n| carried >= n) {
            return Ok(Copied::Reached(carried));
        }
        let n = read_into(src, buf).await.map_err(|e| way.at_src(e))?;
        if n == 0 {
            ends.end(dst).map_err(|e| way.at_dst(e))?;
            return Ok(Copied::Ended(carried));
        }
        write_all(dst, &buf[..n]).await.map_err(|e| way.at_dst(e))?;
        carried += n as u64;
    }
}

/// Reads what `src` has (0: its end) into `buf`'s capacity, replacing what `buf`
/// held, waiting for it. The capacity is never zeroed first: a connection's buffers
/// cost an allocation, not a 64 KiB memset each.
async fn read_into(src: &TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.clear();
    loop {
        src.readable().await?;
        match try_read_buf(src, buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// As [`TcpStream::try_read_buf`], and a read that comes back short (0 < n < the
/// room `buf` had) took all `src` had: its readiness is cleared, so the next read
/// waits for the poller instead of first costing a read that fails with EAGAIN (a
/// request or an answer is one short read: that was a syscall in every way of
/// every exchange). As tokio's own `AsyncRead` does: the clear is tied to the
/// readiness seen before the read, so one the poller reports meanwhile (from
/// another worker) is kept, and so is an end-of-stream already seen.
pub(crate) fn try_read_buf(src: &TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut short = None;
    let read = src.try_io(Interest::READABLE, || {
        let n = src.try_read_buf(buf)?;
        if 0 < n && n < room {
            short = Some(n);
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (read, short) {
        (_, Some(n)) => Ok(n),
        (r, None) => r,
    }
}

/// Reads what `src` has (0: its end), waiting for it.
pub(super) async fn read(src: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        src.readable().await?;
        match src.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Writes all of `bytes` to `dst`, waiting for room.
pub(super) async fn write_all(dst: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        dst.ready(Interest::WRITABLE).await?;
        match dst.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
