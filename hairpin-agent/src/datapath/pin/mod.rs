//! What outlives the agent: the datapath's links, programs and maps pinned in a bpf
//! filesystem (`--bpf-pin-dir`, the host's `/sys/fs/bpf/hairpin`), so that a
//! restart, an upgrade, a crash or an OOM kill leaves no instant without hairpin's
//! programs and no socket without the state its header needs.
//!
//! ```text
//! <dir>/                 flock()ed by the agent that owns the datapath
//!   v<PIN_LAYOUT>/maps/   every map the programs share, by ELF name
//!   v<PIN_LAYOUT>/links/  one bpf_link per hook (connect4, connect6, sock_ops,
//!                         setsockopt, sk_msg), by role; where the connect links
//!                         are at the root's child cgroups (a kernel that cannot
//!                         order cgroup links), one per hook and child:
//!                         `connect4@<child>`, `connect6@<child>`
//!   v<PIN_LAYOUT>/progs/  the program each link runs, for BPF_F_REPLACE
//! ```
//!
//! The layout version ([`hairpin_ebpf::PIN_LAYOUT`]) is in the path, so an agent
//! never reuses a map it would misread: one of another layout finds no maps of its
//! own and refuses to take over the links it finds (see [`PinDir::foreign_layouts`]).
//! A dead agent's datapath stays live until its heartbeat's TTL passes; `cleanup`
//! and an uninstall remove it ([`remove_all`]).
//!
//! Owns the directory: its lock, its layout, what is pinned where, whether this
//! agent's datapath is pinned ([`Pin`]) and the removal of another layout's expired
//! datapath. Never loads or links a program and never writes a map entry; it reads
//! only the heartbeat of another layout (through liveness.rs).

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use aya::maps::{Map, MapData, SockHash};
use tracing::{info, warn};

use super::role::Role;

/// Between a hook's name and a child cgroup's in the pin of a link at that child
/// (`connect4@kubepods.slice`).
pub(crate) const CHILD_SEPARATOR: char = '@';

/// The child cgroup of a link pin named `name` at `role` (`connect4@system.slice`:
/// `system.slice`), `None` for any other pin.
pub(crate) fn child_of_pin(name: &str, role: Role) -> Option<&str> {
    name.strip_prefix(role.name())?
        .strip_prefix(CHILD_SEPARATOR)
        .filter(|c| !c.is_empty())
}

/// `statfs` type of a bpf filesystem (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The pin name prefix of the sockets maps earlier releases pinned one per agent
/// (`sockets-<map id>`); the map id follows. Adopted and removed once empty.
pub(crate) const SOCKETS_PIN_PREFIX: &str = "sockets-";

