//! Mesh shapes in the simulated pod: an outbound-redirecting proxy between the pod's
//! processes and the LB, as service meshes install it. Each is a real Envoy 1.40
//! dialling the original destination, behind the redirect rules the mesh's init
//! container (or CNI plugin) writes in the pod's network namespace:
//!
//! - [`MeshShape::IstioTcp`] and [`MeshShape::IstioHttp`]: Istio's sidecar.
//!   `iptables -t nat ... ! -d 127.0.0.1/32 -m owner ! --uid-owner 1337 -j REDIRECT
//!   --to-ports 15001`, and Envoy as uid 1337 in the pod's cgroup on 127.0.0.1:15001
//!   with the `original_dst` listener filter, to an `ORIGINAL_DST` cluster
//!   (`lb_policy: CLUSTER_PROVIDED`) through `tcp_proxy` (TCP passthrough) or an HTTP
//!   connection manager.
//! - [`MeshShape::Linkerd`]: Linkerd's proxy-init rules (the proxy's uid 2102 and
//!   loopback return, everything else to the outbound port 4140) and a proxy that
//!   detects HTTP (Envoy with `http_inspector`: HTTP through an HTTP connection
//!   manager, anything else passed through as TCP), as uid 2102.
//! - [`MeshShape::Ambient`]: Istio ambient's in-pod redirection (istio-cni's rules:
//!   the proxy's mark 0x539 exempt, other TCP to 15001), with the proxy outside the
//!   pod's cgroup (as ztunnel is: a pod of its own) and dialling from the pod's address
//!   (Envoy's `original_src` listener filter, which binds the upstream socket to the
//!   downstream's source with `IP_TRANSPARENT` and marks it).
//!
//! Dual-stack, as Istio and Linkerd install it in a dual-stack pod: the same rules in
//! iptables and ip6tables (`::1/128` for `127.0.0.1/32`), and the proxy listening on
//! `127.0.0.1` and `::1`. Removing a [`Mesh`] (drop) stops the proxy and deletes its
//! rules, so a test can show the pod without it on the same node.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{
    dataplanes::envoy::{EnvoyRun, start_envoy, stdout_access_log, typed},
    node::SimNode,
    servers::Server,
    sh::{run_in, run_quiet},
};

/// The uid Istio's sidecar runs as, exempt from the redirect.
pub const ISTIO_PROXY_UID: u32 = 1337;
/// Istio's outbound capture port (sidecar and ambient).
pub const ISTIO_OUTBOUND_PORT: u16 = 15001;
/// The uid Linkerd's proxy runs as, exempt from the redirect.
pub const LINKERD_PROXY_UID: u32 = 2102;
/// Linkerd's outbound proxy port.
pub const LINKERD_OUTBOUND_PORT: u16 = 4140;
/// The mark ambient's proxy (ztunnel) sets on its own sockets; istio-cni's rules
/// exempt it (`0x539/0xfff`).
pub const AMBIENT_MARK: u32 = 0x539;

/// A mesh's shape in the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeshShape {
    /// Istio's sidecar passing TCP through (`tcp_proxy`).
    IstioTcp,
    /// Istio's sidecar proxying HTTP (an HTTP connection manager).
    IstioHttp,
    /// Linkerd: an HTTP-detecting proxy under uid 2102 on port 4140.
    Linkerd,
    /// Istio ambient: the proxy outside the pod's cgroup, dialling from the pod's address.
    Ambient,
}

impl MeshShape {
    /// Every shape.
    pub const ALL: [MeshShape; 4] = [
        MeshShape::IstioTcp,
        MeshShape::IstioHttp,
        MeshShape::Linkerd,
        MeshShape::Ambient,
    ];

