//! The datapath outlives the agent, on a simulated node with the node's own bpf
//! filesystem as `--bpf-pin-dir`: links, programs and maps are pinned, so replacing
//! the agent (a rollout's SIGTERM, a crash's SIGKILL) leaves the kernel path
//! writing headers with no process in the path, the next agent adopts the links and
//! swaps its programs in place, a dead agent's datapath goes inert at its TTL, and
//! `cleanup` removes it all. Real nginx and haproxy say what header each connection
//! carried.
//!
//! One test binary, a module per concern: `replacement` (an agent replaced, killed,
//! or gone with its relay), `upgrade` (programs swapped in place, a second agent
//! waiting for the lock, a hand-over across pin layouts), `rollout` (the
//! DaemonSet's capabilities, a rollout and the DaemonSet's deletion).

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

mod replacement;
mod rollout;
mod upgrade;
