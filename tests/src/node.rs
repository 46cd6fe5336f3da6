//! A simulated Kubernetes node: network namespaces for the node, a pod and an
//! ingress pod, veths and routes between them, a fake LoadBalancer IP range with
//! kube-proxy-style DNAT, and a cgroup v2 subtree the agent attaches at.
//!
//! ```text
//!   pod ns                 node ns                            ingress ns
//!  192.0.2.10  --veth--  192.0.2.1 (node IP)                 198.51.100.20
//!  2001:db8:1::10        2001:db8:1::1   198.51.100.1 --veth-- 2001:db8:2::20
//!                        KUBE-SERVICES: LB IPs -> ingress     nginx :80 proxy_protocol
//!                                                             nginx :8081 plain
//!                                                             haproxy :8080 accept-proxy
//! ```
//! Everything is removed on drop, also when the test panics; a run killed
//! outright is swept by the next one (names carry the creating pid).

use std::{
    fs,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use crate::sh::{run, run_in};
use teardown::sweep_stale;

/// Where the agent's relays listen by default (`--listen-address`): node-local,
/// on `lo` of the node namespace here (this kernel has no dummy link type).
pub const RELAY_IP4: &str = "169.254.104.1";
/// The IPv6 default.
pub const RELAY_IP6: &str = "fd68:6169:7270:696e::1";

/// The node's address on the link of [`SimNode::add_off_node_peer`] (RFC 2544's
/// benchmarking range: routed nowhere).
pub const OFF_NODE_GW4: &str = "198.18.0.1";
/// A peer off the node, on the node's segment.
pub const OFF_NODE_PEER4: &str = "198.18.0.2";
/// Its IPv6 address.
pub const OFF_NODE_PEER6: &str = "2001:db8:3::2";

/// The node's IPv4 address (on its pod-facing veth), the PROXY source for host processes.
pub const NODE_IP4: &str = "192.0.2.1";
/// The node's IPv6 address.
pub const NODE_IP6: &str = "2001:db8:1::1";
/// The pod's addresses.
pub const POD_IP4: &str = "192.0.2.10";
/// The pod's IPv6 address.
pub const POD_IP6: &str = "2001:db8:1::10";
/// The ingress pod's addresses.
pub const INGRESS_IP4: &str = "198.51.100.20";
/// The ingress pod's IPv6 address.
pub const INGRESS_IP6: &str = "2001:db8:2::20";

/// A LoadBalancer rule as kube-proxy would program it: `lb_ip:lb_port` DNATed to
/// `backend_ip:backend_port` in the ingress namespace.
#[derive(Clone, Debug)]
pub struct LbRule {
    /// The LB's external IP.
    pub lb_ip: &'static str,
    /// The LB port.
    pub lb_port: u16,
    /// The ingress endpoint's port (its IP is the ingress pod's, same family).
    pub backend_port: u16,
    /// A name for the chain comments, like kube-proxy's `ns/svc:port`.
    pub name: &'static str,
}

/// How the simulated kube-proxy programs its LoadBalancer DNAT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeProxyMode {
    /// iptables mode: KUBE-SERVICES and friends in the nat table.
    Iptables,
    /// nftables mode: the `kube-proxy` tables of the `ip` and `ip6` families.
    Nftables,
}

/// nginx with `listen 80 proxy_protocol`, ingress-nginx with use-proxy-protocol.
pub const NGINX_PP_PORT: u16 = 80;
/// haproxy with `accept-proxy`.
pub const HAPROXY_PP_PORT: u16 = 8080;
/// nginx without the PROXY protocol: a Service that does not want the header.
pub const NGINX_PLAIN_PORT: u16 = 8081;

