//! The names ports: one held by another process is retried until free, and a later
//! wildcard bind of :80 and :443 succeeds with and without the connect programs.

use super::*;

#[test]
fn a_name_relay_port_held_by_another_process_is_retried_until_it_is_free() {
    require_privileges!();
    let (node, _nginx, hosts) = node_with_hosts(NODE_HOSTS);
    // Something else on the node already listens on the names address at :80 (the
    // address left on lo by an earlier agent). With `--names-redirect off` the name
    // relay binds the names ports themselves; by default nothing binds them (see
    // the test below).
    run_in(
        &node.node_ns,
        &["ip", "addr", "add", &format!("{RELAY_IP4}/32"), "dev", "lo"],
    );
    let squat = format!("{RELAY_IP4}:80");
    let mut squatter = Helper::in_netns(&node.node_ns, &["serve", &squat]);
    assert_eq!(squatter.line(), "listening");
    let sock = admin_socket(&node);
    let mut agent = agent_with_names_in(
        &node,
        "fallback",
        &[
            "--hosts-file",
            hosts.to_str().expect("utf-8 path"),
            "--admin-socket",
            sock.to_str().expect("utf-8 path"),
            "--names-redirect",
            "off",
        ],
        "name relay cannot listen",
    );

    // Said, shown in status and failed by doctor, with the address and the cause.
    let status = run_cli(&node, &["status", "--output", "json"]).json();
    let names = &status["status"]["names"];
    let failed = names["failed_listeners"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(failed.len(), 1, "{names}");
    assert_eq!(failed[0]["address"], squat.as_str(), "{names}");
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("in use"), "{names}");
    assert!(
        names["listeners"]
            .as_array()
            .is_some_and(|l| l.iter().any(|a| *a == format!("{RELAY_IP4}:443"))),
        "the other port is unaffected: {names}"
    );
    let doctor = run_cli(&node, &["doctor", "--output", "json"]);
    assert_eq!(doctor.code, 1, "{doctor:?}");
    let check = doctor_check(&doctor.json(), "name_relay");
    assert_eq!(check["status"], "fail", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap_or_default()
            .contains(&squat),
        "{check}"
    );
    let text = run_cli(&node, &["status"]);
    assert!(
        text.stdout.contains(&format!("cannot listen on {squat}: ")),
        "{}",
        text.stdout
    );
    // Its name is on :80 too: the hosts file does not point it at a relay that
    // cannot serve that port (all of a name's ports, or none).
    // The node's file holds bytes that are not UTF-8 (kept as they are): read bytes.
    let block = String::from_utf8_lossy(&fs::read(&hosts).expect("hosts")).into_owned();
    assert!(!block.contains("a.example.com"), "{block}");

    // The port is freed: the agent binds it on its own (no signal, no change) and
    // the name answers through the relay.
    let freed = Instant::now();
    squatter.kill();
    let mut last = None;
    while freed.elapsed() < Duration::from_secs(40) {
        let got = sh_with_hosts_file(&node, &hosts, "curl -sS --max-time 5 http://a.example.com/");
        if got.ok() && got.body.trim_end().ends_with("dst=203.0.113.10:80") {
            last = None;
            break;
        }
        last = Some(got);
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = agent.log();
    assert!(last.is_none(), "not retried on its own: {last:?}\n{log}");
    eprintln!(
        "name relay port held: listening {:?} after the port was freed",
        freed.elapsed()
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("name relay cannot listen") && l.contains(&squat))
            .count(),
        1,
        "the error is said once, not on every retry\n{log}"
    );
    let names = &run_cli(&node, &["status", "--output", "json"]).json()["status"]["names"];
    assert!(names.get("failed_listeners").is_none(), "{names}");
    agent.stop();
}

/// Python on the node that binds each address with a plain `bind()` (no
/// SO_REUSEADDR, as a strict server would), listens, says `bound`, and holds them
/// until killed: a hostNetwork ingress starting after names were published.
const BIND_WILDCARDS: &str = "import socket, sys, time
socks = []
for port in (80, 443):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(('0.0.0.0', port))
    s.listen(16)
    socks.append(s)
print('bound', flush=True)
time.sleep(120)
";

