//! The kernel path's sockets map, pinned in a bpf filesystem so it outlives the agent.
//!
//! A socket enters the sockets map when its handshake completes and gets its header
//! from the map's sk_msg program on its first write. Unpinned, the map goes with the
//! agent's process: a socket established but not yet written when the agent is
//! SIGKILLed or OOM-killed, or outlives its SIGTERM drain, would write without its
//! header. Pinned, the map and its sk_msg program stay in the kernel, so every socket
//! already in it still gets its header; the cgroup programs are links of the process
//! and still detach with it, so connects made after that go the way they went before
//! hairpin, and no new socket ever enters the pinned map.
//!
//! Each agent pins its own map as `sockets-<map id>` in the pin directory. At start,
//! an agent adopts the maps earlier agents left there: it removes each pin once its
//! map holds no socket (every socket in it wrote or closed), so the kernel frees it.

use std::{
    fs,
    os::fd::AsFd,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{Map, MapData, SockHash};
use tracing::{info, warn};

/// `statfs` type of a bpf filesystem (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The pin file name prefix; the map id follows.
pub const SOCKETS_PIN_PREFIX: &str = "sockets-";

/// Pins the sockets map behind `fd` (kernel id `id`) as `sockets-<id>` in `dir`,
/// which is made (mode 0700) when missing. `dir` must be on a bpf filesystem: a pin
/// anywhere else could not outlive the process, so that is refused with the reason.
pub fn pin_sockets(dir: &Path, fd: impl AsFd, id: u32) -> Result<PathBuf, String> {
    ensure_dir(dir)?;
    let path = dir.join(format!("{SOCKETS_PIN_PREFIX}{id}"));
    let owned = fd
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("dup of the sockets map's descriptor: {e}"))?;
    let map = MapData::from_fd(owned).map_err(|e| format!("the sockets map: {e}"))?;
    map.pin(&path)
        .map_err(|e| format!("pin at {}: {e}", path.display()))?;
    Ok(path)
}

/// Makes `dir` (0700) when missing and checks that it is on a bpf filesystem.
fn ensure_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.is_dir() {
        let parent = dir.parent().unwrap_or(Path::new("/"));
        check_bpffs(parent)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    }
    check_bpffs(dir)
}

/// Ok when `path` is on a bpf filesystem; else what it is on, and what to mount.
fn check_bpffs(path: &Path) -> Result<(), String> {
    let st =
        nix::sys::statfs::statfs(path).map_err(|e| format!("{}: statfs: {e}", path.display()))?;
    let kind = st.filesystem_type().0 as i64;
    if kind == BPF_FS_MAGIC {
        Ok(())
    } else {
        Err(format!(
            "{} is not on a bpf filesystem (statfs type {kind:#x}, expected {BPF_FS_MAGIC:#x}): \
             mount the host's /sys/fs/bpf there (the kernel-path deploy component does)",
            path.display()
        ))
    }
}

/// Removes the pin at `path` (the map is freed once nothing else holds it). A pin
/// already gone is fine.
pub fn unpin(path: &Path) -> Result<(), String> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("remove {}: {e}", path.display())),
    }
}

/// The sockets-map pins in `dir`, sorted.
pub fn pins(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(SOCKETS_PIN_PREFIX)
        })
        .map(|e| e.path())
        .collect();
    paths.sort();
    Ok(paths)
}

/// A sockets map an earlier agent pinned and this one watches until it is empty.
pub struct Inherited {
    /// The pin.
    pub path: PathBuf,
    map: SockHash<MapData, u64>,
}

impl std::fmt::Debug for Inherited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inherited")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Inherited {
    /// Sockets still in the map: established under the earlier agent and not yet
    /// closed (or not yet written: those are why it is kept). A key that cannot be
    /// read counts as a socket, so the pin is never removed on a doubt.
    pub fn sockets(&self) -> usize {
        self.map.keys().count()
    }
}

/// The sockets maps pinned in `dir` other than `own`, each opened, and the pins that
/// could not be opened with the reason. A missing `dir` has none.
pub fn inherited(dir: &Path, own: Option<&Path>) -> (Vec<Inherited>, Vec<(PathBuf, String)>) {
    let mut maps = Vec::new();
    let mut failed = Vec::new();
    let Ok(paths) = pins(dir) else {
        return (maps, failed);
    };
    for path in paths.into_iter().filter(|p| Some(p.as_path()) != own) {
        let opened = MapData::from_pin(&path)
            .map_err(|e| e.to_string())
            .and_then(|m| SockHash::try_from(Map::SockHash(m)).map_err(|e| e.to_string()));
        match opened {
            Ok(map) => maps.push(Inherited { path, map }),
            Err(e) => failed.push((path, e)),
        }
    }
    (maps, failed)
}

/// Watches `maps` every `every` and removes each pin once its map is empty, until
/// none is left. Logs what it found at the start and each removal.
pub async fn release_when_empty(mut maps: Vec<Inherited>, every: Duration) {
    for m in &maps {
        info!(pin = %m.path.display(), sockets = m.sockets(),
            "an earlier agent's sockets map: its sockets keep their header; unpinned once they are gone");
    }
    loop {
        maps.retain(|m| {
            if m.sockets() > 0 {
                return true;
            }
            match unpin(&m.path) {
                Ok(()) => info!(pin = %m.path.display(), "an earlier agent's sockets map is empty: unpinned"),
                Err(e) => warn!(error = %e, "an earlier agent's empty sockets map could not be unpinned"),
            }
            false
        });
        if maps.is_empty() {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_off_bpffs_is_refused_with_what_to_mount() {
        let dir = std::env::temp_dir();
        let e = check_bpffs(&dir).expect_err("a temp dir is not bpffs");
        assert!(e.contains("is not on a bpf filesystem"), "{e}");
        assert!(e.contains("/sys/fs/bpf"), "{e}");
    }

    #[test]
    fn unpinning_what_is_gone_is_fine() {
        let p = std::env::temp_dir().join("hairpin-no-such-pin");
        assert_eq!(unpin(&p), Ok(()));
    }

    #[test]
    fn a_missing_pin_dir_has_nothing_inherited() {
        let (maps, failed) = inherited(Path::new("/nonexistent/hairpin"), None);
        assert!(maps.is_empty() && failed.is_empty());
    }
}
