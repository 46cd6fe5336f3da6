//! How a relayed connection's bytes move once the header is out: both ways at
//! once, each on its own, with half-close (a way ends when its source does, and
//! shuts its destination for writing; the other way carries on).
//!
//! Each way starts as a copy through the relay's buffer. Once it has carried
//! [`SpliceConfig::after`] bytes it is spliced, so that the rest of its bytes never
//! cross user space: by the kernel ([`kernel`]: the datapath's stream verdict sends
//! what one socket receives out of the other) where the datapath offers it and the
//! kernel's budget has room, else by `splice(2)` through a pipe ([`pipe`]), as
//! [`SpliceMode`] allows. Short exchanges (a request and its answer) stay copies:
//! joining the kernel costs more syscalls than they do (docs/architecture.md).
//!
//! The first error on either way ends both; it names the socket it came from
//! ([`Side`]), and the caller resets the client.

mod copy;
pub(crate) mod kernel;
pub(crate) mod pipe;
mod tcp;

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::net::TcpStream;

pub(crate) use copy::try_read_buf;
pub use kernel::KernelSplice;
pub(crate) use kernel::{Counts, Grant, Joined, Pair, SpliceError};
pub(crate) use pipe::PipePool;

use crate::status::metrics::Direction;

/// `--relay-splice`: how a relayed way's bytes may move once it is spliced.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SpliceMode {
    /// The kernel's splice where the datapath offers it, else `splice(2)`.
    Auto,
    /// The kernel's splice only (ways it cannot take stay copies).
    Kernel,
    /// `splice(2)` through a pipe.
    Pipe,
    /// Never: every byte is copied through the relay.
    Off,
}

impl SpliceMode {
    /// The `--relay-splice` value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SpliceMode::Auto => "auto",
            SpliceMode::Kernel => "kernel",
            SpliceMode::Pipe => "pipe",
            SpliceMode::Off => "off",
        }
    }
}

/// What splices a way, resolved once at startup from [`SpliceMode`] and what the
/// datapath offers.
#[derive(Clone)]
pub enum Splicer {
    /// The datapath's kernel splice, with `splice(2)` for the ways it cannot take
    /// (`None`: those stay copies).
    Kernel(Arc<dyn KernelSplice>, Option<Arc<PipePool>>),
    /// `splice(2)` through pipes.
    Pipe(Arc<PipePool>),
    /// None: ways stay copies.
    Copy,
}

impl std::fmt::Debug for Splicer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Splicer::Kernel(..) => "kernel",
            Splicer::Pipe(_) => "pipe",
            Splicer::Copy => "copy",
        })
    }
}

/// The relay's splice settings.
#[derive(Clone, Debug)]
pub struct SpliceConfig {
    /// What splices.
    pub splicer: Splicer,
    /// Bytes a way carries as a copy before it is spliced (0: spliced from the
    /// first byte after the header).
    pub after: u64,
    /// The most the kernel holds for one way (see `hairpin_ebpf::splice`).
    pub window: u64,
    /// The most the kernel holds for every way together: a way joins only while its
    /// window fits, else it is spliced through a pipe (or stays a copy).
    pub budget: Arc<Budget>,
}

impl SpliceConfig {
    /// Ways that are never spliced.
    pub fn copy() -> SpliceConfig {
        SpliceConfig {
            splicer: Splicer::Copy,
            after: 0,
            window: DEFAULT_WINDOW,
            budget: Arc::new(Budget::new(DEFAULT_BUDGET)),
        }
    }
}

/// Default [`SpliceConfig::window`]: larger than any chunk the kernel hands the
/// verdict at once (a GRO packet of up to 64 KiB), so that a way's window always
/// admits one.
pub(crate) const DEFAULT_WINDOW: u64 = 8 << 20;
/// Default [`SpliceConfig::budget`] bytes.
pub(crate) const DEFAULT_BUDGET: u64 = 256 << 20;
/// Default [`SpliceConfig::after`]: a way that has carried this much is a transfer,
/// not an exchange.
pub(crate) const DEFAULT_AFTER: u64 = 64 * 1024;

/// Bytes of kernel window every joined way holds, against a cap.
#[derive(Debug)]
pub struct Budget {
    cap: u64,
    held: AtomicU64,
}

