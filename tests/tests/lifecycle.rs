//! The datapath outlives the agent, on a simulated node with the node's own bpf
//! filesystem as `--bpf-pin-dir`: links, programs and maps are pinned, so replacing
//! the agent (a rollout's SIGTERM, a crash's SIGKILL) leaves the kernel path
//! writing headers with no process in the path, the next agent adopts the links and
//! swaps its programs in place, a dead agent's datapath goes inert at its TTL, and
//! `cleanup` removes it all. Real nginx and haproxy say what header each connection
//! carried.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::{
        Agent, CappedAgent, DAEMONSET_CAPS, SIM_POD_NETWORKS, agent_bin, all_frontends,
        frontends_yaml, status,
    },
    client::{KeepAlive, assert_true_client, from_pod, mptcp_enabled, mptcp_from_pod, url},
    fakeapi::{digitalocean_service, recorded},
    node::{NODE_IP4, NODE_IP6, POD_IP4, POD_IP6, SimNode},
    require_privileges,
    servers::{nginx_access_log, start_haproxy, start_nginx},
    sh::command_in,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// The default configuration (the test harness's agents otherwise run the relay).
const DEFAULTS: &[&str] = &["--kernel-path", "auto"];

/// A pod client opening a new connection to `lb`:80 every few ms until stopped:
/// one line per connection in `out`, the body nginx echoes (`client=IP:PORT
/// dst=...`) and ` code=HTTP_CODE exit=CURL_EXIT`.
struct Connector {
    child: Child,
    out: PathBuf,
    stop: PathBuf,
}

