//! One way by `splice(2)` through a pipe: the kernel moves the source socket's
//! received pages into the pipe and from the pipe into the destination's send
//! queue, so the bytes never cross user space; the relay only says when. The kernel
//! splice's stand-in where the datapath offers none (no programs on the node, or the
//! stream verdict refused), and where it is chosen (`--relay-splice pipe`).
//!
//! A way holds a pipe only while bytes are in it: an idle connection holds none, so
//! descriptors and pipe pages follow the bytes in flight, not the connections open.
//! Empty pipes go back to a pool shared by every connection.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::{io::Interest, net::TcpStream};

use super::{Ends, Fault, Way, tcp};

/// Bytes asked of one `splice(2)` into the pipe: more than a pipe holds, so each
/// call takes what the pipe has room for.
const CHUNK: usize = 1 << 20;
/// Empty pipes the pool keeps for the next bursts; more are closed. Few: each
/// counts its [`PIPE_BYTES`] against its user's pipe pages
/// (`fs.pipe-user-pages-soft`, 64 MiB by default, shared by every process of the
/// agent's uid on the node), past which new pipes get two pages; 16 keep a quarter.
const POOL_KEEPS: usize = 16;
/// Bytes a new pipe is asked to hold (`F_SETPIPE_SZ`; the kernel's default
/// `fs.pipe-max-size`): a pipe holds 16 pages by default (64 KiB of full pages,
/// less where the received pages are partly filled), so a transfer cost two
/// splices and a wakeup per 64 KiB at best; 1 MiB takes 256.
const PIPE_BYTES: nix::libc::c_int = 1 << 20;
/// Enlarged pipes alive at once (in use or pooled); past it new pipes keep the
/// default size. The pages count against the agent's uid, 0, node-wide
/// (`fs.pipe-user-pages-soft`, 64 MiB by default), which every root container shares:
/// without a cap, about 48 slow readers held it all and left every root process on
/// the node with two-page pipes. 16 take a quarter.
pub(crate) const MAX_ENLARGED: usize = 16;

/// A pipe's two ends, and its place among the enlarged ones if it has one.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    _enlarged: Option<Enlarged>,
}

/// One of the [`MAX_ENLARGED`] places, given back when its pipe closes.
struct Enlarged(Arc<AtomicUsize>);

impl Drop for Enlarged {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Empty pipes, shared by every relayed connection.
#[derive(Default)]
pub struct PipePool {
    kept: Mutex<Vec<Pipe>>,
    enlarged: Arc<AtomicUsize>,
}

impl std::fmt::Debug for PipePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipePool")
            .field("kept", &self.kept())
            .field("enlarged", &self.enlarged())
            .finish()
    }
}

impl PipePool {
    fn take(&self) -> io::Result<Pipe> {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some(p) = kept {
            return Ok(p);
        }
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)?;
        let place = self
            .enlarged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_ENLARGED).then_some(n + 1)
            })
            .is_ok()
            .then(|| Enlarged(self.enlarged.clone()));
        let enlarged = match place {
            // Refused past the user's pipe pages (`fs.pipe-user-pages-soft`,
            // without CAP_SYS_RESOURCE) or above `fs.pipe-max-size`: the pipe
            // keeps its default size, and the splice works as before.
            Some(place) => {
                match nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES)) {
                    Ok(_) => Some(place),
                    Err(e) => {
                        tracing::debug!(error = %e, "a relay pipe keeps its default size");
                        None
                    }
                }
            }
            None => None,
        };
        Ok(Pipe {
            read,
            write,
            _enlarged: enlarged,
        })
    }

    fn give_back(&self, p: Pipe) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < POOL_KEEPS {
            kept.push(p);
        }
    }

    /// Empty pipes kept now.
    pub(crate) fn kept(&self) -> usize {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Enlarged pipes alive now (in use or kept).
    pub(crate) fn enlarged(&self) -> usize {
        self.enlarged.load(Ordering::Acquire)
    }
}

/// What a splice through the pipe came to.
pub(super) enum Spliced {
    /// The source ended; the destination was shut for writing. Bytes carried.
    Ended(u64),
    /// No pipe could be had (descriptor limits) and nothing is held: the way goes
    /// on as a copy. Bytes carried.
    NoPipe(u64),
}

/// Splices `way` from `src` to `dst` until the source ends.
pub(super) async fn splice(
    src: &TcpStream,
    dst: &TcpStream,
    way: Way,
    pool: &PipePool,
    ends: &Ends,
) -> Result<Spliced, Fault> {
    let mut carried = 0u64;
    loop {
        src.readable().await.map_err(|e| way.at_src(e))?;
        let pipe = match pool.take() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "no pipe for a splice: the way goes on as a copy");
                return Ok(Spliced::NoPipe(carried));
            }
        };
        let filled = src.try_io(Interest::READABLE, || {
            tcp::splice(src.as_fd(), pipe.write.as_fd(), CHUNK)
        });
        let n = match filled {
            Ok(0) => {
                pool.give_back(pipe);
                ends.end(dst).map_err(|e| way.at_dst(e))?;
                return Ok(Spliced::Ended(carried));
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pool.give_back(pipe);
                continue;
            }
            // The pipe may hold nothing of it: it is dropped, not pooled.
            Err(e) => return Err(way.at_src(e)),
        };
        drain(&pipe, dst, n).await.map_err(|e| way.at_dst(e))?;
        pool.give_back(pipe);
        carried += n as u64;
    }
}

/// Moves the `held` bytes in `pipe` to `dst`, waiting for room.
async fn drain(pipe: &Pipe, dst: &TcpStream, mut held: usize) -> io::Result<()> {
    while held > 0 {
        dst.ready(Interest::WRITABLE).await?;
        match dst.try_io(Interest::WRITABLE, || {
            tcp::splice(pipe.read.as_fd(), dst.as_fd(), held)
        }) {
            Ok(n) => held -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pipes past [`MAX_ENLARGED`] keep the kernel's default size, so the relay
    /// never holds more than 16 MiB of uid 0's node-wide pipe pages; a place comes
    /// back when its pipe closes.
    #[test]
    fn at_most_max_enlarged_pipes_are_enlarged_at_once() {
        let pool = PipePool::default();
        let size = |p: &Pipe| {
            nix::fcntl::fcntl(&p.write, nix::fcntl::FcntlArg::F_GETPIPE_SZ).expect("size")
        };
        let held: Vec<Pipe> = (0..MAX_ENLARGED + 24)
            .map(|_| pool.take().expect("pipe"))
            .collect();
        let big = held.iter().filter(|p| size(p) >= PIPE_BYTES).count();
        assert_eq!(big, MAX_ENLARGED, "pipes enlarged at once");
        assert_eq!(pool.enlarged(), MAX_ENLARGED);
        drop(held);
        assert_eq!(pool.enlarged(), 0, "places come back with their pipes");
        let again = pool.take().expect("pipe");
        assert!(size(&again) >= PIPE_BYTES);
    }
}
