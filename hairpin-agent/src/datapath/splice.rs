//! The relay's splice: the stream-verdict program (`hairpin_splice`) attached to
//! the splice map, the maps it reads and writes, the reader of its refill requests,
//! and [`Splice`], through which the relay joins the ways of a relayed connection
//! so that the kernel carries their bytes (`relay::carry` decides when).
//!
//! Owns the splice maps' entries and the refill ring. Never touches a link, a pin,
//! or another room's map. Nothing here is pinned: the relay's sockets die with the
//! agent, and so do these maps.

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsRawFd, BorrowedFd},
    sync::{Arc, Mutex, PoisonError},
};

use aya::{
    Ebpf,
    maps::{HashMap, MapData, RingBuf, SockHash},
    programs::SkSkb,
};
use hairpin_ebpf::{
    MAP_SPLICE, MAP_SPLICE_CREDIT, MAP_SPLICE_PEERS, MAP_SPLICE_REFILL, MAP_SPLICE_SEEN,
    PROG_SPLICE, SpliceCredit, SpliceSeen,
};
use tokio::sync::Notify;

use crate::relay::carry::{Counts, Grant, Joined, KernelSplice, Pair, SpliceError as RelayError};

/// Why the kernel splice is not offered, or failed for one connection.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    /// The object lacks a program or map of the splice.
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        /// `program` or `map`.
        kind: &'static str,
        /// Its name.
        name: &'static str,
    },
    /// The stream verdict did not load or attach.
    #[error("failed to {op} {PROG_SPLICE} on {MAP_SPLICE}: {source}")]
    Program {
        /// `load` or `attach`.
        op: &'static str,
        /// aya's error (boxed: it carries the verifier log).
        source: Box<aya::programs::ProgramError>,
    },
    /// A splice map could not be opened, read or written.
    #[error("failed to {op} {map} for socket {key:#x}: {source}")]
    Map {
        /// What was done.
        op: &'static str,
        /// The map.
        map: &'static str,
        /// The socket's cookie (0: the map itself).
        key: u64,
        /// aya's error (boxed: aya's map errors are large).
        source: Box<aya::maps::MapError>,
    },
    /// A relayed socket's cookie (SO_COOKIE) could not be read.
    #[error("failed to read the cookie of relayed socket {fd}: {source}")]
    Cookie {
        /// The descriptor.
        fd: i32,
        /// The error.
        source: std::io::Error,
    },
    /// The refill ring could not be watched (no tokio runtime, or epoll refused it).
    #[error("failed to watch {MAP_SPLICE_REFILL}: {0}")]
    Refill(std::io::Error),
}

fn map_error(
    op: &'static str,
    map: &'static str,
    key: u64,
) -> impl FnOnce(aya::maps::MapError) -> SpliceError {
    move |source| SpliceError::Map {
        op,
        map,
        key,
        source: Box::new(source),
    }
}

/// See [`Splice::held`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpliceHeld {
    /// Sockets whose received bytes run the verdict.
    pub spliced: usize,
    /// Sockets named as a peer.
    pub paired: usize,
    /// Credit and count records.
    pub records: usize,
}

/// The kernel splice, shared by every relayed connection (cheap to clone).
#[derive(Clone)]
pub struct Splice(Arc<Inner>);

