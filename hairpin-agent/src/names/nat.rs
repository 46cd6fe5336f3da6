//! The names ports through the node's netfilter, where the connect programs are not
//! attached: one nftables table of the agent's own (`hairpin`, in the `ip` or `ip6`
//! family of the names address) whose `output` and `prerouting` chains DNAT a
//! connect to the names address at port 80 (or 443, ...) to the name relay's
//! listener on a privileged port of the same address (below 1024: while no agent
//! runs and the table stays, no uid without CAP_NET_BIND_SERVICE can bind it and
//! receive the names' traffic). Nothing then binds the names
//! ports themselves, so a hostNetwork ingress can bind `0.0.0.0:80` later.
//!
//! Written over netlink (`NETLINK_NETFILTER`), the way `nft` writes it, in one
//! batch: the table is created, deleted and created again with its chains and
//! rules, so a replacement (an agent restarting on other ports) is atomic and no
//! rule of an earlier agent survives beside the new ones. The table is the agent's
//! alone: no other table or chain is read or written (kube-proxy's, the CNI's and
//! the operator's are left as they are). [`remove`] deletes it (uninstall and
//! `hairpin-agent cleanup`).

use std::{
    io,
    net::IpAddr,
    time::{Duration, Instant},
};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

/// The table's name, in the `ip` or `ip6` family.
pub(crate) const TABLE: &str = "hairpin";

// include/uapi/linux/netlink.h
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_APPEND: u16 = 0x800;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLMSG_HDRLEN: usize = 16;
const NLA_F_NESTED: u16 = 0x8000;
// include/uapi/linux/netfilter/nfnetlink.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
// include/uapi/linux/netfilter.h
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_LOCAL_OUT: u32 = 3;
/// `NF_IP_PRI_NAT_DST`: where `nft`'s `dstnat` chains and kube-proxy's DNAT run.
const PRIORITY_DSTNAT: i32 = -100;
// include/uapi/linux/netfilter/nf_tables.h
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFT_NAT_DNAT: u32 = 1;
const IPPROTO_TCP: u8 = 6;

/// How long to wait for the kernel's answer to one batch.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// One names port and the listener port its connects are sent to, on the names address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PortRedirect {
    /// The port clients dial on the names address.
    pub dialled: u16,
    /// The name relay's listener port on the same address.
    pub listener: u16,
}

/// Replaces the agent's table for `address`'s family with one that sends each
/// `redirects` port on `address` to its listener port, atomically.
pub(crate) fn apply(address: IpAddr, redirects: &[PortRedirect]) -> io::Result<()> {
    let family = family(address);
    let mut batch = Batch::new(family);
    batch.replace_table();
    for (chain, hook) in [
        ("output", NF_INET_LOCAL_OUT),
        ("prerouting", NF_INET_PRE_ROUTING),
    ] {
        batch.chain(chain, hook);
        for r in redirects {
            batch.dnat_rule(chain, address, *r);
        }
    }
    batch.send()
}

