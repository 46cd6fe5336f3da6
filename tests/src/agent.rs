//! The agent under test: `hairpin-agent run` as a process in the node namespace,
//! inside the attached cgroup subtree, as the DaemonSet runs on a real node.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::{
    node::{NODE_IP4, NODE_IP6, SimNode},
    pod::with_only_caps,
    sh::command_in,
};

/// `run` flags of an agent publishing names under example.com through its name
/// relay (`--mode both`), as the names suites run it; more flags follow them.
pub const NAMES_UNDER_EXAMPLE_COM: [&str; 4] = ["--mode", "both", "--names-domains", "example.com"];

/// The simulated pod network (the pod's /24 and /64), passed as `--allowed-clients`
/// to agents reading a frontends file.
pub const SIM_POD_NETWORKS: &str = "192.0.2.0/24,2001:db8:1::/64";

/// Waits until the file `log` contains `needle`; panics with the log if it does not
/// within `within` or `child` (`who`, for the message) exits first.
pub fn wait_for_log_of(
    who: &str,
    log: &std::path::Path,
    mut child: Option<&mut Child>,
    needle: &str,
    within: Duration,
) {
    let deadline = Instant::now() + crate::wait::slack(within);
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        if let Some(c) = child.as_deref_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!("{who} exited ({status}) before logging {needle:?}:\n{text}");
        }
        assert!(
            Instant::now() < deadline,
            "{who} did not log {needle:?} within {within:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The binary agents start from instead of [`agent_bin`]'s, while set: the bench's
/// baseline comparison alternates two builds of the agent in one process.
static AGENT_BIN_OVERRIDE: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// Makes the agents started from now on run `bin` (`None`: [`agent_bin`]'s again).
pub fn set_agent_bin(bin: Option<PathBuf>) {
    *AGENT_BIN_OVERRIDE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = bin;
}

/// `hairpin-agent` ([`agent_bin`]) without the `HAIRPIN_*` variables this process
/// inherited ([`crate::sh::without_inherited_hairpin_env`]): as the harness starts
/// every agent, whose settings come from the test alone.
pub fn agent_command() -> Command {
    let mut cmd = Command::new(agent_bin());
    crate::sh::without_inherited_hairpin_env(&mut cmd);
    cmd
}

/// Whether `bin run --help` lists `flag`: whether that build of the agent has it.
/// Asked once per binary and flag.
fn run_knows(bin: &std::path::Path, flag: &str) -> bool {
    static KNOWN: std::sync::Mutex<std::collections::BTreeMap<(PathBuf, String), bool>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let key = (bin.to_path_buf(), flag.to_string());
    let mut known = KNOWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *known.entry(key).or_insert_with(|| {
        Command::new(bin)
            .args(["run", "--help"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("{flag} ")))
    })
}

/// Path of the agent binary: the one [`set_agent_bin`] set, else HAIRPIN_AGENT_BIN
/// (set by `cargo xtask test`), else the debug build beside this test binary.
pub fn agent_bin() -> PathBuf {
    if let Some(bin) = AGENT_BIN_OVERRIDE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
    {
        return bin;
    }
    workspace_bin(
        "HAIRPIN_AGENT_BIN",
        "hairpin-agent",
        "run the tests with `cargo xtask test`",
    )
}

/// `$env` when set, else the binary `name` beside this test binary
/// (target/<profile>/deps/<test> -> target/<profile>/<name>); `hint` says how to get
/// it when neither exists.
pub fn workspace_bin(env: &str, name: &str, hint: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .ancestors()
        .nth(2)
        .expect("test binary lives in target/<profile>/deps")
        .join(name);
    assert!(bin.exists(), "no {name} at {}: {hint}", bin.display());
    bin
}

/// One frontend line for the frontends file.
pub struct FrontendSpec {
    /// LB IP.
    pub ip: &'static str,
    /// TCP ports.
    pub ports: Vec<u16>,
    /// `v1` or `v2`.
    pub version: &'static str,
}

/// One frontend on port 80 of `ip` with PROXY `version`.
pub fn spec(ip: &'static str, version: &'static str) -> FrontendSpec {
    FrontendSpec {
        ip,
        ports: vec![80],
        version,
    }
}

/// The simulated node's frontends: nginx over v4 and v6 with v1 and v2, haproxy
/// with v1 (v4) and v2 (v6).
pub fn all_frontends() -> Vec<FrontendSpec> {
    vec![
        spec("203.0.113.10", "v1"),
        spec("2001:db8:ffff::10", "v1"),
        spec("203.0.113.11", "v1"),
        spec("2001:db8:ffff::11", "v2"),
        spec("203.0.113.12", "v2"),
        spec("2001:db8:ffff::12", "v2"),
    ]
}

/// Renders a frontends file.
pub fn frontends_yaml(specs: &[FrontendSpec]) -> String {
    frontends_yaml_with_hosts(specs, &[])
}

/// Renders a frontends file; `hosts[i]`, when present and not empty, becomes the
/// `hosts` of `specs[i]`.
pub fn frontends_yaml_with_hosts(specs: &[FrontendSpec], hosts: &[Vec<String>]) -> String {
    let mut s = String::from("frontends:\n");
    for (i, f) in specs.iter().enumerate() {
        let ports: Vec<String> = f.ports.iter().map(u16::to_string).collect();
        s.push_str(&format!(
            "- ip: \"{}\"\n  ports: [{}]\n  proxyProtocol: {}\n",
            f.ip,
            ports.join(", "),
            f.version
        ));
        if let Some(names) = hosts.get(i).filter(|n| !n.is_empty()) {
            s.push_str(&format!("  hosts: [{}]\n", names.join(", ")));
        }
    }
    s
}

/// A running agent; SIGKILLed on drop if still running.
pub struct Agent {
    child: Option<Child>,
    /// Its stderr (the tracing log).
    pub log: PathBuf,
    /// The frontends file it reads.
    pub frontends: PathBuf,
}

impl Agent {
    /// Replaces the frontends file in one step (write aside, then rename), as an
    /// operator's tooling or kubelet's ConfigMap update does: the agent never reads a
    /// half-written file.
    pub fn replace_frontends(&self, yaml: &str) -> std::io::Result<()> {
        let tmp = self.frontends.with_extension("tmp");
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &self.frontends)
    }

    /// Starts the agent on `node` with `specs` and waits until it logs `agent ready`.
    pub fn start(node: &SimNode, specs: &[FrontendSpec]) -> Agent {
        Agent::start_with(node, specs, &[])
    }

    /// As [`Agent::start`], with extra `run` arguments.
    pub fn start_with(node: &SimNode, specs: &[FrontendSpec], extra: &[&str]) -> Agent {
        Agent::start_logging(node, specs, "hairpin_agent=debug,info", extra)
    }

    /// As [`Agent::start_with`], with `log_filter` as the agent's `--log`: the bench
    /// runs the agent at `info`, as deployed, since `debug` logs every connection.
    pub fn start_logging(
        node: &SimNode,
        specs: &[FrontendSpec],
        log_filter: &str,
        extra: &[&str],
    ) -> Agent {
        Agent::start_at(node, specs, &node.cgroup, log_filter, extra)
    }

    /// As [`Agent::start_with`], attaching at `cgroup` instead of the node's cgroup
    /// (the mode tests pass a directory that is not a cgroup, to make attach fail).
    pub fn start_with_cgroup(
        node: &SimNode,
        specs: &[FrontendSpec],
        cgroup: &std::path::Path,
        extra: &[&str],
    ) -> Agent {
        Agent::start_at(node, specs, cgroup, "hairpin_agent=debug,info", extra)
    }

    /// As [`Agent::start`], without `--allowed-clients`: the file names no pod
    /// network, so the relays serve the node only.
    pub fn start_without_pod_network(node: &SimNode, specs: &[FrontendSpec]) -> Agent {
        Agent::start_file(
            node,
            specs,
            &node.cgroup,
            "hairpin_agent=debug,info",
            &[],
            false,
        )
    }

    /// As [`Agent::start_with`], with `yaml` as the frontends file as written (for
    /// settings [`FrontendSpec`] does not carry, such as `firstSpeaker`).
    pub fn start_with_frontends_yaml(node: &SimNode, yaml: &str, extra: &[&str]) -> Agent {
        let mut agent = Agent::spawn_file(
            node,
            yaml,
            &node.cgroup,
            "hairpin_agent=debug,info",
            extra,
            true,
        );
        agent.wait_for_log("agent ready", Duration::from_secs(20));
        agent
    }

    fn start_at(
        node: &SimNode,
        specs: &[FrontendSpec],
        cgroup: &std::path::Path,
        log_filter: &str,
        extra: &[&str],
    ) -> Agent {
        Agent::start_file(node, specs, cgroup, log_filter, extra, true)
    }

    /// As [`Agent::start_with`], without waiting for it to get ready (an agent that
    /// waits for the datapath, say).
    pub fn spawn_with(node: &SimNode, specs: &[FrontendSpec], extra: &[&str]) -> Agent {
        Agent::spawn_file(
            node,
            &frontends_yaml(specs),
            &node.cgroup,
            "hairpin_agent=debug,info",
            extra,
            true,
        )
    }

    fn start_file(
        node: &SimNode,
        specs: &[FrontendSpec],
        cgroup: &std::path::Path,
        log_filter: &str,
        extra: &[&str],
        pod_network: bool,
    ) -> Agent {
        let yaml = frontends_yaml(specs);
        let mut agent = Agent::spawn_file(node, &yaml, cgroup, log_filter, extra, pod_network);
        agent.wait_for_log("agent ready", Duration::from_secs(20));
        agent
    }

    /// Writes `yaml` as the node's frontends file and spawns the agent reading it,
    /// without waiting for it to get ready. A file source names no pod network: with
    /// `pod_network`, the simulated pod's is passed, as an operator would pass this
    /// node's pod CIDR (without it only the node is served).
    fn spawn_file(
        node: &SimNode,
        yaml: &str,
        cgroup: &std::path::Path,
        log_filter: &str,
        extra: &[&str],
        pod_network: bool,
    ) -> Agent {
        let frontends = node.dir.join("frontends.yaml");
        fs::write(&frontends, yaml).expect("write frontends");
        let mut source = vec!["--frontends", frontends.to_str().expect("utf-8 path")];
        if pod_network {
            source.extend_from_slice(&["--allowed-clients", SIM_POD_NETWORKS]);
        }
        let mut agent = Agent::spawn(node, &source, cgroup, log_filter, extra);
        agent.frontends = frontends;
        agent
    }

    /// Starts the agent on `node` watching the (fake) API server of `kubeconfig`
    /// instead of a frontends file, and waits until it is attached. It logs
    /// `agent ready` only once the Service list has synced.
    /// The simulated pod network is passed as `--allowed-clients` (these fakes
    /// serve no Node or Pod objects unless a test adds them);
    /// [`Agent::start_kube_default_clients`] leaves the client policy to the agent.
    pub fn start_kube(node: &SimNode, kubeconfig: &std::path::Path, extra: &[&str]) -> Agent {
        let mut args = vec!["--allowed-clients", SIM_POD_NETWORKS];
        args.extend_from_slice(extra);
        Agent::start_kube_default_clients(node, kubeconfig, &args)
    }

    /// As [`Agent::start_kube`], without `--allowed-clients`: the agent's default
    /// client policy (the Node's pod CIDRs, else this node's Pods).
    pub fn start_kube_default_clients(
        node: &SimNode,
        kubeconfig: &std::path::Path,
        extra: &[&str],
    ) -> Agent {
        Agent::start_as_daemonset(node, kubeconfig, &[], extra)
    }

    /// The agent with the environment the chart's DaemonSet gives it (`env`, its
    /// field references resolved for the simulated node; set after this harness's
    /// own defaults, so the DaemonSet's kernel-path choice applies), reading the API
    /// server of `kubeconfig` as `--node-name sim-node`; returns once its programs
    /// are attached.
    pub fn start_as_daemonset(
        node: &SimNode,
        kubeconfig: &std::path::Path,
        env: &[(String, String)],
        extra: &[&str],
    ) -> Agent {
        let source = [
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8 path"),
            "--node-name",
            "sim-node",
        ];
        let mut agent = Agent::spawn_env(
            node,
            &source,
            &node.cgroup,
            "hairpin_agent=debug,info",
            extra,
            env,
        );
        agent.wait_for_log("programs attached", Duration::from_secs(20));
        agent
    }

    /// `hairpin-agent run` with `source` flags in the node namespace, inside the
    /// agent's child cgroup, attaching at `cgroup`, logging to the node's agent.log.
    fn spawn(
        node: &SimNode,
        source: &[&str],
        cgroup: &std::path::Path,
        log_filter: &str,
        extra: &[&str],
    ) -> Agent {
        Agent::spawn_env(node, source, cgroup, log_filter, extra, &[])
    }

    /// As [`Agent::spawn`], with `env` set last.
    fn spawn_env(
        node: &SimNode,
        source: &[&str],
        cgroup: &std::path::Path,
        log_filter: &str,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Agent {
        let log = node.dir.join("agent.log");
        let out = fs::File::create(&log).expect("agent log");
        let bin = agent_bin();
        let node_ips = format!("{NODE_IP4},{NODE_IP6}");
        let mut argv = vec![bin.to_str().expect("utf-8 path"), "run"];
        argv.extend_from_slice(source);
        argv.extend_from_slice(&[
            "--cgroup-path",
            cgroup.to_str().expect("utf-8 path"),
            "--node-ip",
            &node_ips,
            "--log",
            log_filter,
        ]);
        // The mesh cache as at the node's cgroup root, where `auto` turns it on: below
        // it `auto` leaves it off, and every process of a simulated node (any mesh
        // proxy included) runs inside the node's cgroup, where sock_ops sees its
        // listen(2). For every build that has the flag (the bench's baseline may be
        // one from before it, or one with it: both sides of a comparison then run
        // alike), and unless the test passes it.
        if !extra.contains(&"--mesh-listener-cache") && run_knows(&bin, "--mesh-listener-cache") {
            argv.extend_from_slice(&["--mesh-listener-cache", "on"]);
        }
        argv.extend_from_slice(extra);
        let child = command_in(&node.node_ns, Some(&node.agent_cgroup()), &argv)
            // One admin socket per node: the default path is shared by the whole machine
            // and parallel tests' agents would refuse each other's live socket.
            .env("HAIRPIN_ADMIN_SOCKET", node.dir.join("admin.sock"))
            // The node's own bpf filesystem, not the machine's /sys/fs/bpf.
            .env("HAIRPIN_BPF_PIN_DIR", node.pin_dir())
            // The suites written for the relay path keep it: the agent's default is
            // the kernel path (`auto`) now, and a test that wants it passes
            // `--kernel-path`, which takes precedence over this variable.
            .env("HAIRPIN_KERNEL_PATH", "off")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start hairpin-agent");
        Agent {
            child: Some(child),
            log,
            frontends: PathBuf::new(),
        }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; panics with the log if it never does
    /// or the agent exits first.
    pub fn wait_for_log(&mut self, needle: &str, within: Duration) {
        wait_for_log_of("agent", &self.log, self.child.as_mut(), needle, within);
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("agent running").id() as i32
    }

    /// Sends `sig` to the agent.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("signal agent");
    }

    /// SIGTERM, then asserts the agent exits 0 within 30 s: a graceful stop, as in
    /// a rollout.
    pub fn stop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.wait(Duration::from_secs(30));
        assert!(status.success(), "{status}\n{}", self.log());
    }

    /// Waits for the agent to exit, at most `within`.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let log = self.log.clone();
        let child = self.child.as_mut().expect("agent running");
        let status = wait_exit(child, within, &log);
        self.child = None;
        status
    }
}

