//! A stand-in for a socket load balancer (Cilium's `cil_sock4_connect` with its
//! kube-proxy replacement, Calico eBPF's `calico_connect_v4`): cgroup connect4 and
//! connect6 programs of a few BPF instructions, loaded and linked with raw bpf(2)
//! calls (the agent's own, `hairpin_agent::datapath::link_create`), that rewrite a service
//! address to a backend at connect time, as those do for a LoadBalancer IP, or
//! refuse the connect (as Cilium does for a service without backends). Their names are their own (`socklb4_connect`,
//! `socklb6_connect`), so a test can tell them from hairpin's in `bpftool` and in
//! what `status` and `doctor` say.
//!
//! Linked with no flags, a link goes after every program already at the cgroup:
//! attached before the agent starts, the stand-in is what a node with Cilium has at
//! its cgroup root when hairpin arrives. Dropping it detaches it.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use hairpin_agent::datapath::{AttachType, bpf_fd, link_create};

/// The kernel name of the stand-in's connect4 program.
pub const SOCKET_LB4: &str = "socklb4_connect";
/// The kernel name of the stand-in's connect6 program.
pub const SOCKET_LB6: &str = "socklb6_connect";

/// What the stand-in does with a connect to one service address.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    /// Rewrite the destination to this backend (same family).
    Rewrite(SocketAddr, SocketAddr),
    /// Refuse the connect (EPERM), as a socket LB does for a service without
    /// backends.
    Refuse(SocketAddr),
}

impl Rule {
    fn service(&self) -> SocketAddr {
        match *self {
            Rule::Rewrite(from, _) | Rule::Refuse(from) => from,
        }
    }
}

/// The loaded stand-in and its links; detached on drop.
pub struct SocketLb {
    _links: Vec<OwnedFd>,
    _programs: Vec<OwnedFd>,
}

impl SocketLb {
    /// Loads the stand-in for `rules` and links its connect4 and connect6 programs at
    /// `cgroup`, after whatever is attached there.
    pub fn attach(cgroup: &Path, rules: &[Rule]) -> io::Result<SocketLb> {
        let dir = std::fs::File::open(cgroup)?;
        let mut links = Vec::new();
        let mut programs = Vec::new();
        for v6 in [false, true] {
            let mine: Vec<Rule> = rules
                .iter()
                .copied()
                .filter(|r| r.service().is_ipv6() == v6)
                .collect();
            let (name, attach) = if v6 {
                (SOCKET_LB6, AttachType::Connect6)
            } else {
                (SOCKET_LB4, AttachType::Connect4)
            };
            let prog = prog_load(name, attach, &program(&mine, v6))?;
            // No flags: after whatever is attached there.
            links.push(link_create(prog.as_fd(), dir.as_fd(), attach, 0)?);
            programs.push(prog);
        }
        Ok(SocketLb {
            _links: links,
            _programs: programs,
        })
    }
}

/// `BPF_PROG_LOAD`.
const BPF_PROG_LOAD: libc::c_long = 5;
/// `BPF_PROG_TYPE_CGROUP_SOCK_ADDR`.
const PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
/// Offsets in `struct bpf_sock_addr`.
const USER_IP4: i16 = 4;
const USER_IP6: i16 = 8;
const USER_PORT: i16 = 24;

/// One BPF instruction, as the kernel lays it out.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// `r2 = *(u32 *)(r1 + off)`.
fn load_ctx(off: i16) -> Insn {
    insn(0x61, 2, 1, off, 0)
}

/// `if w2 != imm goto +off` (a 32-bit compare, so any u32 fits the immediate).
fn jne(imm: u32, off: i16) -> Insn {
    insn(0x56, 2, 0, off, imm as i32)
}

/// `w2 = imm; *(u32 *)(r1 + off) = r2` (a context field takes no immediate store).
fn store_ctx(off: i16, imm: u32) -> [Insn; 2] {
    [insn(0xb4, 2, 0, 0, imm as i32), insn(0x63, 1, 2, off, 0)]
}

