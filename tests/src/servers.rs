//! The "ingress": a real nginx and a real haproxy with the PROXY protocol on, in the
//! ingress namespace, each logging what the header said.

use std::{
    fs,
    io::{Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::{
    node::{HAPROXY_PP_PORT, NGINX_PLAIN_PORT, NGINX_PP_PORT, SimNode},
    sh::{command_in, output_in},
};

/// A server process, killed on drop.
pub struct Server {
    child: Child,
    /// Its log files.
    pub logs: Vec<PathBuf>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Spawns `cmd` with its stdout and stderr going to `log` (the server's first log
    /// file, `more_logs` after it).
    pub fn spawn(cmd: &mut Command, log: PathBuf, more_logs: &[PathBuf]) -> Server {
        let out = fs::File::create(&log)
            .unwrap_or_else(|e| panic!("create the log {}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log fd"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let mut logs = vec![log];
        logs.extend_from_slice(more_logs);
        Server { child, logs }
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.logs
            .iter()
            .map(|p| fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("")
    }
}

/// The lines every `http {}` block of the suites' nginx carries: its temporary
/// directories under `dir`/tmp (the compiled-in ones are not writable here) and
/// the default type.
pub fn nginx_http_common(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    default_type text/plain;
"
    )
}

/// A whole nginx.conf for the suites' servers: one worker, in the foreground, its
/// pid, error log and temporary files under `dir`, and `http` (the servers, in an
/// `http {}` block's indentation) inside the common `http {}` lines.
pub fn nginx_conf(dir: &Path, http: &str) -> String {
    let d = dir.display();
    format!(
        "
worker_processes 1;
user root;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
{common}{http}}}
",
        common = nginx_http_common(dir),
    )
}

/// Size of the file nginx serves at /slow, rate-limited, for in-flight transfer tests.
pub const SLOW_BYTES: usize = 3 * 1024 * 1024;

/// Starts nginx: port 80 requires the PROXY protocol (v1 or v2, nginx detects which)
/// and answers with what the header said; port 8081 is a plain server.
pub fn start_nginx(node: &SimNode) -> Server {
    let dir = node.dir.join("nginx");
    fs::create_dir_all(dir.join("tmp")).expect("nginx dir");
    fs::write(dir.join("slow.bin"), vec![b'x'; SLOW_BYTES]).expect("slow file");
    let d = dir.display();
    let http = format!(
        r#"    log_format pp 'pp_client=$proxy_protocol_addr:$proxy_protocol_port pp_dst=$proxy_protocol_server_addr:$proxy_protocol_server_port remote=$remote_addr "$request" $status $bytes_sent';
    access_log {d}/access.log pp;
    server {{
        listen {pp} proxy_protocol;
        listen [::]:{pp} proxy_protocol;
        location = /slow {{
            limit_rate 1m;
            alias {d}/slow.bin;
        }}
        location / {{
            return 200 "client=$proxy_protocol_addr:$proxy_protocol_port dst=$proxy_protocol_server_addr:$proxy_protocol_server_port\n";
        }}
    }}
    server {{
        listen {plain};
        listen [::]:{plain};
        location / {{
            return 200 "plain remote=$remote_addr\n";
        }}
    }}
"#,
        pp = NGINX_PP_PORT,
        plain = NGINX_PLAIN_PORT,
    );
    let conf = nginx_conf(&dir, &http);
    run_nginx(node, &dir, &conf, &[NGINX_PP_PORT, NGINX_PLAIN_PORT])
}

/// Writes `conf` to `dir/nginx.conf`, checks it with `nginx -t`, starts nginx with
/// prefix `dir` in the ingress namespace and waits until `ports` listen.
pub fn run_nginx(node: &SimNode, dir: &Path, conf: &str, ports: &[u16]) -> Server {
    let conf_path = dir.join("nginx.conf");
    fs::write(&conf_path, conf).expect("nginx.conf");
    let conf_arg = conf_path.to_str().expect("utf-8 path");
    let prefix = dir.to_str().expect("utf-8 path");
    let check = output_in(
        &node.ingress_ns,
        None,
        &["nginx", "-t", "-q", "-c", conf_arg, "-p", prefix],
    );
    assert!(
        check.status.success(),
        "nginx -t: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let child = command_in(
        &node.ingress_ns,
        None,
        &["nginx", "-c", conf_arg, "-p", prefix],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start nginx");
    let server = Server {
        child,
        logs: vec![dir.join("access.log"), dir.join("error.log")],
    };
    wait_listening(node, ports);
    server
}

/// nginx's access log only.
pub fn nginx_access_log(node: &SimNode) -> String {
    fs::read_to_string(node.dir.join("nginx/access.log")).unwrap_or_default()
}

/// nginx's error log only.
pub fn nginx_error_log(node: &SimNode) -> String {
    fs::read_to_string(node.dir.join("nginx/error.log")).unwrap_or_default()
}

/// Starts haproxy with `accept-proxy` on port 8080 (v1 and v2), answering and logging
/// the client and destination the header carried.
pub fn start_haproxy(node: &SimNode) -> Server {
    let dir = node.dir.join("haproxy");
    fs::create_dir_all(&dir).expect("haproxy dir");
    let conf = format!(
        r#"
global
    log stdout format raw local0 info
defaults
    mode http
    log global
    timeout connect 5s
    timeout client 10s
    timeout server 10s
frontend ingress
    bind 0.0.0.0:{port} accept-proxy
    bind :::{port} v6only accept-proxy
    log-format "haproxy client=%ci:%cp dst=%fi:%fp status=%ST"
    http-request return status 200 content-type text/plain lf-string "client=%[src]:%[src_port] dst=%[dst]:%[dst_port]\n"
"#,
        port = HAPROXY_PP_PORT
    );
    let conf_path = dir.join("haproxy.cfg");
    fs::write(&conf_path, conf).expect("haproxy.cfg");
    let server = Server::spawn(
        &mut command_in(
            &node.ingress_ns,
            None,
            &[
                "haproxy",
                "-db",
                "-f",
                conf_path.to_str().expect("utf-8 path"),
            ],
        ),
        dir.join("haproxy.log"),
        &[],
    );
    wait_listening(node, &[HAPROXY_PP_PORT]);
    server
}

fn wait_listening(node: &SimNode, ports: &[u16]) {
    wait_listening_in(&node.ingress_ns, ports, None);
}

/// Waits until TCP `ports` listen in `netns` (10 s); when `server` is given, fails at
/// once with its log if it exits first.
pub fn wait_listening_in(netns: &str, ports: &[u16], mut server: Option<&mut Server>) {
    let deadline = Instant::now() + crate::wait::slack(Duration::from_secs(10));
    loop {
        let out = output_in(netns, None, &["ss", "-Htln"]);
        let text = String::from_utf8_lossy(&out.stdout);
        if ports.iter().all(|p| text.contains(&format!(":{p} "))) {
            return;
        }
        if let Some(s) = server.as_deref_mut()
            && let Ok(Some(status)) = s.child.try_wait()
        {
            panic!(
                "the server exited ({status}) before listening on {ports:?}:\n{}",
                s.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "servers not listening on {ports:?}: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where [`banner_server`] listens in the ingress namespace (a test's LB rule DNATs a
/// port-25 LB to it).
pub const BANNER_PORT: u16 = 9025;

/// Accepts `n` connections in `netns` on BANNER_PORT as a PROXY-aware server whose
/// server speaks first: it reads the PROXY v1 line (at most 2 s), then writes its
/// banner, reads the client's command and answers. Sends the header line each
/// connection carried (empty when none came in time).
pub fn banner_server(netns: &str, n: usize) -> mpsc::Receiver<String> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let netns = netns.to_string();
    std::thread::spawn(move || {
        crate::sh::enter_netns(&netns);
        let listener = TcpListener::bind(("::", BANNER_PORT)).expect("bind banner port");
        ready_tx.send(()).expect("ready");
        for _ in 0..n {
            let (mut conn, _) = listener.accept().expect("accept");
            conn.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            let mut got = Vec::new();
            let mut byte = [0u8; 1];
            while !got.ends_with(b"\r\n") && got.len() < 108 {
                match conn.read(&mut byte) {
                    Ok(1) => got.push(byte[0]),
                    _ => break,
                }
            }
            let header = if got.starts_with(b"PROXY ") && got.ends_with(b"\r\n") {
                String::from_utf8_lossy(&got).trim_end().to_string()
            } else {
                String::new()
            };
            if !header.is_empty() {
                let _ = conn.write_all(b"220 banner ready\r\n");
                let mut cmd = [0u8; 64];
                if let Ok(k) = conn.read(&mut cmd)
                    && cmd[..k].starts_with(b"QUIT")
                {
                    let _ = conn.write_all(b"221 bye\r\n");
                }
            }
            if tx.send(header).is_err() {
                return;
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("banner server ready");
    rx
}

/// A client of a server-speaks-first LB at `lb`:`port` in `netns` and `cgroup`:
/// waits for the banner (3 s), then says QUIT; what the server said
/// (`banner|answer`, or `timeout`).
pub fn banner_client(netns: &str, cgroup: &Path, lb: &str, port: u16) -> String {
    let py = format!(
        r#"
import socket
s = socket.create_connection(("{lb}", {port}), timeout=3)
try:
    banner = s.recv(100)
    s.sendall(b"QUIT\r\n")
    print(banner.decode().strip() + "|" + s.recv(100).decode().strip())
except socket.timeout:
    print("timeout")
"#
    );
    let out = output_in(netns, Some(cgroup), &["python3", "-c", &py]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