impl Connector {
    fn start(node: &SimNode, lb: &str, name: &str) -> Connector {
        let out = node.dir.join(format!("{name}.out"));
        let stop = node.dir.join(format!("{name}.stop"));
        // One line per connection: the body (which ends in a newline) folded onto
        // one line with curl's verdict.
        let script = format!(
            "while [ ! -e {stop} ]; do echo \"$(curl -sS --max-time 3 -w ' code=%{{http_code}} exit=%{{exitcode}}' \
             http://{host}/ 2>/dev/null | tr -d '\\n')\" >> {out}; sleep 0.003; done",
            stop = stop.display(),
            out = out.display(),
            host = if lb.contains(':') {
                format!("[{lb}]")
            } else {
                lb.to_string()
            },
        );
        let child = node.spawn_in_pod(&["bash", "-c", &script]);
        Connector { child, out, stop }
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits until `n` more connections than now have been made.
    fn wait_more(&self, n: usize) {
        let start = self.lines().len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.lines().len() < start + n {
            assert!(
                Instant::now() < deadline,
                "the connector stalled: {:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it; every line.
    fn finish(mut self) -> Vec<String> {
        std::fs::write(&self.stop, "").expect("stop file");
        let _ = self.child.wait();
        self.lines()
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The connections in `lines` that did not get an answer naming `client` as the
/// header's source.
fn failed<'a>(lines: &'a [String], client: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| !(l.starts_with(&format!("client={client}:")) && l.contains(" code=200 ")))
        .collect()
}

/// The pinned map `name` of this layout in the node's pin dir.
fn pinned_map(node: &SimNode, name: &str) -> PathBuf {
    node.pin_dir()
        .join(format!("v{}", hairpin_ebpf::PIN_LAYOUT))
        .join("maps")
        .join(name)
}

/// A counter of the programs, summed over CPUs, read from the pinned counters map
/// (no agent needed).
fn pinned_counter(node: &SimNode, name: &str) -> u64 {
    let index = hairpin_ebpf::Counter::ALL
        .iter()
        .position(|c| c.name() == name)
        .unwrap_or_else(|| panic!("no counter {name}"));
    let out = Command::new("bpftool")
        .args(["-j", "map", "lookup", "pinned"])
        .arg(pinned_map(node, hairpin_ebpf::MAP_COUNTERS))
        .args(["key"])
        .args((index as u32).to_le_bytes().map(|b| b.to_string()))
        .output()
        .expect("run bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bpftool map lookup: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["values"]
        .as_array()
        .expect("per-cpu values")
        .iter()
        .map(|c| {
            let bytes: Vec<u8> = c["value"]
                .as_array()
                .expect("value bytes")
                .iter()
                .map(|b| {
                    let s = b.as_str().expect("a hex byte");
                    u8::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex")
                })
                .collect();
            u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
        })
        .sum()
}

/// hairpin's programs attached at the node's cgroup: (attach type, program id).
fn attached(node: &SimNode) -> BTreeSet<(String, u64)> {
    attached_at(&node.cgroup)
}

/// hairpin's programs attached at `cgroup`, as bpftool lists them.
fn attached_at(cgroup: &Path) -> BTreeSet<(String, u64)> {
    let out = Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(cgroup)
        .output()
        .expect("run bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("hairpin")))
                .map(|p| {
                    (
                        p["attach_type"].as_str().unwrap_or("").to_string(),
                        p["id"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The hooks hairpin's kernel path links at a cgroup.
const HOOKS: [&str; 4] = [
    "cgroup_inet4_connect",
    "cgroup_inet6_connect",
    "cgroup_sock_ops",
    "cgroup_setsockopt",
];

/// What a [`Sampler`] saw.
struct Samples {
    /// How many times it read the cgroup's attachments.
    count: usize,
    /// Every sample where one of [`HOOKS`] had no hairpin program.
    gaps: Vec<String>,
    /// Every (hook, program id) seen.
    seen: BTreeSet<(String, u64)>,
}

/// Samples the cgroup's attachments back to back until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Samples>,
}

impl Sampler {
    fn start(cgroup: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Samples {
                count: 0,
                gaps: Vec::new(),
                seen: BTreeSet::new(),
            };
            while !flag.load(Ordering::Relaxed) {
                let now = attached_at(&cgroup);
                samples.count += 1;
                for hook in HOOKS {
                    if !now.iter().any(|(t, _)| t == hook) {
                        samples
                            .gaps
                            .push(format!("sample {}: no {hook} in {now:?}", samples.count));
                    }
                }
                samples.seen.extend(now);
            }
            samples
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler")
    }
}

/// An agent with the default flags and a `ttl` heartbeat, SIGKILLed once ready; when.
fn killed_agent(node: &SimNode, ttl: &str) -> (Agent, Instant) {
    let mut agent = Agent::start_with(
        node,
        &all_frontends(),
        &["--kernel-path", "auto", "--datapath-ttl", ttl],
    );
    ready(&mut agent);
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    (agent, Instant::now())
}

/// Every hook ran one program `before` and runs one `after`, another.
fn assert_one_new_program_per_hook(
    before: &BTreeSet<(String, u64)>,
    after: &BTreeSet<(String, u64)>,
) {
    for hook in HOOKS {
        let old: Vec<_> = before.iter().filter(|(t, _)| t == hook).collect();
        let new: Vec<_> = after.iter().filter(|(t, _)| t == hook).collect();
        assert_eq!(
            (old.len(), new.len()),
            (1, 1),
            "{hook}: {before:?} -> {after:?}"
        );
        assert_ne!(old[0].1, new[0].1, "{hook} still runs the old program");
    }
}

/// Waits for the agent to say it is ready.
fn ready(agent: &mut Agent) {
    agent.wait_for_log("agent ready", Duration::from_secs(30));
}

#[test]
fn replacing_the_agent_by_sigterm_or_sigkill_fails_no_new_connection_and_keeps_a_keep_alive_one() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // Default flags, only the DaemonSet's capabilities.
    let start = || CappedAgent::start(&node, &all_frontends(), &[], &DAEMONSET_CAPS);
    let mut agent = start();
    let ka_dir = node.dir.join("ka");
    let ka = KeepAlive::start(&node, &ka_dir, 3);
    let first = ka.answer(1);
    assert!(
        first.starts_with(&format!("client={POD_IP4}:")),
        "{first}\n{}",
        agent.log()
    );
    let v4 = Connector::start(&node, "203.0.113.10", "v4");
    let v6 = Connector::start(&node, "2001:db8:ffff::12", "v6");
    v4.wait_more(20);
    v6.wait_more(20);

    // A rollout: SIGTERM, wait for the exit, the next agent a second later.
    agent.stop();
    assert!(agent.log().contains("datapath kept"), "{}", agent.log());
    std::thread::sleep(Duration::from_secs(1));
    v4.wait_more(10);
    let mut agent = start();
    assert!(
        agent.log().contains("adopted the pinned link"),
        "{}",
        agent.log()
    );
    v4.wait_more(20);
    assert_eq!(
        ka.answer(2),
        first,
        "the keep-alive connection across SIGTERM"
    );

    // A crash: SIGKILL, the next agent a second later.
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    v4.wait_more(10);
    let agent = start();
    v4.wait_more(20);
    v6.wait_more(20);
    assert_eq!(
        ka.answer(3),
        first,
        "the keep-alive connection across SIGKILL"
    );

    let (v4, v6) = (v4.finish(), v6.finish());
    let (bad4, bad6) = (failed(&v4, POD_IP4), failed(&v6, POD_IP6));
    eprintln!(
        "connections across SIGTERM and SIGKILL replacements: {} v4, {} v6; failed {} and {}",
        v4.len(),
        v6.len(),
        bad4.len(),
        bad6.len()
    );
    assert!(
        v4.len() >= 80 && v6.len() >= 40,
        "too few connections: {} {}",
        v4.len(),
        v6.len()
    );
    assert!(
        bad4.is_empty() && bad6.is_empty(),
        "failed: {bad4:?} {bad6:?}\n{}",
        agent.log()
    );
    // nginx saw the true client on every one of them.
    let access = nginx_access_log(&node);
    assert!(
        !access.contains("pp_client= ") && !access.contains("pp_client=-"),
        "a request without a header reached nginx:\n{access}"
    );
}

#[test]
fn a_killed_agent_not_restarted_keeps_writing_headers_until_the_ttl_then_traffic_goes_as_before_hairpin()
 {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let _haproxy = start_haproxy(&node);
    let (agent, killed) = killed_agent(&node, "6s");
    // No agent: the kernel path still writes the exact header, v1 and v2, v4 and v6,
    // to nginx and haproxy.
    for (lb, ip) in [
        ("203.0.113.10", POD_IP4),
        ("2001:db8:ffff::10", POD_IP6),
        ("203.0.113.11", POD_IP4),
        ("2001:db8:ffff::11", POD_IP6),
        ("203.0.113.12", POD_IP4),
        ("2001:db8:ffff::12", POD_IP6),
    ] {
        let reply = from_pod(&node, &url(lb, 80, "/"));
        assert_true_client("pod, no agent", &reply, ip, lb, &agent);
    }
    // TLS: openssl's ClientHello goes out behind the header too (nginx, speaking
    // plain HTTP here, answers 400 and logs the header's client).
    let out = hairpin_tests::sh::output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &[
            "bash",
            "-c",
            "openssl s_client -connect 203.0.113.12:80 -servername lb </dev/null >/dev/null 2>&1; true",
        ],
    );
    assert!(out.status.success());
    let tls_logged = |a: &str| {
        a.lines()
            .any(|l| l.contains(&format!("pp_client={POD_IP4}:")) && l.contains("\" 400 "))
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !tls_logged(&nginx_access_log(&node)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        tls_logged(&nginx_access_log(&node)),
        "{}",
        nginx_access_log(&node)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "the checks took too long for the TTL"
    );
    assert_eq!(pinned_counter(&node, "expired"), 0);
    // Past the TTL the connect programs leave traffic alone: as before hairpin.
    std::thread::sleep(
        Duration::from_secs(6).saturating_sub(killed.elapsed()) + Duration::from_millis(500),
    );
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(
        reply.code, 52,
        "pre-hairpin behaviour past the TTL: {reply:?}"
    );
    assert_eq!(pinned_counter(&node, "expired"), 1);
    // The programs are still attached (the TTL disarms them; cleanup removes them).
    assert!(!attached(&node).is_empty());
}

#[test]
fn a_relay_frontend_goes_as_before_hairpin_while_no_relay_listens() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // The relay path for every frontend: each connect goes to a listener only while
    // it listens.
    let mut agent = Agent::start_with(&node, &all_frontends(), &["--kernel-path", "off"]);
    ready(&mut agent);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod, relay", &reply, POD_IP4, "203.0.113.10", &agent);
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    // The programs stay (pinned) and the heartbeat is fresh, but the listener is gone:
    // the connect is not sent to it (no refusal, no hang) and reaches nginx as
    // before hairpin, which refuses it for its missing header.
    let started = Instant::now();
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(reply.code, 52, "pre-hairpin behaviour: {reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a hang: {:?}",
        started.elapsed()
    );
    assert_eq!(pinned_counter(&node, "relay_down"), 1);
    assert!(!attached(&node).is_empty());
    // The next agent serves it again.
    let mut next = Agent::start_with(&node, &all_frontends(), &["--kernel-path", "off"]);
    ready(&mut next);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod, relay again", &reply, POD_IP4, "203.0.113.10", &next);
}

#[test]
fn an_upgrade_swaps_every_program_in_place_with_no_instant_without_one() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start_with(&node, &all_frontends(), DEFAULTS);
    ready(&mut agent);
    let before = attached(&node);
    let sampler = Sampler::start(node.cgroup.clone());
    let conns = Connector::start(&node, "203.0.113.10", "up");
    conns.wait_more(10);
    agent.stop();
    let mut next = Agent::start_with(&node, &all_frontends(), DEFAULTS);
    ready(&mut next);
    conns.wait_more(10);
    let Samples {
        count: samples,
        gaps,
        seen,
    } = sampler.finish();
    let after = attached(&node);
    let lines = conns.finish();
    let bad = failed(&lines, POD_IP4);
    eprintln!(
        "upgrade: {samples} samples of the cgroup, {} connections, {} failed",
        lines.len(),
        bad.len()
    );
    assert!(samples >= 20, "too few samples: {samples}");
    assert!(gaps.is_empty(), "a hook without a program: {gaps:?}");
    assert!(bad.is_empty(), "failed: {bad:?}\n{}", next.log());
    // Every hook runs the new agent's program now, through the same links.
    assert_one_new_program_per_hook(&before, &after);
    assert!(seen.len() <= before.len() + after.len(), "{seen:?}");
    let s = status(&node);
    let adopted: Vec<&Value> = s["lifecycle"]["adopted"]
        .as_array()
        .expect("adopted")
        .iter()
        .collect();
    assert_eq!(adopted.len(), 5, "{s}");
    assert!(adopted.iter().all(|a| a[1] == "swapped"), "{s}");
}

#[test]
fn a_second_agent_on_the_same_pin_dir_waits_and_takes_over_when_the_first_is_gone() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut first = Agent::start_with(&node, &all_frontends(), DEFAULTS);
    ready(&mut first);
    // A second agent (a debugging run, a second release) with the same pin dir.
    let frontends = node.dir.join("second.yaml");
    std::fs::write(&frontends, frontends_yaml(&all_frontends())).expect("frontends");
    let log = node.dir.join("second.log");
    let mut second = command_in(
        &node.node_ns,
        Some(&node.agent_cgroup()),
        &[
            agent_bin().to_str().expect("utf-8"),
            "run",
            "--frontends",
            frontends.to_str().expect("utf-8"),
            "--cgroup-path",
            node.cgroup.to_str().expect("utf-8"),
            "--kernel-path",
            "on",
            "--node-ip",
            &format!("{NODE_IP4},{NODE_IP6}"),
            "--allowed-clients",
            SIM_POD_NETWORKS,
            "--admin-address",
            "127.0.0.1:9911",
            "--metrics-address",
            "127.0.0.1:9912",
        ],
    )
    .env("HAIRPIN_ADMIN_SOCKET", node.dir.join("second.sock"))
    .env("HAIRPIN_BPF_PIN_DIR", node.pin_dir())
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).expect("log"))
    .spawn()
    .expect("start the second agent");
    hairpin_tests::agent::wait_for_log_of(
        "second agent",
        &log,
        Some(&mut second),
        "another hairpin agent owns this node's datapath",
        Duration::from_secs(20),
    );
    // The first one still runs the datapath, untouched.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &first);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("agent ready"), "{text}");
    // Waiting, it answers its probes (a rollout's startup probe is not left
    // unanswered): live, not ready, and why, in /readyz and `status`.
    let sock = node.dir.join("second.sock");
    assert_eq!(admin_at(&sock, "/healthz").0, 200);
    let (code, ready) = admin_at(&sock, "/readyz");
    assert_eq!(code, 503, "{ready}");
    assert!(
        ready.contains("programs are not attached: waiting for the pin directory"),
        "{ready}"
    );
    let out = Command::new(agent_bin())
        .args(["status", "--admin-socket"])
        .arg(&sock)
        .env("NO_COLOR", "1")
        .output()
        .expect("run status");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("not ready: programs are not attached: waiting for the pin directory"),
        "{said}"
    );
    // Once the first is gone, the second adopts its datapath.
    first.signal(Signal::SIGKILL);
    first.wait(Duration::from_secs(10));
    hairpin_tests::agent::wait_for_log_of(
        "second agent",
        &log,
        Some(&mut second),
        "agent ready",
        Duration::from_secs(20),
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("adopted the pinned link"), "{text}");
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &first);
    let _ = second.kill();
    let _ = second.wait();
}

/// A process holding the pin directory's lock (`flock(1)`, as another agent or
/// `hairpin-agent cleanup` would), killed with it.
struct LockHolder(Child);

impl LockHolder {
    /// Takes the lock of `dir` and returns once it is held.
    fn hold(dir: &Path) -> LockHolder {
        std::fs::create_dir_all(dir).expect("the pin directory");
        let child = Command::new("flock")
            .arg(dir)
            .args(["sleep", "600"])
            .spawn()
            .expect("run flock");
        let holder = LockHolder(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        // Held once a non-blocking attempt of our own fails.
        while Command::new("flock")
            .args(["-n"])
            .arg(dir)
            .arg("true")
            .status()
            .expect("run flock -n")
            .success()
        {
            assert!(
                Instant::now() < deadline,
                "flock never took {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        holder
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every file or directory under `dir`, recursively.
fn entries_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.path().is_dir() {
            out.extend(entries_under(&e.path()));
        }
    }
    out
}

/// The kubelet stops a pod whose agent still waits for the pin directory's lock
/// (a rollout where the old agent, or `cleanup`, holds it): SIGTERM ends the wait
/// at once, well within the DaemonSet's 30 s grace period, with exit status 0, a
/// line saying so, nothing attached or pinned, and its admin socket gone. Costs
/// under a second (0.4 s here: the agent's start; no program is loaded).
#[test]
fn sigterm_while_waiting_for_the_pin_lock_stops_the_agent_at_once_with_nothing_attached() {
    require_privileges!();
    let node = SimNode::new();
    let _holder = LockHolder::hold(&node.pin_dir());
    let mut agent = Agent::spawn_with(&node, &all_frontends(), DEFAULTS);
    agent.wait_for_log("waiting to own the datapath", Duration::from_secs(20));
    let sent = Instant::now();
    agent.signal(Signal::SIGTERM);
    // Without the wait watching for it, the signal is queued behind the lock and
    // the agent runs on until the kubelet's SIGKILL: this wait fails.
    let exit = agent.wait(Duration::from_secs(5));
    let took = sent.elapsed();
    let log = agent.log();
    assert!(exit.success(), "{exit}\n{log}");
    assert!(took < Duration::from_secs(2), "took {took:?}\n{log}");
    assert!(
        log.contains("stopped while waiting to own the datapath: nothing was attached or changed")
            && log.contains("signal=\"SIGTERM\""),
        "{log}"
    );
    assert!(!log.contains("programs attached"), "{log}");
    assert!(attached(&node).is_empty(), "{:?}", attached(&node));
    let pinned = entries_under(&node.pin_dir());
    assert!(pinned.is_empty(), "{pinned:?}");
    assert!(!node.dir.join("admin.sock").exists(), "{log}");
}

#[test]
fn an_upgrade_across_pin_layouts_is_handed_over_at_once_with_no_instant_without_a_program() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // The running release, with the default TTL (10 minutes): waiting it out would
    // stall the rollout on this node.
    let mut old = Agent::start_with(&node, &all_frontends(), DEFAULTS);
    ready(&mut old);
    let before = attached(&node);
    let sampler = Sampler::start(node.cgroup.clone());
    let conns = Connector::start(&node, "203.0.113.10", "layouts");
    conns.wait_more(10);
    // A rollout to a release whose maps are laid out otherwise.
    let (old_layout, new_layout) = (hairpin_ebpf::PIN_LAYOUT, hairpin_ebpf::PIN_LAYOUT + 1);
    old.stop();
    assert!(old.log().contains("datapath kept"), "{}", old.log());
    let exited = Instant::now();
    let mut new = Agent::spawn_with(
        &node,
        &all_frontends(),
        &[
            "--kernel-path",
            "auto",
            "--pin-layout",
            &new_layout.to_string(),
        ],
    );
    ready(&mut new);
    let took = exited.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "ready {took:?} after its predecessor's exit\n{}",
        new.log()
    );
    // The old layout's consumers go once the sockets it marked have their header.
    new.wait_for_log(
        "the other layout's datapath is handed over: removed",
        Duration::from_secs(40),
    );
    conns.wait_more(10);
    let Samples {
        count: samples,
        gaps,
        seen: _,
    } = sampler.finish();
    let after = attached(&node);
    let lines = conns.finish();
    let bad = failed(&lines, POD_IP4);
    eprintln!(
        "across pin layouts: ready {took:?} after the old agent's exit, {samples} samples of \
         the cgroup, {} connections, {} failed",
        lines.len(),
        bad.len()
    );
    assert!(samples >= 20, "too few samples: {samples}");
    assert!(gaps.is_empty(), "a hook without a program: {gaps:?}");
    assert!(bad.is_empty(), "failed: {bad:?}\n{}", new.log());
    // One program per hook again, the new agent's.
    assert_one_new_program_per_hook(&before, &after);
    assert!(
        !node.pin_dir().join(format!("v{old_layout}")).exists(),
        "the old layout's pins stay"
    );
    assert!(
        node.pin_dir()
            .join(format!("v{new_layout}"))
            .join("links")
            .join("connect4")
            .exists()
    );
    let s = status(&node);
    let adopted = s["lifecycle"]["adopted"].as_array().expect("adopted");
    for hook in ["connect4", "connect6"] {
        assert!(
            adopted
                .iter()
                .any(|a| a[0] == hook && a[1] == format!("taken over from layout v{old_layout}")),
            "{s}"
        );
    }
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod, new datapath", &reply, POD_IP4, "203.0.113.10", &new);
}

#[test]
fn with_only_the_daemonsets_capabilities_mptcp_is_told_apart_and_relayed_with_its_true_address() {
    require_privileges!();
    let node = SimNode::new();
    assert!(
        mptcp_enabled(&node.pod_ns),
        "this kernel must have MPTCP enabled"
    );
    let _nginx = start_nginx(&node);
    let agent = CappedAgent::start(&node, &all_frontends(), DEFAULTS, &DAEMONSET_CAPS);
    let s = status(&node);
    assert_eq!(
        s["kernel_path"]["mptcp_detection"],
        "notsent_lowat",
        "{s}\n{}",
        agent.log()
    );
    for (lb, ip) in [("203.0.113.10", POD_IP4), ("2001:db8:ffff::10", POD_IP6)] {
        let out = mptcp_from_pod(&node, lb);
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            body.starts_with(&format!("client={ip}:"))
                && body.trim().ends_with(&format!("dst={lb}:80")),
            "MPTCP -> {lb}: {body}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
    }
    let s = status(&node);
    let counter = |name: &str| s["counters"]["kernel"][name].as_u64().unwrap_or(0);
    assert_eq!(counter("kernel_fallback_mptcp"), 2, "{s}");
    assert_eq!(counter("kernel_missed_insert"), 0, "{s}");
    // A plain TCP socket reads TCP_NOTSENT_LOWAT 0: it keeps the kernel path.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert!(
        reply.ok() && reply.body.starts_with(&format!("client={POD_IP4}:")),
        "{reply:?}"
    );
    let s = status(&node);
    assert_eq!(
        s["counters"]["kernel"]["kernel_headers_written"].as_u64(),
        Some(1),
        "{s}"
    );
}

/// The relays' listen addresses in the node namespace (on `lo` here: this kernel has
/// no dummy link type for `hairpin0`).
fn listen_addresses_on_the_node(node: &SimNode) -> String {
    let out = hairpin_tests::sh::output_in(&node.node_ns, None, &["ip", "-o", "addr", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("169.254.104.1") || l.contains("fd68:6169:7270:696e::1"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_rollout_keeps_the_datapath_and_the_daemonsets_deletion_removes_it_with_its_addresses() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = hairpin_tests::fakeapi::FakeApi::start_in_netns(&node.node_ns);
    let kubeconfig = api.node_kubeconfig(&node);
    // ingress-nginx on DigitalOcean with the PROXY protocol on; LB IP 203.0.113.10.
    api.apply(digitalocean_service());
    api.put_daemonset(recorded("daemonsets/hairpin.yaml"));
    let flags = [
        "--kernel-path",
        "auto",
        "--daemonset",
        "hairpin-system/hairpin",
    ];
    let mut agent = Agent::start_kube(&node, &kubeconfig, &flags);
    ready(&mut agent);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);

    // A rollout: the DaemonSet stays, so SIGTERM keeps everything for the next agent.
    agent.stop();
    assert!(agent.log().contains("datapath kept"), "{}", agent.log());
    assert!(!attached(&node).is_empty());
    assert!(!listen_addresses_on_the_node(&node).is_empty());
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client(
        "pod, between agents",
        &reply,
        POD_IP4,
        "203.0.113.10",
        &agent,
    );

    // The next agent adopts it; then the DaemonSet is deleted (its deletion done: a
    // 404) and the agent gets its SIGTERM.
    let mut agent = Agent::start_kube(&node, &kubeconfig, &flags);
    ready(&mut agent);
    api.remove_daemonset("hairpin-system/hairpin");
    agent.stop();
    let log = agent.log();
    assert!(
        log.contains("datapath removed") && log.contains("uninstalled"),
        "{log}"
    );
    // Nothing attached, nothing pinned, no listen address: traffic as before hairpin.
    assert!(attached(&node).is_empty(), "{:?}", attached(&node));
    let pins: Vec<_> = std::fs::read_dir(node.pin_dir())
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(pins.is_empty(), "pins left: {pins:?}");
    assert_eq!(listen_addresses_on_the_node(&node), "", "{log}");
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(reply.code, 52, "pre-hairpin behaviour: {reply:?}");
}

/// `GET path` on the admin socket `sock`: the status code and the body.
fn admin_at(sock: &Path, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-w",
            "\\n%{http_code}",
            "--unix-socket",
        ])
        .arg(sock)
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}