/// Waits for an agent process to exit, at most `within`; fails with its log (the
/// file `log`) when it does not.
fn wait_exit(child: &mut Child, within: Duration, log: &std::path::Path) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait agent") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "agent still running after {within:?}:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `GET path` on the admin socket of `node`'s agent; the body.
pub fn admin_get(node: &SimNode, path: &str) -> String {
    let sock = node.dir.join("admin.sock");
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "--unix-socket"])
        .arg(&sock)
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "GET {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `/status` document of `node`'s agent.
pub fn status(node: &SimNode) -> serde_json::Value {
    serde_json::from_str(&admin_get(node, "/status")).expect("status is json")
}

/// The DaemonSet's capabilities (deploy/base/daemonset.yaml): no CAP_PERFMON, no
/// CAP_SYS_ADMIN.
pub const DAEMONSET_CAPS: [&str; 4] = [
    "CAP_BPF",
    "CAP_CHOWN",
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
];

/// The DaemonSet's pin owner (`HAIRPIN_PIN_OWNER`), whose group is the pod's
/// supplementary group.
pub const DAEMONSET_PIN_OWNER: u32 = 60104;

/// The agent as [`Agent::start_with`] runs it, but with exactly `caps` (as the
/// DaemonSet's securityContext grants them); killed on drop.
pub struct CappedAgent {
    child: Child,
    log: std::path::PathBuf,
}

