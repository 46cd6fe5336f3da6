//! One way spliced by the kernel: the datapath's stream verdict sends what the
//! source receives out of the destination, within a credit the relay grants. The
//! relay is woken only when the credit runs low (a refill), when the verdict left
//! bytes with the source (past the credit, or the destination gone), and at the
//! source's end or error.
//!
//! Bytes are never reordered: the relay writes bytes left with the source only once
//! the destination has taken every byte the kernel sent on before them, and the
//! verdict sends on again only once the relay has read every byte it left behind
//! (`resume`). The end is propagated the same way: the destination is shut for
//! writing only once it has taken every byte the kernel sent on.

use std::{sync::Arc, time::Duration};

use tokio::{net::TcpStream, sync::Notify};

use super::{Fault, Way, copy, tcp};

/// The kernel's splice of relayed sockets, as the datapath provides it. The relay
/// names no BPF type: the datapath implements this over its maps.
pub trait KernelSplice: Send + Sync {
    /// Makes `client` and `upstream` each other's destination, once per connection
    /// and before either way joins. Returns their keys.
    fn pair(
        &self,
        client: std::os::fd::BorrowedFd<'_>,
        upstream: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Pair, SpliceError>;
    /// From now on, what `src` (keyed `key`) receives goes out of its pair's other
    /// socket within `grant`, bytes already queued included.
    fn join(
        &self,
        src: std::os::fd::BorrowedFd<'_>,
        key: u64,
        grant: Grant,
    ) -> Result<Joined, SpliceError>;
    /// Stops the kernel sending `joined`'s bytes on: what arrives is left with the
    /// socket, in order, for the relay to read (counted in its receive buffer, so
    /// TCP's own window stops the sender while the relay does not read).
    fn pause(&self, joined: &Joined) -> Result<(), SpliceError>;
    /// Has the kernel send `joined`'s bytes on again within `grant` (from the
    /// moment the relay has read every byte it left behind, `grant.resume`).
    fn resume(
        &self,
        src: std::os::fd::BorrowedFd<'_>,
        joined: &Joined,
        grant: Grant,
    ) -> Result<(), SpliceError>;
    /// What the kernel did with `joined`'s bytes so far.
    fn counts(&self, joined: &Joined) -> Result<Counts, SpliceError>;
    /// Grants `joined` a new credit.
    fn grant(&self, joined: &Joined, grant: Grant) -> Result<(), SpliceError>;
    /// Forgets `joined` (its socket closes next: the kernel takes it out of the
    /// socket maps then).
    fn leave(&self, joined: &Joined);
}

/// Why the datapath could not splice: its owner's own error, boxed so that the
/// relay names no BPF type.
pub(crate) type SpliceError = Box<dyn std::error::Error + Send + Sync>;

/// The keys of a paired client and upstream.
#[derive(Clone, Copy, Debug)]
pub struct Pair {
    /// The client's.
    pub client: u64,
    /// The upstream's.
    pub upstream: u64,
}

/// One joined way: its source's key and the wake-up for its refills.
#[derive(Debug)]
pub struct Joined {
    /// The source socket's key.
    pub key: u64,
    /// Notified when the kernel asks for a refill.
    pub refill: Arc<Notify>,
}

/// A credit: the kernel sends on while its count of bytes sent on stays within
/// `limit`, asks for a refill once it reaches `low`, and sends on only while the
/// bytes it left with the source number `resume` (all read by the relay).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// See the type.
    pub limit: u64,
    /// See the type.
    pub low: u64,
    /// See the type.
    pub resume: u64,
}

impl Grant {
    /// Up to `window` bytes beyond `sent` (what the destination has taken of the
    /// kernel's), asking for more halfway.
    pub(super) fn beyond(sent: u64, window: u64, resume: u64) -> Grant {
        let limit = sent + window;
        Grant {
            limit,
            low: limit - window / 2,
            resume,
        }
    }
}

/// What the kernel did with a way's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Sent on to the destination.
    pub redirected: u64,
    /// Left with the source.
    pub passed: u64,
}

/// How often a way waiting for its destination to take the kernel's bytes looks
/// again: first at once, then doubling up to the last.
const BACKOFF: [Duration; 7] = [
    Duration::ZERO,
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(8),
    Duration::from_millis(32),
    Duration::from_millis(100),
];

/// Steps of [`BACKOFF`] a way waits for late bytes at its source's end (about 1 s).
const LATE_STEPS: usize = 16;

