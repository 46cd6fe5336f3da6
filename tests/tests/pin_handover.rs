//! The pin hand-over (`--pin-owner`) against whoever may write the pin
//! directories (group 60104, or root with CAP_DAC_OVERRIDE and the host's /sys):
//! between the agent's look at a name and its chown, the name is exchanged for a
//! symbolic link to a directory elsewhere, over and over. Nothing outside the pin
//! directory may change owner or mode, on another filesystem or on the same bpf
//! filesystem. Also the layout removal, with a link planted where a pin directory was.
//!
//! Bounded: 1,000 hand-overs and 1,000 removals (about 20 s in all), one racing
//! thread each.

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use hairpin_agent::datapath::{remove_pin_layout as remove_layout, secure_pin_dir as secure};
use hairpin_tests::require_privileges;

/// How many hand-overs race the link.
const ROUNDS: usize = 1_000;

/// A bpf filesystem of this test's own, unmounted (lazily) on drop.
struct Bpffs {
    dir: PathBuf,
}

impl Bpffs {
    fn mount(tag: &str) -> Bpffs {
        let dir =
            std::env::temp_dir().join(format!("hairpin-handover-{tag}-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mount point");
        nix::mount::mount(
            Some("bpf"),
            &dir,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount a bpf filesystem");
        Bpffs { dir }
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(&self.dir);
    }
}

/// A directory outside the pin directory and what it looks like now.
struct Victim {
    path: PathBuf,
    before: (u32, u32, u32),
}

impl Victim {
    fn new(path: PathBuf, mode: u32) -> Victim {
        fs::create_dir_all(&path).expect("victim");
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod victim");
        let before = Victim::look(&path);
        Victim { path, before }
    }

    fn look(p: &Path) -> (u32, u32, u32) {
        let m = fs::symlink_metadata(p).expect("stat victim");
        (m.uid(), m.gid(), m.mode() & 0o7777)
    }

    fn unchanged(&self) -> bool {
        Victim::look(&self.path) == self.before
    }
}

/// Puts the pin directory back as the agent made it, root's and 0755 (while the
/// racer is paused, so these calls by path cannot follow its link).
fn reset(root: &Path) {
    for d in [
        root.to_path_buf(),
        root.join("v1"),
        root.join("v1/maps"),
        root.join("v1/links"),
        root.join("v1/progs"),
    ] {
        fs::create_dir_all(&d).expect("pin dir");
        nix::unistd::chown(&d, Some(0.into()), Some(0.into())).expect("chown back");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod back");
    }
}

#[test]
fn a_link_planted_between_check_and_chown_never_hands_over_anything_outside() {
    require_privileges!();
    let bpffs = Bpffs::mount("race");
    let root = bpffs.dir.join("hairpin");
    // Elsewhere on another filesystem (the node's /etc, say), and elsewhere on the
    // same bpf filesystem (another tool's pins).
    let scratch = tempfile::tempdir().expect("tempdir");
    let victims = Arc::new([
        Victim::new(scratch.path().join("etc"), 0o755),
        Victim::new(bpffs.dir.join("cni"), 0o700),
    ]);
    reset(&root);
    let owner = (60_104, 60_104);

    let (paused, parked, stop) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(false)),
    );
    let planted = Arc::new(AtomicU64::new(0));
    let racer = {
        let (paused, parked, stop, planted, victims, root) = (
            paused.clone(),
            parked.clone(),
            stop.clone(),
            planted.clone(),
            victims.clone(),
            root.clone(),
        );
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Acquire) {
                if paused.load(Ordering::Acquire) {
                    parked.store(true, Ordering::Release);
                    std::thread::yield_now();
                    continue;
                }
                parked.store(false, Ordering::Release);
                // Exchange one of the agent's directories for a link to a victim,
                // then put it back: the agent's look may see either.
                let name = ["v1/maps", "v1/links", "v1", "v1/progs"][i % 4];
                let victim = &victims[i % 2].path;
                i += 1;
                let real = root.join(name);
                // No dots: a bpf filesystem refuses them in names.
                let aside = root.join(format!("{}-aside", name.replace('/', "-")));
                if fs::rename(&real, &aside).is_err() {
                    continue;
                }
                if std::os::unix::fs::symlink(victim, &real).is_ok() {
                    planted.fetch_add(1, Ordering::Relaxed);
                    for _ in 0..50 {
                        std::hint::spin_loop();
                    }
                    let _ = fs::remove_file(&real);
                }
                fs::rename(&aside, &real).expect("put the directory back");
            }
            parked.store(true, Ordering::Release);
        })
    };

    let (mut handed, mut refused) = (0usize, 0usize);
    for _ in 0..ROUNDS {
        paused.store(true, Ordering::Release);
        while !parked.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        reset(&root);
        paused.store(false, Ordering::Release);
        while parked.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        match secure(&root, owner.0, owner.1) {
            Ok(_) => handed += 1,
            Err(_) => refused += 1,
        }
        if !victims.iter().all(Victim::unchanged) {
            break;
        }
    }
    stop.store(true, Ordering::Release);
    racer.join().expect("racer");
    let planted = planted.load(Ordering::Relaxed);
    eprintln!(
        "{ROUNDS} hand-overs: {handed} completed, {refused} refused a link; {planted} links planted"
    );
    for v in victims.iter() {
        assert!(
            v.unchanged(),
            "{} changed from {:?} to {:?} ({handed} hand-overs completed, {refused} refused, {planted} links planted)",
            v.path.display(),
            v.before,
            Victim::look(&v.path)
        );
    }
    assert!(
        planted >= ROUNDS as u64 / 2,
        "the racer planted only {planted} links"
    );
    // Unraced, the hand-over completes and hands over the agent's directories.
    reset(&root);
    secure(&root, owner.0, owner.1).expect("hand-over without a racer");
    let m = fs::metadata(root.join("v1/maps")).expect("maps");
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        (60_104, 60_104, 0o2770)
    );
}