/// Issue 22: where the programs are attached, the names ports are frontends of
/// the connect programs, not bound sockets, so a hostNetwork ingress that starts
/// after the first name is published binds `0.0.0.0:80` and `0.0.0.0:443`, and
/// names still reach their LBs through the name relay with the true client.
#[test]
fn a_later_wildcard_bind_of_80_and_443_succeeds_and_names_still_work() {
    later_wildcard_bind("both", "redirected by the connect programs");
}

/// The same without programs (`fallback`, or `auto` where they cannot attach): the
/// agent's own nftables table sends the names ports to the listeners.
#[test]
fn without_programs_a_later_wildcard_bind_succeeds_too_through_the_nftables_table() {
    later_wildcard_bind("fallback", "nftables");
}

fn later_wildcard_bind(mode: &str, how: &str) {
    require_privileges!();
    let (node, _nginx, tls, hosts) = node_with_tls_and_hosts();
    let sock = admin_socket(&node);
    let agent = agent_with_names_in(
        &node,
        mode,
        &[
            "--hosts-file",
            hosts.to_str().expect("utf-8 path"),
            "--admin-socket",
            sock.to_str().expect("utf-8 path"),
        ],
        "hosts file updated",
    );

    // The ingress starts now, in the node's network namespace, outside hairpin.
    let mut ingress =
        hairpin_tests::sh::command_in(&node.node_ns, None, &["python3", "-c", BIND_WILDCARDS])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start python");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(ingress.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read python");
    if line.trim() != "bound" {
        let out = ingress.wait_with_output().expect("python output");
        panic!(
            "a later 0.0.0.0:80/443 bind failed: {}\nagent:\n{}",
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
    }

    // Names still go through the name relay, with the true client, to each LB.
    let lines = host_lines(
        &node,
        &hosts,
        "curl -sS --max-time 10 http://a.example.com/ \
         && curl -sS -k --max-time 10 https://b.example.com/",
        2,
        (&agent, &tls),
    );
    let _ = ingress.kill();
    let _ = ingress.wait();
    assert_from_node(&lines[0], "", "dst=203.0.113.10:80");
    assert_from_node(
        &lines[1],
        "tls-b sni=b.example.com ",
        "dst=203.0.113.11:443",
    );

    // Status says how: each names port redirected to a listener on another port.
    let names = &run_cli(&node, &["status", "--output", "json"]).json()["status"]["names"];
    assert!(
        names["redirect"].as_str().is_some_and(|r| r.contains(how)),
        "{names}"
    );
    let redirects = names["redirects"].as_array().cloned().unwrap_or_default();
    let dialled: Vec<&str> = redirects
        .iter()
        .filter_map(|r| r["dialled"].as_str())
        .collect();
    assert_eq!(
        dialled,
        [format!("{RELAY_IP4}:80"), format!("{RELAY_IP4}:443")],
        "{names}"
    );
    let mut listener_ports = Vec::new();
    for r in &redirects {
        let listener = r["listener"].as_str().unwrap_or_default();
        assert!(
            listener.starts_with(&format!("{RELAY_IP4}:"))
                && !listener.ends_with(":80")
                && !listener.ends_with(":443"),
            "{names}"
        );
        // Issue 31: a privileged port, never an ephemeral one.
        let port: u16 = listener
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        assert!((512..1024).contains(&port), "{listener}: {names}");
        listener_ports.push(port);
    }
    let text = run_cli(&node, &["status"]);
    assert!(
        text.stdout
            .contains(&format!("{RELAY_IP4}:80 (redirected to {RELAY_IP4}:")),
        "{}",
        text.stdout
    );

    // Issue 31: the agent dies and its redirect stays (the table or the frontends
    // entry outlives it); no uid without CAP_NET_BIND_SERVICE can take the port the
    // names' traffic is sent to.
    let mut agent = agent;
    agent.signal(nix::sys::signal::Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    for port in listener_ports {
        let out = hairpin_tests::sh::command_in(
            &node.node_ns,
            None,
            &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                // Debian's interpreter: a pyenv shim under /root is not nobody's.
                "/usr/bin/python3",
                "-c",
                &format!(
                    "import socket, errno\ns = socket.socket()\ntry:\n    s.bind(('{RELAY_IP4}', {port}))\n    print('bound')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])"
                ),
            ],
        )
        .output()
        .expect("python as nobody");
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            said.trim(),
            "EACCES",
            "nobody binding {RELAY_IP4}:{port}: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