struct Inner {
    maps: Mutex<Maps>,
    /// Each joined way's wake-up, by its source's cookie.
    waiting: Arc<Mutex<StdHashMap<u64, Arc<Notify>>>>,
    /// Reads the refill ring while the splice lives.
    reader: tokio::task::AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

struct Maps {
    splice: SockHash<MapData, u64>,
    peers: SockHash<MapData, u64>,
    credit: HashMap<MapData, u64, SpliceCredit>,
    seen: HashMap<MapData, u64, SpliceSeen>,
}

impl Splice {
    /// Loads the stream verdict of `ebpf`, attaches it to the splice map and starts
    /// reading refill requests on the current tokio runtime.
    pub(super) fn load(ebpf: &mut Ebpf) -> Result<Splice, SpliceError> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|e| SpliceError::Refill(std::io::Error::other(e)))?;
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name)
                .ok_or(SpliceError::Missing { kind: "map", name })
        };
        let splice = SockHash::<_, u64>::try_from(take(ebpf, MAP_SPLICE)?)
            .map_err(map_error("open", MAP_SPLICE, 0))?;
        let peers = SockHash::<_, u64>::try_from(take(ebpf, MAP_SPLICE_PEERS)?)
            .map_err(map_error("open", MAP_SPLICE_PEERS, 0))?;
        let credit = HashMap::try_from(take(ebpf, MAP_SPLICE_CREDIT)?).map_err(map_error(
            "open",
            MAP_SPLICE_CREDIT,
            0,
        ))?;
        let seen = HashMap::try_from(take(ebpf, MAP_SPLICE_SEEN)?).map_err(map_error(
            "open",
            MAP_SPLICE_SEEN,
            0,
        ))?;
        let ring = RingBuf::try_from(take(ebpf, MAP_SPLICE_REFILL)?).map_err(map_error(
            "open",
            MAP_SPLICE_REFILL,
            0,
        ))?;
        let program: &mut SkSkb = ebpf
            .program_mut(PROG_SPLICE)
            .ok_or(SpliceError::Missing {
                kind: "program",
                name: PROG_SPLICE,
            })?
            .try_into()
            .map_err(|e| SpliceError::Program {
                op: "load",
                source: Box::new(e),
            })?;
        let program_error = |op| {
            move |e| SpliceError::Program {
                op,
                source: Box::new(e),
            }
        };
        program.load().map_err(program_error("load"))?;
        program
            .attach(splice.fd())
            .map_err(program_error("attach"))?;
        let waiting = Arc::new(Mutex::new(StdHashMap::new()));
        let reader = read_refills(ring, waiting.clone(), &rt)?;
        Ok(Splice(Arc::new(Inner {
            maps: Mutex::new(Maps {
                splice,
                peers,
                credit,
                seen,
            }),
            waiting,
            reader,
        })))
    }

    /// What the splice holds now: sockets in the verdict's map, sockets in the
    /// peers map, and ways' records (credit, counts). All go to 0 as connections end.
    pub fn held(&self) -> SpliceHeld {
        let maps = self.maps();
        SpliceHeld {
            spliced: maps.splice.keys().count(),
            paired: maps.peers.keys().count(),
            records: maps.credit.keys().count() + maps.seen.keys().count(),
        }
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        // The maps are kernel objects: a panicking holder left them usable.
        self.0.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, StdHashMap<u64, Arc<Notify>>> {
        self.0
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads refill requests (socket cookies) off `ring` and wakes each one's way.
fn read_refills(
    ring: RingBuf<MapData>,
    waiting: Arc<Mutex<StdHashMap<u64, Arc<Notify>>>>,
    rt: &tokio::runtime::Handle,
) -> Result<tokio::task::AbortHandle, SpliceError> {
    let _entered = rt.enter();
    // SAFETY: the ring buffer owns its descriptor and keeps it, open and the same,
    // for as long as it lives, which is as long as the AsyncFd.
    let mut fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
    }
    .map_err(|e| SpliceError::Refill(std::io::Error::other(e.to_string())))?;
    let task = rt.spawn(async move {
        loop {
            let Ok(mut ready) = fd.readable_mut().await else {
                return;
            };
            let ring = ready.get_inner_mut();
            while let Some(item) = ring.next() {
                let Ok(cookie) = <[u8; 8]>::try_from(&item[..]) else {
                    continue;
                };
                let cookie = u64::from_ne_bytes(cookie);
                let way = waiting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&cookie)
                    .cloned();
                if let Some(way) = way {
                    way.notify_one();
                }
            }
            ready.clear_ready();
        }
    });
    Ok(task.abort_handle())
}