/// The LBs every simulated node has. Which of them hairpin proxies is up to each
/// test's frontends file.
pub fn default_lbs() -> Vec<LbRule> {
    let r = |lb_ip, lb_port, backend_port, name| LbRule {
        lb_ip,
        lb_port,
        backend_port,
        name,
    };
    vec![
        r(
            "203.0.113.10",
            80,
            NGINX_PP_PORT,
            "ingress-nginx/ingress-nginx-controller:http",
        ),
        r(
            "203.0.113.10",
            81,
            NGINX_PLAIN_PORT,
            "ingress-nginx/ingress-nginx-controller:plain",
        ),
        r(
            "203.0.113.11",
            80,
            HAPROXY_PP_PORT,
            "haproxy/haproxy-ingress:http",
        ),
        r(
            "203.0.113.12",
            80,
            NGINX_PP_PORT,
            "ingress-nginx/ingress-nginx-v2:http",
        ),
        r("203.0.113.99", 80, NGINX_PLAIN_PORT, "other/plain-lb:http"),
        r(
            "2001:db8:ffff::10",
            80,
            NGINX_PP_PORT,
            "ingress-nginx/ingress-nginx-controller-v6:http",
        ),
        r(
            "2001:db8:ffff::11",
            80,
            HAPROXY_PP_PORT,
            "haproxy/haproxy-ingress-v6:http",
        ),
        r(
            "2001:db8:ffff::12",
            80,
            NGINX_PP_PORT,
            "ingress-nginx/ingress-nginx-v2-v6:http",
        ),
    ]
}

static COUNTER: AtomicU32 = AtomicU32::new(0);
const PREFIX: &str = "hpt";

/// The simulated node. Dropping it tears everything down.
pub struct SimNode {
    /// Short unique id; prefixes every name this node created.
    pub id: String,
    /// Node network namespace name.
    pub node_ns: String,
    /// Pod network namespace name.
    pub pod_ns: String,
    /// Ingress pod network namespace name.
    pub ingress_ns: String,
    /// The cgroup the agent attaches at: the node's "root".
    pub cgroup: PathBuf,
    /// Scratch directory for configs and logs.
    pub dir: PathBuf,
    netns_created: Vec<String>,
}

