//! The bench's servers on a [`SimNode`]: nginx tuned for load (PROXY on :80, plain
//! on :8081, a sparse bulk file), and HAProxy with `send-proxy` / `send-proxy-v2`
//! in the node namespace, as hairpin-proxy's data plane runs it.

use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, bail};

use super::procs::Proc;
use hairpin_tests::{
    node::{LbRule, NGINX_PLAIN_PORT, NGINX_PP_PORT, NODE_IP4, SimNode},
    sh::{command_in, output_in},
};

/// The proxied LB the PROXY v1 cases target (kube-proxy DNATs it to nginx :80).
pub const LB_V1: &str = "203.0.113.10";
/// The proxied LB the PROXY v2 cases target.
pub const LB_V2: &str = "203.0.113.12";
/// An LB hairpin does not proxy, DNATed to nginx's plain port: the floor.
pub const LB_PLAIN: &str = "203.0.113.99";
/// The LB HAProxy's `send-proxy` server dials.
pub const LB_HAPROXY_V1: &str = "203.0.113.20";
/// The LB HAProxy's `send-proxy-v2` server dials.
pub const LB_HAPROXY_V2: &str = "203.0.113.22";
/// The LB the kernel-path run's PROXY v1 rows dial.
pub const LB_KERNEL_V1: &str = "203.0.113.30";
/// The LB the kernel-path run's PROXY v2 rows dial.
pub const LB_KERNEL_V2: &str = "203.0.113.32";

/// Each proxied LB the bench dials and the nginx PROXY port kube-proxy DNATs it to:
/// one LB and one port per kind of row. Flows from different pre-NAT addresses, or
/// from the pod (masqueraded to the node IP) and from the node itself, carry
/// different TCP timestamp offsets; had they shared an nginx port, a SYN meeting
/// nginx's TIME_WAIT socket from the other kind of flow on the same source port
/// would fail PAWS and wait a 1 s retransmit. Seen each time rows shared one: v1
/// with v2 (errors, 1 s p99), HAProxy's upstream with the kernel path's pod flows
/// (its rows void), the relay's upstream with the kernel path's (about a sixth of
/// the kernel path's rate, its client idle).
const PP_BACKENDS: [(&str, u16, &str); 6] = [
    (LB_V1, NGINX_PP_PORT, "bench/pp-v1:http"),
    (LB_V2, 82, "bench/pp-v2:http"),
    (LB_HAPROXY_V1, 83, "bench/haproxy-v1:http"),
    (LB_HAPROXY_V2, 84, "bench/haproxy-v2:http"),
    (LB_KERNEL_V1, 85, "bench/kernel-v1:http"),
    (LB_KERNEL_V2, 86, "bench/kernel-v2:http"),
];

/// The bench's kube-proxy rules: each of [`PP_BACKENDS`], and LB_PLAIN:80 to nginx's
/// plain port.
pub fn bench_lbs() -> Vec<LbRule> {
    PP_BACKENDS
        .iter()
        .copied()
        .chain([(LB_PLAIN, NGINX_PLAIN_PORT, "bench/plain:http")])
        .map(|(lb_ip, backend_port, name)| LbRule {
            lb_ip,
            lb_port: 80,
            backend_port,
            name,
        })
        .collect()
}

/// HAProxy's `send-proxy` listener (node IP).
pub const HAPROXY_V1_PORT: u16 = 9001;
/// HAProxy's `send-proxy-v2` listener.
pub const HAPROXY_V2_PORT: u16 = 9002;

/// The file the upload case sends: sparse, as large as the bulk file.
pub fn upload_file(node: &SimNode) -> std::path::PathBuf {
    node.dir.join("bench-nginx").join("upload.bin")
}