impl Budget {
    /// A budget of `cap` bytes, none held.
    pub(crate) fn new(cap: u64) -> Budget {
        Budget {
            cap,
            held: AtomicU64::new(0),
        }
    }

    /// Takes `n` bytes if they fit.
    fn take(&self, n: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h + n <= self.cap).then_some(h + n)
            })
            .is_ok()
    }

    fn give_back(&self, n: u64) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Which end of a relayed connection an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The accepted client.
    Client,
    /// The upstream socket to the LoadBalancer address.
    Upstream,
}

/// An error on a relayed connection and the socket it came from.
#[derive(Debug)]
pub(crate) struct Fault {
    /// Where.
    pub side: Side,
    /// What.
    pub error: io::Error,
}

/// One way of a connection: where its bytes come from and go.
#[derive(Clone, Copy, Debug)]
struct Way {
    from: Side,
    to: Side,
}

impl Way {
    const UP: Way = Way {
        from: Side::Client,
        to: Side::Upstream,
    };
    const DOWN: Way = Way {
        from: Side::Upstream,
        to: Side::Client,
    };

    fn at_src(self, error: io::Error) -> Fault {
        Fault {
            side: self.from,
            error,
        }
    }

    fn at_dst(self, error: io::Error) -> Fault {
        Fault {
            side: self.to,
            error,
        }
    }

    /// The datapath failed mid-way: the connection cannot go on (bytes may be in
    /// the kernel's hands); counted against the upstream path.
    fn internal(self, e: SpliceError) -> Fault {
        Fault {
            side: Side::Upstream,
            error: io::Error::other(e),
        }
    }

    fn direction(self) -> Direction {
        match self.from {
            Side::Client => Direction::Upstream,
            Side::Upstream => Direction::Downstream,
        }
    }
}

/// Bytes each way carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Carried {
    /// Client to upstream (after the header).
    pub up: u64,
    /// Upstream to client.
    pub down: u64,
    /// Ways the kernel spliced.
    pub kernel: u8,
    /// Ways spliced through a pipe.
    pub piped: u8,
    /// Bytes of kernel-spliced ways that the relay carried itself: those the
    /// kernel left with their source past its credit (a slow reader).
    pub left: u64,
    /// Times a kernel-spliced way paused for a slow reader.
    pub pauses: u64,
}

