//! The node's other processes as adversaries (SECURITY.md, "Local neighbours"): a
//! process as uid 65534 with no capabilities crowds or squats the agent's admin port,
//! and the kubelet's probes, run exactly as the DaemonSet defines them, are answered
//! every time; a node address given as a slot address is refused at start.
//!
//! A process as nobody holding a mesh capture port (which sends the node's own
//! kernel-path connects to the relay) and every relay connection it may: the
//! node's other processes are still relayed.
//!
//! Bounded: the crowd holds at most 256 connections for at most 12 s; each probe has
//! the DaemonSet's own timeout; the relay hog holds 40 connections for 20 s.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::{Agent, admin_get, agent_bin, all_frontends, status},
    cli::{admin_socket, run_cli, start_agent},
    client::{assert_true_client, from_host, url},
    node::{NODE_IP4, SimNode},
    require_privileges,
    servers::start_nginx,
    sh::command_in,
};
use serde_json::Value;

/// The uid of `nobody`, without capabilities: any process on a node can be that.
const NOBODY: &str = "65534";

/// Holds every TCP connection it can to HOST:PORT, from sources 127.0.0.1-.8 (the
/// admin listener caps per peer address), re-opening those the server closes, and
/// tries the admin socket each round; writes what it managed as JSON at the end.
const CROWD: &str = r#"
import errno, json, select, socket, sys, time
host, port, sock_path, secs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
held, opened, most, unix_errors, unix_ok = [], 0, 0, {}, 0
end = time.time() + secs
src = 0
while time.time() < end:
    while len(held) < 256:
        s = socket.socket()
        s.settimeout(0.2)
        try:
            s.bind(("127.0.0.%d" % (1 + src % 8), 0))
            src += 1
            s.connect((host, port))
            s.setblocking(False)
            held.append(s)
            opened += 1
        except OSError:
            s.close()
            break
    if held:
        readable, _, _ = select.select(held, [], [], 0.01)
        for s in readable:
            try:
                gone = s.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone:
                held.remove(s)
                s.close()
    most = max(most, len(held))
    u = socket.socket(socket.AF_UNIX)
    try:
        u.connect(sock_path)
        unix_ok += 1
    except OSError as e:
        unix_errors[errno.errorcode.get(e.errno, str(e.errno))] = unix_errors.get(errno.errorcode.get(e.errno, str(e.errno)), 0) + 1
    u.close()
    time.sleep(0.005)
json.dump({"opened": opened, "most_held": most, "unix_ok": unix_ok, "unix_errors": unix_errors}, open(out, "w"))
"#;

/// Binds HOST:PORT before the agent does and answers every request 200 with a
/// forged body (`/status` included), until killed.
const SQUAT: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
open(sys.argv[3], "w").write("bound")
while True:
    c, _ = s.accept()
    c.settimeout(1)
    try:
        c.recv(4096)
        c.sendall(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"forged\": \"SQUATTER\"}")
    except OSError:
        pass
    c.close()
"#;

/// Listens on 127.0.0.1:15001 (a mesh's outbound capture port: the node's connects
/// to kernel-path frontends then go to the relay), opens N connections to LB:PORT
/// and holds them; after a second writes how many are still open (the relay resets
/// those past its cap) and a file saying so, then holds them HOLD seconds.
const RELAY_HOG: &str = r#"
import json, socket, sys, time
lb, port, n, hold, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
mesh = socket.socket()
mesh.bind(("127.0.0.1", 15001))
mesh.listen(16)
held = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((lb, port))
        held.append(s)
    except OSError:
        s.close()
time.sleep(1)
alive = 0
for s in held:
    s.setblocking(False)
    try:
        alive += 1 if s.recv(1, socket.MSG_PEEK) else 0
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
json.dump({"connected": len(held), "alive": alive}, open(out + ".tmp", "w"))
import os
os.rename(out + ".tmp", out)
time.sleep(hold)
"#;

/// `python3 -c SCRIPT ARGS` in `node`'s namespace as uid and gid 65534, no groups,
/// no capabilities (none inheritable, an empty bounding set).
fn as_nobody(node: &SimNode, script: &str, args: &[&str]) -> Child {
    as_nobody_in(node, None, script, args)
}

