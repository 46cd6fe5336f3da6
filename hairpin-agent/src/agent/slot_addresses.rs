//! The relay's addresses (`--listen-address`) become slot addresses: the
//! `hairpin_sk_lookup` program hands every SYN to a slot port (1024 up) on them to
//! the relay, whatever else listens there. On an address the node uses for anything
//! else (its own IP, where the kubelet, the API server and NodePorts listen) that
//! would relay the node's own services' connections to whichever LoadBalancer holds
//! the slot. So such an address is refused at start, naming it.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// Why an address may not be a slot address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SlotAddressError {
    /// One of the node's IPs (`--node-ip`).
    #[error(
        "--listen-address {0} is a node IP (--node-ip): its slots would take connections \
         meant for the node's own services (kubelet, API server, NodePorts); leave \
         --listen-address unset for the node-local default or pass an address of its own"
    )]
    NodeIp(IpAddr),
    /// Another process listens on it at a slot port.
    #[error(
        "--listen-address {address} is used by other listeners on this node ({what}): its slots \
         (ports 1024-65535) would take their connections; pass an address nothing else uses"
    )]
    InUse {
        /// The address.
        address: IpAddr,
        /// The listeners found, as `tcp port 10250, tcp port 30080`.
        what: String,
    },
}

/// One TCP listener of the node's network namespace, as `/proc/net/tcp{,6}` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BoundSocket {
    /// `tcp` (slots are TCP only).
    pub proto: &'static str,
    /// Its local address.
    pub address: IpAddr,
    /// Its local port.
    pub port: u16,
}

/// The first port of a slot address that is a slot: below it the relay's and the
/// name relay's own listeners sit on privileged ports, which the slots leave alone.
pub(crate) const FIRST_SLOT_PORT: u16 = 1024;

/// Refuses each of `addresses` that is one of `node_ips` or has a listener of
/// `bound` on that very address at a slot port ([`FIRST_SLOT_PORT`] and up; the
/// wildcard address is not counted, nor a connection: those on a slot address are
/// the relay's own, such as a killed agent's in TIME_WAIT).
pub(crate) fn check(
    addresses: &[IpAddr],
    node_ips: &[IpAddr],
    bound: &[BoundSocket],
) -> Result<(), SlotAddressError> {
    for &a in addresses {
        let a = a.to_canonical();
        if node_ips.iter().any(|n| n.to_canonical() == a) {
            return Err(SlotAddressError::NodeIp(a));
        }
        let on: BTreeSet<(&str, u16)> = bound
            .iter()
            .filter(|b| b.address.to_canonical() == a && b.port >= FIRST_SLOT_PORT)
            .map(|b| (b.proto, b.port))
            .collect();
        if !on.is_empty() {
            let what: Vec<String> = on
                .iter()
                .take(8)
                .map(|(p, port)| format!("{p} port {port}"))
                .collect();
            let more = on.len().saturating_sub(8);
            let mut what = what.join(", ");
            if more > 0 {
                what.push_str(&format!(" and {more} more"));
            }
            return Err(SlotAddressError::InUse { address: a, what });
        }
    }
    Ok(())
}

/// The TCP listeners of this network namespace on a specific address, from
/// `/proc/net/{tcp,tcp6}`; a file that cannot be read adds nothing.
pub(crate) fn bound_sockets() -> Vec<BoundSocket> {
    let mut out = Vec::new();
    for (file, proto) in [("/proc/net/tcp", "tcp"), ("/proc/net/tcp6", "tcp")] {
        if let Ok(text) = std::fs::read_to_string(file) {
            out.extend(parse_proc_net(&text, proto));
        }
    }
    out
}

/// The listeners of one `/proc/net/tcp{,6}` table (its header line skipped): state
/// `0A`, `TCP_LISTEN`.
pub(crate) fn parse_proc_net(text: &str, proto: &'static str) -> Vec<BoundSocket> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            if fields.nth(1)? != "0A" {
                return None;
            }
            let (addr, port) = local.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let address = parse_hex_addr(addr)?;
            (!address.is_unspecified()).then_some(BoundSocket {
                proto,
                address,
                port,
            })
        })
        .collect()
}

/// An address as the kernel prints it there: 32-bit words in host byte order.
fn parse_hex_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(b)).to_canonical())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_node_ip_or_an_address_with_other_sockets_is_refused_by_name() {
        let node = [ip("10.0.0.5"), ip("fd00::5")];
        let err = check(&[ip("169.254.104.1"), ip("10.0.0.5")], &node, &[]).unwrap_err();
        assert_eq!(err, SlotAddressError::NodeIp(ip("10.0.0.5")));
        assert!(err.to_string().contains("10.0.0.5"), "{err}");
        let err = check(&[ip("::ffff:10.0.0.5")], &node, &[]).unwrap_err();
        assert_eq!(err, SlotAddressError::NodeIp(ip("10.0.0.5")));
        let kubelet = BoundSocket {
            proto: "tcp",
            address: ip("10.0.0.6"),
            port: 10250,
        };
        let err = check(&[ip("10.0.0.6")], &node, &[kubelet]).unwrap_err();
        assert!(
            err.to_string().contains("10.0.0.6") && err.to_string().contains("tcp port 10250"),
            "{err}"
        );
        check(
            &[ip("169.254.104.1"), ip("fd68:6169:7270:696e::1")],
            &node,
            &[kubelet],
        )
        .expect("the node-local defaults");
        // A privileged port is no slot: a names port held there is the name
        // relay's business (it retries), not a reason to refuse the address.
        let names_port = BoundSocket {
            proto: "tcp",
            address: ip("169.254.104.1"),
            port: 80,
        };
        check(&[ip("169.254.104.1")], &node, &[names_port]).expect("below the slots");
    }

    #[test]
    fn proc_net_tables_parse_to_their_bound_addresses() {
        let v4 = "  sl  local_address rem_address   st\n   \
                  0: 0100007F:26AD 00000000:0000 0A\n   \
                  1: 00000000:0016 00000000:0000 0A\n   \
                  2: 0100007F:E000 0100007F:26AD 01\n";
        let got = parse_proc_net(v4, "tcp");
        assert_eq!(
            got,
            vec![BoundSocket {
                proto: "tcp",
                address: ip("127.0.0.1"),
                port: 9901
            }],
            "the wildcard listener and a connection are not counted"
        );
        let v6 = "  sl  local_address rem_address st\n   \
                  0: 00000000000000000000000001000000:0035 x 0A\n   \
                  1: 0000000000000000FFFF00000500000A:1F90 x 0A\n";
        let got = parse_proc_net(v6, "tcp");
        if cfg!(target_endian = "little") {
            assert_eq!(got[0].address, ip("::1"));
            assert_eq!(got[1].address, ip("10.0.0.5"), "a v4-mapped socket");
            assert_eq!(got[1].port, 8080);
        }
    }
}
