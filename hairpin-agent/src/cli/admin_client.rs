//! A tiny HTTP/1.0 client for the agent's admin server: one GET, over the unix
//! socket first, then TCP. Synchronous and dependency-free on purpose: the CLI must
//! work on a broken node, and one request needs no runtime.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    os::unix::net::UnixStream,
    path::PathBuf,
    time::Duration,
};

use crate::status::{Snapshot, admin::STATUS_PATH};

/// How long any admin request may take: a hung agent must not hang the CLI.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Where the running agent's admin server is.
#[derive(clap::Args, Debug, Clone)]
pub struct AdminArgs {
    /// Unix socket of the running agent's admin server, tried first.
    #[arg(
        long,
        env = "HAIRPIN_ADMIN_SOCKET",
        default_value = crate::status::admin::DEFAULT_ADMIN_SOCKET
    )]
    pub admin_socket: PathBuf,

    /// TCP address of the running agent's admin server, tried when the socket does not answer.
    #[arg(long, env = "HAIRPIN_ADMIN_ADDRESS", default_value = crate::status::admin::DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: SocketAddr,
}

/// Where to read the running agent from: its admin server, else what it pinned.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
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
    pub fn read_pinned(&self) -> Option<Vec<crate::datapath::inspect::PinnedDatapath>> {
        (self.bpf_pin_dir.as_os_str() != "none")
            .then(|| crate::datapath::inspect::read_pinned(&self.bpf_pin_dir))
    }
}

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    /// Neither the socket nor the address answered.
    #[error(
        "the agent is not reachable: socket {socket}: {socket_error}; address {address}: {address_error}"
    )]
    Unreachable {
        /// The socket tried.
        socket: PathBuf,
        /// Its error.
        socket_error: std::io::Error,
        /// The address tried.
        address: SocketAddr,
        /// Its error.
        address_error: std::io::Error,
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
pub struct Reply {
    /// The status code.
    pub code: u16,
    /// The body.
    pub body: String,
}

impl AdminArgs {
    /// GETs `path` from the agent, socket first.
    pub fn get(&self, path: &str) -> Result<Reply, AdminClientError> {
        let raw = match UnixStream::connect(&self.admin_socket) {
            Ok(s) => {
                s.set_read_timeout(Some(TIMEOUT)).ok();
                s.set_write_timeout(Some(TIMEOUT)).ok();
                request(s, path)
            }
            Err(socket_error) => match TcpStream::connect_timeout(&self.admin_address, TIMEOUT) {
                Ok(s) => {
                    s.set_read_timeout(Some(TIMEOUT)).ok();
                    s.set_write_timeout(Some(TIMEOUT)).ok();
                    request(s, path)
                }
                Err(address_error) => {
                    return Err(AdminClientError::Unreachable {
                        socket: self.admin_socket.clone(),
                        socket_error,
                        address: self.admin_address,
                        address_error,
                    });
                }
            },
        };
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
    pub fn status(&self) -> Result<Snapshot, AdminClientError> {
        let reply = self.get(STATUS_PATH)?;
        if reply.code == 404 {
            // The socket did not answer and the TCP address has no /status.
            return Err(AdminClientError::BadReply {
                path: STATUS_PATH.into(),
                detail: format!(
                    "404 on {}: /status is served on the admin socket only ({}), which \
                     needs root on the node (or pass --admin-socket)",
                    self.admin_address,
                    self.admin_socket.display()
                ),
            });
        }
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
pub fn parse_reply(raw: &str) -> Option<Reply> {
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