/// nginx for load: one worker (the machine has two cores and the client needs one),
/// no access log, `/bulk` a sparse file of `bulk_bytes` served with sendfile,
/// `/upload` taking a body of any size and discarding it (nginx answers at once and
/// reads the rest away; the client's transfer ends when all of it is read).
pub fn start_bench_nginx(node: &SimNode, bulk_bytes: u64) -> Result<Proc> {
    let dir = node.dir.join("bench-nginx");
    fs::create_dir_all(dir.join("tmp"))?;
    let bulk = dir.join("bulk.bin");
    // Sparse: 1 GiB costs no disk and reads from the page cache's zero pages.
    fs::File::create(&bulk)?.set_len(bulk_bytes)?;
    fs::File::create(upload_file(node))?.set_len(bulk_bytes)?;
    let pp_listens: String = PP_BACKENDS
        .iter()
        .map(|(_, port, _)| format!("        listen {port} proxy_protocol backlog=4096;\n"))
        .collect();
    let d = dir.display();
    let conf = format!(
        r#"
worker_processes 1;
worker_rlimit_nofile 65536;
user root;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 16384; multi_accept on; }}
http {{
    access_log off;
    sendfile on;
{http_common}    server {{
        listen [::]:{pp} proxy_protocol backlog=4096;
{pp_listens}        location = /bulk {{ alias {d}/bulk.bin; }}
        location = /upload {{ client_max_body_size 0; return 200 "ok $proxy_protocol_addr\n"; }}
        location / {{ return 200 "ok $proxy_protocol_addr\n"; }}
    }}
    server {{
        listen {plain} backlog=4096;
        listen [::]:{plain} backlog=4096;
        location = /bulk {{ alias {d}/bulk.bin; }}
        location = /upload {{ client_max_body_size 0; return 200 "ok $remote_addr\n"; }}
        location / {{ return 200 "ok $remote_addr\n"; }}
    }}
}}
"#,
        http_common = hairpin_tests::servers::nginx_http_common(&dir),
        pp = NGINX_PP_PORT,
        plain = NGINX_PLAIN_PORT,
    );
    let conf_path = dir.join("nginx.conf");
    fs::write(&conf_path, conf)?;
    let conf_arg = conf_path.to_str().context("utf-8 path")?.to_string();
    let prefix = d.to_string();
    let cmd = command_in(
        &node.ingress_ns,
        None,
        &["nginx", "-c", &conf_arg, "-p", &prefix],
    );
    let mut proc = Proc::spawn("nginx", cmd, &dir.join("stderr.log"))?;
    wait_listening(
        node,
        &node.ingress_ns,
        &PP_BACKENDS
            .iter()
            .map(|(_, port, _)| *port)
            .chain([NGINX_PLAIN_PORT])
            .collect::<Vec<_>>(),
        &mut proc,
    )?;
    Ok(proc)
}

/// HAProxy as hairpin-proxy runs it: TCP mode, the `server` is an LB address (which
/// kube-proxy DNATs to the ingress) with `send-proxy` / `send-proxy-v2`; its own
/// LBs, see [`LB_HAPROXY_V1`]. It runs in
/// the node namespace but outside the attached cgroup, so its upstream connects are
/// never redirected by hairpin's programs.
pub fn start_haproxy_send_proxy(node: &SimNode) -> Result<Proc> {
    let dir = node.dir.join("bench-haproxy");
    fs::create_dir_all(&dir)?;
    let conf = format!(
        r#"
global
    nbthread 1
    maxconn 8000
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
listen send_proxy
    bind {NODE_IP4}:{HAPROXY_V1_PORT}
    server lb {LB_HAPROXY_V1}:80 send-proxy
listen send_proxy_v2
    bind {NODE_IP4}:{HAPROXY_V2_PORT}
    server lb {LB_HAPROXY_V2}:80 send-proxy-v2
"#
    );
    let conf_path = dir.join("haproxy.cfg");
    fs::write(&conf_path, conf)?;
    let cmd = command_in(
        &node.node_ns,
        None,
        &[
            "haproxy",
            "-db",
            "-f",
            conf_path.to_str().context("utf-8 path")?,
        ],
    );
    let mut proc = Proc::spawn("haproxy", cmd, &dir.join("haproxy.log"))?;
    wait_listening(
        node,
        &node.node_ns,
        &[HAPROXY_V1_PORT, HAPROXY_V2_PORT],
        &mut proc,
    )?;
    Ok(proc)
}

fn wait_listening(node: &SimNode, ns: &str, ports: &[u16], proc: &mut Proc) -> Result<()> {
    let _ = node;
    for _ in 0..500 {
        proc.check_alive()?;
        let out = output_in(ns, None, &["ss", "-Htln"]);
        let text = String::from_utf8_lossy(&out.stdout);
        if ports.iter().all(|p| text.contains(&format!(":{p} "))) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("{} not listening on {ports:?} within 10 s", proc.name)
}

/// A command run from the pod (pod namespace, pod cgroup), pinned to `cpu` when given.
pub fn in_pod(node: &SimNode, cpu: Option<usize>, argv: &[&str]) -> Command {
    in_cgroup(node, &node.pod_cgroup(), cpu, argv)
}

/// `argv` in the pod's network namespace and `cgroup`, pinned to `cpu` when given.
pub fn in_cgroup(node: &SimNode, cgroup: &Path, cpu: Option<usize>, argv: &[&str]) -> Command {
    let cpu = cpu.map(|c| c.to_string());
    let mut full: Vec<&str> = Vec::new();
    if let Some(c) = cpu.as_deref() {
        full.extend(["taskset", "-c", c]);
    }
    full.extend_from_slice(argv);
    command_in(&node.pod_ns, Some(cgroup), &full)
}

/// `http://ip:port/path`.
pub fn url(ip: &str, port: u16, path: &str) -> String {
    hairpin_tests::client::url(ip, port, path)
}
