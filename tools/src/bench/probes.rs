//! Code the bench runs as a child inside the pod (its own binary, re-executed with
//! a hidden subcommand under `nsenter` and the pod cgroup): per-connect timing, and
//! the probe that notices when a redirect starts or stops working.

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

/// How a connect-loop run dials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectMode {
    /// Blocking connect to a closed port: SYN, RST, ECONNREFUSED, all inside the call.
    Refused,
    /// Nonblocking connect (returns EINPROGRESS once the SYN is sent), then close.
    Nonblocking,
}

impl ConnectMode {
    /// The subcommand argument.
    pub fn arg(self) -> &'static str {
        match self {
            ConnectMode::Refused => "refused",
            ConnectMode::Nonblocking => "nonblocking",
        }
    }
}

/// `connect-loop MODE ADDR N`: prints the mean ns per socket()+connect()+close().
pub fn connect_loop(args: &[String]) -> Result<()> {
    let [mode, addr, n] = args else {
        bail!("usage: connect-loop refused|nonblocking ADDR N");
    };
    let addr: SocketAddr = addr.parse().context("ADDR")?;
    let n: u32 = n.parse().context("N")?;
    println!("{:.1}", time_connects(mode, addr, n)?);
    Ok(())
}

/// `connect-pairs MODE ADDR N K CGROUP_A CGROUP_B`: K pairs of back-to-back loops of
/// N connects, one from each cgroup (this process moves itself between them; a
/// socket's cgroup, which decides which connect programs run, is the one its process
/// is in when it is created). The order alternates pair by pair. Prints one line per
/// pair: mean ns per connect from A, then from B. Pairs milliseconds apart cancel the
/// drift that separate runs seconds apart carry.
pub fn connect_pairs(args: &[String]) -> Result<()> {
    let [mode, addr, n, k, a, b] = args else {
        bail!("usage: connect-pairs refused|nonblocking ADDR N K CGROUP_A CGROUP_B");
    };
    let addr: SocketAddr = addr.parse().context("ADDR")?;
    let n: u32 = n.parse().context("N")?;
    let k: u32 = k.parse().context("K")?;
    // One untimed loop first: page faults, the neighbour cache and conntrack warm up.
    time_connects(mode, addr, n.min(1000))?;
    for i in 0..k {
        let mut ns = [0.0f64; 2];
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for slot in order {
            join_cgroup(if slot == 0 { a } else { b })?;
            ns[slot] = time_connects(mode, addr, n)?;
        }
        println!("{:.1} {:.1}", ns[0], ns[1]);
    }
    Ok(())
}

fn join_cgroup(cgroup: &str) -> Result<()> {
    // Writing 0 moves the writing process.
    std::fs::write(std::path::Path::new(cgroup).join("cgroup.procs"), "0")
        .with_context(|| format!("join cgroup {cgroup}"))
}

/// Mean ns per socket()+connect()+close() over `n` calls.
fn time_connects(mode: &str, addr: SocketAddr, n: u32) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..n {
        match mode {
            "refused" => match TcpStream::connect(addr) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                other => bail!("connect {addr}: expected ECONNREFUSED, got {other:?}"),
            },
            "nonblocking" => nonblocking_connect(addr)?,
            _ => bail!("unknown mode {mode}"),
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / f64::from(n.max(1)))
}

fn nonblocking_connect(addr: SocketAddr) -> Result<()> {
    let SocketAddr::V4(v4) = addr else {
        bail!("IPv4 only");
    };
    // SAFETY: plain socket syscalls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if r != 0 && err.raw_os_error() != Some(libc::EINPROGRESS) {
            bail!("connect {addr}: {err}");
        }
    }
    Ok(())
}

/// `probe ADDR redirected|direct TIMEOUT_MS`: prints `ready`, then connects to ADDR
/// every millisecond until the connection is (or is no longer) redirected, and
/// prints the wall-clock time (ns since the epoch) it first saw that. A redirected
/// connect's peer is the relay's listener, not ADDR (no getpeername hook hides it).
pub fn probe(args: &[String]) -> Result<()> {
    let [addr, want, timeout_ms] = args else {
        bail!("usage: probe ADDR redirected|direct TIMEOUT_MS");
    };
    let addr: SocketAddr = addr.parse().context("ADDR")?;
    let want_redirected = want == "redirected";
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.parse()?);
    println!("ready");
    std::io::stdout().flush()?;
    while Instant::now() < deadline {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            let redirected = s.peer_addr().is_ok_and(|p| p != addr);
            // Reset rather than FIN: nothing was sent, nothing to wait for.
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: setsockopt on a live descriptor with a correctly sized value.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
            }
            if redirected == want_redirected {
                let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
                println!("{now}");
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("timeout");
    Ok(())
}