/// `r0 = imm; exit`.
fn ret(imm: i32) -> [Insn; 2] {
    [insn(0xb7, 0, 0, 0, imm), insn(0x95, 0, 0, 0, 0)]
}

/// An address's 32-bit words as `bpf_sock_addr` holds them (network byte order),
/// and its port likewise.
fn words(a: SocketAddr) -> (Vec<u32>, u32) {
    let port = u32::from(a.port().to_be());
    let w = match a.ip() {
        IpAddr::V4(ip) => vec![u32::from_ne_bytes(ip.octets())],
        IpAddr::V6(ip) => ip
            .octets()
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    (w, port)
}

/// The program: for each rule, compare the destination's words and port, and on a
/// match rewrite (then allow) or refuse; anything else is allowed untouched.
fn program(rules: &[Rule], v6: bool) -> Vec<Insn> {
    let base = if v6 { USER_IP6 } else { USER_IP4 };
    let mut out = Vec::new();
    for rule in rules {
        let (service, port) = words(rule.service());
        let mut action = Vec::new();
        match *rule {
            Rule::Rewrite(_, to) => {
                let (to, to_port) = words(to);
                for (i, w) in to.iter().enumerate() {
                    action.extend(store_ctx(base + 4 * i as i16, *w));
                }
                action.extend(store_ctx(USER_PORT, to_port));
                action.extend(ret(1));
            }
            Rule::Refuse(_) => action.extend(ret(0)),
        }
        // Each compare jumps past the rest of this rule's compares and its action.
        let checks: Vec<(i16, u32)> = service
            .iter()
            .enumerate()
            .map(|(i, w)| (base + 4 * i as i16, *w))
            .chain([(USER_PORT, port)])
            .collect();
        let mut left = 2 * checks.len() + action.len();
        for (off, want) in checks {
            left -= 2;
            out.push(load_ctx(off));
            out.push(jne(want, left as i16));
        }
        out.extend(action);
    }
    out.extend(ret(1));
    out
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

fn prog_load(name: &str, attach: AttachType, insns: &[Insn]) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut prog_name = [0u8; 16];
    prog_name[..name.len()].copy_from_slice(name.as_bytes());
    let mut attr = ProgLoadAttr {
        prog_type: PROG_TYPE_CGROUP_SOCK_ADDR,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name,
        expected_attach_type: attach.raw(),
        ..ProgLoadAttr::default()
    };
    // SAFETY: a #[repr(C)] prefix of bpf_attr for BPF_PROG_LOAD, zeroed beyond
    // expected_attach_type; the instructions, the license and the log outlive the call.
    unsafe { bpf_fd(BPF_PROG_LOAD, &mut attr) }.map_err(|e| {
        let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
        io::Error::new(
            e.kind(),
            format!("load {name}: {e}: {}", String::from_utf8_lossy(&log[..end])),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compare_of_a_rule_jumps_to_the_next_rule() {
        let from: SocketAddr = "203.0.113.10:80".parse().expect("addr");
        let to: SocketAddr = "198.51.100.20:80".parse().expect("addr");
        let p = program(&[Rule::Rewrite(from, to), Rule::Refuse(from)], false);
        // Rule 1: 2 compares (4 insns) and 6 action insns; rule 2: 4 + 2; the end 2.
        assert_eq!(p.len(), 10 + 6 + 2);
        // The first compare skips the second compare and the action: to index 10.
        assert_eq!(1 + 1 + i32::from(p[1].off), 10);
        assert_eq!(3 + 1 + i32::from(p[3].off), 10);
        assert_eq!(11 + 1 + i32::from(p[11].off), 16);
        assert_eq!((p[14].imm, p[15].code), (0, 0x95), "rule 2 refuses");
        assert_eq!(
            (p[16].imm, p[17].code),
            (1, 0x95),
            "anything else is allowed"
        );
    }
}