/// A layout directory being removed (a takeover of another layout) whose `maps`
/// is exchanged for a link to another tool's directory while it goes, over and
/// over: nothing there is removed, and the layout's own pins go.
#[test]
fn removing_a_layout_never_follows_a_link_planted_for_its_directories() {
    require_privileges!();
    let bpffs = Bpffs::mount("remove");
    let root = bpffs.dir.join("hairpin");
    let layout = root.join("v0");
    // Another tool's directory on the same bpf filesystem, with an entry of its own.
    let other = bpffs.dir.join("cni");
    fs::create_dir_all(&other).expect("another tool's directory");
    let theirs = other.join("policy");
    std::os::unix::fs::symlink("/nonexistent", &theirs).expect("their entry");
    let (stop, planted) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let racer = {
        let (stop, planted, layout, other) =
            (stop.clone(), planted.clone(), layout.clone(), other.clone());
        std::thread::spawn(move || {
            let (real, aside) = (layout.join("maps"), layout.with_file_name("v0-maps-aside"));
            while !stop.load(Ordering::Acquire) {
                if fs::rename(&real, &aside).is_err() {
                    std::hint::spin_loop();
                    continue;
                }
                if std::os::unix::fs::symlink(&other, &real).is_ok() {
                    planted.fetch_add(1, Ordering::Relaxed);
                    for _ in 0..200 {
                        std::hint::spin_loop();
                    }
                    let _ = fs::remove_file(&real);
                }
                // The layout may be gone by now: then so is its place.
                if fs::rename(&aside, &real).is_err() {
                    let _ = fs::remove_dir_all(&aside);
                }
            }
        })
    };
    let mut rounds = 0;
    for _ in 0..ROUNDS {
        for sub in ["maps", "links", "progs"] {
            let _ = fs::create_dir_all(layout.join(sub));
        }
        let _ = std::os::unix::fs::symlink("/nonexistent", layout.join("maps/own"));
        // Start each removal while the racer is flipping (a few exchanges in; at
        // most 10 ms).
        let before = planted.load(Ordering::Relaxed);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(10);
        while planted.load(Ordering::Relaxed) < before + 3 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let _ = remove_layout(&layout);
        rounds += 1;
        if fs::symlink_metadata(&theirs).is_err() {
            break;
        }
    }
    stop.store(true, Ordering::Release);
    racer.join().expect("racer");
    let planted = planted.load(Ordering::Relaxed);
    eprintln!("{rounds} removals raced, {planted} links planted");
    assert!(
        fs::symlink_metadata(&theirs).is_ok(),
        "another tool's entry was removed through a planted link (round {rounds}, {planted} links planted)"
    );
    assert!(planted > 0, "the racer planted nothing");
    // Unraced, the layout goes whole.
    let _ = fs::remove_dir_all(layout.with_file_name("v0-maps-aside"));
    let _ = fs::remove_dir_all(&layout);
    for sub in ["maps", "links", "progs"] {
        fs::create_dir_all(layout.join(sub)).expect("layout");
    }
    std::os::unix::fs::symlink("/nonexistent", layout.join("maps/own")).expect("own pin");
    let removed = remove_layout(&layout);
    assert!(fs::symlink_metadata(&layout).is_err(), "{removed:?}");
}
