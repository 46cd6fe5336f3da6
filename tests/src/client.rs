//! Clients: curl run as a pod or as a host process would run it.

use std::process::Output;

use crate::{node::SimNode, sh::output_in};

/// What curl got.
#[derive(Debug)]
pub struct Reply {
    /// curl's exit code (0 on success, 52 on an empty reply, 56 on a reset...).
    pub code: i32,
    /// The response body.
    pub body: String,
    /// curl's error text.
    pub stderr: String,
}

impl Reply {
    /// What a finished client process printed and returned.
    pub fn from_output(out: Output) -> Reply {
        Reply {
            code: out.status.code().unwrap_or(-1),
            body: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// True when curl succeeded.
    pub fn ok(&self) -> bool {
        self.code == 0
    }

    /// True when the connection was refused: curl could not connect (7), or the
    /// connection was closed or reset before a reply came (52; 55 when the reset
    /// met the request's send, 56 its receive).
    pub fn refused(&self) -> bool {
        matches!(self.code, 7 | 52 | 55 | 56)
    }
}

/// A URL for `ip:port/path`, bracketing IPv6.
pub fn url(ip: &str, port: u16, path: &str) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}{path}")
    } else {
        format!("http://{ip}:{port}{path}")
    }
}

fn curl(netns: &str, cgroup: &std::path::Path, url: &str) -> Reply {
    Reply::from_output(output_in(
        netns,
        Some(cgroup),
        &["curl", "-sS", "--max-time", "10", url],
    ))
}

/// curl from the pod (pod namespace, pod cgroup).
pub fn from_pod(node: &SimNode, url: &str) -> Reply {
    curl(&node.pod_ns, &node.pod_cgroup(), url)
}

/// Whether network namespace `netns` has MPTCP enabled (`net.mptcp.enabled`).
pub fn mptcp_enabled(netns: &str) -> bool {
    let out = output_in(netns, None, &["sysctl", "-n", "net.mptcp.enabled"]);
    String::from_utf8_lossy(&out.stdout).trim() == "1"
}

/// Python for a client script to start with: `get(s, host)` sends an HTTP/1.0 GET of
/// `/` for `host` on the connected socket `s` and returns the whole reply (status
/// line, headers, body), read until the server closes.
pub const PY_GET: &str = r#"
def get(s, host):
    s.sendall(b"GET / HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
    reply = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply.decode(errors="replace")
"#;

/// One HTTP/1.0 request from the pod to `lb`:80 over an MPTCP socket (python's
/// `IPPROTO_MPTCP`; curl cannot ask for one everywhere): stdout is the reply's body.
pub fn mptcp_from_pod(node: &SimNode, lb: &str) -> Output {
    const PY: &str = r#"
import socket, sys
lb = sys.argv[1]
s = socket.socket(socket.AF_INET6 if ":" in lb else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
s.settimeout(5)
s.connect((lb, 80))
print(get(s, "lb").split("\r\n\r\n", 1)[-1].strip())
"#;
    output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &["python3", "-c", &format!("{PY_GET}{PY}"), lb],
    )
}

/// curl from a host process (node namespace, host cgroup).
pub fn from_host(node: &SimNode, url: &str) -> Reply {
    curl(&node.node_ns, &node.host_cgroup(), url)
}

/// Asserts that `reply` succeeded and names `client` as the source and `lb:80` as
/// the destination of its header (the test servers echo them); `who` and the
/// agent's log go into the message.
pub fn assert_true_client(
    who: &str,
    reply: &Reply,
    client: &str,
    lb: &str,
    agent: &crate::agent::Agent,
) {
    assert!(
        reply.ok(),
        "{who} -> {lb}: {reply:?}\nagent:\n{}",
        agent.log()
    );
    assert!(
        reply.body.starts_with(&format!("client={client}:")),
        "{who} -> {lb}: the header must name {client}: {}",
        reply.body
    );
    assert!(
        reply.body.trim_end().ends_with(&format!("dst={lb}:80")),
        "{who} -> {lb}: {}",
        reply.body
    );
}

/// A keep-alive connection from the pod to 203.0.113.10:80 (one bash process holding
/// it): request `i` goes once [`KeepAlive::answer`] asks for it (the first at once),
/// its body lands in `dir/ans{i}`. Killed on drop.
pub struct KeepAlive {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl KeepAlive {
    /// Opens the connection and sends the first of `n` requests.
    pub fn start(node: &SimNode, dir: &std::path::Path, n: usize) -> KeepAlive {
        std::fs::create_dir_all(dir).expect("client dir");
        std::fs::write(dir.join("go1"), "").expect("go1");
        let d = dir.display();
        let script = format!(
            r#"exec 3<>/dev/tcp/203.0.113.10/80
for i in $(seq 1 {n}); do
    while [ ! -e {d}/go$i ]; do sleep 0.05; done
    printf 'GET /%s HTTP/1.1\r\nHost: lb\r\n\r\n' "$i" >&3
    len=0
    while IFS= read -r line <&3; do
        line=${{line%$'\r'}}
        [ -z "$line" ] && break
        case "$line" in [Cc]ontent-[Ll]ength:*) len=${{line#*: }};; esac
    done
    body=
    [ "$len" -gt 0 ] && IFS= read -r -N "$len" body <&3
    printf '%s' "$body" > {d}/ans$i.tmp; mv {d}/ans$i.tmp {d}/ans$i
done
"#
        );
        let child = crate::sh::command_in(
            &node.pod_ns,
            Some(&node.pod_cgroup()),
            &["bash", "-c", &script],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the keep-alive client");
        KeepAlive {
            child,
            dir: dir.to_path_buf(),
        }
    }

    /// Sends request `i` (the first went at start) and returns its answer: empty when
    /// none came within 10 s (the connection is gone).
    pub fn answer(&self, i: usize) -> String {
        if i > 1 {
            std::fs::write(self.dir.join(format!("go{i}")), "").expect("go");
        }
        let file = self.dir.join(format!("ans{i}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(s) = std::fs::read_to_string(&file) {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        String::new()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// From the pod and from the node, `target` is answered by nginx's plain server,
/// which would answer 400 to a PROXY header: nothing was written ahead of the request.
pub fn assert_plain_server_answers(node: &SimNode, target: &str) {
    for (who, reply) in [
        ("pod", from_pod(node, target)),
        ("node", from_host(node, target)),
    ] {
        assert!(reply.ok(), "{who} -> {target}: {reply:?}");
        assert!(
            reply.body.starts_with("plain remote="),
            "{who} -> {target}: {}",
            reply.body
        );
    }
}