/// A way joined to the kernel, and what the relay knows of it.
pub(super) struct KernelWay<'a> {
    pub kernel: &'a dyn KernelSplice,
    pub joined: Joined,
    pub src: &'a TcpStream,
    pub dst: &'a TcpStream,
    pub way: Way,
    /// Bytes the relay itself wrote to `dst` (header, copied and left bytes).
    pub written: u64,
    /// The destination's SYN in its acknowledged count (see [`tcp::taken`]).
    pub syn: u64,
    /// The most the kernel holds for this way at once (see `hairpin_ebpf::splice`).
    pub window: u64,
    /// Bytes the kernel left with the source that the relay read and wrote.
    pub consumed: u64,
    /// Times the kernel stopped taking the source's bytes for a slow destination.
    pub pauses: u64,
}

/// What a way of the kernel's does next.
enum Next {
    /// Carry on spliced.
    Spliced,
    /// The kernel does not take the source's bytes until the destination has
    /// taken most of what it holds.
    Paused,
    /// The source ended: the destination was shut for writing.
    Ended,
    /// The kernel could not be told to send on again (its credit could not be
    /// written): the rest is copied (the verdict, paused, leaves it all behind).
    Copy,
}

impl KernelWay<'_> {
    /// Runs the way until the source ends (the destination shut for writing) or
    /// fails. Returns the bytes it carried (the kernel's and the relay's), those
    /// the relay carried, and how often it paused.
    pub(super) async fn run(mut self, buf: &mut Vec<u8>) -> Result<(u64, u64, u64), Fault> {
        let mut low = false;
        let mut wait = 0usize;
        let mut next = Next::Spliced;
        loop {
            next = match next {
                Next::Spliced => {
                    tokio::select! {
                        r = self.src.readable() => {
                            r.map_err(|e| self.way.at_src(e))?;
                            self.left_behind(buf).await?
                        }
                        () = self.joined.refill.notified(), if !low => {
                            low = true;
                            Next::Spliced
                        }
                    }
                }
                Next::Paused => {
                    tokio::time::sleep(BACKOFF[wait]).await;
                    wait = (wait + 1).min(BACKOFF.len() - 1);
                    self.resume(buf).await?
                }
                Next::Ended => {
                    let seen = self.counts()?;
                    return Ok((seen.redirected + self.consumed, self.consumed, self.pauses));
                }
                Next::Copy => {
                    self.drained().await?;
                    // Its own ends: a kernel-spliced way always shuts its destination
                    // (see `Ends`).
                    let ends = super::Ends::default();
                    let rest =
                        match super::copy::copy(self.src, self.dst, self.way, buf, None, &ends)
                            .await?
                        {
                            super::copy::Copied::Ended(n) | super::copy::Copied::Reached(n) => n,
                        };
                    let seen = self.counts()?;
                    return Ok((
                        seen.redirected + self.consumed + rest,
                        self.consumed + rest,
                        self.pauses,
                    ));
                }
            };
            if low && matches!(next, Next::Spliced) {
                low = false;
                next = self.refill()?;
                wait = 0;
            }
        }
    }

    /// Bytes of the kernel's that `dst` has taken.
    fn sent(&self) -> Result<u64, Fault> {
        let taken = tcp::taken(self.dst, self.syn).map_err(|e| self.way.at_dst(e))?;
        Ok(taken.saturating_sub(self.written))
    }

    fn counts(&self) -> Result<Counts, Fault> {
        self.kernel
            .counts(&self.joined)
            .map_err(|e| self.way.internal(e))
    }

    /// The kernel's credit runs low: a new window while the destination keeps up
    /// (it has taken at least half of what the kernel holds), else a pause, so that
    /// the source's own receive window, not the kernel, holds the sender back.
    fn refill(&mut self) -> Result<Next, Fault> {
        let seen = self.counts()?;
        let sent = self.sent()?;
        if seen.redirected.saturating_sub(sent) <= self.window / 2 {
            let grant = Grant::beyond(sent, self.window, self.consumed);
            self.kernel
                .grant(&self.joined, grant)
                .map_err(|e| self.way.internal(e))?;
            return Ok(Next::Spliced);
        }
        self.kernel
            .pause(&self.joined)
            .map_err(|e| self.way.internal(e))?;
        self.pauses += 1;
        Ok(Next::Paused)
    }

    /// Paused: once the destination has taken all but a quarter of what the kernel
    /// holds, the bytes the kernel left behind (if any) are carried and the kernel
    /// takes the source's bytes again, those that waited first.
    async fn resume(&mut self, buf: &mut Vec<u8>) -> Result<Next, Fault> {
        let seen = self.counts()?;
        if seen.redirected.saturating_sub(self.sent()?) > self.window / 4 {
            return Ok(Next::Paused);
        }
        if seen.passed > self.consumed {
            self.drained().await?;
            self.carry_left(buf, seen.passed - self.consumed).await?;
        }
        let grant = Grant::beyond(self.sent()?, self.window, self.consumed);
        use std::os::fd::AsFd;
        match self.kernel.resume(self.src.as_fd(), &self.joined, grant) {
            Ok(()) => Ok(Next::Spliced),
            Err(e) => {
                tracing::debug!(error = %e, "a paused way cannot be resumed: the rest is copied");
                Ok(Next::Copy)
            }
        }
    }

    /// Carries exactly `n` bytes the kernel left with the source (they wait ahead
    /// of anything in its receive queue, which is not read here).
    async fn carry_left(&mut self, buf: &mut Vec<u8>, mut n: u64) -> Result<(), Fault> {
        if buf.is_empty() {
            buf.resize(64 * 1024, 0);
        }
        let mut wait = 0;
        while n > 0 {
            let want = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            let got = super::copy::read(self.src, &mut buf[..want])
                .await
                .map_err(|e| self.way.at_src(e))?;
            if got == 0 {
                // The source's end came first: the verdict counted these bytes, but
                // one it could not queue at once (a full receive buffer) waits in
                // the socket's backlog and reaches the queue a moment later.
                wait = self.late_bytes(wait).await?;
                continue;
            }
            copy::write_all(self.dst, &buf[..got])
                .await
                .map_err(|e| self.way.at_dst(e))?;
            self.written += got as u64;
            self.consumed += got as u64;
            n -= got as u64;
        }
        Ok(())
    }

    /// Waits a step (by `wait`, the step reached) for bytes the verdict left behind
    /// that have not reached the source's receive queue yet; fails after about a
    /// second, when they never will (the socket was torn down under the relay).
    async fn late_bytes(&self, wait: usize) -> Result<usize, Fault> {
        if wait >= LATE_STEPS {
            return Err(self.way.at_src(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the source ended before the bytes the kernel left with it arrived",
            )));
        }
        tokio::time::sleep(BACKOFF[wait.min(BACKOFF.len() - 1)]).await;
        Ok(wait + 1)
    }

    /// Waits until `dst` has taken every byte the kernel sent on.
    async fn drained(&self) -> Result<Counts, Fault> {
        let mut wait = 0;
        loop {
            let seen = self.counts()?;
            if self.sent()? >= seen.redirected {
                return Ok(seen);
            }
            tokio::time::sleep(BACKOFF[wait]).await;
            wait = (wait + 1).min(BACKOFF.len() - 1);
        }
    }

    /// The source is readable while spliced: bytes the kernel left with it (its
    /// credit ran out before the relay paused it, or the destination is gone), its
    /// end, or an error. Left bytes pause the way (nothing more is left behind while
    /// the relay catches up): once the kernel's bytes are out, the relay writes
    /// them, and the way resumes as paused ways do. At the end, once the kernel's
    /// bytes are out, `dst` is shut for writing.
    async fn left_behind(&mut self, buf: &mut Vec<u8>) -> Result<Next, Fault> {
        if buf.is_empty() {
            buf.resize(64 * 1024, 0);
        }
        let n = match self.src.try_read(buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Next::Spliced),
            Err(e) => return Err(self.way.at_src(e)),
        };
        if n > 0 {
            self.kernel
                .pause(&self.joined)
                .map_err(|e| self.way.internal(e))?;
            self.pauses += 1;
        }
        if n == 0 && self.counts()?.passed > self.consumed {
            // Not the end yet: bytes the verdict left behind are still on their way
            // to the receive queue (see `carry_left`); `resume` carries them.
            return Ok(Next::Paused);
        }
        // Nothing of the relay's may overtake the kernel's bytes.
        self.drained().await?;
        if n == 0 {
            tcp::shutdown_write(self.dst).map_err(|e| self.way.at_dst(e))?;
            return Ok(Next::Ended);
        }
        copy::write_all(self.dst, &buf[..n])
            .await
            .map_err(|e| self.way.at_dst(e))?;
        self.written += n as u64;
        self.consumed += n as u64;
        Ok(Next::Paused)
    }
}
