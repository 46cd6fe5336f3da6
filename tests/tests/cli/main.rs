//! The node subcommands against a live agent on the simulated node, and against none.
//! JSON output is checked field by field; exit codes are part of the contract.
//! `uninstall.rs`: the cluster's one-command removal against the fake API server.

mod env;
mod uninstall;

/// Exit statuses, one meaning each: a typo (clap) is 2 and never a verdict; a bad
/// `check` target is a usage error too; every subcommand's verdicts keep theirs; the
/// table in the README lists exactly these. No privileges: nothing is probed.
#[test]
fn exit_statuses_never_collide_and_the_readme_lists_them() {
    use hairpin_agent::cli::Exit;
    let codes: std::collections::BTreeSet<i32> = Exit::ALL.iter().map(|e| e.code()).collect();
    assert_eq!(codes.len(), Exit::ALL.len(), "one status per meaning");
    let run = |args: &[&str]| {
        let out = hairpin_tests::agent::agent_command()
            .args(args)
            .env("HAIRPIN_ADMIN_SOCKET", "/nonexistent/hairpin/admin.sock")
            .env("HAIRPIN_ADMIN_ADDRESS", "127.0.0.1:1")
            .output()
            .expect("run hairpin-agent");
        out.status.code().unwrap_or(-1)
    };
    assert_eq!(
        run(&["stauts"]),
        Exit::Usage.code(),
        "a typo of a subcommand"
    );
    assert_eq!(
        run(&["status", "--outptu", "json"]),
        Exit::Usage.code(),
        "a typo of a flag"
    );
    assert_eq!(
        run(&["check", "host:port"]),
        Exit::Usage.code(),
        "a target that does not parse"
    );
    assert_eq!(
        run(&["check", "host:99999"]),
        Exit::Usage.code(),
        "a port out of range"
    );
    let readme = std::fs::read_to_string(hairpin_tests::repo::workspace().join("README.md"))
        .expect("README");
    let table = &readme[readme
        .find("| exit status | meaning |")
        .expect("the exit status table")..];
    for e in Exit::ALL {
        assert!(
            table.contains(&format!("\n| {} |", e.code())),
            "the README's exit status table lacks {e:?} ({})",
            e.code()
        );
    }
}

use hairpin_tests::{
    agent::{Agent, FrontendSpec, spec},
    cli::{admin_socket, doctor_check, run_cli, start_agent},
    names_support::{lbs_with_tls, start_tls_nginx},
    node::{RELAY_IP4, SimNode},
    require_privileges,
    servers::start_nginx,
    sh::output_in,
};

fn lb10() -> Vec<FrontendSpec> {
    vec![spec("203.0.113.10", "v1")]
}