impl CappedAgent {
    /// Starts it on `node` with `specs` as its frontends file and `extra` flags, with
    /// only `caps`; returns once it is ready.
    pub fn start(
        node: &SimNode,
        specs: &[FrontendSpec],
        extra: &[&str],
        caps: &[&str],
    ) -> CappedAgent {
        CappedAgent::start_yaml(node, &frontends_yaml(specs), extra, caps)
    }

    /// As [`CappedAgent::start`], with `yaml` as the frontends file as written (for
    /// settings [`FrontendSpec`] does not carry, such as `path: relay`).
    pub fn start_yaml(node: &SimNode, yaml: &str, extra: &[&str], caps: &[&str]) -> CappedAgent {
        CappedAgent::start_in_groups(node, yaml, extra, caps, &[])
    }

    /// As [`CappedAgent::start_yaml`], with `groups` as its supplementary groups (a
    /// pod's `supplementalGroups`).
    pub fn start_in_groups(
        node: &SimNode,
        yaml: &str,
        extra: &[&str],
        caps: &[&str],
        groups: &[u32],
    ) -> CappedAgent {
        use std::os::{fd::AsRawFd, unix::process::CommandExt};
        let groups: Vec<libc::gid_t> = groups.to_vec();
        let frontends = node.dir.join("frontends.yaml");
        std::fs::write(&frontends, yaml).expect("write frontends");
        let log = node.dir.join("agent.log");
        let netns = std::fs::File::open(format!("/run/netns/{}", node.node_ns)).expect("netns");
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(node.agent_cgroup().join("cgroup.procs"))
            .expect("the agent's cgroup");
        let (netns_fd, procs_fd) = (netns.as_raw_fd(), procs.as_raw_fd());
        let mut cmd = agent_command();
        cmd.arg("run")
            .arg("--frontends")
            .arg(&frontends)
            .args(["--allowed-clients", SIM_POD_NETWORKS, "--cgroup-path"])
            .arg(&node.cgroup)
            .args(["--node-ip", &format!("{NODE_IP4},{NODE_IP6}")])
            .args(["--log", "hairpin_agent=debug,info"])
            .args(extra)
            .env("HAIRPIN_ADMIN_SOCKET", node.dir.join("admin.sock"))
            .env("HAIRPIN_BPF_PIN_DIR", node.pin_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"));
        // SAFETY: setns and write on descriptors opened above, async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(netns_fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Writing 0 moves the writing process itself.
                if libc::write(procs_fd, b"0\n".as_ptr().cast(), 2) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Before the capabilities go (CAP_SETGID).
                if !groups.is_empty() && libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // After joining the namespace, which needs CAP_SYS_ADMIN.
        with_only_caps(&mut cmd, caps);
        let child = cmd.spawn().expect("start hairpin-agent");
        drop((netns, procs));
        let agent = CappedAgent { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !agent.log().contains("agent ready") {
            assert!(
                Instant::now() < deadline,
                "the agent did not get ready:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        agent
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` to the agent.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .expect("signal agent");
    }

    /// SIGTERM, then asserts the agent exits 0 within 30 s.
    pub fn stop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.wait(Duration::from_secs(30));
        assert!(status.success(), "{status}\n{}", self.log());
    }

    /// Waits for the agent to exit, at most `within`.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        wait_exit(&mut self.child, within, &self.log)
    }

    /// A `CapXxx:` line of its /proc status, as a mask.
    pub fn caps(&self, which: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the agent's status");
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{which}:")))
            .unwrap_or_else(|| panic!("no {which} in {status}"));
        u64::from_str_radix(line.trim(), 16).expect("a hex mask")
    }
}

impl Drop for CappedAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