/// Carries `client` and `upstream` both ways until both have ended or one fails.
/// `written` bytes (the header, and the client's bytes the caller already sent
/// with it) are in the upstream's send queue already.
pub(crate) async fn carry(
    client: &TcpStream,
    upstream: &TcpStream,
    written: u64,
    cfg: &SpliceConfig,
    buffer: usize,
) -> Result<Carried, Fault> {
    let ctx = Ctx {
        client,
        upstream,
        cfg,
        buffer,
        paired: AtomicBool::new(false),
        pair: std::sync::OnceLock::new(),
        ends: Ends::default(),
    };
    let (up, down) = tokio::try_join!(ctx.way(Way::UP, written), ctx.way(Way::DOWN, 0))?;
    Ok(Carried {
        up: up.bytes,
        down: down.bytes,
        kernel: u8::from(up.how == How::Kernel) + u8::from(down.how == How::Kernel),
        piped: u8::from(up.how == How::Pipe) + u8::from(down.how == How::Pipe),
        left: up.left + down.left,
        pauses: up.pauses + down.pauses,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Copy,
    Pipe,
    Kernel,
}

struct Moved {
    bytes: u64,
    how: How,
    /// See [`Carried::left`].
    left: u64,
    /// See [`Carried::pauses`].
    pauses: u64,
}

impl Moved {
    fn by(how: How, bytes: u64) -> Moved {
        Moved {
            bytes,
            how,
            left: 0,
            pauses: 0,
        }
    }
}

/// One connection's ways and what they share.
struct Ctx<'a> {
    client: &'a TcpStream,
    upstream: &'a TcpStream,
    cfg: &'a SpliceConfig,
    buffer: usize,
    /// Whether a way tried to pair the sockets (the first to join does it).
    paired: AtomicBool,
    /// Their keys, once paired.
    pair: std::sync::OnceLock<Pair>,
    /// Whether a way has ended.
    ends: Ends,
}

/// Whether one of a connection's ways has ended: the half-close a way's end makes
/// is needed only while the other way goes on.
#[derive(Debug, Default)]
pub(super) struct Ends(AtomicBool);

impl Ends {
    /// A copied or piped way's source ended: shuts `dst` for writing (its peer
    /// reads end-of-stream once what is queued has gone), unless the other way has
    /// ended already. Then both have, [`carry`] returns, and its caller closes both
    /// sockets: the close sends the same FIN after what is queued (`dst`'s receive
    /// queue is empty, its own way read its end, so the close does not reset), one
    /// syscall fewer per connection. A kernel-spliced way shuts its destination
    /// itself and is not counted here, so a way after it still shuts its own.
    pub(super) fn end(&self, dst: &TcpStream) -> io::Result<()> {
        if self.0.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        tcp::shutdown_write(dst)
    }
}

impl Ctx<'_> {
    async fn way(&self, way: Way, written: u64) -> Result<Moved, Fault> {
        let (src, dst) = match way.from {
            Side::Client => (self.client, self.upstream),
            Side::Upstream => (self.upstream, self.client),
        };
        if way.to == Side::Upstream {
            self.nodelay_when_more(src, dst, way).await?;
        }
        let mut buf = Vec::with_capacity(self.buffer.max(1));
        let spliced = !matches!(self.cfg.splicer, Splicer::Copy);
        let mut carried = 0;
        if !spliced || self.cfg.after > 0 {
            let until = spliced.then_some(self.cfg.after);
            match copy::copy(src, dst, way, &mut buf, until, &self.ends).await? {
                copy::Copied::Ended(n) => return Ok(Moved::by(How::Copy, n)),
                copy::Copied::Reached(n) => carried = n,
            }
        }
        let pipes = match &self.cfg.splicer {
            Splicer::Kernel(kernel, pipes) => {
                if let Some((moved, left, pauses)) = self
                    .kernel(kernel.as_ref(), src, dst, way, written + carried, &mut buf)
                    .await?
                {
                    return Ok(Moved {
                        left,
                        pauses,
                        ..Moved::by(How::Kernel, carried + moved)
                    });
                }
                pipes.clone()
            }
            Splicer::Pipe(pipes) => Some(pipes.clone()),
            Splicer::Copy => None,
        };
        if let Some(pipes) = pipes {
            match pipe::splice(src, dst, way, &pipes, &self.ends).await? {
                pipe::Spliced::Ended(n) => return Ok(Moved::by(How::Pipe, carried + n)),
                pipe::Spliced::NoPipe(n) => carried += n,
            }
        }
        match copy::copy(src, dst, way, &mut buf, None, &self.ends).await? {
            copy::Copied::Ended(n) | copy::Copied::Reached(n) => {
                Ok(Moved::by(How::Copy, carried + n))
            }
        }
    }

    /// Sets `TCP_NODELAY` on the upstream (`dst`) once the client (`src`) has more
    /// to send than the first write took, before any of it is carried: without it,
    /// Nagle holds a small write behind the first one's delayed ACK. Most clients
    /// of a relayed exchange send nothing more but their end, which needs no
    /// NODELAY (the FIN pushes what is queued): then the setsockopt, one syscall a
    /// connection, is not made.
    async fn nodelay_when_more(
        &self,
        src: &TcpStream,
        dst: &TcpStream,
        way: Way,
    ) -> Result<(), Fault> {
        let ready = src
            .ready(tokio::io::Interest::READABLE)
            .await
            .map_err(|e| way.at_src(e))?;
        if !ready.is_read_closed() {
            let _ = dst.set_nodelay(true);
        }
        Ok(())
    }

    /// Joins `way` to the kernel and runs it to its end: the bytes it carried and,
    /// of those, the ones the relay carried itself ([`Carried::left`]). None
    /// (nothing joined, the way holds nothing) when the kernel cannot take it: the
    /// budget is spent, or the datapath refused (a socket no longer established:
    /// a sockmap takes only those).
    async fn kernel(
        &self,
        kernel: &dyn KernelSplice,
        src: &TcpStream,
        dst: &TcpStream,
        way: Way,
        written: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Option<(u64, u64, u64)>, Fault> {
        let window = self.cfg.window;
        if !self.cfg.budget.take(window) {
            return Ok(None);
        }
        let _held = Held(&self.cfg.budget, window);
        let Some(pair) = self.pair(kernel) else {
            return Ok(None);
        };
        let key = match way.from {
            Side::Client => pair.client,
            Side::Upstream => pair.upstream,
        };
        use std::os::fd::AsFd;
        let joined = match kernel.join(src.as_fd(), key, Grant::beyond(0, window, 0)) {
            Ok(j) => j,
            Err(e) => {
                tracing::debug!(error = %e, direction = ?way.direction(), "the kernel could not splice a way: it goes on without");
                return Ok(None);
            }
        };
        let kernel_way = kernel::KernelWay {
            kernel,
            joined,
            src,
            dst,
            way,
            written,
            // The upstream connected: its SYN counts as acknowledged (tcp::taken).
            syn: u64::from(way.to == Side::Upstream),
            window,
            consumed: 0,
            pauses: 0,
        };
        let left = Left(
            kernel,
            kernel_way.joined.key,
            kernel_way.joined.refill.clone(),
        );
        let moved = kernel_way.run(buf).await;
        drop(left);
        moved.map(Some)
    }

    /// The connection's pair of keys, made by the first way to ask.
    fn pair(&self, kernel: &dyn KernelSplice) -> Option<Pair> {
        if !self.paired.swap(true, Ordering::AcqRel) {
            use std::os::fd::AsFd;
            match kernel.pair(self.client.as_fd(), self.upstream.as_fd()) {
                Ok(p) => {
                    let _ = self.pair.set(p);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the kernel could not pair a connection's sockets: its ways go on without");
                }
            }
        }
        self.pair.get().copied()
    }
}

/// A way's window of the budget, given back when the way ends.
struct Held<'a>(&'a Budget, u64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.give_back(self.1);
    }
}

