//! Listening, as both relays do it: a socket whose accepted connections inherit
//! TCP keepalive, an accept loop that resets peers outside the client policy and
//! sheds connections past the caps, and a stop that still takes the connects
//! already queued.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::{
    net::{TcpListener, TcpSocket, TcpStream},
    time::timeout,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, warn};

use super::client_policy::ClientPolicy;
use super::peer_owner::{PeerOwners, SourceKey};
use crate::status::metrics::Metrics;

/// Unanswered keepalive probes before a relayed connection is dropped; they are sent
/// every `min(keepalive, 10 s)`.
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

/// Turns on TCP keepalive on `s` as `idle` says (see [`RelayConfig::keepalive`]).
/// Set on a listener, every accepted socket inherits it (the kernel clones the
/// listener's options and arms the timer), so clients cost no syscall per connection.
pub(crate) fn set_keepalive<S: std::os::fd::AsFd>(s: &S, idle: Option<Duration>) {
    let Some(idle) = idle else { return };
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(idle.min(Duration::from_secs(10)))
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(s).set_tcp_keepalive(&ka) {
        debug!(error = %e, "TCP keepalive not set");
    }
}

/// How many connections the relays hold at once: in all, and from one source (a
/// peer address; for the node's own processes, the uid owning the client's socket).
/// Every held connection costs two sockets and up to two copy buffers; past the
/// caps a flood from one pod would take the agent's memory (and with it every
/// node's hosts block and redirects) rather than its own connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Across every listener of both relays.
    pub total: usize,
    /// From one source: a pod's address; a process of the node by its uid (the
    /// node's processes share the node's addresses; see `peer_owner`).
    pub per_source: usize,
}

/// Which cap shed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shed {
    /// [`ConnLimits::total`].
    Total,
    /// [`ConnLimits::per_source`].
    PerSource,
}

impl Shed {
    /// The metrics label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Shed::Total => "total",
            Shed::PerSource => "per_source",
        }
    }
}

/// The open connections of every listener sharing it, admitted against the caps.
/// Cloning shares the counts: both relays hold one gate.
#[derive(Clone, Debug)]
pub struct ConnGate {
    limits: ConnLimits,
    open: Arc<Mutex<Open>>,
    owners: Arc<PeerOwners>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<SourceKey, usize>,
    /// Sheds since the last log line, and when that was: said at most every 10 s.
    shed_unsaid: u64,
    said_at: Option<Instant>,
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: ConnGate,
    source: SourceKey,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.gate.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
    }
}

/// How often a run of sheds is said in the log.
const SHED_LOG_EVERY: Duration = Duration::from_secs(10);