/// Why the pin directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PinError {
    /// Not on a bpf filesystem: nothing pinned there could outlive the agent.
    #[error(
        "{path} is not on a bpf filesystem (statfs type {found:#x}, expected {BPF_FS_MAGIC:#x}): \
         mount the host's /sys/fs/bpf/hairpin there (the DaemonSet does)"
    )]
    NotBpffs {
        /// The directory.
        path: PathBuf,
        /// Its filesystem type.
        found: i64,
    },
    /// Another process holds the directory's lock: another agent owns the datapath.
    #[error(
        "another process holds the lock of {path}: another hairpin agent owns this node's datapath"
    )]
    Busy {
        /// The directory.
        path: PathBuf,
    },
    /// A symbolic link where a pin directory must be: whoever planted it would
    /// have `cleanup` remove files wherever it points.
    #[error(
        "{path} is a symbolic link: a pin directory must be a real directory on a bpf filesystem"
    )]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// `--pin-owner`'s group is not among this process's groups: once the
    /// directories are handed over the agent could not reach its own pins.
    #[error(
        "--pin-owner {owner}: this process is not in group {gid} (its groups: {groups}), so it \
         could not reach {path} once handed over: give the pod that supplementary group \
         (securityContext.supplementalGroups: [{gid}]), as the DaemonSet does"
    )]
    NotInGroup {
        /// The pin directory.
        path: PathBuf,
        /// The owner asked for.
        owner: PinOwner,
        /// Its group.
        gid: u32,
        /// This process's groups, comma-separated.
        groups: String,
    },
    /// A filesystem call failed.
    #[error("failed to {op} {path}: {source}")]
    Io {
        /// What was tried.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Why the pin directory cannot be used ([`PinError`]), shared by the lifecycle's
/// states and `status`, which carry it as it is.
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct Unusable(Arc<PinError>);

impl Unusable {
    /// `e`, shared.
    pub(crate) fn new(e: PinError) -> Unusable {
        Unusable(Arc::new(e))
    }
}

/// Equal when they say the same: an I/O error has no equality of its own.
impl PartialEq for Unusable {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}

impl Eq for Unusable {}

mod owner;
pub(crate) use owner::{PinOwner, secure};
use owner::{check_in_group, private_dirs};

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PinError + 'a {
    move |source| PinError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The pin directory, locked by this process for as long as it lives: one agent
/// owns a node's datapath at a time.
pub(crate) struct PinDir {
    root: PathBuf,
    layout: u32,
    /// Holds the flock (released on drop, and by the kernel when the process dies).
    _lock: nix::fcntl::Flock<File>,
}

impl std::fmt::Debug for PinDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinDir")
            .field("root", &self.root)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl PinDir {
    /// Makes `root` and this layout's directories when missing, checks that they are
    /// on a bpf filesystem, and takes the lock without waiting: [`PinError::Busy`]
    /// when another process holds it. `layout` is [`PIN_LAYOUT`] but in tests.
    /// With `owner`, everything under `root` is handed to it ([`secure`]) once locked;
    /// without, the directories are 0700 (a hostPath made them 0755).
    pub(crate) fn lock(
        root: &Path,
        layout: u32,
        owner: Option<PinOwner>,
    ) -> Result<PinDir, PinError> {
        if let Some(owner) = owner {
            check_in_group(root, owner)?;
        }
        ensure_dir(root)?;
        let lock = File::open(root).map_err(io_error("open", root))?;
        match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(locked) => {
                let dir = PinDir {
                    root: root.to_path_buf(),
                    layout,
                    _lock: locked,
                };
                for sub in ["maps", "links", "progs"] {
                    let d = dir.layout_dir().join(sub);
                    fs::create_dir_all(&d).map_err(io_error("make", &d))?;
                }
                match owner {
                    Some(owner) => {
                        let changed = secure(root, owner)?;
                        if changed > 0 {
                            tracing::info!(
                                dir = %root.display(),
                                %owner,
                                changed,
                                "pin directory handed to its owner: no access for others"
                            );
                        }
                    }
                    None => private_dirs(root)?,
                }
                Ok(dir)
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(PinError::Busy {
                path: root.to_path_buf(),
            }),
            Err((_, e)) => Err(PinError::Io {
                op: "lock",
                path: root.to_path_buf(),
                source: e.into(),
            }),
        }
    }

    /// A pin directory at `root` on any filesystem, locked, without the bpf
    /// filesystem check: for the executor's unit tests, whose fake kernel keeps the
    /// pins in memory and only needs their paths.
    #[cfg(test)]
    pub(crate) fn for_tests(root: &Path, layout: u32) -> PinDir {
        let lock = File::open(root).expect("the test's directory opens");
        let locked = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .expect("the test's own directory is not locked by another");
        PinDir {
            root: root.to_path_buf(),
            layout,
            _lock: locked,
        }
    }

    /// The directory itself.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// This layout's directory, `v<layout>`.
    pub(crate) fn layout_dir(&self) -> PathBuf {
        self.root.join(format!("v{}", self.layout))
    }

    /// Where the map of ELF name `name` is pinned.
    pub(crate) fn map(&self, name: &str) -> PathBuf {
        self.layout_dir().join("maps").join(name)
    }

    /// Where the link of `role` is pinned.
    pub(crate) fn link(&self, role: Role) -> PathBuf {
        self.layout_dir().join("links").join(role.name())
    }

    /// Where the link of `role` at the root's child cgroup `child` is pinned
    /// (`None`: at the root itself, [`PinDir::link`]).
    pub(crate) fn link_at(&self, role: Role, child: Option<&str>) -> PathBuf {
        match child {
            Some(child) => self
                .layout_dir()
                .join("links")
                .join(format!("{}{CHILD_SEPARATOR}{child}", role.name())),
            None => self.link(role),
        }
    }

    /// The directory of the links.
    pub(crate) fn links_dir(&self) -> PathBuf {
        self.layout_dir().join("links")
    }

    /// Where the program the link of `role` runs is pinned.
    pub(crate) fn prog(&self, role: Role) -> PathBuf {
        self.layout_dir().join("progs").join(role.name())
    }

    /// The layout directories other than this agent's (`v*`) that hold links: a
    /// datapath of another layout, which this agent never adopts.
    pub(crate) fn foreign_layouts(&self) -> Vec<PathBuf> {
        let own = self.layout_dir();
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| *p != own && is_layout_dir(p))
            .filter(|p| fs::read_dir(p.join("links")).is_ok_and(|mut links| links.next().is_some()))
            .collect();
        found.sort();
        found
    }
}