/// `SO_COOKIE`: the kernel's own id of a socket, which the verdict reads off its
/// bytes (`bpf_get_socket_cookie`).
fn cookie(fd: BorrowedFd<'_>) -> Result<u64, SpliceError> {
    const SO_COOKIE: libc::c_int = 57;
    let mut cookie: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes to a u64 of that size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(SpliceError::Cookie {
            fd: fd.as_raw_fd(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(cookie)
}

/// Has the kernel run the verdict on bytes `fd` received before it joined: the
/// verdict runs as bytes arrive, and those were already queued. Setting
/// `SO_RCVLOWAT` (to 1, the default) does it: TCP checks there and then, under
/// the socket's lock, whether the socket has bytes to hand on.
fn kick(fd: BorrowedFd<'_>) {
    let one: libc::c_int = 1;
    // SAFETY: SO_RCVLOWAT reads one int from a valid pointer of that size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        // Bytes queued before the join then wait for the next to arrive.
        tracing::warn!(error = %std::io::Error::last_os_error(), "SO_RCVLOWAT refused on a spliced socket");
    }
}

impl Splice {
    /// Puts `src` under the verdict with `grant`: its credit first, then the splice
    /// map (from there the verdict runs on its bytes), then a kick for the bytes it
    /// received before.
    fn enter(&self, src: BorrowedFd<'_>, joined: &Joined, grant: Grant) -> Result<(), RelayError> {
        {
            let mut maps = self.maps();
            maps.credit
                .insert(joined.key, credit(grant), 0)
                .map_err(map_error("insert", MAP_SPLICE_CREDIT, joined.key))?;
            maps.splice
                .insert(joined.key, src.as_raw_fd(), 0)
                .map_err(map_error("insert", MAP_SPLICE, joined.key))?;
        }
        kick(src);
        Ok(())
    }
}

impl KernelSplice for Splice {
    fn pair(&self, client: BorrowedFd<'_>, upstream: BorrowedFd<'_>) -> Result<Pair, RelayError> {
        let pair = Pair {
            client: cookie(client)?,
            upstream: cookie(upstream)?,
        };
        let mut maps = self.maps();
        // Each socket's cookie names the other: where the verdict sends its bytes.
        maps.peers
            .insert(pair.client, upstream.as_raw_fd(), 0)
            .map_err(map_error("insert", MAP_SPLICE_PEERS, pair.client))?;
        if let Err(e) = maps.peers.insert(pair.upstream, client.as_raw_fd(), 0) {
            let _ = maps.peers.remove(&pair.client);
            return Err(map_error("insert", MAP_SPLICE_PEERS, pair.upstream)(e).into());
        }
        Ok(pair)
    }

    fn join(&self, src: BorrowedFd<'_>, key: u64, grant: Grant) -> Result<Joined, RelayError> {
        let refill = Arc::new(Notify::new());
        self.waiting().insert(key, refill.clone());
        let joined = Joined { key, refill };
        let seen = self
            .maps()
            .seen
            .insert(key, SpliceSeen::default(), 0)
            .map_err(map_error("insert", MAP_SPLICE_SEEN, key));
        if let Err(e) = seen
            .map_err(Into::into)
            .and_then(|()| self.enter(src, &joined, grant))
        {
            self.leave(&joined);
            return Err(e);
        }
        Ok(joined)
    }

    fn pause(&self, joined: &Joined) -> Result<(), RelayError> {
        // A credit the verdict never sends on within: every chunk is left with the
        // socket, in order, for the relay to read. The socket stays in the splice
        // map: taking it out would strand what the verdict already left behind
        // (a chunk it could not queue at once waits in the socket's own backlog,
        // delivered after the verdict is gone, behind newer bytes).
        let stop = Grant {
            limit: 0,
            low: u64::MAX,
            resume: u64::MAX,
        };
        self.grant(joined, stop)
    }

    fn resume(
        &self,
        _src: BorrowedFd<'_>,
        joined: &Joined,
        grant: Grant,
    ) -> Result<(), RelayError> {
        self.grant(joined, grant)
    }

    fn counts(&self, joined: &Joined) -> Result<Counts, RelayError> {
        let seen = self.maps().seen.get(&joined.key, 0).map_err(map_error(
            "read",
            MAP_SPLICE_SEEN,
            joined.key,
        ))?;
        Ok(Counts {
            redirected: seen.redirected,
            passed: seen.passed,
        })
    }

    fn grant(&self, joined: &Joined, grant: Grant) -> Result<(), RelayError> {
        self.maps()
            .credit
            .insert(joined.key, credit(grant), 0)
            .map_err(|e| map_error("write", MAP_SPLICE_CREDIT, joined.key)(e).into())
    }

    fn leave(&self, joined: &Joined) {
        self.waiting().remove(&joined.key);
        let mut maps = self.maps();
        // The socket maps let go of a socket as it closes, which its owner does next.
        let _ = maps.credit.remove(&joined.key);
        let _ = maps.seen.remove(&joined.key);
    }
}

fn credit(g: Grant) -> SpliceCredit {
    SpliceCredit {
        limit: g.limit,
        low: g.low,
        resume: g.resume,
    }
}

/// The splice of a freshly loaded object (its program and maps taken out of it),
/// or why not (shared: the datapath hands it to each asker); logged either way.
pub(super) fn offer(ebpf: &mut Ebpf) -> Result<Splice, Arc<SpliceError>> {
    match Splice::load(ebpf) {
        Ok(s) => Ok(s),
        Err(e) => {
            tracing::info!(reason = %e, "the relay's kernel splice is unavailable: relayed bytes are spliced through pipes");
            Err(Arc::new(e))
        }
    }
}
