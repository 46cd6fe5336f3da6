//! Booting a kernel under qemu (TCG: a KVM guest hangs on these machines) with the
//! host's root shared read-only over 9p; the console streamed, logged, and read for
//! the init's exit sentinel, under a hard timeout.

use std::{
    collections::VecDeque,
    fs::File,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{initramfs::EXIT_SENTINEL, kernel::KernelTree};

/// How many console lines a failure quotes.
const TAIL: usize = 40;

/// What a boot printed and returned.
pub(super) struct Boot {
    /// The script's exit status, from the sentinel line.
    pub(crate) status: i32,
    /// Every console line.
    pub(crate) console: Vec<String>,
    /// From qemu's start to the first line the init printed.
    pub(crate) to_userspace: Option<Duration>,
    /// From qemu's start to its exit.
    pub(crate) total: Duration,
}

/// Boots `kernel` with `initrd` (2 vCPUs, `memory_mib`), echoing the console with
/// `prefix` and writing it to `log`; kills qemu after `timeout`. Fails, quoting the
/// console's last lines, when no exit sentinel was printed.
pub(super) fn boot(
    kernel: &KernelTree,
    initrd: &Path,
    memory_mib: u32,
    timeout: Duration,
    log: &Path,
) -> Result<Boot> {
    let mut cmd = Command::new("qemu-system-x86_64");
    // One emulation thread for both vCPUs: with thread=multi, Linux 6.12 took an
    // int3 Oops in get_random_u32 while a static key was being patched (attaching
    // cgroup programs flips static keys; cross-modifying code is not coherent across
    // multi-threaded TCG vCPUs) and panicked mid-suite.
    cmd.args(["-accel", "tcg,thread=single", "-smp", "2", "-m"])
        .arg(memory_mib.to_string())
        .args([
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
            "-monitor",
            "none",
        ])
        .args(["-serial", "stdio", "-kernel"])
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        // mitigations=off: the guest's speculation barriers cost much under emulation
        // and guard nothing here. no_timer_check: on a loaded host the emulated timer
        // can miss the kernel's early IO-APIC check, which then panics at boot ("IO-APIC
        // + timer doesn't work!", seen here with two builds running).
        .args([
            "-append",
            "console=ttyS0 panic=-1 quiet mitigations=off no_timer_check",
            "-virtfs",
            "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .context("failed to start qemu-system-x86_64 (package qemu-system-x86)")?;
    let stdout = child.stdout.take().context("qemu's stdout")?;
    let stderr = child.stderr.take().context("qemu's stderr")?;
    let (tx, rx) = mpsc::channel::<String>();
    let tx2 = tx.clone();
    let readers = [
        std::thread::spawn(move || forward(stdout, &tx)),
        std::thread::spawn(move || forward(stderr, &tx2)),
    ];
    let mut file =
        File::create(log).with_context(|| format!("failed to create {}", log.display()))?;
    let prefix = format!("[linux {}] ", kernel.series.name());
    let mut console = Vec::new();
    let mut status = None;
    let mut to_userspace = None;
    let deadline = start + timeout;
    let mut timed_out = false;
    loop {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            let _ = child.kill();
            break;
        }
        match rx.recv_timeout((deadline - now).min(Duration::from_millis(500))) {
            Ok(line) => {
                let line = strip_control(&line);
                let _ = writeln!(file, "{line}");
                eprintln!("{prefix}{line}");
                if to_userspace.is_none() && line.starts_with("hairpin-vm:") {
                    to_userspace = Some(start.elapsed());
                }
                if let Some(rc) = line.trim().strip_prefix(EXIT_SENTINEL) {
                    status = rc.trim().parse().ok();
                }
                console.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // Both pipes closed: qemu exited.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.wait();
    for r in readers {
        let _ = r.join();
    }
    let total = start.elapsed();
    let tail = || {
        let last: VecDeque<&String> = console.iter().rev().take(TAIL).collect();
        last.into_iter()
            .rev()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    };
    match status {
        Some(status) => Ok(Boot {
            status,
            console,
            to_userspace,
            total,
        }),
        None if timed_out => bail!(
            "the Linux {} VM did not finish within {}s (killed); console log {}; its last lines:\n{}",
            kernel.series.name(),
            timeout.as_secs(),
            log.display(),
            tail()
        ),
        None => bail!(
            "the Linux {} VM stopped without reporting an exit status; console log {}; its last lines:\n{}",
            kernel.series.name(),
            log.display(),
            tail()
        ),
    }
}

fn forward(pipe: impl std::io::Read, tx: &mpsc::Sender<String>) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                if tx.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

/// The line without terminal escapes (SeaBIOS clears the screen) and carriage returns.
fn strip_control(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ params final-byte; other escapes: ESC and one char.
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' => {}
            c if c.is_control() && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// The directory a series' VM files go to (`target/vm/<series>`).
pub(super) fn work_dir(target: &Path, kernel: &KernelTree) -> Result<PathBuf> {
    let dir = target.join("vm").join(kernel.series.name());
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_stripped() {
        assert_eq!(
            strip_control("\u{1b}c\u{1b}[?7l\u{1b}[2JBooting from ROM..\r"),
            "Booting from ROM.."
        );
    }
}