impl ConnGate {
    /// A gate with `limits` and nothing open.
    pub fn new(limits: ConnLimits) -> ConnGate {
        ConnGate {
            limits,
            open: Arc::default(),
            owners: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // Counts are plain integers: a panicking holder left them usable.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection from `peer` accepted at `local`, counted against
    /// its source ([`PeerOwners::key`]), or the cap it would pass.
    pub(crate) fn admit(&self, peer: SocketAddr, local: SocketAddr) -> Result<Permit, Shed> {
        self.admit_key(self.owners.key(peer, local))
    }

    /// A place for a connection from `source`, or the cap it would pass.
    pub(crate) fn admit_key(&self, source: SourceKey) -> Result<Permit, Shed> {
        let source = match source {
            SourceKey::Addr(ip) => SourceKey::Addr(ip.to_canonical()),
            other => other,
        };
        let mut open = self.lock();
        let from_source = open.by_source.get(&source).copied().unwrap_or(0);
        let refused = if open.total >= self.limits.total {
            Some(Shed::Total)
        } else if from_source >= self.limits.per_source {
            Some(Shed::PerSource)
        } else {
            None
        };
        if let Some(shed) = refused {
            open.shed_unsaid += 1;
            let due = open.said_at.is_none_or(|t| t.elapsed() >= SHED_LOG_EVERY);
            if due {
                warn!(
                    cap = shed.as_str(),
                    %source,
                    shed = open.shed_unsaid,
                    open = open.total,
                    total_cap = self.limits.total,
                    per_source_cap = self.limits.per_source,
                    "relay connection caps reached: new connections are reset (said at most every 10 s)"
                );
                open.shed_unsaid = 0;
                open.said_at = Some(Instant::now());
            }
            return Err(shed);
        }
        open.total += 1;
        *open.by_source.entry(source).or_insert(0) += 1;
        Ok(Permit {
            gate: self.clone(),
            source,
        })
    }

    /// Connections held now.
    pub fn open(&self) -> usize {
        self.lock().total
    }
}

/// A listener on `addr` (port 0: an ephemeral one) whose accepted sockets inherit
/// TCP keepalive as `keepalive` says, and `TCP_NODELAY` (see [`super::proxy`]): set
/// once here, not twice per connection. `SO_REUSEADDR`: a relay restarted within
/// TIME_WAIT must be able to take its ports again.
pub fn bind(addr: SocketAddr, keepalive: Option<Duration>) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    set_keepalive(&socket, keepalive);
    if let Err(e) = socket.set_nodelay(true) {
        debug!(error = %e, "TCP_NODELAY not set on the listener");
    }
    socket.listen(1024)
}

/// The privileged ports [`bind_privileged`] tries, from the top down: below 1024
/// only a process with CAP_NET_BIND_SERVICE may bind, and none of them is in the
/// node's ephemeral range, so a port held here is never one an outbound connect
/// needs, and one left behind by a dead agent cannot be taken by any uid.
pub(crate) const PRIVILEGED_PORTS: std::ops::RangeInclusive<u16> = 512..=1023;

/// A listener as [`bind`] makes it, on `ip` at the highest port of
/// [`PRIVILEGED_PORTS`] that is free, not in `avoid` and not in the node's
/// `ip_local_reserved_ports` (`reserved`, as read by [`reserved_ports`]). Fails
/// with the last error when none can be bound (EACCES: no CAP_NET_BIND_SERVICE).
pub(crate) fn bind_privileged(
    ip: std::net::IpAddr,
    keepalive: Option<Duration>,
    avoid: &[u16],
    reserved: &[std::ops::RangeInclusive<u16>],
) -> io::Result<TcpListener> {
    let mut last = io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free port in {PRIVILEGED_PORTS:?} on {ip}"),
    );
    for port in PRIVILEGED_PORTS.rev() {
        if avoid.contains(&port) || reserved.iter().any(|r| r.contains(&port)) {
            continue;
        }
        match bind(SocketAddr::new(ip, port), keepalive) {
            Ok(l) => return Ok(l),
            // Without CAP_NET_BIND_SERVICE no port of the range will do.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The node's `net.ipv4.ip_local_reserved_ports` (which also applies to IPv6):
/// ports the operator keeps for listeners of their own. Unreadable: none.
pub(crate) fn reserved_ports() -> Vec<std::ops::RangeInclusive<u16>> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports")
        .map(|s| parse_port_ranges(&s))
        .unwrap_or_default()
}

/// `8080,9000-9010` -> [8080..=8080, 9000..=9010]; what does not parse is skipped.
pub(crate) fn parse_port_ranges(s: &str) -> Vec<std::ops::RangeInclusive<u16>> {
    s.trim()
        .split(',')
        .filter_map(|part| {
            let part = part.trim();
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
            (a <= b).then_some(a..=b)
        })
        .collect()
}

/// What every accepted connection is checked against, counted in, and run on.
#[derive(Clone)]
pub struct Admission {
    /// Peers outside it are reset.
    pub clients: ClientPolicy,
    /// Connections past its caps are reset.
    pub gate: ConnGate,
    /// Refusals and sheds are counted here.
    pub metrics: Metrics,
    /// Every admitted connection runs as one of its tasks (drained at shutdown).
    pub connections: TaskTracker,
}

/// Accepts on `listener` (bound at `local`) until `stop`, resets peers outside
/// the client policy and connections past the caps, and runs
/// `serve(client, peer, local)` for every other connection as a task, holding its
/// place in the gate until it ends. `local` is the connection's own address as the
/// kernel gives it: a connection handed over by the relay's sk_lookup program (or
/// to a wildcard listener) has an address of its own, its slot.
///
/// Once stopped it still takes what is queued or arrives within a short quiet
/// period: connects redirected just before their redirect went away sit in the
/// accept queue, and closing at once would reset them.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    local: SocketAddr,
    stop: CancellationToken,
    admission: Admission,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Admission {
        clients,
        gate,
        metrics,
        connections,
    } = admission;
    let handle = |accepted: io::Result<(TcpStream, SocketAddr)>| {
        let (client, peer) = match accepted {
            Ok(a) => a,
            Err(e) => return Err(e),
        };
        // Checked before the gate: a peer outside the policy is reset at once and
        // never holds a place in the caps a flood from off the node would fill.
        if !clients.allows(peer.ip()) {
            refuse(&client, peer, &metrics);
            return Ok(());
        }
        let local = client.local_addr().unwrap_or(local);
        let permit = match gate.admit(peer, local) {
            Ok(p) => p,
            Err(shed) => {
                metrics.shed(shed.as_str());
                reset(&client);
                return Ok(());
            }
        };
        let served = serve(client, peer, local);
        connections.spawn(
            async move {
                let _held = permit;
                served.await;
            }
            .in_current_span(),
        );
        Ok(())
    };
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        if let Err(e) = handle(accepted) {
            warn!(error = %e, "accept failed");
            // EMFILE/ENFILE persist until something closes: do not spin on them.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    while let Ok(accepted) = timeout(Duration::from_millis(50), listener.accept()).await {
        if handle(accepted).is_err() {
            break;
        }
    }
}

/// Closes a connection from a peer outside the client policy with a reset.
fn refuse(client: &TcpStream, peer: SocketAddr, metrics: &Metrics) {
    metrics.refused_client();
    debug!(%peer, "client outside the relay client policy: refused (reset)");
    reset(client);
}

/// Closes `client` with a reset when dropped: the peer learns at once, and no
/// TIME_WAIT is left behind.
pub(crate) fn reset(client: &TcpStream) {
    let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_port_ranges_parse_as_the_kernel_prints_them() {
        assert_eq!(parse_port_ranges("\n"), vec![]);
        assert_eq!(
            parse_port_ranges("1000-1010,8080\n"),
            vec![1000..=1010, 8080..=8080]
        );
        assert_eq!(parse_port_ranges("x,20-10,443"), vec![443..=443]);
    }

    /// As root (the test runs unprivileged too: then the bind is refused with
    /// EACCES, which is what the agent reports).
    #[tokio::test]
    async fn a_privileged_listener_takes_the_highest_free_port_outside_avoid_and_reserved() {
        let ip: std::net::IpAddr = "127.0.0.1".parse().expect("ip");
        let first = match bind_privileged(ip, None, &[1023], &[1020..=1022]) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return,
            Err(e) => panic!("{e}"),
        };
        let port = first.local_addr().expect("addr").port();
        assert!(
            port < 1020,
            "skipped 1023 (avoid) and 1020-1022 (reserved): {port}"
        );
        let second = bind_privileged(ip, None, &[1023], &[1020..=1022]).expect("another");
        let next = second.local_addr().expect("addr").port();
        assert!(
            next < port && PRIVILEGED_PORTS.contains(&next),
            "{next} after {port}"
        );
    }