/// `v<number>`.
/// Takes the lock of an existing pin directory `root` for `cleanup`, waiting up to
/// `within` for an agent that is exiting: [`PinError::Busy`] when one still holds
/// it after that (removing a live agent's datapath under it is not cleanup's to
/// do), [`PinError::Symlink`] for a symbolic link, [`PinError::NotBpffs`] for a
/// directory elsewhere. The directory is opened without following a link.
pub(crate) fn lock_for_cleanup(
    root: &Path,
    within: std::time::Duration,
) -> Result<nix::fcntl::Flock<File>, PinError> {
    use std::os::unix::fs::OpenOptionsExt;
    if fs::symlink_metadata(root)
        .map_err(io_error("stat", root))?
        .file_type()
        .is_symlink()
    {
        return Err(PinError::Symlink {
            path: root.to_path_buf(),
        });
    }
    check_bpffs(root)?;
    let deadline = std::time::Instant::now() + within;
    loop {
        let dir = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
            .open(root)
            .map_err(io_error("open", root))?;
        match nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(locked),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(PinError::Busy {
                    path: root.to_path_buf(),
                });
            }
            Err((_, e)) => {
                return Err(PinError::Io {
                    op: "lock",
                    path: root.to_path_buf(),
                    source: e.into(),
                });
            }
        }
    }
}

/// Whether `p` is a directory itself, not a symbolic link to one: [`remove_all`]
/// never descends through a link (it would unpin files wherever it points).
fn real_dir(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_dir())
}

/// Whether `p` names a layout directory (`v<N>`).
pub(crate) fn is_layout_dir(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix('v'))
        .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
}

/// Makes `dir` (0700) when missing and checks that it is on a bpf filesystem.
fn ensure_dir(dir: &Path) -> Result<(), PinError> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.is_dir() {
        let parent = dir.parent().unwrap_or(Path::new("/"));
        check_bpffs(parent)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .or_else(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(io_error("make", dir))?;
    }
    check_bpffs(dir)
}

/// Ok when `path` is on a bpf filesystem; else what it is on, and what to mount.
pub(crate) fn check_bpffs(path: &Path) -> Result<(), PinError> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| PinError::Io {
        op: "statfs",
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let found = st.filesystem_type().0 as i64;
    if found == BPF_FS_MAGIC {
        Ok(())
    } else {
        Err(PinError::NotBpffs {
            path: path.to_path_buf(),
            found,
        })
    }
}

/// Why a pinned object of [`remove_all`] stayed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnpinError {
    /// The pinned link could not be opened or detached.
    #[error("detach {}: {source}", path.display())]
    Detach {
        /// The link's pin.
        path: PathBuf,
        /// The kernel's error.
        source: io::Error,
    },
    /// A symbolic link where a directory of pins must be: not followed.
    #[error("refused {}: a symbolic link, not followed", path.display())]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// The pin (or layout directory) could not be removed.
    #[error("remove {}: {source}", path.display())]
    Remove {
        /// The pin or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Removes the pin at `path`. A pin already gone is fine.
pub(crate) fn unpin(path: &Path) -> Result<(), UnpinError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(UnpinError::Remove {
            path: path.to_owned(),
            source,
        }),
    }
}

/// What [`remove_all`] did with one object.
#[derive(Debug)]
pub(crate) struct Removed {
    /// `link`, `program`, `map` or `directory`.
    pub kind: &'static str,
    /// The pin.
    pub path: PathBuf,
    /// Ok, or why not.
    pub result: Result<(), UnpinError>,
}

/// Removes every datapath pinned under `root`, of any layout: each link is
/// detached first (its hook stops running it at once, whoever else holds it), then
/// every pin goes, links, programs, maps, and the layout directories; the legacy
/// `sockets-*` maps too. What the kernel frees follows from the pins going. `root`
/// itself stays (it is usually a mount point). A missing `root` has nothing to do.
pub(crate) fn remove_all(root: &Path) -> Vec<Removed> {
    let mut done = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return done;
    };
    let mut layouts = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        if is_layout_dir(&p) && !real_dir(&p) {
            done.push(Removed {
                kind: "directory",
                result: Err(UnpinError::Symlink { path: p.clone() }),
                path: p,
            });
        } else if is_layout_dir(&p) {
            layouts.push(p);
        } else if e
            .file_name()
            .to_string_lossy()
            .starts_with(SOCKETS_PIN_PREFIX)
        {
            done.push(Removed {
                kind: "map",
                result: unpin(&p),
                path: p,
            });
        }
    }
    layouts.sort();
    for layout in layouts {
        done.extend(remove_layout(&layout));
    }
    done
}

