//! The VM's initramfs: busybox (Debian's static build), the 9p module chain in
//! dependency order, and an init that mounts this machine's root read-only over 9p,
//! enters it with chroot, runs the given script as root and prints its exit status on
//! the console as a sentinel line before powering off.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::kernel::KernelTree;
use crate::run;

/// The line init prints with the script's exit status: `HAIRPIN-VM-EXIT=<status>`.
pub(super) const EXIT_SENTINEL: &str = "HAIRPIN-VM-EXIT=";

/// busybox-static's binary.
pub(super) const BUSYBOX: &str = "/bin/busybox";

/// The modules that mount the host's root: virtio's PCI transport, 9p over virtio,
/// the 9p file system. `modprobe --show-depends` expands each into its chain.
const ROOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// The init the kernel runs (busybox sh). The chroot's tmpfs mounts give the tests
/// the writable /tmp, /run (netns names, xtables lock) and /var/log they need over a
/// read-only root; cgroup2 at /sys/fs/cgroup as on a unified host; bpffs for pins.
/// The kernel loads modules (veth, netfilter) through /proc/sys/kernel/modprobe,
/// resolved in the initramfs: a wrapper running the host's kmod against the
/// extracted package's modules.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "hairpin-vm: kernel $(uname -r), loading the 9p modules"
for m in $(cat /modules.list); do
  insmod "/mods/$m" || echo "hairpin-vm: insmod $m failed"
done
mkdir -p /host
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 host /host; then
  echo "hairpin-vm: mounting the host's root over 9p failed"
  echo "HAIRPIN-VM-EXIT=125"
  poweroff -f
fi
echo /bin/modprobe-host > /proc/sys/kernel/modprobe
ip link set lo up
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
mount -t tmpfs log /host/var/log
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
mount -t bpf bpf /host/sys/fs/bpf
mount -t debugfs debugfs /host/sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /host/sys/kernel/tracing 2>/dev/null
echo "hairpin-vm: running the script in the host's root"
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp \
  chroot /host /bin/sh -c "$(cat /script)" </dev/null
rc=$?
sync
echo "HAIRPIN-VM-EXIT=$rc"
poweroff -f
"#;

/// Builds the initramfs for `kernel` running `script` (sh, inside the host's root)
/// into `dir`; returns the gzipped cpio archive.
pub(super) fn build(kernel: &KernelTree, script: &str, dir: &Path) -> Result<PathBuf> {
    let tree = dir.join("initramfs");
    let _ = fs::remove_dir_all(&tree);
    for sub in ["bin", "mods", "proc", "sys", "dev", "host"] {
        fs::create_dir_all(tree.join(sub))
            .with_context(|| format!("failed to create {}", tree.join(sub).display()))?;
    }
    fs::copy(BUSYBOX, tree.join("bin/busybox"))
        .with_context(|| format!("failed to copy {BUSYBOX} (busybox-static)"))?;
    write_exec(&tree.join("init"), INIT)?;
    fs::write(tree.join("script"), script)?;
    let modules = root_module_chain(kernel)?;
    let mut names = String::new();
    for module in &modules {
        let file = module
            .file_name()
            .context("module path without a name")?
            .to_string_lossy()
            .into_owned();
        // busybox's insmod takes plain ELF: 6.12's modules are xz-compressed.
        let (plain, bytes) = if let Some(base) = file.strip_suffix(".xz") {
            let out = Command::new("xz").arg("-dc").arg(module).output()?;
            if !out.status.success() {
                bail!("xz could not decompress {}", module.display());
            }
            (base.to_string(), out.stdout)
        } else if let Some(base) = file.strip_suffix(".zst") {
            let out = Command::new("zstd").arg("-dc").arg(module).output()?;
            if !out.status.success() {
                bail!("zstd could not decompress {}", module.display());
            }
            (base.to_string(), out.stdout)
        } else {
            (file.clone(), fs::read(module)?)
        };
        fs::write(tree.join("mods").join(&plain), bytes)?;
        names.push_str(&plain);
        names.push('\n');
    }
    fs::write(tree.join("modules.list"), names)?;
    // Run by the kernel (argv `-q -- NAME`) from the initramfs's root: kmod from the
    // host's root, reading the extracted package's modules.
    write_exec(
        &tree.join("bin/modprobe-host"),
        &format!(
            "#!/bin/sh\nexec /bin/chroot /host /usr/sbin/modprobe -d '{}' -S '{}' \"$@\"\n",
            kernel.root.display(),
            kernel.release
        ),
    )?;
    let archive = dir.join("initramfs.cpio.gz");
    run(Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . | cpio -o -H newc --quiet | gzip -1 > \"$2\"")
        .arg("sh")
        .arg(&tree)
        .arg(&archive))
    .context("could not pack the initramfs (cpio, gzip)")?;
    Ok(archive)
}

fn write_exec(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("failed to write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The module files that mount 9p, each once, dependencies first (built-in ones,
/// such as 6.12's virtio_pci, are left out).
fn root_module_chain(kernel: &KernelTree) -> Result<Vec<PathBuf>> {
    let mut chain: Vec<PathBuf> = Vec::new();
    for module in ROOT_MODULES {
        let out = Command::new("modprobe")
            .arg("-d")
            .arg(&kernel.root)
            .arg("-S")
            .arg(&kernel.release)
            .arg("--show-depends")
            .arg(module)
            .output()
            .context("failed to run modprobe (kmod)")?;
        if !out.status.success() {
            bail!(
                "modprobe --show-depends {module} for {} failed: {}",
                kernel.release,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // `insmod /path/to/x.ko ` or `builtin x`.
            if let Some(path) = line.strip_prefix("insmod ") {
                let path = PathBuf::from(path.trim());
                if !chain.contains(&path) {
                    chain.push(path);
                }
            }
        }
    }
    if chain.is_empty() && !kernel.root.join("lib/modules").is_dir() {
        bail!(
            "no modules for {} in {}",
            kernel.release,
            kernel.root.display()
        );
    }
    Ok(chain)
}
