//! Whose a relayed connection from this node's own network namespace is: the uid
//! owning the client's socket, which the relay reads with one exact `sock_diag`
//! lookup of the connection's four-tuple (the client's socket sits in the relay's
//! own namespace, the node's). A pod's connection comes from an address of its
//! own and is keyed by it; the node's processes all share the node's addresses, so
//! without their uid one process (any uid, holding a mesh capture port to send
//! the node's kernel-path connects to the relay) could take the one cap the
//! addresses share from every other process on the node.
//!
//! `SO_PEERCRED` is for unix sockets only; `sock_diag` reports the owner of a TCP
//! socket (`sk_uid`, set when it was created) to any process of the namespace,
//! with no capability, and an exact lookup costs one request and one reply.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, OwnedFd},
    sync::{Mutex, PoisonError},
};

use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, recv, send, socket,
};

/// Who a connection counts against in the relays' per-source cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SourceKey {
    /// A peer with an address of its own (a pod): the address.
    Addr(IpAddr),
    /// A process in the node's own network namespace: the uid owning its socket.
    HostUid(u32),
    /// A peer with a node address whose socket could not be found or has no owner
    /// any more (closed before the relay accepted it: a time-wait socket reports
    /// none): a key of its own, so such connections never count against a uid.
    HostUnknown,
}

impl std::fmt::Display for SourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceKey::Addr(ip) => write!(f, "{ip}"),
            SourceKey::HostUid(uid) => write!(f, "uid {uid} on this node"),
            SourceKey::HostUnknown => f.write_str("this node, owner unknown"),
        }
    }
}

/// The lookups' netlink socket, made on first use and kept.
#[derive(Debug, Default)]
pub(crate) struct PeerOwners {
    socket: Mutex<Option<OwnedFd>>,
    /// Whether a failed lookup was said at warning level (once: a kernel without
    /// TCP `sock_diag` fails every lookup alike).
    warned: std::sync::atomic::AtomicBool,
}

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`.
const NLMSG_ERROR: u16 = 2;
/// Length of `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// Length of `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
/// Offset of `idiag_uid` in `struct inet_diag_msg`: family, state, timer,
/// retrans (4), the socket id (48), expires, rqueue, wqueue (12).
const UID_AT: usize = 64;
/// Length of `struct inet_diag_msg`.
const MSG_LEN: usize = 72;
/// `INET_DIAG_NOCOOKIE`: an exact lookup by address, whatever the socket's cookie.
const NO_COOKIE: u32 = u32::MAX;

impl PeerOwners {
    /// The key of a connection from `peer` accepted at `local` (its slot): the uid
    /// owning the client's socket when `peer` is loopback or `local`'s own address
    /// (which a process of the node connecting to a local address takes as its
    /// source), its address otherwise. A process that binds another address of the
    /// node as its source is keyed by that address: a key no other process shares
    /// unless it binds it too.
    pub(crate) fn key(&self, peer: SocketAddr, local: SocketAddr) -> SourceKey {
        let ip = peer.ip().to_canonical();
        if !ip.is_loopback() && ip != local.ip().to_canonical() {
            return SourceKey::Addr(ip);
        }
        match self.owner(peer, local) {
            Ok(Some(uid)) => SourceKey::HostUid(uid),
            Ok(None) => SourceKey::HostUnknown,
            Err(e) => {
                if self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::debug!(%peer, error = %e, "the owner of a connection from this node could not be read");
                } else {
                    tracing::warn!(%peer, error = %e, "the owner of a connection from this node could not be read (sock_diag): such connections share one per-source cap (said once)");
                }
                SourceKey::HostUnknown
            }
        }
    }

    /// The uid owning the TCP socket of this network namespace whose own address is
    /// `peer` and whose peer is `local`: `None` when there is none, or it has no
    /// owner any more (time-wait, a request not yet accepted, a listener).
    pub(crate) fn owner(&self, peer: SocketAddr, local: SocketAddr) -> io::Result<Option<u32>> {
        let mut held = self.socket.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_none() {
            *held = Some(
                socket(
                    AddressFamily::Netlink,
                    SockType::Raw,
                    SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                    SockProtocol::NetlinkSockDiag,
                )
                .map_err(io::Error::from)?,
            );
        }
        let Some(fd) = held.as_ref() else {
            return Ok(None);
        };
        let fd = fd.as_raw_fd();
        let request = request(peer, local);
        send(fd, &request, MsgFlags::empty()).map_err(io::Error::from)?;
        // The kernel answers within the send: the reply is queued already.
        let mut buf = [0u8; 1024];
        loop {
            let n = match recv(fd, &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(nix::errno::Errno::EAGAIN) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            match reply(&buf[..n]) {
                Reply::Other => continue,
                Reply::Owner(uid) => return Ok(uid),
                Reply::Error(0) | Reply::Error(libc::ENOENT) => return Ok(None),
                Reply::Error(errno) => return Err(io::Error::from_raw_os_error(errno)),
            }
        }
    }
}

/// The sequence number every request carries: one request is in flight at a time
/// (under the lock), and replies to others are skipped.
const SEQ: u32 = 0x6861_6972;