/// Removes the datapath of one layout directory (`<dir>/v<N>`): links detached
/// first, connect programs before their consumers, then every pin and the
/// directories; by descriptor, never through a symbolic link (`owner::remove_layout`).
pub(crate) fn remove_layout(layout: &Path) -> Vec<Removed> {
    owner::remove_layout(layout)
}

/// The legacy sockets-map pins in `dir`, sorted.
pub(crate) fn pins(dir: &Path) -> io::Result<Vec<PathBuf>> {
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

/// A sockets map an earlier release pinned per agent, watched until it is empty.
pub(crate) struct Inherited {
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
    /// Sockets still in the map. A key that cannot be read counts as a socket, so
    /// the pin is never removed on a doubt.
    pub(crate) fn sockets(&self) -> usize {
        self.map.keys().count()
    }
}

/// The legacy sockets maps pinned in `dir`, each opened, and the pins that could
/// not be opened with the reason. A missing `dir` has none.
pub(crate) fn inherited(dir: &Path) -> (Vec<Inherited>, Vec<(PathBuf, String)>) {
    let mut maps = Vec::new();
    let mut failed = Vec::new();
    let Ok(paths) = pins(dir) else {
        return (maps, failed);
    };
    for path in paths {
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
/// none is left.
pub(crate) async fn release_when_empty(mut maps: Vec<Inherited>, every: Duration) {
    for m in &maps {
        info!(pin = %m.path.display(), sockets = m.sockets(),
            "an earlier release's sockets map: its sockets keep their header; unpinned once they are gone");
    }
    loop {
        maps.retain(|m| {
            if m.sockets() > 0 {
                return true;
            }
            match unpin(&m.path) {
                Ok(()) => info!(pin = %m.path.display(), "an earlier release's sockets map is empty: unpinned"),
                Err(e) => warn!(error = %e, "an earlier release's empty sockets map could not be unpinned"),
            }
            false
        });
        if maps.is_empty() {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

/// Whether the datapath outlives the agent (see this module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pin {
    /// No pin directory: the links and maps are the process's own and go with it.
    Off,
    /// Pinned here: links and maps outlive the process.
    Pinned(PathBuf),
    /// Pinning failed, and why: the datapath is the process's own.
    Failed(Unusable),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_off_bpffs_is_refused_with_what_to_mount() {
        let dir = std::env::temp_dir();
        let e = check_bpffs(&dir).expect_err("a temp dir is not bpffs");
        let e = e.to_string();
        assert!(e.contains("is not on a bpf filesystem"), "{e}");
        assert!(e.contains("/sys/fs/bpf"), "{e}");
    }

    #[test]
    fn unpinning_what_is_gone_is_fine() {
        let p = std::env::temp_dir().join("hairpin-no-such-pin");
        assert!(unpin(&p).is_ok(), "{:?}", unpin(&p));
    }

    #[test]
    fn nothing_to_remove_or_inherit_in_a_missing_dir() {
        assert!(remove_all(Path::new("/nonexistent/hairpin")).is_empty());
        let (maps, failed) = inherited(Path::new("/nonexistent/hairpin"));
        assert!(maps.is_empty() && failed.is_empty());
    }

    #[test]
    fn layout_dirs_are_v_and_a_number() {
        for (name, is) in [
            ("v1", true),
            ("v12", true),
            ("v", false),
            ("vx", false),
            ("maps", false),
        ] {
            assert_eq!(is_layout_dir(Path::new(name)), is, "{name}");
        }
    }

    #[test]
    fn roles_go_consumers_first() {
        let names: Vec<&str> = Role::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            ["sk_msg", "sock_ops", "setsockopt", "connect4", "connect6"]
        );
        assert!(Role::ALL[..3].iter().all(|r| r.kernel_path_only()));
        assert!(!Role::Connect4.kernel_path_only());
    }
}

/// The links' pinning, as their owner holds it: off, failed (why), or pinned in
/// the locked directory.
#[derive(Debug)]
pub(crate) enum Pinning {
    /// No pin directory: the links and maps are the process's own.
    Off,
    /// Pinning failed, and why: the datapath is the process's own.
    Failed(Unusable),
    /// Pinned in this directory, locked by this process.
    Pinned(PinDir),
}

impl Pinning {
    /// The locked directory, when pinned.
    pub(crate) fn dir(&self) -> Option<&PinDir> {
        match self {
            Pinning::Pinned(dir) => Some(dir),
            Pinning::Off | Pinning::Failed(_) => None,
        }
    }

    /// As `status` says it.
    pub(crate) fn status(&self) -> Pin {
        match self {
            Pinning::Off => Pin::Off,
            Pinning::Failed(why) => Pin::Failed(why.clone()),
            Pinning::Pinned(dir) => Pin::Pinned(dir.root().to_path_buf()),
        }
    }
}