    fn ip(s: &str) -> SourceKey {
        SourceKey::Addr(s.parse().expect("ip"))
    }

    /// What the relay saves a setsockopt per connection on: Linux clones the
    /// listener's options into each accepted socket.
    #[tokio::test]
    async fn accepted_sockets_inherit_keepalive_and_nodelay_from_the_listener() {
        let idle = Duration::from_secs(37);
        let l = bind("127.0.0.1:0".parse().expect("addr"), Some(idle)).expect("bind");
        let _c = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (a, _) = l.accept().await.expect("accept");
        assert!(a.nodelay().expect("nodelay"));
        let s = socket2::SockRef::from(&a);
        assert!(s.keepalive().expect("keepalive"));
        assert_eq!(s.tcp_keepalive_time().expect("idle"), idle);
        assert_eq!(
            s.tcp_keepalive_interval().expect("interval"),
            Duration::from_secs(10)
        );
        assert_eq!(
            s.tcp_keepalive_retries().expect("retries"),
            KEEPALIVE_PROBES
        );
        // Off: neither.
        let l = bind("127.0.0.1:0".parse().expect("addr"), None).expect("bind");
        let _c = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (a, _) = l.accept().await.expect("accept");
        assert!(!socket2::SockRef::from(&a).keepalive().expect("keepalive"));
    }

    #[test]
    fn the_gate_sheds_past_either_cap_and_gives_places_back() {
        let gate = ConnGate::new(ConnLimits {
            total: 3,
            per_source: 2,
        });
        let a1 = gate.admit_key(ip("192.0.2.10")).expect("a1");
        let _a2 = gate
            .admit_key(ip("::ffff:192.0.2.10"))
            .expect("a2, the same source");
        assert_eq!(
            gate.admit_key(ip("192.0.2.10")).err(),
            Some(Shed::PerSource)
        );
        let _b1 = gate.admit_key(ip("192.0.2.11")).expect("b1");
        assert_eq!(gate.admit_key(ip("192.0.2.12")).err(), Some(Shed::Total));
        assert_eq!(gate.open(), 3);
        drop(a1);
        assert_eq!(gate.open(), 2);
        let _a3 = gate.admit_key(ip("192.0.2.10")).expect("a place again");
        assert_eq!(gate.clone().open(), 3, "clones share the counts");
    }

    /// The node's processes share its addresses: each uid has a cap of its own, so
    /// one uid holding all it may leaves another's connections admitted.
    #[test]
    fn the_nodes_own_processes_are_capped_per_uid() {
        let gate = ConnGate::new(ConnLimits {
            total: 10,
            per_source: 2,
        });
        let nobody = SourceKey::HostUid(65534);
        let _held: Vec<Permit> = (0..2)
            .map(|_| gate.admit_key(nobody).expect("nobody's"))
            .collect();
        assert_eq!(gate.admit_key(nobody).err(), Some(Shed::PerSource));
        let _root = gate
            .admit_key(SourceKey::HostUid(0))
            .expect("root's own place");
        let _unknown = gate
            .admit_key(SourceKey::HostUnknown)
            .expect("an owner unknown counts against no uid");
        // Through the lookup: a loopback connection of this test's own uid.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let _c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (a, peer) = l.accept().expect("accept");
        let local = a.local_addr().expect("local");
        let me = nix::unistd::geteuid().as_raw();
        let permit = gate.admit(peer, local).expect("admitted");
        assert_eq!(permit.source, SourceKey::HostUid(me));
    }
}