#[test]
fn status_reports_attachment_frontends_sources_and_counters() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = start_agent(&node, &lb10());
    let run = run_cli(&node, &["status", "--output", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let j = run.json();
    assert_eq!(j["agent_reachable"], true);
    let s = &j["status"];
    assert_eq!(s["agent"]["pid"], agent.pid());
    assert_eq!(s["agent"]["bypass_mark"], hairpin_ebpf::DEFAULT_BYPASS_MARK);
    let att = &s["attachment"];
    assert_eq!(att["cgroup"], node.cgroup.to_str().expect("utf-8"));
    let programs = att["programs"].as_array().expect("programs");
    assert_eq!(programs.len(), 2);
    for (p, name) in programs
        .iter()
        .zip(["hairpin_connect4", "hairpin_connect6"])
    {
        assert_eq!(p["name"], name);
        assert!(p["program_id"].as_u64().expect("id") > 0);
        assert_eq!(p["link_ids"].as_array().expect("links").len(), 1, "{p}");
    }
    assert!(att["frontends_map_id"].as_u64().is_some(), "{att}");
    assert!(att["counters_map_id"].as_u64().is_some(), "{att}");
    let f = &s["frontends"][0];
    assert_eq!(f["ip"], "203.0.113.10");
    assert_eq!(f["port"], 80);
    assert_eq!(f["state"], "active");
    assert_eq!(f["version"], "v1");
    assert_eq!(f["path"], "ebpf");
    assert!(
        f["listener"]
            .as_str()
            .expect("listener")
            .starts_with(&format!("{RELAY_IP4}:"))
    );
    assert_eq!(s["sources"][0]["synced"], true);
    assert!(
        s["sources"][0]["name"]
            .as_str()
            .expect("name")
            .starts_with("file ")
    );
    assert!(s["last_reconcile"]["at"].is_string());

    // A redirected request moves the kernel and relay counters.
    let curl = output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["curl", "-sS", "--max-time", "5", "http://203.0.113.10/"],
    );
    assert!(curl.status.success(), "{curl:?}");
    // The relay counts a connection's bytes as it ends, which may be a moment after
    // curl has its reply.
    let started = std::time::Instant::now();
    let j = loop {
        let j = run_cli(&node, &["status", "-o", "json"]).json();
        let c = &j["status"]["counters"]["relay"];
        if c["active_connections"] == 0 || started.elapsed() > std::time::Duration::from_secs(5) {
            break j;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let c = &j["status"]["counters"];
    assert!(
        c["kernel"]["redirected"].as_u64().expect("redirected") >= 1,
        "{c}"
    );
    assert!(
        c["kernel"]["skipped_bypass_mark"]
            .as_u64()
            .expect("skipped")
            >= 1,
        "{c}"
    );
    assert_eq!(c["relay"]["connections"], 1, "{c}");
    assert!(
        c["relay"]["bytes_downstream"].as_u64().expect("bytes") > 0,
        "{c}"
    );

    let text = run_cli(&node, &["status"]);
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("ready"), "{}", text.stdout);
    assert!(
        text.stdout.contains("203.0.113.10:80  active  ebpf"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("kernel path off (--kernel-path off): every frontend takes the relay\n"),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains('\x1b'), "no colour into a pipe");
}

#[test]
fn status_without_an_agent_says_so_and_exits_4() {
    require_privileges!();
    let node = SimNode::new();
    let run = run_cli(&node, &["status", "--output", "json"]);
    assert_eq!(run.code, 4, "{run:?}");
    let j = run.json();
    assert_eq!(j["agent_reachable"], false);
    assert!(
        j["agent_error"]
            .as_str()
            .expect("error")
            .contains("not reachable"),
        "{j}"
    );
    assert!(j["status"].is_null());
    assert!(j["kernel_programs"].is_array(), "{j}");
    let text = run_cli(&node, &["status"]);
    assert_eq!(text.code, 4);
    assert!(
        text.stdout.contains("the agent is not reachable"),
        "{}",
        text.stdout
    );
}

#[test]
fn check_says_broken_before_hairpin_and_works_after() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);

    let before = run_cli(&node, &["check", "203.0.113.10:80", "--output", "json"]);
    assert_eq!(before.code, 1, "{before:?}");
    let j = before.json();
    assert_eq!(j["verdict"], "broken");
    assert_eq!(j["exit_code"], 1);
    assert_eq!(j["agent_reachable"], false);
    assert_eq!(j["kube_proxy_modes"][0], "iptables");
    let a = &j["addresses"][0];
    assert_eq!(a["address"], "203.0.113.10:80");
    assert_eq!(a["kube_proxy"][0]["mode"], "iptables");
    assert_eq!(a["kube_proxy"][0]["port"], 80);
    assert_eq!(a["hairpin"]["state"], "unknown");
    assert_eq!(a["probes"]["in_cluster"]["outcome"], "no_answer", "{a}");
    assert_eq!(a["probes"]["direct"]["outcome"], "no_answer", "{a}");
    assert_eq!(
        a["probes"]["direct_with_header"]["outcome"], "answered",
        "{a}"
    );
    assert!(
        a["probes"]["direct_with_header"]["detail"]
            .as_str()
            .expect("detail")
            .contains("200"),
        "{a}"
    );

    let plain = run_cli(&node, &["check", "203.0.113.10:81", "--output", "json"]);
    assert_eq!(plain.code, 0, "{plain:?}");
    let j = plain.json();
    assert_eq!(j["verdict"], "works");
    assert_eq!(j["addresses"][0]["probes"]["direct"]["outcome"], "answered");

    let _agent = start_agent(&node, &lb10());
    let after = run_cli(&node, &["check", "203.0.113.10", "--output", "json"]);
    assert_eq!(after.code, 0, "{after:?}");
    let j = after.json();
    assert_eq!(j["verdict"], "works");
    let a = &j["addresses"][0];
    assert_eq!(a["hairpin"]["state"], "active", "{a}");
    assert_eq!(a["hairpin"]["header_by"], "relay", "{a}");
    assert_eq!(a["hairpin"]["why"], "the kernel path is off", "{a}");
    assert_eq!(a["probes"]["in_cluster"]["outcome"], "answered", "{a}");
    assert_eq!(
        a["probes"]["direct"]["outcome"], "no_answer",
        "the mark bypasses the redirect: {a}"
    );
    assert!(
        a["explanation"]
            .as_str()
            .expect("text")
            .contains("through hairpin"),
        "{a}"
    );

    let text = run_cli(&node, &["check", "203.0.113.10"]);
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("short-circuits it"), "{}", text.stdout);
    assert!(
        text.stdout.contains("works through hairpin"),
        "{}",
        text.stdout
    );
}