impl SimNode {
    /// Builds the node with the default LoadBalancer rules.
    #[expect(
        clippy::new_without_default,
        reason = "building a node creates namespaces and cgroups: not a default value"
    )]
    pub fn new() -> SimNode {
        SimNode::with_lbs(&default_lbs())
    }

    /// Builds the node with `lbs` as kube-proxy rules.
    pub fn with_lbs(lbs: &[LbRule]) -> SimNode {
        SimNode::with_lbs_in(lbs, KubeProxyMode::Iptables)
    }

    /// Builds the node with the default LoadBalancer rules as kube-proxy's nftables
    /// mode programs them (and no iptables rules at all).
    pub fn nftables() -> SimNode {
        SimNode::with_lbs_in(&default_lbs(), KubeProxyMode::Nftables)
    }

    /// Builds the node with no service rules at all: the real kube-proxy programs
    /// them (tests/src/cluster/proxy.rs).
    pub fn for_real_kube_proxy() -> SimNode {
        SimNode::with_rules(&[], None)
    }

    /// Builds the node with `lbs` as kube-proxy rules in `mode`.
    pub fn with_lbs_in(lbs: &[LbRule], mode: KubeProxyMode) -> SimNode {
        SimNode::with_rules(lbs, Some(mode))
    }

    fn with_rules(lbs: &[LbRule], mode: Option<KubeProxyMode>) -> SimNode {
        sweep_stale();
        let id = format!(
            "{PREFIX}{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let cgroup = cgroup2_root().join(format!("{id}-node"));
        let dir = std::env::temp_dir().join(format!("{id}-node"));
        let mut node = SimNode {
            node_ns: format!("{id}-node"),
            pod_ns: format!("{id}-pod"),
            ingress_ns: format!("{id}-ing"),
            id,
            cgroup,
            dir,
            netns_created: Vec::new(),
        };
        // From here on, a panic drops `node` and removes what was made so far.
        node.build(lbs, mode);
        node
    }

    fn build(&mut self, lbs: &[LbRule], mode: Option<KubeProxyMode>) {
        let _ = fs::remove_dir_all(&self.dir);
        fs::create_dir_all(&self.dir).expect("create scratch dir");
        // A bpf filesystem of the node's own, where agents pin the kernel path's
        // sockets map (`--bpf-pin-dir`): unmounted with the node, which frees the maps
        // pinned there, so no test leaves a pin on the machine's /sys/fs/bpf.
        fs::create_dir_all(self.bpffs()).expect("create the bpffs mount point");
        let at = self.bpffs();
        run(&[
            "mount",
            "-t",
            "bpf",
            "bpf",
            at.to_str().expect("utf-8 path"),
        ]);
        for ns in [&self.node_ns, &self.pod_ns, &self.ingress_ns].map(|s| s.to_string()) {
            run(&["ip", "netns", "add", &ns]);
            self.netns_created.push(ns);
        }
        for ns in [&self.node_ns, &self.pod_ns, &self.ingress_ns] {
            run_in(ns, &["ip", "link", "set", "lo", "up"]);
        }
        // The node's links to the pod and to the ingress, each the far side's eth0.
        let node_ns = self.node_ns.clone();
        for (tag, link, far) in [
            ("a", "vpod", self.pod_ns.clone()),
            ("b", "ving", self.ingress_ns.clone()),
        ] {
            self.veth(tag, &node_ns, link, &far, "eth0");
        }
        let (node, pod, ing) = (&self.node_ns, &self.pod_ns, &self.ingress_ns);
        let addr = |ns: &str, a: &str, dev: &str| {
            let fam = if a.contains(':') { "-6" } else { "-4" };
            let mut argv = vec!["ip", fam, "addr", "add", a, "dev", dev];
            if a.contains(':') {
                argv.push("nodad");
            }
            run_in(ns, &argv);
        };
        addr(node, &format!("{NODE_IP4}/24"), "vpod");
        addr(node, &format!("{NODE_IP6}/64"), "vpod");
        addr(node, "198.51.100.1/24", "ving");
        addr(node, "2001:db8:2::1/64", "ving");
        addr(pod, &format!("{POD_IP4}/24"), "eth0");
        addr(pod, &format!("{POD_IP6}/64"), "eth0");
        addr(ing, &format!("{INGRESS_IP4}/24"), "eth0");
        addr(ing, &format!("{INGRESS_IP6}/64"), "eth0");
        for (ns, dev) in [(node, "vpod"), (node, "ving"), (pod, "eth0"), (ing, "eth0")] {
            run_in(ns, &["ip", "link", "set", dev, "up"]);
        }
        default_routes(pod, [NODE_IP4, NODE_IP6]);
        default_routes(ing, ["198.51.100.1", "2001:db8:2::1"]);
        // The node's uplink: LB IPs are off-node, so the node needs a route towards
        // them before kube-proxy's OUTPUT DNAT rewrites the destination.
        default_routes(node, [INGRESS_IP4, INGRESS_IP6]);
        run_in(node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        run_in(node, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        match mode {
            Some(KubeProxyMode::Iptables) => self.kube_proxy_rules(lbs),
            Some(KubeProxyMode::Nftables) => self.kube_proxy_nft_rules(lbs),
            None => {}
        }
        fs::create_dir(&self.cgroup)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", self.cgroup.display()));
        for child in ["pod", "host", "agent"] {
            fs::create_dir(self.cgroup.join(child)).expect("create child cgroup");
        }
    }

    /// A peer off the node: its own namespace on a link of the node's (its
    /// "uplink" segment, as another machine on the node's L2 network would be), with
    /// routes through the node to everything the node serves: the node IP, the relays'
    /// link-local default address and the LB range. Returns its namespace name; it is
    /// removed with the node.
    pub fn add_off_node_peer(&mut self) -> String {
        let ns = format!("{}-peer", self.id);
        run(&["ip", "netns", "add", &ns]);
        self.netns_created.push(ns.clone());
        run_in(&ns, &["ip", "link", "set", "lo", "up"]);
        self.veth("c", &self.node_ns.clone(), "vpeer", &ns, "eth0");
        run_in(
            &self.node_ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{OFF_NODE_GW4}/24"),
                "dev",
                "vpeer",
            ],
        );
        run_in(
            &self.node_ns,
            &[
                "ip",
                "-6",
                "addr",
                "add",
                "2001:db8:3::1/64",
                "dev",
                "vpeer",
                "nodad",
            ],
        );
        run_in(&self.node_ns, &["ip", "link", "set", "vpeer", "up"]);
        run_in(
            &ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{OFF_NODE_PEER4}/24"),
                "dev",
                "eth0",
            ],
        );
        run_in(
            &ns,
            &[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{OFF_NODE_PEER6}/64"),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        run_in(&ns, &["ip", "link", "set", "eth0", "up"]);
        default_routes(&ns, [OFF_NODE_GW4, "2001:db8:3::1"]);
        ns
    }

    fn veth(&self, tag: &str, a_ns: &str, a_name: &str, b_ns: &str, b_name: &str) {
        // Created in the root namespace under unique names, then moved and renamed.
        let (a, b) = (format!("{}{tag}0", self.id), format!("{}{tag}1", self.id));
        run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
        run(&["ip", "link", "set", &a, "netns", a_ns, "name", a_name]);
        run(&["ip", "link", "set", &b, "netns", b_ns, "name", b_name]);
    }

    /// iptables-restore input in kube-proxy's iptables-mode shape: KUBE-SERVICES from
    /// PREROUTING (pod traffic) and OUTPUT (node traffic), KUBE-EXT -> KUBE-SVC ->
    /// KUBE-SEP with DNAT, and the masquerade mark, for one family.
    fn kube_proxy_rules(&self, lbs: &[LbRule]) {
        for v6 in [false, true] {
            let backend = ingress_backend(v6);
            let mut chains = String::from(
                ":KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
            );
            let mut rules = String::from(
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                 -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                 -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
                 -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
                 -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
                 -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
                 -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE\n",
            );
            for (lb, [ext, svc, sep]) in
                service_chains(lbs, v6, ["KUBE-EXT", "KUBE-SVC", "KUBE-SEP"])
            {
                chains.push_str(&format!(":{ext} - [0:0]\n:{svc} - [0:0]\n:{sep} - [0:0]\n"));
                let plen = if v6 { 128 } else { 32 };
                rules.push_str(&format!(
                    "-A KUBE-SERVICES -d {ip}/{plen} -p tcp -m comment --comment \"{name} loadbalancer IP\" -m tcp --dport {port} -j {ext}\n\
                     -A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ\n\
                     -A {ext} -j {svc}\n\
                     -A {svc} -m comment --comment \"{name} -> {backend}:{bport}\" -j {sep}\n\
                     -A {sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {backend}:{bport}\n",
                    ip = lb.lb_ip,
                    name = lb.name,
                    port = lb.lb_port,
                    bport = lb.backend_port,
                ));
            }
            let input = format!("*nat\n{chains}{rules}COMMIT\n");
            self.nat_restore(v6, if v6 { "rules6" } else { "rules4" }, &input);
        }
    }

    /// `nft -f` input in kube-proxy's nftables-mode shape, one table per family
    /// (`ip kube-proxy`, `ip6 kube-proxy`): base chains at prerouting (pod traffic) and
    /// output (node traffic) jump to `services`, whose `service-ips` verdict map sends
    /// each LB `ip . tcp . port` to `external-*` (mark for masquerade) -> `service-*`
    /// (`numgen` over the endpoints) -> `endpoint-*` with DNAT; `masquerading` at
    /// postrouting.
    fn kube_proxy_nft_rules(&self, lbs: &[LbRule]) {
        let mut input = String::new();
        for v6 in [false, true] {
            let (family, addr_type, daddr) = if v6 {
                ("ip6", "ipv6_addr", "ip6 daddr")
            } else {
                ("ip", "ipv4_addr", "ip daddr")
            };
            let backend = ingress_backend(v6);
            let mut chains = String::new();
            let mut elements = Vec::new();
            for (lb, [ext, svc, ep]) in service_chains(lbs, v6, ["external", "service", "endpoint"])
            {
                chains.push_str(&format!(
                    "\tchain {ep} {{\n\t\tcomment \"{name}\"\n\t\tmeta l4proto tcp dnat to {backend}:{bport}\n\t}}\n\
                     \tchain {svc} {{\n\t\tnumgen random mod 1 vmap {{ 0 : goto {ep} }}\n\t}}\n\
                     \tchain {ext} {{\n\t\tjump mark-for-masquerade\n\t\tgoto {svc}\n\t}}\n",
                    name = lb.name,
                    bport = lb.backend_port,
                ));
                elements.push(format!("{} . tcp . {} : goto {ext}", lb.lb_ip, lb.lb_port));
            }
            let map = if elements.is_empty() {
                String::new()
            } else {
                format!(
                    "\tmap service-ips {{\n\t\ttype {addr_type} . inet_proto . inet_service : verdict\n\
                     \t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"\n\
                     \t\telements = {{ {} }}\n\t}}\n\
                     \tchain services {{\n\t\t{daddr} . meta l4proto . th dport vmap @service-ips\n\t}}\n",
                    elements.join(", ")
                )
            };
            // Output at -100, dstnat's value: older nft (1.0.6) takes the name at
            // prerouting only.
            let services = if elements.is_empty() {
                ""
            } else {
                "jump services; "
            };
            input.push_str(&format!(
                "table {family} kube-proxy {{\n\
                 \tcomment \"rules for kube-proxy\"\n\
                 \tchain mark-for-masquerade {{\n\t\tmeta mark set meta mark | 0x4000\n\t}}\n\
                 \tchain masquerading {{\n\t\tmeta mark & 0x4000 == 0 return\n\
                 \t\tmeta mark set meta mark ^ 0x4000\n\t\tmasquerade fully-random\n\t}}\n\
                 {chains}{map}\
                 \tchain nat-prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept; {services}\n\t}}\n\
                 \tchain nat-output {{\n\t\ttype nat hook output priority -100; policy accept; {services}\n\t}}\n\
                 \tchain nat-postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept; jump masquerading\n\t}}\n\
                 }}\n"
            ));
        }
        let file = self.dir.join("rules.nft");
        fs::write(&file, &input).expect("write nft rules");
        run_in(
            &self.node_ns,
            &["nft", "-f", file.to_str().expect("utf-8 path")],
        );
    }

    /// Loads `input` (iptables-restore format) into the node namespace's nat table
    /// without flushing, keeping it in the scratch directory as `name`.
    fn nat_restore(&self, v6: bool, name: &str, input: &str) {
        let file = self.dir.join(name);
        fs::write(&file, input).expect("write rules");
        let tool = if v6 {
            "ip6tables-restore"
        } else {
            "iptables-restore"
        };
        run_in(
            &self.node_ns,
            &[tool, "--noflush", file.to_str().expect("utf-8 path")],
        );
    }

    /// Adds a ClusterIP Service with `internalTrafficPolicy: Local` as kube-proxy's
    /// iptables mode programs it: KUBE-SERVICES matches `cluster_ip:port` (from
    /// PREROUTING for pods, OUTPUT for host processes), marks traffic from outside
    /// the pod CIDR for masquerade, and DNATs to the node-local endpoint through a
    /// KUBE-SVL chain. With a hostNetwork endpoint, `endpoint` is a node IP.
    pub fn add_cluster_ip(&self, cluster_ip: &str, port: u16, endpoint: &str, target_port: u16) {
        let v6 = cluster_ip.contains(':');
        let tag = format!("{}-{port}", cluster_ip.replace([':', '.'], ""));
        let (svl, sep) = (format!("KUBE-SVL-{tag}"), format!("KUBE-SEP-{tag}"));
        let (plen, pod_cidr, dest) = if v6 {
            (
                128,
                "2001:db8:1::/64",
                format!("[{endpoint}]:{target_port}"),
            )
        } else {
            (32, "192.0.2.0/24", format!("{endpoint}:{target_port}"))
        };
        let name = format!("hairpin-system/hairpin:{port}");
        let input = format!(
            "*nat\n:{svl} - [0:0]\n:{sep} - [0:0]\n\
             -A KUBE-SERVICES -d {cluster_ip}/{plen} -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j {svl}\n\
             -A {svl} ! -s {pod_cidr} -m comment --comment \"{name} cluster IP\" -j KUBE-MARK-MASQ\n\
             -A {svl} -m comment --comment \"{name} -> {dest}\" -j {sep}\n\
             -A {sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {dest}\n\
             COMMIT\n"
        );
        self.nat_restore(v6, &format!("svc-{tag}"), &input);
    }

    /// Child cgroup for the pod's processes.
    pub fn pod_cgroup(&self) -> PathBuf {
        self.cgroup.join("pod")
    }

    /// Child cgroup for processes on the host.
    pub fn host_cgroup(&self) -> PathBuf {
        self.cgroup.join("host")
    }

    /// The node's own bpf filesystem (mounted while the node lives).
    pub fn bpffs(&self) -> PathBuf {
        self.dir.join("bpffs")
    }

    /// Where the node's agents pin the kernel path's sockets map (`--bpf-pin-dir`).
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs().join("hairpin")
    }

    /// Child cgroup for the agent itself (inside the attached subtree, as on a real node).
    pub fn agent_cgroup(&self) -> PathBuf {
        self.cgroup.join("agent")
    }

    /// A cgroup outside the attached subtree (a sibling of the node cgroup), created on
    /// first use: processes in it are never seen by the agent's programs, whatever the
    /// agent is doing. Removed with the node.
    pub fn outside_cgroup(&self) -> PathBuf {
        let cg = self.outside_cgroup_path();
        if !cg.exists() {
            fs::create_dir(&cg).unwrap_or_else(|e| panic!("create cgroup {}: {e}", cg.display()));
        }
        cg
    }

    fn outside_cgroup_path(&self) -> PathBuf {
        cgroup2_root().join(format!("{}-outside", self.id))
    }

    /// Programs attached at the node cgroup, as bpftool lists them.
    pub fn attached_programs(&self) -> String {
        run(&[
            "bpftool",
            "cgroup",
            "show",
            self.cgroup.to_str().expect("utf-8 path"),
        ])
    }

    /// Spawns `argv` as a pod process (the pod namespace and cgroup), its output
    /// discarded.
    pub fn spawn_in_pod(&self, argv: &[&str]) -> std::process::Child {
        crate::sh::command_in(&self.pod_ns, Some(&self.pod_cgroup()), argv)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {argv:?} in the pod: {e}"))
    }

    /// Per-namespace sysctls so a minute of `Connection: close` requests does not run
    /// out of ephemeral ports or conntrack entries; these namespaces are the
    /// bench's (and the reliability suite's) own.
    /// The wider range takes in the agent's admin port (127.0.0.1:9901, 9902 for
    /// metrics), which each agent the bench starts binds again: reserved, so no
    /// connection's TIME_WAIT on it refuses the next agent's bind (seen once as
    /// "failed to listen on admin address 127.0.0.1:9901: Address already in use").
    pub fn tune_for_load(&self) {
        for ns in [&self.pod_ns, &self.node_ns, &self.ingress_ns] {
            for kv in [
                "net.ipv4.ip_local_port_range=1024 65000",
                "net.ipv4.ip_local_reserved_ports=9901-9902",
                "net.ipv4.tcp_tw_reuse=1",
                "net.core.somaxconn=4096",
                "net.ipv4.tcp_max_syn_backlog=4096",
                "net.netfilter.nf_conntrack_tcp_timeout_time_wait=5",
            ] {
                // Best effort: a sysctl this kernel lacks only makes the run less roomy.
                let _ = crate::sh::output_in(ns, None, &["sysctl", "-qw", kv]);
            }
        }
    }
}

/// The IPv4 and IPv6 default routes of namespace `ns`, via `[v4, v6]`.
fn default_routes(ns: &str, [v4, v6]: [&str; 2]) {
    run_in(ns, &["ip", "route", "add", "default", "via", v4]);
    run_in(ns, &["ip", "-6", "route", "add", "default", "via", v6]);
}

/// The ingress backend kube-proxy DNATs the family's LBs to, as a rule writes it.
fn ingress_backend(v6: bool) -> String {
    if v6 {
        format!("[{INGRESS_IP6}]")
    } else {
        INGRESS_IP4.to_string()
    }
}

/// The family's LBs, each with its chains named as kube-proxy numbers them: the
/// external, service and endpoint chain `prefixes`, each with the LB's index.
fn service_chains<'a>(
    lbs: &'a [LbRule],
    v6: bool,
    prefixes: [&'static str; 3],
) -> impl Iterator<Item = (&'a LbRule, [String; 3])> {
    lbs.iter()
        .filter(move |l| l.lb_ip.contains(':') == v6)
        .enumerate()
        .map(move |(i, lb)| (lb, prefixes.map(|p| format!("{p}-{i}"))))
}

mod teardown;

pub use teardown::cgroup2_root;
