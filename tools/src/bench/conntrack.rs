//! Flushing a network namespace's conntrack table between rounds, over ctnetlink
//! (what `conntrack -F` sends), so a round does not start with the previous round's
//! tens of thousands of TIME_WAIT entries in the table its DNAT looks up.

use std::{fs::File, os::fd::AsRawFd};

use anyhow::{Context, Result, bail};

/// `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE`: with no tuple, a flush.
const CT_DELETE: u16 = (1 << 8) | 2;

/// The flush request: nlmsghdr (16 bytes), then nfgenmsg (family, version, res_id).
fn request(family: u8, seq: u32) -> [u8; 20] {
    let mut m = [0u8; 20];
    m[0..4].copy_from_slice(&20u32.to_ne_bytes());
    m[4..6].copy_from_slice(&CT_DELETE.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m[16] = family;
    m
}

/// Flushes the conntrack entries of both families in the namespace `/run/netns/<ns>`,
/// from a thread of its own that enters it (the bench's other threads stay where
/// they are).
pub fn flush(ns: &str) -> Result<()> {
    let path = format!("/run/netns/{ns}");
    let netns = File::open(&path).with_context(|| format!("open {path}"))?;
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            // SAFETY: setns on this thread only, with a namespace fd we hold open.
            if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("setns {path}: {}", std::io::Error::last_os_error());
            }
            for (seq, family) in [(1, libc::AF_INET), (2, libc::AF_INET6)] {
                flush_here(family as u8, seq)?;
            }
            Ok(())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the conntrack flush thread panicked"))?
    })
}

fn flush_here(family: u8, seq: u32) -> Result<()> {
    // SAFETY: plain socket(2); the descriptor is closed below on every path.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        bail!("netlink socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor we own from here on.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let msg = request(family, seq);
    // SAFETY: a 20-byte buffer; the kernel's address (all zero) is the default.
    let sent = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        bail!(
            "send the conntrack flush: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut buf = [0u8; 512];
    // SAFETY: reading into our own buffer.
    let got = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if got < 20 {
        bail!(
            "read the conntrack flush's answer: {}",
            std::io::Error::last_os_error()
        );
    }
    // An NLMSG_ERROR whose error is 0 is the ack; ENOENT: nothing to flush.
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    if kind == libc::NLMSG_ERROR as u16 {
        let err = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if err != 0 && err != -libc::ENOENT {
            bail!(
                "conntrack flush: {}",
                std::io::Error::from_raw_os_error(-err)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_an_acked_ctnetlink_delete_without_a_tuple() {
        let m = request(libc::AF_INET as u8, 7);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0102);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 0x0005);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!((m[16], m[17], m[18], m[19]), (2, 0, 0, 0));
    }
}