    /// A short name for messages and file names.
    pub fn name(self) -> &'static str {
        match self {
            MeshShape::IstioTcp => "istio-tcp",
            MeshShape::IstioHttp => "istio-http",
            MeshShape::Linkerd => "linkerd",
            MeshShape::Ambient => "ambient",
        }
    }

    /// The proxy's uid; root (ztunnel runs as root with CAP_NET_ADMIN) when `None`.
    pub fn proxy_uid(self) -> Option<u32> {
        match self {
            MeshShape::IstioTcp | MeshShape::IstioHttp => Some(ISTIO_PROXY_UID),
            MeshShape::Linkerd => Some(LINKERD_PROXY_UID),
            MeshShape::Ambient => None,
        }
    }

    /// The port the redirect sends the pod's connections to.
    pub fn proxy_port(self) -> u16 {
        match self {
            MeshShape::Linkerd => LINKERD_OUTBOUND_PORT,
            _ => ISTIO_OUTBOUND_PORT,
        }
    }

    /// The nat chain the rules live in (hooked from OUTPUT).
    fn chain(self) -> &'static str {
        match self {
            MeshShape::Linkerd => "PROXY_INIT_OUTPUT",
            _ => "ISTIO_OUTPUT",
        }
    }

    /// The redirect rules, as `iptables-restore --noflush` input (`ip6tables-restore`
    /// with `v6`).
    fn rules(self, v6: bool) -> String {
        let rules = self.rules4();
        if v6 {
            rules.replace("127.0.0.1/32", "::1/128")
        } else {
            rules
        }
    }

    /// The IPv4 rules.
    fn rules4(self) -> String {
        let chain = self.chain();
        let port = self.proxy_port();
        let body = match self {
            MeshShape::IstioTcp | MeshShape::IstioHttp => format!(
                "-A {chain} -p tcp ! -d 127.0.0.1/32 -m owner ! --uid-owner {ISTIO_PROXY_UID} -j REDIRECT --to-ports {port}\n"
            ),
            MeshShape::Linkerd => format!(
                "-A {chain} -m owner --uid-owner {LINKERD_PROXY_UID} -j RETURN\n\
                 -A {chain} -o lo -j RETURN\n\
                 -A {chain} -p tcp -j REDIRECT --to-ports {port}\n"
            ),
            MeshShape::Ambient => format!(
                "-A {chain} -m mark --mark {AMBIENT_MARK:#x}/0xfff -j ACCEPT\n\
                 -A {chain} -p tcp ! -d 127.0.0.1/32 -m mark ! --mark {AMBIENT_MARK:#x}/0xfff -j REDIRECT --to-ports {port}\n"
            ),
        };
        format!("*nat\n:{chain} - [0:0]\n-A OUTPUT -j {chain}\n{body}COMMIT\n")
    }

    /// The proxy's Envoy bootstrap.
    fn envoy_config(self) -> String {
        let original_dst = typed(
            4,
            "envoy.filters.listener.original_dst",
            "envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
            "",
        );
        let mut listener_filters = original_dst;
        match self {
            MeshShape::Linkerd => listener_filters.push_str(&typed(
                4,
                "envoy.filters.listener.http_inspector",
                "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector",
                "",
            )),
            MeshShape::Ambient => listener_filters.push_str(&typed(
                4,
                "envoy.filters.listener.original_src",
                "envoy.extensions.filters.listener.original_src.v3.OriginalSrc",
                &format!("mark: {AMBIENT_MARK}"),
            )),
            MeshShape::IstioTcp | MeshShape::IstioHttp => {}
        }
        let chains = match self {
            MeshShape::IstioTcp | MeshShape::Ambient => {
                format!("    filter_chains:\n    - filters:\n{}", tcp_proxy(6))
            }
            MeshShape::IstioHttp => {
                format!("    filter_chains:\n    - filters:\n{}", http_proxy(6))
            }
            MeshShape::Linkerd => format!(
                "    filter_chains:\n    - filter_chain_match:\n        application_protocols: [\"http/1.1\", \"h2c\"]\n      filters:\n{}    default_filter_chain:\n      filters:\n{}",
                http_proxy(6),
                tcp_proxy(6)
            ),
        };
        format!(
            "static_resources:
  listeners:
  - name: outbound
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {port} }}
    additional_addresses:
    - address:
        socket_address: {{ address: \"::1\", port_value: {port} }}
    listener_filters:
{listener_filters}{chains}  clusters:
  - name: {PASSTHROUGH}
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 5s
",
            port = self.proxy_port(),
        )
    }
}

/// The original-destination cluster's name (Istio's).
const PASSTHROUGH: &str = "PassthroughCluster";

/// What starts each of the proxy's access log lines (on its stdout, in its log).
pub const ACCESS_PREFIX: &str = "mesh-access ";

/// The proxy's `access_log`: one line per proxied connection or request, naming who
/// came in, the original destination, the upstream dialled and from which address.
fn access_log() -> String {
    stdout_access_log(&format!(
        "{ACCESS_PREFIX}downstream=%DOWNSTREAM_REMOTE_ADDRESS% original_dst=%DOWNSTREAM_LOCAL_ADDRESS% \
         upstream=%UPSTREAM_HOST% from=%UPSTREAM_LOCAL_ADDRESS% code=%RESPONSE_CODE%"
    ))
}

/// A `tcp_proxy` network filter to the original destination.
fn tcp_proxy(indent: usize) -> String {
    typed(
        indent,
        "envoy.filters.network.tcp_proxy",
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        &format!(
            "stat_prefix: passthrough\ncluster: {PASSTHROUGH}\n{}",
            access_log()
        ),
    )
}

