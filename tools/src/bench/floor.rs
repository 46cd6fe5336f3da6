//! The floor: what the kernel path cannot avoid on this kernel, measured with
//! trivial programs. The kernel runs a cgroup sock_ops program five times on every
//! active connect whatever the program asks for, and writing TCP payload from BPF
//! needs a psock, created when the socket enters a sockmap and freed when it leaves.
//! So the floor is the direct path from a cgroup with a sock_ops program that does
//! nothing but insert the socket into a one-slot sockmap once it is established (the
//! next connection's insert, or its close, deletes it): five empty runs and one
//! psock insert and delete per connection.
//!
//! The program is thirteen instructions, assembled here and loaded with the bpf(2)
//! syscall: no object file, no loader, nothing of hairpin's.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_MAP_TYPE_SOCKMAP: u32 = 15;
const BPF_PROG_TYPE_SOCK_OPS: u32 = 13;
const BPF_CGROUP_SOCK_OPS: u32 = 3;
/// `bpf_sock_map_update` (helper 53).
const HELPER_SOCK_MAP_UPDATE: i32 = 53;
/// `BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB`: the client's SYN-ACK has arrived.
const ACTIVE_ESTABLISHED: i32 = 4;

/// One `struct bpf_insn`: opcode, registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst | (src << 4)) << 8)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// The floor's sock_ops program, with `map_fd` as its sockmap.
fn program(map_fd: i32) -> Vec<u64> {
    vec![
        insn(0xbf, 6, 1, 0, 0),                      // r6 = r1 (the context)
        insn(0x61, 2, 1, 0, 0),                      // r2 = ctx->op
        insn(0x55, 2, 0, 8, ACTIVE_ESTABLISHED),     // if r2 != ACTIVE_ESTABLISHED goto out
        insn(0x62, 10, 0, -4, 0),                    // *(u32 *)(r10 - 4) = 0: the key
        insn(0xbf, 1, 6, 0, 0),                      // r1 = ctx
        insn(0x18, 2, 1, 0, map_fd),                 // r2 = the map (ld_imm64, map fd)
        0,                                           //   its second half
        insn(0xbf, 3, 10, 0, 0),                     // r3 = r10
        insn(0x07, 3, 0, 0, -4),                     // r3 += -4: &key
        insn(0xb7, 4, 0, 0, 0),                      // r4 = BPF_ANY
        insn(0x85, 0, 0, 0, HELPER_SOCK_MAP_UPDATE), // bpf_sock_map_update()
        insn(0xb7, 0, 0, 0, 1),                      // out: r0 = 1
        insn(0x95, 0, 0, 0, 0),                      // exit
    ]
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> std::io::Result<i32> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` of the size passed.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as i32)
}

fn put32(attr: &mut [u8; 128], at: usize, v: u32) {
    attr[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(attr: &mut [u8; 128], at: usize, v: u64) {
    attr[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The floor's cgroup with the trivial program attached; detached and removed on
/// drop.
pub struct Floor {
    cgroup: PathBuf,
    cgroup_fd: std::fs::File,
    prog: OwnedFd,
    _map: OwnedFd,
}

impl Floor {
    /// Makes cgroup `cgroup` (it must not be under hairpin's attach point) and
    /// attaches the floor's program there.
    pub fn attach(cgroup: &Path) -> Result<Floor> {
        std::fs::create_dir_all(cgroup)
            .with_context(|| format!("create cgroup {}", cgroup.display()))?;
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_MAP_TYPE_SOCKMAP);
        put32(&mut attr, 4, 4); // key size
        put32(&mut attr, 8, 4); // value size
        put32(&mut attr, 12, 1); // entries
        let map = bpf(BPF_MAP_CREATE, &mut attr).context("create the floor's sockmap")?;
        // SAFETY: a descriptor the kernel just returned, owned by nobody else.
        let map = unsafe { OwnedFd::from_raw_fd(map) };
        let insns = program(map.as_raw_fd());
        let license = CString::new("GPL").expect("no NUL");
        let mut log = vec![0u8; 4096];
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_PROG_TYPE_SOCK_OPS);
        put32(&mut attr, 4, insns.len() as u32);
        put64(&mut attr, 8, insns.as_ptr() as u64);
        put64(&mut attr, 16, license.as_ptr() as u64);
        put32(&mut attr, 24, 1); // log level
        put32(&mut attr, 28, log.len() as u32);
        put64(&mut attr, 32, log.as_mut_ptr() as u64);
        attr[48..48 + 11].copy_from_slice(b"bench_floor");
        let prog = bpf(BPF_PROG_LOAD, &mut attr).with_context(|| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            format!(
                "load the floor's sock_ops program: {}",
                String::from_utf8_lossy(&log[..end])
            )
        })?;
        // SAFETY: as above.
        let prog = unsafe { OwnedFd::from_raw_fd(prog) };
        let cgroup_fd = std::fs::File::open(cgroup)
            .with_context(|| format!("open cgroup {}", cgroup.display()))?;
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, cgroup_fd.as_raw_fd() as u32);
        put32(&mut attr, 4, prog.as_raw_fd() as u32);
        put32(&mut attr, 8, BPF_CGROUP_SOCK_OPS);
        bpf(BPF_PROG_ATTACH, &mut attr)
            .with_context(|| format!("attach the floor's program to {}", cgroup.display()))?;
        Ok(Floor {
            cgroup: cgroup.to_path_buf(),
            cgroup_fd,
            prog,
            _map: map,
        })
    }

    /// The cgroup the floor's clients run in.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, self.cgroup_fd.as_raw_fd() as u32);
        put32(&mut attr, 4, self.prog.as_raw_fd() as u32);
        put32(&mut attr, 8, BPF_CGROUP_SOCK_OPS);
        let _ = bpf(BPF_PROG_DETACH, &mut attr);
        // Empty by now: the floor's clients have exited.
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        // `r2 = *(u32 *)(r1 + 0)`: 0x61, dst 2, src 1.
        assert_eq!(insn(0x61, 2, 1, 0, 0), 0x1261);
        // `*(u32 *)(r10 - 4) = 0`: offset -4 as 0xfffc.
        assert_eq!(insn(0x62, 10, 0, -4, 0), 0xfffc_0a62);
        // `r3 += -4`: the immediate's two's complement in the high word.
        assert_eq!(insn(0x07, 3, 0, 0, -4) >> 32, 0xffff_fffc);
        // The jump over the update lands on `r0 = 1`.
        let p = program(7);
        assert_eq!(p.len(), 13);
        assert_eq!(p[2 + 1 + 8], insn(0xb7, 0, 0, 0, 1));
        assert_eq!(p[5] >> 32, 7);
    }
}
