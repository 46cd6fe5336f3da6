//! The pinned datapath's place: cleanup of a killed agent's datapath, a pin directory
//! bind-mounted from the host's bpffs, one off bpffs.

use super::*;

#[test]
fn cleanup_removes_a_killed_agents_datapath_and_traffic_goes_as_before_hairpin() {
    require_privileges!();
    let node = capture_node();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let map_id = status(&node)["kernel_path"]["sockets_map_id"]
        .as_u64()
        .expect("the sockets map's id");
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    assert!(map_exists(map_id), "kept by its pin");
    let attached = node.attached_programs();
    assert!(attached.contains("connect"), "{attached}");
    let run = hairpin_tests::cli::run_node_cleanup(&node);
    let steps = hairpin_tests::cli::steps(&run.json());
    let count = |name: &str| {
        steps
            .iter()
            .filter(|(n, o)| n == name && o == "removed")
            .count()
    };
    // Five links (detached, then unpinned), five programs, nine maps, the layout
    // directory and the pin directory.
    assert_eq!(
        (
            count("pinned-link"),
            count("pinned-program"),
            count("pinned-map"),
            count("pinned-layout"),
            count("pinned-maps")
        ),
        (5, 5, 9, 1, 1),
        "{}",
        run.stdout
    );
    // Everything pinned was removed; the names ports' nftables table was never
    // written (no names here, and the programs were attached).
    assert!(
        steps
            .iter()
            .all(|(n, o)| o == "removed" || (n == "names-nat" && o == "absent")),
        "{}",
        run.stdout
    );
    assert!(!node.pin_dir().exists());
    assert_nothing_attached(&node);
    let gone = Instant::now();
    while map_exists(map_id) && gone.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!map_exists(map_id), "the kernel must free the unpinned map");
    let fresh = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(fresh.code, 52, "pre-hairpin behaviour expected: {fresh:?}");
}

/// Issue 31: `cleanup` takes the pin directory's lock as an agent does: while a
/// live agent holds it, the pins are left alone and the step fails saying why,
/// and traffic keeps its headers; through a symlink it never goes.
#[test]
fn cleanup_leaves_a_live_agents_pins_alone_and_never_follows_a_symlink() {
    require_privileges!();
    let node = capture_node();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let step_of = |run: &hairpin_tests::cli::CliRun| {
        run.json()["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .find(|s| s["name"] == "pinned-maps")
            .cloned()
            .unwrap_or_else(|| panic!("no pinned-maps step: {}", run.stdout))
    };
    let cleanup = |pin_dir: &std::path::Path| {
        hairpin_tests::cli::node_cleanup(
            &node,
            &[
                "--bpf-pin-dir",
                pin_dir.to_str().expect("utf-8 path"),
                "--pin-lock-wait",
                "1s",
            ],
        )
    };
    let run = cleanup(&node.pin_dir());
    let step = step_of(&run);
    assert_eq!(step["outcome"], "failed", "{}", run.stdout);
    assert!(
        step["detail"]
            .as_str()
            .is_some_and(|d| d.contains("another process holds the lock")),
        "{step}"
    );
    assert!(node.attached_programs().contains("connect"));
    let got = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(
        got.code, 0,
        "the live agent's datapath still serves: {got:?}"
    );

    // Through a symlink to the (still locked) directory: refused before any lock.
    let link = node.dir.join("pins-link");
    std::os::unix::fs::symlink(node.pin_dir(), &link).expect("symlink");
    let run = cleanup(&link);
    let step = step_of(&run);
    assert!(
        step["detail"]
            .as_str()
            .is_some_and(|d| d.contains("symbolic link")),
        "{step}"
    );
    assert!(node.pin_dir().exists(), "the pins are left as they are");
    agent.stop();
}

#[test]
fn a_pin_dir_bind_mounted_from_the_hosts_bpffs_as_the_daemonset_does_is_pinned_into() {
    require_privileges!();
    // The DaemonSet mounts the host's /sys/fs/bpf/hairpin at the same path: the pin
    // directory is then a mount point of a directory of the bpf filesystem.
    let node = capture_node();
    let host_dir = node.bpffs().join("host-hairpin");
    std::fs::create_dir_all(&host_dir).expect("the host's directory");
    let in_pod = node.dir.join("pod-sys-fs-bpf-hairpin");
    std::fs::create_dir_all(&in_pod).expect("the mount point");
    hairpin_tests::sh::run(&[
        "mount",
        "--bind",
        host_dir.to_str().expect("utf-8 path"),
        in_pod.to_str().expect("utf-8 path"),
    ]);
    // Unmounted however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(in_pod.clone());
    let mut agent = Agent::start_with(
        &node,
        &capture_v1(),
        &[
            "--kernel-path",
            "on",
            "--bpf-pin-dir",
            in_pod.to_str().expect("utf-8 path"),
        ],
    );
    let s = status(&node);
    let layout = std::path::PathBuf::from(format!("v{}", hairpin_ebpf::PIN_LAYOUT));
    let map = layout.join("maps").join("HAIRPIN_SOCKETS");
    assert_eq!(
        s["kernel_path"]["sockets_map_pin"].as_str(),
        in_pod.join(&map).to_str(),
        "{s}\n{}",
        agent.log()
    );
    for pin in [map.clone(), layout.join("links").join("connect4")] {
        assert!(
            host_dir.join(&pin).exists(),
            "{} is on the host's side",
            pin.display()
        );
    }
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(10)).success(),
        "{}",
        agent.log()
    );
    assert!(
        host_dir.join(&map).exists(),
        "a rollout's SIGTERM keeps the datapath for the next agent"
    );
}

