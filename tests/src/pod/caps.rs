//! Capabilities by name and the capset(2) call, and a child process limited to some
//! capabilities as containerd limits a container.

use std::{collections::BTreeSet, fs};

/// Capability numbers of `CAP_` names (linux/capability.h).
pub fn cap_number(name: &str) -> u32 {
    const NAMES: [&str; 41] = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_DAC_READ_SEARCH",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_LINUX_IMMUTABLE",
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_BROADCAST",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_IPC_LOCK",
        "CAP_IPC_OWNER",
        "CAP_SYS_MODULE",
        "CAP_SYS_RAWIO",
        "CAP_SYS_CHROOT",
        "CAP_SYS_PTRACE",
        "CAP_SYS_PACCT",
        "CAP_SYS_ADMIN",
        "CAP_SYS_BOOT",
        "CAP_SYS_NICE",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_TIME",
        "CAP_SYS_TTY_CONFIG",
        "CAP_MKNOD",
        "CAP_LEASE",
        "CAP_AUDIT_WRITE",
        "CAP_AUDIT_CONTROL",
        "CAP_SETFCAP",
        "CAP_MAC_OVERRIDE",
        "CAP_MAC_ADMIN",
        "CAP_SYSLOG",
        "CAP_WAKE_ALARM",
        "CAP_BLOCK_SUSPEND",
        "CAP_AUDIT_READ",
        "CAP_PERFMON",
        "CAP_BPF",
        "CAP_CHECKPOINT_RESTORE",
    ];
    NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("unknown capability {name}")) as u32
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

pub(super) fn capset(effective: u64, permitted: u64, inheritable: u64) -> std::io::Result<()> {
    const V3: u32 = 0x2008_0522;
    let hdr = CapHeader {
        version: V3,
        pid: 0,
    };
    let lo = |m: u64| m as u32;
    let hi = |m: u64| (m >> 32) as u32;
    let data = [
        CapData {
            effective: lo(effective),
            permitted: lo(permitted),
            inheritable: lo(inheritable),
        },
        CapData {
            effective: hi(effective),
            permitted: hi(permitted),
            inheritable: hi(inheritable),
        },
    ];
    // SAFETY: capset(2) with a v3 header and two data structs, as the kernel expects.
    let r = unsafe { libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `cmd` (run as root) start with exactly the capabilities `caps` (`CAP_`
/// names), as the container's process would have them: every other one dropped from
/// the bounding set (which is what a root process's permitted and effective sets
/// become at execve), the permitted and effective sets cut to `caps`, and the
/// ambient set cleared. Only the child is changed; steps that need more (joining a
/// network namespace) must be registered on `cmd` before this.
pub fn with_only_caps(cmd: &mut std::process::Command, caps: &[&str]) {
    use std::os::unix::process::CommandExt;
    let last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .expect("read cap_last_cap")
        .trim()
        .parse()
        .expect("cap_last_cap is a number");
    let keep: BTreeSet<u32> = caps.iter().map(|c| cap_number(c)).collect();
    let mask: u64 = keep.iter().fold(0, |m, c| m | (1u64 << c));
    // SAFETY: the closure only makes prctl and capset system calls, which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for cap in 0..=last_cap {
                if mask & (1u64 << cap) == 0
                    && libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            capset(mask, mask, 0)?;
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
}
