//! hairpin beside a socket load balancer: Cilium's kube-proxy replacement or Calico's
//! eBPF dataplane, whose cgroup connect programs at the cgroup root rewrite a
//! connect to a LoadBalancer IP into a connect to a backend pod. The stand-in
//! (`hairpin_tests::socket_lb`) is attached before the agent starts, as on a node
//! where the CNI's agent came up first, and the simulated node has no kube-proxy
//! rules at all (the socket LB replaces kube-proxy): a connect that the stand-in did
//! not rewrite goes nowhere. The agent runs with its default flags and only the
//! DaemonSet's capabilities.
//!
//! What must hold: hairpin's connect programs run before the socket LB's (links
//! created with `BPF_F_BEFORE`), so they see the LB address the client dialled; on
//! the kernel path the header still goes on after the socket LB changed the socket's
//! peer to the backend, naming the LB address; on the relay path the relay's own
//! upstream connect is rewritten by the socket LB like any other; and a socket whose
//! marked connect failed, or that was disconnected, and then connected elsewhere,
//! gets no header.
//!
//! Where the kernel cannot order cgroup links (simulated with the agent's hidden
//! `--link-order append`), the socket LB runs first and hides the LB address: the
//! requests get the pre-hairpin failure, and `status` and `doctor` name the program
//! in front and give the remedy. An adopted link that an earlier agent left behind the
//! socket LB is re-created in front.
//!
//! Cost: five simulated nodes, 16 + 16 + 4 + 2 + 2 requests; about 20 s.

use std::net::SocketAddr;

use hairpin_tests::{
    agent::{CappedAgent, DAEMONSET_CAPS, status},
    cli::{doctor_check, run_cli},
    client::{PY_GET, Reply, from_host, from_pod, url},
    node::{
        INGRESS_IP4, INGRESS_IP6, NGINX_PLAIN_PORT, NGINX_PP_PORT, NODE_IP4, NODE_IP6, POD_IP4,
        POD_IP6, SimNode,
    },
    require_privileges,
    servers::{Server, nginx_error_log, start_nginx},
    sh::output_in,
    socket_lb::{Rule, SOCKET_LB4, SOCKET_LB6, SocketLb},
};
use serde_json::Value;

/// The source of a host process's socket towards the ingress pod (the node's
/// address on that link): what the kernel path names for node processes. The relay
/// names `--node-ip` instead.
const NODE_UPLINK4: &str = "198.51.100.1";
const NODE_UPLINK6: &str = "2001:db8:2::1";

/// One proxied LB address of the test, and how it is proxied.
struct Lb {
    ip: &'static str,
    version: &'static str,
    relay: bool,
}

/// The kernel path's LBs (v1, v2, both families), then the same on `path: relay`.
const LBS: [Lb; 8] = [
    Lb {
        ip: "203.0.113.10",
        version: "v1",
        relay: false,
    },
    Lb {
        ip: "2001:db8:ffff::10",
        version: "v1",
        relay: false,
    },
    Lb {
        ip: "203.0.113.12",
        version: "v2",
        relay: false,
    },
    Lb {
        ip: "2001:db8:ffff::12",
        version: "v2",
        relay: false,
    },
    Lb {
        ip: "203.0.113.20",
        version: "v1",
        relay: true,
    },
    Lb {
        ip: "2001:db8:ffff::20",
        version: "v1",
        relay: true,
    },
    Lb {
        ip: "203.0.113.22",
        version: "v2",
        relay: true,
    },
    Lb {
        ip: "2001:db8:ffff::22",
        version: "v2",
        relay: true,
    },
];

/// Kernel-path LBs whose connect fails after hairpin marked it: refused by the
/// socket LB (a service without backends), rewritten to an address that never
/// answers, rewritten to a closed port (reset).
const REFUSED4: &str = "203.0.113.13";
const REFUSED6: &str = "2001:db8:ffff::13";
const SILENT4: &str = "203.0.113.14";
const RESET4: &str = "203.0.113.15";
/// An LB hairpin does not proxy: the socket LB sends it to nginx's plain port, which
/// answers 400 to anything that starts with a PROXY header.
const PLAIN4: &str = "203.0.113.99";
const PLAIN6: &str = "2001:db8:ffff::99";

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("an IP"), port)
}

