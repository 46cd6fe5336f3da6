//! Helpers for the name-routing suite (`tests/names.rs`): a TLS "ingress" (nginx with
//! `listen ... ssl proxy_protocol` and a certificate made at test time), the LB rules
//! for port 443, and clients that resolve names through a given hosts file or curl's
//! `--resolve`. Additive: the shared harness is used as it is.

use std::{fs, path::PathBuf};

use crate::{
    client::Reply,
    node::{LbRule, SimNode, default_lbs},
    servers::{Server, run_nginx},
    sh::{output_in, run},
};

/// nginx TLS port behind LB 203.0.113.10:443 (body starts `tls-a`).
pub const TLS_A_PORT: u16 = 443;
/// nginx TLS port behind LB 203.0.113.11:443 (body starts `tls-b`).
pub const TLS_B_PORT: u16 = 8443;

/// The default LBs plus a TLS port on each of the two proxied LBs.
pub fn lbs_with_tls() -> Vec<LbRule> {
    let mut lbs = default_lbs();
    lbs.push(LbRule {
        lb_ip: "203.0.113.10",
        lb_port: 443,
        backend_port: TLS_A_PORT,
        name: "ingress-nginx/ingress-nginx-controller:https",
    });
    lbs.push(LbRule {
        lb_ip: "203.0.113.11",
        lb_port: 443,
        backend_port: TLS_B_PORT,
        name: "haproxy/haproxy-ingress:https",
    });
    lbs
}

/// Starts a second nginx in the ingress namespace with two TLS servers requiring the
/// PROXY protocol, answering with the SNI and what the header said.
pub fn start_tls_nginx(node: &SimNode) -> Server {
    let dir = node.dir.join("nginx-tls");
    fs::create_dir_all(dir.join("tmp")).expect("nginx-tls dir");
    let d = dir.display().to_string();
    run(&[
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=hairpin-test",
        "-keyout",
        &format!("{d}/key.pem"),
        "-out",
        &format!("{d}/cert.pem"),
    ]);
    let server = |port: u16, tag: &str| {
        format!(
            r#"    server {{
        listen {port} ssl proxy_protocol;
        listen [::]:{port} ssl proxy_protocol;
        ssl_certificate {d}/cert.pem;
        ssl_certificate_key {d}/key.pem;
        location / {{
            return 200 "{tag} sni=$ssl_server_name client=$proxy_protocol_addr:$proxy_protocol_port dst=$proxy_protocol_server_addr:$proxy_protocol_server_port\n";
        }}
    }}
"#
        )
    };
    let http = format!(
        "    access_log {d}/access.log;\n{}{}",
        server(TLS_A_PORT, "tls-a"),
        server(TLS_B_PORT, "tls-b"),
    );
    let conf = crate::servers::nginx_conf(&dir, &http);
    run_nginx(node, &dir, &conf, &[TLS_A_PORT, TLS_B_PORT])
}

/// curl `url` from the pod with `--resolve name:port:addr`: the name (so the SNI and
/// Host) is real, its address is the name relay's. `-k`: the certificate is self-signed.
pub fn curl_resolved_from_pod(node: &SimNode, resolve: &str, url: &str) -> Reply {
    Reply::from_output(output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &[
            "curl",
            "-sS",
            "-k",
            "--max-time",
            "10",
            "--resolve",
            resolve,
            url,
        ],
    ))
}

/// Runs shell `script` as a host process of the node in a private mount namespace
/// where `hosts` is bind-mounted over /etc/hosts: the real resolver (getent, curl's
/// getaddrinfo) reads the agent-written file, and nothing outside sees the mount.
pub fn sh_with_hosts_file(node: &SimNode, hosts: &std::path::Path, script: &str) -> Reply {
    Reply::from_output(crate::sh::sh_with_files_over(
        &node.node_ns,
        &node.host_cgroup(),
        &[(hosts, "/etc/hosts")],
        script,
    ))
}

/// A simulated node with nginx, and its hosts file (in the node's directory)
/// holding `hosts`.
pub fn node_with_hosts(hosts: &[u8]) -> (SimNode, Server, PathBuf) {
    let node = SimNode::new();
    let nginx = crate::servers::start_nginx(&node);
    let path = node.dir.join("hosts");
    fs::write(&path, hosts).expect("write hosts");
    (node, nginx, path)
}