/// An exact `inet_diag` lookup of the TCP socket whose own address is `own` and
/// whose peer is `remote`.
fn request(own: SocketAddr, remote: SocketAddr) -> [u8; NLMSG_HDR + REQ_LEN] {
    let mut m = [0u8; NLMSG_HDR + REQ_LEN];
    let len = u32::try_from(m.len()).unwrap_or(u32::MAX);
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&SEQ.to_ne_bytes());
    let (family, own_ip, remote_ip) = match (own.ip(), remote.ip()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (libc::AF_INET, v4(a), v4(b)),
        (a, b) => (libc::AF_INET6, v6(a), v6(b)),
    };
    let r = &mut m[NLMSG_HDR..];
    r[0] = u8::try_from(family).unwrap_or(0);
    r[1] = u8::try_from(libc::IPPROTO_TCP).unwrap_or(6);
    r[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
    // inet_diag_sockid: sport, dport (network order), src, dst, ifindex, cookie.
    r[8..10].copy_from_slice(&own.port().to_be_bytes());
    r[10..12].copy_from_slice(&remote.port().to_be_bytes());
    r[12..28].copy_from_slice(&own_ip);
    r[28..44].copy_from_slice(&remote_ip);
    r[48..52].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    r[52..56].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    m
}

fn v4(a: std::net::Ipv4Addr) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&a.octets());
    out
}

fn v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

/// What one netlink message of a reply says.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// The socket, and its owner if it has one (see [`owns`]).
    Owner(Option<u32>),
    /// `NLMSG_ERROR` with this errno (0: an acknowledgement).
    Error(i32),
    /// Not the reply to our request.
    Other,
}

/// Reads the first message of `buf`.
fn reply(buf: &[u8]) -> Reply {
    let u32_at = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    let (Some(_len), Some(kind), Some(seq)) = (
        u32_at(buf, 0),
        buf.get(4..6)
            .and_then(|s| s.try_into().ok())
            .map(u16::from_ne_bytes),
        u32_at(buf, 8),
    ) else {
        return Reply::Other;
    };
    if seq != SEQ {
        return Reply::Other;
    }
    let body = &buf[NLMSG_HDR.min(buf.len())..];
    match kind {
        NLMSG_ERROR => match u32_at(body, 0) {
            Some(e) => Reply::Error((e as i32).saturating_neg()),
            None => Reply::Other,
        },
        SOCK_DIAG_BY_FAMILY if body.len() >= MSG_LEN => {
            let state = body[1];
            Reply::Owner(u32_at(body, UID_AT).filter(|_| owns(state)))
        }
        _ => Reply::Other,
    }
}

/// Whether a socket in TCP state `state` reports its owner: a full socket of a
/// connection. A time-wait socket (its process closed it) and a request socket
/// report uid 0, which would charge root; a listener is no client.
fn owns(state: u8) -> bool {
    // TCP_ESTABLISHED 1, SYN_SENT 2, FIN_WAIT1 4, FIN_WAIT2 5, CLOSE_WAIT 8,
    // LAST_ACK 9, CLOSING 11 (include/net/tcp_states.h).
    matches!(state, 1 | 2 | 4 | 5 | 8 | 9 | 11)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    /// A connection on loopback is found, owned by this test's uid; an address
    /// with no socket is none; a pod's address is keyed by itself, unlooked.
    #[test]
    fn a_node_peer_is_keyed_by_the_uid_owning_its_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (a, peer) = l.accept().expect("accept");
        let local = a.local_addr().expect("local");
        let owners = PeerOwners::default();
        let uid = nix::unistd::geteuid().as_raw();
        assert_eq!(owners.owner(peer, local).expect("lookup"), Some(uid));
        assert_eq!(owners.key(peer, local), SourceKey::HostUid(uid));
        let nobody = addr("127.0.0.1:9");
        assert_eq!(owners.owner(nobody, local).expect("lookup"), None);
        assert_eq!(owners.key(nobody, local), SourceKey::HostUnknown);
        let pod = addr("10.244.0.7:40000");
        let slot = addr("169.254.104.1:2000");
        assert_eq!(owners.key(pod, slot), SourceKey::Addr(pod.ip()));
        // The slot address as source is this node's (looked up: no socket here).
        assert_eq!(
            owners.key(addr("169.254.104.1:40000"), slot),
            SourceKey::HostUnknown
        );
        // Closed by its process (time-wait, or orphaned): never its owner's.
        drop(c);
        drop(a);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while owners.owner(peer, local).expect("lookup").is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "still owned 2 s after close"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn replies_are_read_by_kind_sequence_and_state() {
        let mut msg = vec![0u8; NLMSG_HDR + MSG_LEN];
        msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        msg[8..12].copy_from_slice(&SEQ.to_ne_bytes());
        msg[NLMSG_HDR + 1] = 1;
        msg[NLMSG_HDR + UID_AT..NLMSG_HDR + UID_AT + 4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(reply(&msg), Reply::Owner(Some(1000)));
        // Time-wait: uid 0 in the reply, never taken for root.
        msg[NLMSG_HDR + 1] = 6;
        assert_eq!(reply(&msg), Reply::Owner(None));
        msg[8..12].copy_from_slice(&1u32.to_ne_bytes());
        assert_eq!(reply(&msg), Reply::Other, "another request's");
        let mut err = vec![0u8; NLMSG_HDR + 4];
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[8..12].copy_from_slice(&SEQ.to_ne_bytes());
        err[NLMSG_HDR..].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(reply(&err), Reply::Error(libc::ENOENT));
        assert_eq!(reply(&[0u8; 3]), Reply::Other);
    }
}