fn ingress(ip: &str, port: u16) -> SocketAddr {
    addr(
        if ip.contains(':') {
            INGRESS_IP6
        } else {
            INGRESS_IP4
        },
        port,
    )
}

/// The socket LB's services: every proxied LB to the ingress pod's PROXY port, the
/// plain LBs to its plain port, and the failing ones.
fn rules() -> Vec<Rule> {
    let mut rules: Vec<Rule> = LBS
        .iter()
        .map(|lb| Rule::Rewrite(addr(lb.ip, 80), ingress(lb.ip, NGINX_PP_PORT)))
        .collect();
    for plain in [PLAIN4, PLAIN6] {
        rules.push(Rule::Rewrite(
            addr(plain, 80),
            ingress(plain, NGINX_PLAIN_PORT),
        ));
    }
    rules.push(Rule::Refuse(addr(REFUSED4, 80)));
    rules.push(Rule::Refuse(addr(REFUSED6, 80)));
    rules.push(Rule::Rewrite(addr(SILENT4, 80), addr("198.51.100.77", 80)));
    rules.push(Rule::Rewrite(addr(RESET4, 80), ingress(RESET4, 9)));
    rules
}

fn frontends_yaml() -> String {
    let mut yaml = String::from("frontends:\n");
    for lb in &LBS {
        yaml.push_str(&format!(
            "- ip: \"{}\"\n  ports: [80]\n  proxyProtocol: {}\n",
            lb.ip, lb.version
        ));
        if lb.relay {
            yaml.push_str("  path: relay\n");
        }
    }
    for ip in [REFUSED4, REFUSED6, SILENT4, RESET4] {
        yaml.push_str(&format!(
            "- ip: \"{ip}\"\n  ports: [80]\n  proxyProtocol: v1\n"
        ));
    }
    yaml
}

/// A node without kube-proxy, nginx in its ingress pod, the socket LB attached at
/// its cgroup root, then the agent with the DaemonSet's capabilities and `extra`.
fn socket_lb_node(extra: &[&str]) -> (SimNode, Server, SocketLb, CappedAgent) {
    let node = SimNode::with_lbs(&[]);
    let nginx = start_nginx(&node);
    let socket_lb = SocketLb::attach(&node.cgroup, &rules()).expect("attach the socket LB");
    let agent = CappedAgent::start_yaml(&node, &frontends_yaml(), extra, &DAEMONSET_CAPS);
    (node, nginx, socket_lb, agent)
}

fn counter(s: &Value, name: &str) -> u64 {
    s["counters"]["kernel"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name}: {}", s["counters"]))
}

/// The ids of the connect programs attached at the node's cgroup, in the order they
/// run (`bpftool cgroup show` lists them as the kernel's query does), with the rest
/// of each line (the name, when the program has one: the agent's have none when it
/// runs without CAP_PERFMON, since aya 0.14 probes for names with a tracepoint
/// program).
fn connect_programs_in_order(node: &SimNode, family: &str) -> Vec<(u64, String)> {
    node.attached_programs()
        .lines()
        .filter(|l| l.contains(&format!("cgroup_inet{family}_connect")))
        .filter_map(|l| {
            let (id, rest) = l.trim().split_once(char::is_whitespace)?;
            Some((id.parse().ok()?, rest.to_string()))
        })
        .collect()
}

/// The kernel id of hairpin's program `name`, from `status`.
fn program_id(s: &Value, name: &str) -> u64 {
    s["attachment"]["programs"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .and_then(|p| p["program_id"].as_u64())
        .unwrap_or_else(|| panic!("no program {name} in {}", s["attachment"]))
}

/// The ids of the connect programs attached at `cgroup` itself, in run order.
fn connect_programs_at(cgroup: &std::path::Path, family: &str) -> Vec<u64> {
    let out = std::process::Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(cgroup)
        .output()
        .expect("run bpftool");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("cgroup_inet{family}_connect")))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// hairpin's connect programs run before the socket LB's, for both families: linked
