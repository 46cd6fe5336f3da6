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