/// Issue 13: with `--kernel-path on`, `status` shows the kernel path (state, the
/// sockets map's fill and capacity, headers written, fallbacks, misses) and which
/// frontend's header the kernel writes; `doctor` checks it; `check` says the
/// destination takes the kernel path.
#[test]
fn status_doctor_and_check_show_the_kernel_path() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let sock = admin_socket(&node);
    let agent = Agent::start_with(
        &node,
        &lb10(),
        &[
            "--admin-socket",
            sock.to_str().expect("utf-8 path"),
            "--kernel-path",
            "on",
            "--kernel-path-sockets",
            "1024",
        ],
    );
    let j = run_cli(&node, &["status", "-o", "json"]).json();
    let kp = &j["status"]["kernel_path"];
    if kp["state"] != "on" {
        // This kernel (or this process's privileges) cannot run it: say why.
        assert_eq!(kp["state"], "unavailable", "{kp}");
        let text = run_cli(&node, &["status"]).stdout;
        assert!(text.contains("kernel path unavailable: "), "{text}");
        return;
    }
    assert_eq!(kp["sockets_capacity"], 1024, "{kp}");
    let curl = output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["curl", "-sS", "--max-time", "5", "http://203.0.113.10/"],
    );
    assert!(curl.status.success(), "{curl:?}\nagent:\n{}", agent.log());

    let text = run_cli(&node, &["status"]);
    assert_eq!(text.code, 0, "{text:?}");
    let out = &text.stdout;
    assert!(
        out.contains("kernel path on (--kernel-path on): the kernel writes the header"),
        "{out}"
    );
    let id = kp["sockets_map_id"].as_u64().expect("sockets map id");
    assert!(
        out.contains(&format!("            sockets map id {id}: ")),
        "{out}"
    );
    assert!(
        out.contains(" of 1024 in use (new connects go to the relay from 960)\n"),
        "{out}"
    );
    assert!(
        out.contains("            headers written 1 of 1 sockets marked; to the relay instead: "),
        "{out}"
    );
    assert!(
        out.contains("            missed none: no connection went without its header\n"),
        "{out}"
    );
    assert!(
        out.contains("203.0.113.10:80  active  kernel  kernel"),
        "{out}"
    );
    assert!(out.contains("kernel: the client speaks first"), "{out}");

    let j = run_cli(&node, &["doctor", "-o", "json"]).json();
    let check = doctor_check(&j, "kernel_path");
    assert_eq!(check["status"], "ok", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("on: 1 headers written by the kernel, none missed")),
        "{check}"
    );

    let run = run_cli(&node, &["check", "203.0.113.10", "-o", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let a = &run.json()["addresses"][0];
    assert_eq!(a["hairpin"]["path"], "kernel", "{a}");
    assert_eq!(a["hairpin"]["header_by"], "kernel", "{a}");
    assert_eq!(a["hairpin"]["why"], "the client speaks first", "{a}");
    let text = run_cli(&node, &["check", "203.0.113.10"]).stdout;
    assert!(
        text.contains(
            "kernel path: the kernel writes PROXY v1 on the client's socket (the client speaks \
             first; a socket it cannot take goes to the relay at "
        ),
        "{text}"
    );
}

#[test]
fn check_completes_a_real_tls_handshake_with_the_header_and_through_hairpin() {
    require_privileges!();
    // The TLS nginx behind 203.0.113.10:443 requires the PROXY protocol, as
    // ingress-nginx with use-proxy-protocol does on its https port.
    let node = SimNode::with_lbs(&lbs_with_tls());
    let _nginx = start_nginx(&node);
    let tls = start_tls_nginx(&node);
    let tls_probes = |run: &hairpin_tests::cli::CliRun| {
        let j = run.json();
        let a = j["addresses"][0].clone();
        assert_eq!(a["address"], "203.0.113.10:443", "{a}");
        (j, a)
    };

    // Port 443 implies --tls.
    let before = run_cli(&node, &["check", "203.0.113.10:443", "-o", "json"]);
    assert_eq!(before.code, 1, "{before:?}\ntls:\n{}", tls.log());
    let (j, a) = tls_probes(&before);
    assert_eq!(j["target"]["tls"], true, "{j}");
    assert_eq!(j["verdict"], "broken");
    assert_eq!(a["probes"]["direct"]["outcome"], "no_answer", "{a}");
    let with_header = &a["probes"]["direct_with_header"];
    assert_eq!(with_header["outcome"], "answered", "{a}");
    assert!(
        with_header["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("TLS handshake complete (TLSv1_")),
        "{a}"
    );

    let _agent = start_agent(
        &node,
        &[FrontendSpec {
            ip: "203.0.113.10",
            ports: vec![80, 443],
            version: "v1",
        }],
    );
    let after = run_cli(&node, &["check", "203.0.113.10:443", "-o", "json"]);
    assert_eq!(after.code, 0, "{after:?}\ntls:\n{}", tls.log());
    let (j, a) = tls_probes(&after);
    assert_eq!(j["verdict"], "works");
    assert_eq!(a["hairpin"]["state"], "active", "{a}");
    assert_eq!(a["probes"]["in_cluster"]["outcome"], "answered", "{a}");
    assert!(
        a["probes"]["in_cluster"]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("TLS handshake complete")),
        "{a}"
    );
}

#[test]
fn check_cannot_check_what_does_not_resolve_or_answer() {
    require_privileges!();
    let node = SimNode::new();
    let run = run_cli(&node, &["check", "no-such-host.invalid", "-o", "json"]);
    assert_eq!(run.code, 5, "{run:?}");
    assert_eq!(run.json()["verdict"], "unknown");
    // Nothing listens behind 203.0.113.10:80 without nginx: refused through the DNAT.
    let run = run_cli(
        &node,
        &["check", "203.0.113.10:80", "--timeout", "1s", "-o", "json"],
    );
    assert_eq!(run.code, 5, "{run:?}");
    assert_eq!(
        run.json()["addresses"][0]["probes"]["in_cluster"]["outcome"],
        "connect_failed"
    );
    let bad = run_cli(&node, &["check", "[2001:db8::1"]);
    assert_ne!(bad.code, 0);
}

#[test]
fn doctor_checks_the_node_with_and_without_the_agent() {
    require_privileges!();
    let node = SimNode::new();
    let run = run_cli(&node, &["doctor", "--output", "json"]);
    let j = run.json();
    for name in [
        "kernel",
        "bpf",
        "ebpf_object",
        "cgroup2",
        "capabilities",
        "kube_proxy_mode",
    ] {
        assert_eq!(doctor_check(&j, name)["status"], "ok", "{name}: {j}");
    }
    assert!(
        doctor_check(&j, "kube_proxy_mode")["detail"]
            .as_str()
            .expect("d")
            .starts_with("iptables")
    );
    assert_eq!(doctor_check(&j, "agent")["status"], "warn");
    assert!(doctor_check(&j, "agent")["fix"].is_string());
    assert_eq!(doctor_check(&j, "kube_proxy_frontends")["status"], "skip");
    assert_eq!(
        doctor_check(&j, "ip_mode")["detail"],
        "needs the running agent (it reads the API server)"
    );
    assert_eq!(run.code, 0, "warnings only: {run:?}");
    assert_eq!(j["ok"], true);

    let _agent = start_agent(&node, &lb10());
    let j = run_cli(&node, &["doctor", "-o", "json"]).json();
    assert_eq!(doctor_check(&j, "agent")["status"], "ok", "{j}");
    assert_eq!(
        doctor_check(&j, "kube_proxy_frontends")["status"],
        "ok",
        "{j}"
    );
    assert_eq!(doctor_check(&j, "coredns")["status"], "skip");
    let text = run_cli(&node, &["doctor"]);
    assert!(
        text.stdout.contains("kube_proxy_frontends  ok"),
        "{}",
        text.stdout
    );
}

/// `hairpin-agent <args>` on the host with only `caps` (as inside the DaemonSet's
/// pod), the node's pins and an admin socket where no agent answers.
fn cli_with_only_caps(node: &SimNode, caps: &[&str], args: &[&str]) -> hairpin_tests::cli::CliRun {
    let mut cmd = hairpin_tests::agent::agent_command();
    cmd.args(args)
        .env("HAIRPIN_BPF_PIN_DIR", node.pin_dir())
        .env("HAIRPIN_ADMIN_SOCKET", node.dir.join("no-agent.sock"))
        .env_remove("HAIRPIN_ADMIN_ADDRESS");
    hairpin_tests::pod::with_only_caps(&mut cmd, caps);
    let out = cmd.output().expect("run the cli");
    hairpin_tests::cli::CliRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn dump_reads_this_agents_maps_by_pins_pid_and_id() {
    require_privileges!();
    let node = SimNode::new();
    let agent = start_agent(&node, &lb10());
    let run = run_cli(&node, &["dump", "--output", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let j = run.json();
    // The node's pinned maps, by path and read-only.
    assert_eq!(j["selected_by"], "pins");
    let maps = j["maps"].as_array().expect("maps");
    assert_eq!(maps.len(), 2, "{j}");
    let fe = maps
        .iter()
        .find(|m| m["kind"] == "frontends")
        .expect("frontends map");
    assert!(
        fe["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("/maps/HAIRPIN_FRONTENDS")),
        "{fe}"
    );
    assert_eq!(fe["entries"][0]["frontend"], "203.0.113.10:80");
    // The relay slot it is sent to: #ADDRESS:PORT, the first slot address's index.
    assert!(
        fe["entries"][0]["listener"]
            .as_str()
            .expect("l")
            .starts_with("#0:"),
        "{fe}"
    );
    let ctr = maps
        .iter()
        .find(|m| m["kind"] == "counters")
        .expect("counters map");
    assert!(ctr["counters"]["redirected"].is_u64(), "{ctr}");

    let pid = agent.pid().to_string();
    let by_pid = run_cli(&node, &["dump", "--pid", &pid, "-o", "json"]).json();
    assert_eq!(by_pid["selected_by"], "pid");
    assert_eq!(by_pid["maps"].as_array().expect("maps").len(), 2);
    let fe = by_pid["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .find(|m| m["kind"] == "frontends")
        .cloned()
        .expect("frontends map");
    assert_eq!(fe["name"], "HAIRPIN_FRONTEN");
    let id = fe["id"].to_string();
    let by_id = run_cli(&node, &["dump", "--map-id", &id, "-o", "json"]).json();
    assert_eq!(
        by_id["maps"][0]["entries"][0]["frontend"],
        "203.0.113.10:80"
    );
    let text = run_cli(&node, &["dump", "--map-id", &id]);
    assert!(
        text.stdout.contains("HAIRPIN_FRONTEN (frontends)"),
        "{}",
        text.stdout
    );

    drop(agent);
    // No agent: the datapath is pinned, so its maps stay and dump still reads them,
    // by id where the caller may (CAP_SYS_ADMIN) ...
    let kept = run_cli(&node, &["dump", "--map-id", &id, "-o", "json"]);
    assert_eq!(kept.code, 0, "{kept:?}");
    assert_eq!(
        kept.json()["maps"][0]["entries"][0]["frontend"],
        "203.0.113.10:80"
    );
    // ... and through the pins with only the DaemonSet's capabilities (issue 32):
    // by id that fails without CAP_SYS_ADMIN.
    let caps = &hairpin_tests::agent::DAEMONSET_CAPS;
    let capped = cli_with_only_caps(&node, caps, &["dump", "-o", "json"]);
    assert_eq!(capped.code, 0, "{capped:?}");
    let cj = capped.json();
    assert_eq!(cj["selected_by"], "pins", "{cj}");
    assert!(cj.to_string().contains("203.0.113.10:80"), "{cj}");
    let by_id_capped = cli_with_only_caps(&node, caps, &["dump", "--map-id", &id, "-o", "json"]);
    assert_ne!(
        by_id_capped.code, 0,
        "by id needs CAP_SYS_ADMIN: {by_id_capped:?}"
    );
    // status with the agent down, capped: the pinned links, the heartbeat, the map.
    let st = cli_with_only_caps(&node, caps, &["status", "-o", "json"]);
    assert_eq!(st.code, 4, "unreachable: {st:?}");
    let pinned = &st.json()["pinned"][0];
    assert!(
        pinned["heartbeat"]
            .as_str()
            .is_some_and(|h| h.starts_with("live for")),
        "{pinned}"
    );
    assert!(
        pinned["links"].as_array().is_some_and(|l| l
            .iter()
            .any(|l| l["hook"] == "connect4" && l["prog_id"].is_u64())),
        "{pinned}"
    );
    assert_eq!(
        pinned["frontends"].as_array().map(Vec::len),
        Some(1),
        "{pinned}"
    );
    assert_eq!(
        pinned["errors"].as_array().map(Vec::len),
        Some(0),
        "{pinned}"
    );
    let text = cli_with_only_caps(&node, caps, &["status"]);
    assert!(
        text.stdout.contains("heartbeat live for"),
        "{}",
        text.stdout
    );

    // `cleanup` removes it: the maps go (the kernel frees them after the last
    // reference, deferred), and --map-id of a vanished map finds nothing.
    hairpin_tests::cli::run_node_cleanup(&node);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let gone = loop {
        let gone = run_cli(&node, &["dump", "--map-id", &id, "-o", "json"]);
        if gone.code != 0 || std::time::Instant::now() > deadline {
            break gone;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(gone.code, 1, "{gone:?}");
    assert_eq!(gone.json()["maps"].as_array().expect("maps").len(), 0);
    let all = run_cli(&node, &["dump", "-o", "json"]).json();
    assert_eq!(all["selected_by"], "all");
}

#[test]
fn admin_endpoints_answer_on_the_socket_and_the_node_loopback_and_status_only_on_the_socket() {
    require_privileges!();
    let node = SimNode::new();
    let _agent = start_agent(&node, &lb10());
    let sock = admin_socket(&node);
    let mode = std::fs::metadata(&sock).expect("socket");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    let curl = |args: &[&str]| {
        let mut argv = vec!["curl", "-sS", "-i", "--max-time", "5"];
        argv.extend_from_slice(args);
        let out = output_in(&node.node_ns, None, &argv);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let s = sock.to_str().expect("utf-8");
    let health = curl(&["--unix-socket", s, "http://agent/healthz"]);
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let ready = curl(&["--unix-socket", s, "http://agent/readyz"]);
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.contains(r#"{"ready":true}"#),
        "{ready}"
    );
    let metrics = curl(&["http://127.0.0.1:9901/metrics"]);
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics
            .to_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{metrics}"
    );
    assert!(metrics.contains("hairpin_frontends_proxied 1"), "{metrics}");
    // /status lists every LoadBalancer, hostname and listener: the socket (0600)
    // serves it, the node's TCP address does not.
    let status = curl(&["--unix-socket", s, "http://agent/status"]);
    assert!(status.contains(r#""state":"active""#), "{status}");
    let over_tcp = curl(&["http://127.0.0.1:9901/status"]);
    assert!(over_tcp.starts_with("HTTP/1.1 404"), "{over_tcp}");
}
