//! The socket facts and calls the splice needs beyond tokio's: what a socket has
//! taken from its writers (the bytes its peer acknowledged plus those still queued),
//! whether it has closed, shutting one way, the socket cookie, and `splice(2)`.

use std::{
    io,
    mem::{MaybeUninit, size_of},
    os::fd::{AsFd, AsRawFd, BorrowedFd},
};

use tokio::net::TcpStream;

/// `TCP_CLOSE` in `tcp_info.tcpi_state`.
const TCP_CLOSE: u8 = 7;

/// What a socket has taken from whoever writes to it, in bytes since it connected:
/// acknowledged by its peer (`tcpi_bytes_acked`) plus still queued (`SIOCOUTQ`),
/// less `syn` (1 on a socket that connected, whose SYN the kernel counts as
/// acknowledged; 0 on an accepted one). Read in that order, so that an
/// acknowledgement landing between the two calls makes it smaller, never larger:
/// a caller waiting for it to reach a count waits a little longer, never too little.
/// Err when the socket has closed (its peer reset it, or keepalive gave up).
pub(super) fn taken(s: &TcpStream, syn: u64) -> io::Result<u64> {
    let info = tcp_info(s.as_fd())?;
    if info.tcpi_state == TCP_CLOSE {
        return Err(socket_error(s.as_fd())
            .unwrap_or_else(|| io::Error::from(io::ErrorKind::ConnectionReset)));
    }
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int to the pointer, which is valid.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((info.tcpi_bytes_acked + u64::try_from(queued).unwrap_or(0)).saturating_sub(syn))
}

fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<libc::tcp_info> {
    let mut info = MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes of tcp_info to a buffer of that
    // size, zeroed first, so fields an older kernel does not fill read 0.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised, then (partly) filled by the kernel: every bit
    // pattern is a valid tcp_info.
    Ok(unsafe { info.assume_init() })
}

/// The socket's pending error (`SO_ERROR`), if any.
pub(super) fn socket_error(fd: BorrowedFd<'_>) -> Option<io::Error> {
    socket2::SockRef::from(&fd).take_error().ok().flatten()
}

/// Shuts `s` for writing: its peer reads end-of-stream once what is queued has gone.
pub(super) fn shutdown_write(s: &TcpStream) -> io::Result<()> {
    socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write)
}

/// `splice(2)` of up to `len` bytes from `from` to `to`, one of them a pipe,
/// without blocking.
pub(super) fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the call; null offsets (streams).
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}