#[test]
fn a_pin_dir_off_bpffs_leaves_the_kernel_path_on_and_says_why_it_is_not_pinned() {
    require_privileges!();
    let node = capture_node();
    let plain = node.dir.join("not-bpffs");
    let agent = Agent::start_with(
        &node,
        &capture_v1(),
        &[
            "--kernel-path",
            "on",
            "--bpf-pin-dir",
            plain.to_str().expect("utf-8 path"),
        ],
    );
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}");
    let why = s["kernel_path"]["sockets_map_pin_error"]
        .as_str()
        .unwrap_or_else(|| panic!("no pin error in {s}"));
    assert!(why.contains("is not on a bpf filesystem"), "{why}");
    assert!(
        agent
            .log()
            .contains("the datapath is not pinned: it goes with this process"),
        "{}",
        agent.log()
    );
    let captured = capture_server(&node.ingress_ns, 1, false);
    let _ = from_pod(&node, &url(CAPTURE_LB4, 80, "/"));
    let got = captured
        .recv_timeout(Duration::from_secs(5))
        .expect("a captured connection");
    assert!(got.starts_with(b"PROXY TCP4 "), "{}", got.escape_ascii());
}

/// `bpf(BPF_OBJ_GET)` of `pin` read-write (what stopping the heartbeat or
/// redirecting a destination needs) by a root process stripped of every capability
/// (a root container that reaches the host's bpf filesystem through a hostPath):
/// made in the child between fork and exec, so its error is spawn's.
fn capless_open(pin: &Path) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let path = std::ffi::CString::new(pin.to_str().expect("utf-8")).expect("no NUL");
    let mut cmd = Command::new("true");
    hairpin_tests::pod::with_only_caps(&mut cmd, &[]);
    // SAFETY: one bpf system call on memory prepared before the fork, and close.
    unsafe {
        cmd.pre_exec(move || {
            // union bpf_attr for BPF_OBJ_GET: pathname, bpf_fd, file_flags (0: read
            // and write), path_fd.
            let mut attr = [0u64; 3];
            attr[0] = path.as_ptr() as u64;
            let fd = libc::syscall(
                libc::SYS_bpf,
                7, // BPF_OBJ_GET
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            );
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd as i32);
            Ok(())
        });
    }
    cmd.status().map(|_| ())
}