/// Deletes the agent's table for `family_of`'s family; whether there was one.
pub(crate) fn remove(family_of: IpAddr) -> io::Result<bool> {
    let mut batch = Batch::new(family(family_of));
    batch.message(NFT_MSG_DELTABLE, 0, |m| m.string(NFTA_TABLE_NAME, TABLE));
    match batch.send() {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn family(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => NFPROTO_IPV4,
        IpAddr::V6(_) => NFPROTO_IPV6,
    }
}

/// One nfnetlink batch under construction.
struct Batch {
    family: u8,
    buf: Vec<u8>,
    seq: u32,
    /// Messages that asked for an acknowledgement.
    acked: Vec<(u32, &'static str)>,
}

impl Batch {
    fn new(family: u8) -> Batch {
        let mut b = Batch {
            family,
            buf: Vec::new(),
            seq: 0,
            acked: Vec::new(),
        };
        b.raw(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| {},
        );
        b
    }

    /// Creates the table (a no-op when present), deletes it with everything in it,
    /// and creates it again: what follows is the whole table.
    fn replace_table(&mut self) {
        self.message(NFT_MSG_NEWTABLE, NLM_F_CREATE, |m| {
            m.string(NFTA_TABLE_NAME, TABLE)
        });
        self.message(NFT_MSG_DELTABLE, 0, |m| m.string(NFTA_TABLE_NAME, TABLE));
        self.message(NFT_MSG_NEWTABLE, NLM_F_CREATE, |m| {
            m.string(NFTA_TABLE_NAME, TABLE)
        });
    }

    fn chain(&mut self, name: &str, hook: u32) {
        self.message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, |m| {
            m.string(NFTA_CHAIN_TABLE, TABLE);
            m.string(NFTA_CHAIN_NAME, name);
            m.nested(NFTA_CHAIN_HOOK, |h| {
                h.be32(NFTA_HOOK_HOOKNUM, hook);
                h.be32(NFTA_HOOK_PRIORITY, PRIORITY_DSTNAT as u32);
            });
            m.string(NFTA_CHAIN_TYPE, "nat");
        });
    }

    /// `ip daddr ADDRESS tcp dport DIALLED dnat to ADDRESS:LISTENER` (or `ip6`).
    fn dnat_rule(&mut self, chain: &str, address: IpAddr, r: PortRedirect) {
        let (daddr_offset, addr): (u32, Vec<u8>) = match address {
            IpAddr::V4(a) => (16, a.octets().to_vec()),
            IpAddr::V6(a) => (24, a.octets().to_vec()),
        };
        let family = self.family;
        self.message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, |m| {
            m.string(NFTA_RULE_TABLE, TABLE);
            m.string(NFTA_RULE_CHAIN, chain);
            m.nested(NFTA_RULE_EXPRESSIONS, |e| {
                expr(e, "payload", |d| {
                    d.be32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                    d.be32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
                    d.be32(NFTA_PAYLOAD_OFFSET, daddr_offset);
                    d.be32(NFTA_PAYLOAD_LEN, addr.len() as u32);
                });
                cmp_eq(e, &addr);
                expr(e, "meta", |d| {
                    d.be32(NFTA_META_DREG, NFT_REG_1);
                    d.be32(NFTA_META_KEY, NFT_META_L4PROTO);
                });
                cmp_eq(e, &[IPPROTO_TCP]);
                expr(e, "payload", |d| {
                    d.be32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                    d.be32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_TRANSPORT_HEADER);
                    d.be32(NFTA_PAYLOAD_OFFSET, 2);
                    d.be32(NFTA_PAYLOAD_LEN, 2);
                });
                cmp_eq(e, &r.dialled.to_be_bytes());
                immediate(e, NFT_REG_1, &addr);
                immediate(e, NFT_REG_2, &r.listener.to_be_bytes());
                expr(e, "nat", |d| {
                    d.be32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
                    d.be32(NFTA_NAT_FAMILY, u32::from(family));
                    d.be32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
                    d.be32(NFTA_NAT_REG_PROTO_MIN, NFT_REG_2);
                });
            });
        });
    }

    /// An nf_tables message that asks for an acknowledgement.
    fn message(&mut self, kind: u16, flags: u16, attrs: impl FnOnce(&mut Attrs<'_>)) {
        let seq = self.seq + 1;
        self.acked.push((seq, name_of(kind)));
        let family = self.family;
        self.raw(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            family,
            0,
            attrs,
        );
    }

    fn raw(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        res_id: u16,
        attrs: impl FnOnce(&mut Attrs<'_>),
    ) {
        self.seq += 1;
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; NLMSG_HDRLEN]);
        // struct nfgenmsg: family, version (NFNETLINK_V0), resource id (big endian).
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        attrs(&mut Attrs { buf: &mut self.buf });
        let len = (self.buf.len() - start) as u32;
        let header = &mut self.buf[start..start + NLMSG_HDRLEN];
        header[0..4].copy_from_slice(&len.to_ne_bytes());
        header[4..6].copy_from_slice(&kind.to_ne_bytes());
        header[6..8].copy_from_slice(&flags.to_ne_bytes());
        header[8..12].copy_from_slice(&self.seq.to_ne_bytes());
    }

    /// Ends the batch, sends it and waits for every acknowledgement: the first
    /// error the kernel reports fails the whole batch (nothing of it applies).
    fn send(mut self) -> io::Result<()> {
        self.raw(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| {},
        );
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        socket.set_non_blocking(true)?;
        socket.send(&self.buf, 0)?;
        let deadline = Instant::now() + ANSWER_WITHIN;
        let mut waiting = self.acked.clone();
        let mut buf = vec![0u8; 64 * 1024];
        while !waiting.is_empty() {
            let n = match socket.recv(&mut &mut buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "nftables: no answer from the kernel",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (seq, code) in answers(&buf[..n]) {
                let what = waiting.iter().find(|(s, _)| *s == seq).map(|(_, w)| *w);
                waiting.retain(|(s, _)| *s != seq);
                if code != 0 {
                    let e = io::Error::from_raw_os_error(-code);
                    return Err(io::Error::new(
                        e.kind(),
                        format!("nftables {}: {e}", what.unwrap_or("batch")),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn name_of(kind: u16) -> &'static str {
    match kind {
        NFT_MSG_NEWTABLE => "new table",
        NFT_MSG_DELTABLE => "delete table",
        NFT_MSG_NEWCHAIN => "new chain",
        NFT_MSG_NEWRULE => "new rule",
        _ => "message",
    }
}

/// The (sequence, error code) of each `NLMSG_ERROR` in `buf` (0 is an acknowledgement).
fn answers(mut buf: &[u8]) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if kind == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 {
            let b = &buf[NLMSG_HDRLEN..NLMSG_HDRLEN + 4];
            out.push((seq, i32::from_ne_bytes([b[0], b[1], b[2], b[3]])));
        }
        buf = &buf[align(len).min(buf.len())..];
    }
    out
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// Netlink attributes appended to a message.
struct Attrs<'a> {
    buf: &'a mut Vec<u8>,
}

impl Attrs<'_> {
    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = (4 + payload.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align(self.buf.len()), 0);
    }

    fn string(&mut self, kind: u16, s: &str) {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v);
    }

    fn be32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    fn nested(&mut self, kind: u16, inner: impl FnOnce(&mut Attrs<'_>)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        inner(&mut Attrs { buf: self.buf });
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }
}

/// One element of a rule's expression list.
fn expr(list: &mut Attrs<'_>, name: &str, data: impl FnOnce(&mut Attrs<'_>)) {
    list.nested(NFTA_LIST_ELEM, |e| {
        e.string(NFTA_EXPR_NAME, name);
        e.nested(NFTA_EXPR_DATA, data);
    });
}

fn cmp_eq(list: &mut Attrs<'_>, value: &[u8]) {
    expr(list, "cmp", |d| {
        d.be32(NFTA_CMP_SREG, NFT_REG_1);
        d.be32(NFTA_CMP_OP, NFT_CMP_EQ);
        d.nested(NFTA_CMP_DATA, |v| v.attr(NFTA_DATA_VALUE, value));
    });
}

fn immediate(list: &mut Attrs<'_>, register: u32, value: &[u8]) {
    expr(list, "immediate", |d| {
        d.be32(NFTA_IMMEDIATE_DREG, register);
        d.nested(NFTA_IMMEDIATE_DATA, |v| v.attr(NFTA_DATA_VALUE, value));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_framed_as_nfnetlink_expects() {
        let mut b = Batch::new(NFPROTO_IPV4);
        b.replace_table();
        b.raw(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| {},
        );
        // Five messages, each a whole number of 4-byte words, lengths adding up.
        let mut rest = &b.buf[..];
        let mut kinds = Vec::new();
        while !rest.is_empty() {
            let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            assert_eq!(len % 4, 0);
            kinds.push(u16::from_ne_bytes([rest[4], rest[5]]));
            rest = &rest[len..];
        }
        assert_eq!(
            kinds,
            [
                NFNL_MSG_BATCH_BEGIN,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELTABLE,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE,
                NFNL_MSG_BATCH_END,
            ]
        );
        assert_eq!(b.acked.len(), 3);
    }

    #[test]
    fn answers_reads_acks_and_errors_by_sequence() {
        let mut buf = Vec::new();
        for (seq, code) in [(2u32, 0i32), (3, -22)] {
            buf.extend_from_slice(&36u32.to_ne_bytes());
            buf.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            buf.extend_from_slice(&0u16.to_ne_bytes());
            buf.extend_from_slice(&seq.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            buf.extend_from_slice(&code.to_ne_bytes());
            buf.extend_from_slice(&[0; 16]);
        }
        assert_eq!(answers(&buf), [(2, 0), (3, -22)]);
    }
}
