//! Running commands, inside a network namespace and a cgroup when asked.

use std::{
    ffi::CString,
    io,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, Output, Stdio},
};

/// Runs `argv`, panicking with its output when it fails: scaffolding must not fail quietly.
pub fn run(argv: &[&str]) -> String {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("failed to start {argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `argv`, ignoring failure (for teardown, where the thing may already be gone).
pub fn run_quiet(argv: &[&str]) {
    let _ = Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Removes from `cmd` every `HAIRPIN_*` variable this process inherited: the paths
/// of the workspace's tools that `cargo xtask test` hands the suites
/// (`HAIRPIN_AGENT_BIN`, `HAIRPIN_ETCD_BIN`, `HAIRPIN_TEST_KERNELS`, ...) and any agent
/// setting of the developer's shell. The agent refuses a `HAIRPIN_*` variable it does
/// not read, and a test's processes take their settings from the test alone. Call it
/// before the test's own `env`: a variable set after it is kept.
pub fn without_inherited_hairpin_env(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name.as_encoded_bytes().starts_with(b"HAIRPIN_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// A command that runs in network namespace `netns` (a name under /run/netns) and,
/// when given, cgroup v2 directory `cgroup`, without the `HAIRPIN_*` variables this
/// process inherited ([`without_inherited_hairpin_env`]).
///
/// The child joins the cgroup before it execs nsenter (`ip netns exec` would
/// remount /sys and hide the cgroup2 mount), using only async-signal-safe calls
/// between fork and exec because the test process is multithreaded.
pub fn command_in(netns: &str, cgroup: Option<&Path>, argv: &[&str]) -> Command {
    let mut cmd = Command::new("nsenter");
    without_inherited_hairpin_env(&mut cmd);
    cmd.arg(format!("--net=/run/netns/{netns}"))
        .arg("--")
        .args(argv);
    if let Some(cg) = cgroup {
        let procs = CString::new(
            cg.join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("cgroup path has no NUL");
        // SAFETY: the closure only calls open/write/close, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // Writing 0 moves the writing process itself.
                let n = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n < 0 { Err(err) } else { Ok(()) }
            });
        }
    }
    cmd
}

/// Runs `argv` in `netns` (and `cgroup`), returning its output whatever the exit status.
pub fn output_in(netns: &str, cgroup: Option<&Path>, argv: &[&str]) -> Output {
    command_in(netns, cgroup, argv)
        .output()
        .unwrap_or_else(|e| panic!("failed to start {argv:?} in {netns}: {e}"))
}

/// Runs `argv` in `netns`, panicking when it fails.
pub fn run_in(netns: &str, argv: &[&str]) -> String {
    let mut full = vec!["nsenter", "--net"];
    let ns = format!("--net=/run/netns/{netns}");
    full[1] = &ns;
    full.push("--");
    full.extend_from_slice(argv);
    run(&full)
}

/// Moves the calling thread, and only it, into network namespace `netns` (a name
/// under /run/netns): the sockets it creates from then on belong there.
pub fn enter_netns(netns: &str) {
    let path = format!("/run/netns/{netns}");
    let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
}

/// Runs shell `script` in `netns` and `cgroup` in a private mount namespace where
/// each `(file, over)` of `binds` is bind-mounted over the path `over`: the real
/// resolver reads a test's /etc/hosts or /etc/resolv.conf, and nothing outside sees
/// the mounts. Its output, whatever the exit status.
pub fn sh_with_files_over(
    netns: &str,
    cgroup: &Path,
    binds: &[(&Path, &str)],
    script: &str,
) -> Output {
    let mut full = String::new();
    for (file, over) in binds {
        full.push_str(&format!(
            "mount --bind {} {over} && ",
            file.to_str().expect("utf-8 path")
        ));
    }
    full.push_str(script);
    output_in(
        netns,
        Some(cgroup),
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &full,
        ],
    )
}