/// Forgets a joined way when it ends, however it ends.
struct Left<'a>(&'a dyn KernelSplice, u64, Arc<tokio::sync::Notify>);

impl Drop for Left<'_> {
    fn drop(&mut self) {
        self.0.leave(&Joined {
            key: self.1,
            refill: self.2.clone(),
        });
    }
}

/// Why the relay has no kernel splice to use.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NoKernelSplice {
    /// No eBPF datapath on this node.
    #[error("no eBPF datapath on this node")]
    NoDatapath,
    /// The datapath offers none, and why.
    #[error("{0}")]
    Unavailable(#[source] Arc<dyn std::error::Error + Send + Sync>),
}

/// The splice `mode` asks for, given what the datapath offers (`kernel`: its
/// splice, or why there is none), and what status says of it.
pub fn resolve(
    mode: SpliceMode,
    after: u64,
    kernel: Result<Arc<dyn KernelSplice>, NoKernelSplice>,
) -> (SpliceConfig, crate::status::RelaySpliceStatus) {
    let pipes = || Arc::new(PipePool::default());
    let (splicer, reason) = match (mode, kernel) {
        (SpliceMode::Off, _) => (Splicer::Copy, Some("--relay-splice off".to_string())),
        (SpliceMode::Pipe, _) => (Splicer::Pipe(pipes()), Some("--relay-splice pipe".into())),
        (SpliceMode::Auto, Ok(k)) => (Splicer::Kernel(k, Some(pipes())), None),
        (SpliceMode::Kernel, Ok(k)) => (Splicer::Kernel(k, None), None),
        (SpliceMode::Auto, Err(why)) => (Splicer::Pipe(pipes()), Some(why.to_string())),
        (SpliceMode::Kernel, Err(why)) => (Splicer::Copy, Some(why.to_string())),
    };
    let status = crate::status::RelaySpliceStatus {
        configured: mode.name().into(),
        splicer: format!("{splicer:?}"),
        reason,
        after_bytes: after,
    };
    let cfg = SpliceConfig {
        splicer,
        after,
        ..SpliceConfig::copy()
    };
    (cfg, status)
}
