//! Upgrades: every program swapped in place, a second agent on the same pin
//! directory waiting for the lock (and SIGTERM while it waits), and a hand-over
//! across pin layouts with no instant without a program.

use super::*;

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
    let out = hairpin_tests::agent::agent_command()
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