/// As [`as_nobody`], in `cgroup` (where the connect programs act).
fn as_nobody_in(node: &SimNode, cgroup: Option<&Path>, script: &str, args: &[&str]) -> Child {
    let mut argv = vec![
        "setpriv",
        "--reuid",
        NOBODY,
        "--regid",
        NOBODY,
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        // The system's interpreter: one under root's home is not nobody's to run.
        "/usr/bin/python3",
        "-c",
        script,
    ];
    argv.extend_from_slice(args);
    command_in(&node.node_ns, cgroup, &argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the neighbour")
}

/// A directory in `node`'s scratch directory where the neighbour may write what it
/// reports (the scratch directory itself is root's).
fn nobodys_dir(node: &SimNode) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = node.dir.join("nobody");
    std::fs::create_dir_all(&dir).expect("the neighbour's directory");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// One of the DaemonSet's probes as written in deploy/base/daemonset.yaml.
struct ChartProbe {
    what: &'static str,
    probe: Value,
}

impl ChartProbe {
    fn of(what: &'static str) -> ChartProbe {
        let path = hairpin_tests::repo::workspace().join("deploy/base/daemonset.yaml");
        let text = std::fs::read_to_string(&path).expect("read the DaemonSet");
        let yaml: yaml_serde::Value = yaml_serde::from_str(&text).expect("DaemonSet YAML");
        let ds = serde_json::to_value(yaml).expect("YAML as JSON");
        let probe = ds["spec"]["template"]["spec"]["containers"][0][what].clone();
        assert!(probe.is_object(), "{what} in {}", path.display());
        ChartProbe { what, probe }
    }

    /// Runs the probe once as the kubelet would, in `node`'s namespace (the pod is
    /// hostNetwork) with the container's admin socket; whether it passed, and how
    /// long it took.
    fn run(&self, node: &SimNode) -> (bool, Duration, String) {
        let timeout = self.probe["timeoutSeconds"].as_u64().unwrap_or(1);
        let started = Instant::now();
        let out = if let Some(cmd) = self.probe["exec"]["command"].as_array() {
            let bin = agent_bin();
            let mut argv: Vec<String> = cmd
                .iter()
                .map(|s| s.as_str().expect("string").to_string())
                .collect();
            // The image's binary is the one built here.
            argv[0] = bin.to_str().expect("utf-8").to_string();
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let mut full = vec!["timeout", "-k", "1"];
            let secs = timeout.to_string();
            full.push(&secs);
            full.extend(argv);
            command_in(&node.node_ns, None, &full)
                .env("HAIRPIN_ADMIN_SOCKET", admin_socket(node))
                .output()
                .expect("run the exec probe")
        } else {
            let get = &self.probe["httpGet"];
            let url = format!(
                "http://{}:{}{}",
                get["host"].as_str().unwrap_or("127.0.0.1"),
                get["port"],
                get["path"].as_str().unwrap_or("/")
            );
            let secs = timeout.to_string();
            command_in(
                &node.node_ns,
                None,
                &["curl", "-sf", "-o", "/dev/null", "--max-time", &secs, &url],
            )
            .output()
            .expect("run curl")
        };
        let took = started.elapsed();
        let said = format!(
            "{} {}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        (out.status.success(), took, said)
    }
}

/// The agent's admin TCP address (its default).
const ADMIN_HOST: &str = "127.0.0.1";
const ADMIN_PORT: &str = "9901";

#[test]
fn a_neighbour_holding_every_admin_connection_it_can_never_fails_a_probe() {
    require_privileges!();
    let node = SimNode::new();
    let _agent = start_agent(&node, &hairpin_tests::agent::all_frontends());
    let report = nobodys_dir(&node).join("crowd.json");
    let sock = admin_socket(&node);
    let mut crowd = as_nobody(
        &node,
        CROWD,
        &[
            ADMIN_HOST,
            ADMIN_PORT,
            sock.to_str().expect("utf-8"),
            "12",
            report.to_str().expect("utf-8"),
        ],
    );
    // Let it fill every place first.
    std::thread::sleep(Duration::from_secs(1));
    let probes = [
        ChartProbe::of("livenessProbe"),
        ChartProbe::of("readinessProbe"),
    ];
    let (mut runs, mut slowest, mut failed) = (0, Duration::ZERO, Vec::new());
    let until = Instant::now() + Duration::from_secs(9);
    while Instant::now() < until {
        for p in &probes {
            let (ok, took, said) = p.run(&node);
            runs += 1;
            slowest = slowest.max(took);
            if !ok || took > Duration::from_secs(2) {
                failed.push(format!("{}: ok={ok} in {took:?}: {said}", p.what));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = crowd.wait().expect("the neighbour exits on its own");
    assert!(status.success(), "the neighbour failed: {status}");
    let crowd: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("its report")).expect("json");
    eprintln!("probes: {runs} runs, slowest {slowest:?}; neighbour: {crowd}");
    assert!(
        failed.is_empty(),
        "{} of {runs} probes failed or took over 2 s under the neighbour ({crowd}):\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(runs >= 20, "only {runs} probes ran");
    // The neighbour did crowd the port (every place the caps allow, re-opened)...
    assert!(
        crowd["opened"].as_u64().unwrap_or(0) >= 64,
        "the neighbour should have opened the 64 places: {crowd}"
    );
    // ...and could never reach the socket the probes use.
    assert_eq!(crowd["unix_ok"], 0, "{crowd}");
    assert!(
        crowd["unix_errors"]["EACCES"].as_u64().unwrap_or(0) > 0,
        "{crowd}"
    );
}

#[test]
fn an_admin_port_taken_before_the_agent_starts_neither_stops_it_nor_feeds_the_cli() {
    require_privileges!();
    let node = SimNode::new();
    let bound = nobodys_dir(&node).join("squat.bound");
    let mut squatter = as_nobody(
        &node,
        SQUAT,
        &[ADMIN_HOST, ADMIN_PORT, bound.to_str().expect("utf-8")],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !bound.exists() {
        assert!(Instant::now() < deadline, "the squatter did not bind");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut agent = start_agent(&node, &hairpin_tests::agent::all_frontends());
    assert!(
        agent.log().contains("admin address not bound"),
        "the agent says it runs without its admin address:\n{}",
        agent.log()
    );
    for what in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let (ok, took, said) = ChartProbe::of(what).run(&node);
        assert!(
            ok && took < Duration::from_secs(2),
            "{what}: ok={ok} in {took:?}: {said}"
        );
        assert!(
            !said.contains("SQUATTER"),
            "{what} asked the squatter: {said}"
        );
    }
    // `status` reads the agent (its pid), never the squatter's TCP answer.
    let run = run_cli(&node, &["status", "--output", "json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["status"]["agent"]["pid"], agent.pid());
    // Without the socket it says the agent is unreachable (4), never reads TCP.
    let gone = node.dir.join("no-such.sock");
    let run = run_cli(
        &node,
        &["status", "--admin-socket", gone.to_str().expect("utf-8")],
    );
    assert_eq!(run.code, 4, "{}\n{}", run.stdout, run.stderr);
    assert!(
        !run.stdout.contains("SQUATTER") && !run.stderr.contains("SQUATTER"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    agent.stop();
    let _ = squatter.kill();
    let _ = squatter.wait();
}

/// `--listen-address` on the node's own IP, and on an address where a node service
/// listens: refused at start, naming the address (its slots would take the
/// connections of the kubelet, the API server, NodePorts on it).
#[test]
fn a_node_address_as_listen_address_is_refused_at_start_naming_it() {
    require_privileges!();
    let node = SimNode::new();
    let mut agent = Agent::spawn_with(&node, &[], &["--listen-address", NODE_IP4]);
    let status = agent.wait(Duration::from_secs(20));
    let log = agent.log();
    assert!(!status.success(), "started on a node IP:\n{log}");
    assert!(
        log.contains(&format!("--listen-address {NODE_IP4} is a node IP")),
        "{log}"
    );

    // Another address of the node, where a node service listens.
    let service_ip = "192.0.2.77";
    hairpin_tests::sh::run_in(
        &node.node_ns,
        &[
            "ip",
            "addr",
            "add",
            &format!("{service_ip}/32"),
            "dev",
            "lo",
        ],
    );
    let service = std::net::SocketAddr::new(service_ip.parse().expect("ip"), 8080);
    let mut listener = command_in(
        &node.node_ns,
        None,
        &[
            "python3",
            "-c",
            "import socket,sys,time\ns=socket.socket()\ns.bind((sys.argv[1],int(sys.argv[2])))\ns.listen()\nopen(sys.argv[3],'w').write('up')\ntime.sleep(60)",
            service_ip,
            "8080",
            node.dir.join("service.up").to_str().expect("utf-8"),
        ],
    )
    .spawn()
    .expect("the node service");
    wait_for(&node.dir.join("service.up"));
    let mut agent = Agent::spawn_with(
        &node,
        &[],
        &["--listen-address", service_ip, "--listen-link", "none"],
    );
    let status = agent.wait(Duration::from_secs(20));
    let log = agent.log();
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(!status.success(), "started on {service}:\n{log}");
    assert!(
        log.contains(&format!(
            "--listen-address {service_ip} is used by other listeners"
        )) && log.contains("tcp port 8080"),
        "{log}"
    );
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Which capability `SO_MARK` (the bypass mark) needs on this kernel: CAP_NET_RAW
/// alone is enough since Linux 5.17 (as is CAP_NET_ADMIN), none is not. SECURITY.md
/// names both; a process as root with only the runtimes' default CAP_NET_RAW can opt
/// its connections out of hairpin.
#[test]
fn so_mark_needs_cap_net_raw_or_cap_net_admin_and_nothing_less() {
    require_privileges!();
    let set_mark = |caps: &str| -> String {
        let bounding = format!("--bounding-set=-all{caps}");
        let out = Command::new("setpriv")
            .args([
                "--inh-caps=-all",
                &bounding,
                "--",
                "python3",
                "-c",
                "import socket\ns=socket.socket()\ntry:\n  s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 0x68); print('ok')\nexcept OSError as e: print(e.errno)",
            ])
            .output()
            .expect("setpriv");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(set_mark(",+net_raw"), "ok", "CAP_NET_RAW alone");
    assert_eq!(set_mark(",+net_admin"), "ok", "CAP_NET_ADMIN alone");
    assert_eq!(
        set_mark(",+net_bind_service,+bpf,+chown"),
        libc::EPERM.to_string(),
        "neither"
    );
}

/// Issue: the node's processes share the node's addresses, so they shared one
/// per-source cap of the relay: any uid listening on 127.0.0.1:15001 (a mesh capture
/// port, unprivileged) moves the node's kernel-path connects onto the relay, and
/// then holds that one cap, so every other process's connections are reset. Now a
/// process of the node is capped by the uid owning its socket.
#[test]
fn a_neighbour_holding_the_relays_cap_for_the_node_leaves_other_uids_relayed() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let mut agent = Agent::start_with(
        &node,
        &all_frontends(),
        &[
            "--kernel-path",
            "auto",
            "--max-connections-per-source",
            "16",
        ],
    );
    let report = nobodys_dir(&node).join("hog.json");
    let mut hog = as_nobody_in(
        &node,
        Some(&node.host_cgroup()),
        RELAY_HOG,
        &[
            "203.0.113.10",
            "80",
            "40",
            "20",
            report.to_str().expect("utf-8"),
        ],
    );
    wait_for(&report);
    let hog_said: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("its report")).expect("json");
    // Root on the node, while nobody holds all it may: relayed (the mesh port
    // sends it to the relay), its header naming the node.
    let mut replies = Vec::new();
    for _ in 0..5 {
        replies.push(from_host(&node, &url("203.0.113.10", 80, "/")));
    }
    let s = status(&node);
    let metrics = admin_get(&node, "/metrics");
    let _ = hog.kill();
    let _ = hog.wait();
    eprintln!(
        "nobody: {hog_said}; root: {:?}",
        replies.iter().map(|r| r.code).collect::<Vec<_>>()
    );
    for reply in &replies {
        assert_true_client(
            "root on the node, beside nobody's hog",
            reply,
            NODE_IP4,
            "203.0.113.10",
            &agent,
        );
    }
    assert!(
        s["counters"]["kernel"]["kernel_fallback_mesh"]
            .as_u64()
            .unwrap_or(0)
            >= 5,
        "the node's connects were not sent to the relay by the mesh port: {}",
        s["counters"]
    );
    // Nobody was capped all the same: 16 held, the rest reset at accept.
    // (A connect may itself see the reset of one shed just before it.)
    assert!(
        hog_said["connected"].as_u64().unwrap_or(0) >= 32,
        "{hog_said}"
    );
    assert_eq!(hog_said["alive"], 16, "{hog_said}");
    let shed = metrics
        .lines()
        .find(|l| l.starts_with("hairpin_relay_shed_total{reason=\"per_source\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(shed >= 16.0, "{shed} shed per source:\n{metrics}");
    agent.stop();
}