/// before it at the node's cgroup where the kernel orders links, else (`status`
/// says so) at each child cgroup, the socket LB alone at the root.
fn assert_hairpin_runs_first(node: &SimNode) {
    let s = status(node);
    if !s["link_order"]["children"].is_null() {
        for family in ["4", "6"] {
            let hairpin = program_id(&s, &format!("hairpin_connect{family}_kernel"));
            let root = connect_programs_in_order(node, family);
            assert!(
                root.len() == 1 && root[0].0 != hairpin,
                "the socket LB alone at the root: {root:?}\n{s}"
            );
            for child in [node.pod_cgroup(), node.host_cgroup(), node.agent_cgroup()] {
                assert_eq!(
                    connect_programs_at(&child, family),
                    [hairpin],
                    "hairpin's connect{family} program at {}: {s}",
                    child.display()
                );
            }
        }
        return;
    }
    for (family, socket_lb) in [("4", SOCKET_LB4), ("6", SOCKET_LB6)] {
        let hairpin = program_id(&s, &format!("hairpin_connect{family}_kernel"));
        let order = connect_programs_in_order(node, family);
        assert!(
            order.len() == 2 && order[0].0 == hairpin && order[1].1.ends_with(socket_lb),
            "hairpin's connect{family} program ({hairpin}) must run first: {order:?}\n{}",
            node.attached_programs()
        );
    }
}

fn assert_header(who: &str, lb: &Lb, reply: &Reply, client: &str, agent: &CappedAgent) {
    assert!(
        reply.ok()
            && reply.body.starts_with(&format!("client={client}:"))
            && reply
                .body
                .trim_end()
                .ends_with(&format!("dst={}:80", lb.ip)),
        "{who} -> {} ({}, {}): the header must name {client} and {}:80: {reply:?}\nagent:\n{}",
        lb.ip,
        lb.version,
        if lb.relay { "relay" } else { "kernel path" },
        lb.ip,
        agent.log()
    );
}

#[test]
fn beside_a_socket_lb_attached_first_every_request_names_the_true_client_and_the_lb_it_dialled() {
    require_privileges!();
    every_request_names_the_true_client(&[]);
}

/// As on a kernel that cannot order cgroup links (Linux 6.1, which the kernel
/// matrix runs this suite on with the default flags): hairpin's connect programs at
/// each child cgroup run before the socket LB's at the root.
#[test]
fn beside_a_socket_lb_attached_first_on_a_kernel_without_ordering_the_child_cgroups_run_first() {
    require_privileges!();
    let (node, _nginx, _socket_lb, _agent) =
        every_request_names_the_true_client(&["--link-order", "children"]);
    let s = status(&node);
    let children = &s["link_order"]["children"];
    assert_eq!(
        children["cgroups"],
        serde_json::json!(["agent", "host", "pod"]),
        "{s}"
    );
    assert_eq!(children["root_processes"], 0, "{s}");
    let doctor = run_cli(&node, &["doctor", "--output", "json"]);
    let check = doctor_check(&doctor.json(), "link_order");
    assert_eq!(check["status"], "ok", "{check}");
    // A child cgroup made later gets hairpin's connect links at the next rescan (the
    // agent's heartbeat, every 5 s); removed, its pins go.
    let late = node.cgroup.join("late");
    std::fs::create_dir(&late).expect("create a child cgroup");
    let hairpin = program_id(&s, "hairpin_connect4_kernel");
    let linked = (0..40).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(250));
        connect_programs_at(&late, "4") == [hairpin]
    });
    let s = status(&node);
    let _ = std::fs::remove_dir(&late);
    assert!(
        linked,
        "hairpin's connect4 program at {} within 10 s: {s}",
        late.display()
    );
    assert_eq!(
        s["link_order"]["children"]["cgroups"],
        serde_json::json!(["agent", "host", "late", "pod"]),
        "{s}"
    );
}