/// An HTTP connection manager routing every request to the original destination.
fn http_proxy(indent: usize) -> String {
    let router = typed(
        2,
        "envoy.filters.http.router",
        "envoy.extensions.filters.http.router.v3.Router",
        "",
    );
    typed(
        indent,
        "envoy.filters.network.http_connection_manager",
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        &format!(
            "stat_prefix: outbound_http
route_config:
  virtual_hosts:
  - name: passthrough
    domains: [\"*\"]
    routes:
    - match: {{ prefix: \"/\" }}
      route: {{ cluster: {PASSTHROUGH} }}
{access_log}
http_filters:
{router}",
            access_log = access_log(),
        ),
    )
}

/// A mesh installed in the simulated pod: its redirect rules and its proxy. Dropping
/// it stops the proxy and deletes the rules.
pub struct Mesh {
    shape: MeshShape,
    netns: String,
    proxy: Option<Server>,
    /// The ambient proxy's own cgroup (a child of the node's, beside the pod's).
    own_cgroup: Option<PathBuf>,
}

impl Mesh {
    /// Installs `shape` in `node`'s pod: starts the proxy, waits until it listens,
    /// then adds the redirect (in that order, as a mesh's readiness gate does: no pod
    /// connection is redirected to a port nobody listens on).
    pub fn install(node: &SimNode, shape: MeshShape) -> Mesh {
        let own_cgroup = (shape == MeshShape::Ambient).then(|| {
            let cg = node.cgroup.join("ztunnel");
            fs::create_dir_all(&cg).unwrap_or_else(|e| panic!("create {}: {e}", cg.display()));
            cg
        });
        let proxy_cgroup = own_cgroup.clone().unwrap_or_else(|| node.pod_cgroup());
        Mesh::install_in(node, shape, &proxy_cgroup, own_cgroup)
    }

    /// As [`Mesh::install`], with the proxy in `cgroup` (which the node's teardown
    /// removes), such as one outside the cgroup the agent attached at: a ztunnel
    /// whose pod lies outside it.
    pub fn install_from(node: &SimNode, shape: MeshShape, cgroup: &Path) -> Mesh {
        Mesh::install_in(node, shape, cgroup, None)
    }

    /// Starts the proxy in `proxy_cgroup`, then the rules; `own_cgroup` is removed
    /// with the mesh.
    fn install_in(
        node: &SimNode,
        shape: MeshShape,
        proxy_cgroup: &Path,
        own_cgroup: Option<PathBuf>,
    ) -> Mesh {
        let name = format!("mesh-{}", shape.name());
        let config = shape.envoy_config();
        let proxy = start_envoy(&EnvoyRun {
            name: &name,
            dir: &node.dir,
            netns: &node.pod_ns,
            cgroup: Some(proxy_cgroup),
            uid: shape.proxy_uid(),
            config: &config,
            ports: &[shape.proxy_port()],
        });
        let mesh = Mesh {
            shape,
            netns: node.pod_ns.clone(),
            proxy: Some(proxy),
            own_cgroup,
        };
        for (v6, tool) in [(false, "iptables-restore"), (true, "ip6tables-restore")] {
            let file = node
                .dir
                .join(format!("{name}.rules{}", if v6 { "6" } else { "4" }));
            fs::write(&file, shape.rules(v6)).expect("write the mesh's rules");
            run_in(
                &mesh.netns,
                &[tool, "--noflush", file.to_str().expect("utf-8 path")],
            );
        }
        mesh
    }

    /// The shape installed.
    pub fn shape(&self) -> MeshShape {
        self.shape
    }

    /// The proxy's log so far.
    pub fn proxy_log(&self) -> String {
        self.proxy.as_ref().map(Server::log).unwrap_or_default()
    }

    /// The connections (requests, for an HTTP connection manager) the proxy has
    /// handled so far, one access log line each (after [`ACCESS_PREFIX`]):
    /// `downstream=IP:PORT original_dst=IP:PORT upstream=IP:PORT from=IP:PORT code=N`,
    /// `-` where a value does not apply.
    pub fn proxied(&self) -> Vec<String> {
        self.proxy_log()
            .lines()
            .filter_map(|l| l.strip_prefix(ACCESS_PREFIX))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        let chain = self.shape.chain();
        let ns = format!("--net=/run/netns/{}", self.netns);
        for tool in ["iptables", "ip6tables"] {
            let nat = |args: &[&str]| {
                let mut argv = vec!["nsenter", &ns, "--", tool, "-t", "nat"];
                argv.extend_from_slice(args);
                run_quiet(&argv);
            };
            nat(&["-D", "OUTPUT", "-j", chain]);
            nat(&["-F", chain]);
            nat(&["-X", chain]);
        }
        // Stopped (killed and reaped) before its cgroup goes.
        self.proxy = None;
        if let Some(cg) = &self.own_cgroup {
            let _ = fs::remove_dir(cg);
        }
    }
}
