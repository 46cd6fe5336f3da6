//! A tiny HTTP/1.0 client for the agent's admin server: one GET over its unix
//! socket, never TCP. The socket is root's alone (0600 in a root-owned directory),
//! while any uid on the node can bind a TCP port the agent has not bound yet (during a
//! restart) and answer with a forged `/status`, which `doctor` would then probe.
//! Synchronous and dependency-free on purpose: the CLI must work on a broken node,
//! and one request needs no runtime.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::PathBuf,
    time::Duration,
};

use crate::status::{Snapshot, admin::STATUS_PATH};

/// How long any admin request may take: a hung agent must not hang the CLI.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Where the running agent's admin server is.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct AdminArgs {
    /// Unix socket of the running agent's admin server, the only way the CLI asks
    /// the agent (never its TCP address, which another uid could hold).
    #[arg(
        long,
        env = "HAIRPIN_ADMIN_SOCKET",
        default_value = crate::status::admin::DEFAULT_ADMIN_SOCKET
    )]
    pub admin_socket: PathBuf,
}

/// Where to read the running agent from: its admin server, else what it pinned.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct AgentArgs {
    /// Where the agent's admin server is.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// The agent's pin directory (`run --bpf-pin-dir`), read by path and read-only, so
    /// it works inside the pod with the DaemonSet's capabilities. `none`: not read.
    #[arg(long, env = "HAIRPIN_BPF_PIN_DIR", default_value = crate::agent::args::DEFAULT_BPF_PIN_DIR)]
    pub bpf_pin_dir: PathBuf,
}

impl AgentArgs {
    /// The datapaths pinned in --bpf-pin-dir; `None` when it is `none`.
    pub(crate) fn read_pinned(&self) -> Option<Vec<crate::datapath::inspect::PinnedDatapath>> {
        (self.bpf_pin_dir.as_os_str() != "none")
            .then(|| crate::datapath::inspect::read_pinned(&self.bpf_pin_dir))
    }
}

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminClientError {
    /// The socket did not answer.
    #[error(
        "the agent is not reachable on its admin socket {socket} (root only; --admin-socket): {source}"
    )]
    Unreachable {
        /// The socket tried.
        socket: PathBuf,
        /// Its error.
        source: std::io::Error,
    },
    /// The reply was not HTTP or not 200.
    #[error("the agent answered {path} with {detail}")]
    BadReply {
        /// The request path.
        path: String,
        /// What was wrong.
        detail: String,
    },
    /// `/status` did not decode.
    #[error("the agent's /status did not decode (agent and CLI versions differ?): {0}")]
    Decode(#[from] serde_json::Error),
}

/// An HTTP reply: status code and body.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The status code.
    pub code: u16,
    /// The body.
    pub body: String,
}

impl AdminArgs {
    /// GETs `path` from the agent over its admin socket.
    pub(crate) fn get(&self, path: &str) -> Result<Reply, AdminClientError> {
        let s = UnixStream::connect(&self.admin_socket).map_err(|source| {
            AdminClientError::Unreachable {
                socket: self.admin_socket.clone(),
                source,
            }
        })?;
        s.set_read_timeout(Some(TIMEOUT)).ok();
        s.set_write_timeout(Some(TIMEOUT)).ok();
        let raw = request(s, path);
        let raw = raw.map_err(|e| AdminClientError::BadReply {
            path: path.to_string(),
            detail: e.to_string(),
        })?;
        parse_reply(&raw).ok_or_else(|| AdminClientError::BadReply {
            path: path.to_string(),
            detail: format!(
                "a reply that is not HTTP: {:?}",
                raw.get(..raw.len().min(80))
            ),
        })
    }

    /// The agent's `/status`, which it serves on its unix socket only.
    pub(crate) fn status(&self) -> Result<Snapshot, AdminClientError> {
        let reply = self.get(STATUS_PATH)?;
        if reply.code != 200 {
            return Err(AdminClientError::BadReply {
                path: STATUS_PATH.into(),
                detail: format!("status {}", reply.code),
            });
        }
        Ok(serde_json::from_str(&reply.body)?)
    }
}

fn request(mut s: impl Read + Write, path: &str) -> std::io::Result<String> {
    // HTTP/1.0 with Connection: close: the body ends at EOF, never chunked.
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: hairpin-agent\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Splits a raw HTTP/1.x reply into status code and body.
pub(crate) fn parse_reply(raw: &str) -> Option<Reply> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.lines().next()?;
    let mut parts = status.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?.parse().ok()?;
    Some(Reply {
        code,
        body: body.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_body() {
        let r = parse_reply("HTTP/1.0 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}")
            .expect("reply");
        assert_eq!((r.code, r.body.as_str()), (503, "{}"));
        assert!(parse_reply("SSH-2.0-OpenSSH\r\n\r\n").is_none());
        assert!(parse_reply("HTTP/1.1 200 OK").is_none());
    }
}