/// Every LB, from a pod and from the node, with the socket LB attached first and
/// the agent started with `extra`; all of it, still running, for more checks.
fn every_request_names_the_true_client(extra: &[&str]) -> (SimNode, Server, SocketLb, CappedAgent) {
    let (node, nginx, socket_lb, agent) = socket_lb_node(extra);
    assert_hairpin_runs_first(&node);
    for lb in &LBS {
        let v6 = lb.ip.contains(':');
        let pod_ip = if v6 { POD_IP6 } else { POD_IP4 };
        // The relay names `--node-ip` for a node process; the kernel path the
        // socket's own address.
        let node_ip = match (v6, lb.relay) {
            (false, false) => NODE_UPLINK4,
            (true, false) => NODE_UPLINK6,
            (false, true) => NODE_IP4,
            (true, true) => NODE_IP6,
        };
        assert_header(
            "pod",
            lb,
            &from_pod(&node, &url(lb.ip, 80, "/")),
            pod_ip,
            &agent,
        );
        assert_header(
            "node",
            lb,
            &from_host(&node, &url(lb.ip, 80, "/")),
            node_ip,
            &agent,
        );
    }
    assert!(!nginx_error_log(&node).contains("broken header"));
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}");
    assert_eq!(counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_eq!(counter(&s, "redirected"), 8, "{s}");
    assert_eq!(counter(&s, "kernel_skipped_elsewhere"), 0, "{s}");
    (node, nginx, socket_lb, agent)
}

/// A client that reuses one socket: `how` its first connect to `lb`:80 fails, then
/// the same socket connects to `elsewhere`:80 and sends a request; prints the status
/// line and the body.
const RECONNECT: &str = r#"
import ctypes, errno, socket, sys, time
how, lb, elsewhere = sys.argv[1:4]
family = socket.AF_INET6 if ":" in lb else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
# refused: the socket LB refuses it after hairpin's program marked it; reset: the
# SYN went out (the handshake's callbacks ran) and was reset.
failure = {"refused": PermissionError, "reset": ConnectionRefusedError}.get(how)
if failure:
    try:
        s.connect((lb, 80))
        sys.exit("the connect to %s was not %s" % (lb, how))
    except failure:
        pass
elif how == "unspec":
    # Still connecting (the SYN gets no answer): disconnected with AF_UNSPEC.
    s.setblocking(False)
    if s.connect_ex((lb, 80)) != errno.EINPROGRESS:
        sys.exit("the connect to %s did not stay in progress" % lb)
    time.sleep(0.05)
    libc = ctypes.CDLL(None, use_errno=True)
    unspec = (ctypes.c_ubyte * 28)()
    if libc.connect(s.fileno(), unspec, 28) != 0:
        sys.exit("connect(AF_UNSPEC): errno %d" % ctypes.get_errno())
    s.setblocking(True)
s.settimeout(5)
s.connect((elsewhere, 80))
head, _, body = get(s, "elsewhere").partition("\r\n\r\n")
print(head.splitlines()[0] if head else "", body.strip())
"#;