/// Issue 31: since Linux 5.19 opening a pinned map needs only file access to the pin.
/// Pinned by uid 0, a root process without any capability opens the heartbeat and
/// the frontends map (read-write: it could stop the heartbeat or redirect a
/// destination). Handed to the DaemonSet's pin owner (`--pin-owner`, the agent
/// reaching them through its supplementary group), the same process cannot open
/// either, and the datapath the agent adopted still serves.
#[test]
fn a_root_process_without_capabilities_cannot_open_pins_handed_to_their_owner() {
    use std::os::unix::fs::MetadataExt;
    require_privileges!();
    let node = capture_node();
    let _nginx = start_nginx(&node);
    let yaml = hairpin_tests::agent::frontends_yaml(&all_frontends());
    let owner = hairpin_tests::agent::DAEMONSET_PIN_OWNER;
    let maps = node
        .pin_dir()
        .join(format!("v{}", hairpin_ebpf::PIN_LAYOUT))
        .join("maps");
    let heartbeat = maps.join("HAIRPIN_HEARTBEAT");
    let frontends = maps.join("HAIRPIN_FRONTENDS");
    let pins = [&heartbeat, &frontends];

    // Owned by uid 0 (no --pin-owner): the capability-less process gets in.
    let mut agent =
        CappedAgent::start_in_groups(&node, &yaml, KERNEL_PATH_ON, &DAEMONSET_CAPS, &[]);
    for pin in pins {
        let opened = capless_open(pin);
        assert!(opened.is_ok(), "uid 0 owns {}: {opened:?}", pin.display());
    }
    let mode = std::fs::metadata(node.pin_dir()).expect("pin dir").mode();
    assert_eq!(mode & 0o7777, 0o700, "{mode:o}: 0700 without an owner");
    agent.stop();

    // Handed over: the next agent adopts the datapath and secures it.
    let flag = format!("{owner}:{owner}");
    let mut extra = KERNEL_PATH_ON.to_vec();
    extra.extend(["--pin-owner", &flag]);
    let mut agent = CappedAgent::start_in_groups(&node, &yaml, &extra, &DAEMONSET_CAPS, &[owner]);
    for dir in [node.pin_dir(), maps.clone()] {
        let m = std::fs::metadata(&dir).expect("pin dir");
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o7777),
            (owner, owner, 0o2770),
            "{}",
            dir.display()
        );
    }
    for pin in pins {
        let m = std::fs::metadata(pin).expect("pin");
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (owner, owner, 0o660));
        let opened = capless_open(pin);
        assert_eq!(
            opened.as_ref().map_err(std::io::Error::kind).err(),
            Some(std::io::ErrorKind::PermissionDenied),
            "{} must be out of its reach: {opened:?}",
            pin.display()
        );
    }
    let got = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(got.code, 0, "{got:?}\n{}", agent.log());
    assert!(
        agent.log().contains("pin directory handed to its owner")
            && !agent.log().contains("not the one this build defines"),
        "the earlier agent's maps are adopted as they are:\n{}",
        agent.log()
    );
    agent.stop();
}

/// `bpftool -j map show pinned PATH` as JSON.
fn pinned_map(path: &Path) -> Value {
    let out = Command::new("bpftool")
        .args(["-j", "map", "show", "pinned"])
        .arg(path)
        .output()
        .expect("run bpftool");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bpftool map show pinned {}: {e}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Issue 31: a map pinned where the agent adopts its own is adopted only when it is
/// what the object defines. Here the heartbeat's pin is an array of 4-byte values
/// (the agent's is of 8) and the frontends map's an array, not a hash, as whoever
/// could write the pin directory might plant them: the agent says so, unpins them,
/// makes its own, and the pod's request gets its header.
#[test]
fn a_planted_map_at_a_pin_path_is_not_adopted_but_made_anew() {
    require_privileges!();
    let node = capture_node();
    let _nginx = start_nginx(&node);
    let maps = node
        .pin_dir()
        .join(format!("v{}", hairpin_ebpf::PIN_LAYOUT))
        .join("maps");
    std::fs::create_dir_all(&maps).expect("the maps directory");
    let heartbeat = maps.join("HAIRPIN_HEARTBEAT");
    let frontends = maps.join("HAIRPIN_FRONTENDS");
    for (pin, key, value, entries) in [(&heartbeat, "4", "4", "2"), (&frontends, "4", "8", "16")] {
        hairpin_tests::sh::run(&[
            "bpftool",
            "map",
            "create",
            pin.to_str().expect("utf-8"),
            "type",
            "array",
            "key",
            key,
            "value",
            value,
            "entries",
            entries,
            "name",
            "planted",
        ]);
    }
    let planted = pinned_map(&heartbeat)["id"].clone();
    let mut agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let log = agent.log();
    for name in ["HAIRPIN_HEARTBEAT", "HAIRPIN_FRONTENDS"] {
        assert!(
            log.lines()
                .any(|l| l.contains("not the one this build defines") && l.contains(name)),
            "{name}:\n{log}"
        );
    }
    let hb = pinned_map(&heartbeat);
    assert_ne!(hb["id"], planted, "made anew: {hb}");
    assert_eq!(hb["bytes_value"], 8, "{hb}");
    assert_eq!(
        pinned_map(&frontends)["type"],
        "hash",
        "the agent's own frontends map"
    );
    let got = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(got.code, 0, "{got:?}\n{}", agent.log());
    agent.stop();
}