#[test]
fn a_socket_reconnected_elsewhere_after_its_marked_connect_failed_gets_no_header() {
    require_privileges!();
    let (node, _nginx, _socket_lb, agent) = socket_lb_node(&[]);
    assert_hairpin_runs_first(&node);
    let cases = [
        ("refused", REFUSED4, PLAIN4, POD_IP4),
        ("refused", REFUSED6, PLAIN6, POD_IP6),
        ("reset", RESET4, PLAIN4, POD_IP4),
        ("unspec", SILENT4, PLAIN4, POD_IP4),
    ];
    for (how, lb, elsewhere, pod_ip) in cases {
        let out = output_in(
            &node.pod_ns,
            Some(&node.pod_cgroup()),
            &[
                "python3",
                "-c",
                &format!("{PY_GET}{RECONNECT}"),
                how,
                lb,
                elsewhere,
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        // nginx's plain port answers a request that starts with a PROXY header 400.
        assert!(
            out.status.success()
                && stdout.trim() == format!("HTTP/1.1 200 OK plain remote={pod_ip}"),
            "{how} {lb}, then {elsewhere}: {stdout}{}\nagent:\n{}",
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
    }
    let s = status(&node);
    assert_eq!(counter(&s, "kernel_marked"), 4, "{s}");
    assert_eq!(counter(&s, "kernel_skipped_elsewhere"), 4, "{s}");
    assert_eq!(counter(&s, "kernel_headers_written"), 0, "{s}");
}

/// The programs `status` names in front of hairpin's connect programs, per hook.
fn in_front(s: &Value) -> Vec<(String, Vec<Value>)> {
    s["link_order"]["hooks"]
        .as_array()
        .unwrap_or_else(|| panic!("no link_order.hooks: {s}"))
        .iter()
        .map(|h| {
            (
                h["hook"].as_str().unwrap_or_default().to_string(),
                h["in_front"].as_array().cloned().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn without_link_ordering_the_socket_lb_hides_the_lb_and_status_and_doctor_name_it() {
    require_privileges!();
    let (node, _nginx, _socket_lb, agent) = socket_lb_node(&["--link-order", "append"]);
    // The socket LB rewrote the LB address before hairpin's program ran: nginx gets
    // the connection without a header and closes it (curl: empty reply).
    let r = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_eq!(r.code, 52, "{r:?}\n{}", agent.log());
    assert!(nginx_error_log(&node).contains("broken header"));
    let s = status(&node);
    assert_eq!(s["link_order"]["first"], false, "{s}");
    let hooks = in_front(&s);
    assert_eq!(hooks.len(), 2, "{s}");
    for ((hook, front), socket_lb) in hooks.iter().zip([SOCKET_LB4, SOCKET_LB6]) {
        // The agent has no CAP_SYS_ADMIN: the id, and why there is no name.
        assert!(
            front.len() == 1
                && front[0]["id"].as_u64().is_some()
                && front[0]["name"].is_null()
                && front[0]["name_unknown"]
                    .as_str()
                    .is_some_and(|w| w.contains("CAP_SYS_ADMIN")),
            "{hook} ({socket_lb} in front): {front:?}"
        );
    }
    assert!(
        agent
            .log()
            .contains("another connect program runs before hairpin's"),
        "{}",
        agent.log()
    );
    // `doctor`, run as root on the node, names them and gives the remedy.
    let doctor = run_cli(&node, &["doctor", "--output", "json"]);
    let check = doctor_check(&doctor.json(), "link_order");
    assert_eq!(check["status"], "fail", "{check}");
    let detail = check["detail"].as_str().unwrap_or_default();
    for socket_lb in [SOCKET_LB4, SOCKET_LB6] {
        assert!(detail.contains(socket_lb), "{detail}");
    }
    assert!(
        check["fix"].as_str().is_some_and(|f| f.contains("6.17")),
        "{check}"
    );
}

#[test]
fn an_adopted_link_an_earlier_agent_left_behind_the_socket_lb_is_re_created_in_front() {
    require_privileges!();
    // An earlier agent that appended its links after the socket LB's (an older
    // hairpin, or one started on this node before the kernel ordered links).
    let (node, _nginx, _socket_lb, mut earlier) = socket_lb_node(&["--link-order", "append"]);
    earlier.stop();
    let agent = CappedAgent::start_yaml(&node, &frontends_yaml(), &[], &DAEMONSET_CAPS);
    assert!(
        agent.log().contains("re-created in front"),
        "the log must say so:\n{}",
        agent.log()
    );
    assert_hairpin_runs_first(&node);
    let lb = &LBS[0];
    assert_header(
        "pod",
        lb,
        &from_pod(&node, &url(lb.ip, 80, "/")),
        POD_IP4,
        &agent,
    );
    let s = status(&node);
    if s["link_order"]["children"].is_null() {
        assert!(in_front(&s).iter().all(|(_, f)| f.is_empty()), "{s}");
    } else {
        // At the children (a kernel that cannot order), the earlier root link gone.
        assert!(
            agent.log().contains("at each child cgroup"),
            "{}",
            agent.log()
        );
    }
}
