//! The options of `hairpin-agent run`, validated by clap into typed values.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use hairpin_ebpf::{DEFAULT_BYPASS_MARK, MESH_PORTS};

use crate::{
    k8s::coredns::{CorednsMode, ObjectName},
    model::KernelPathMode,
    model::Mode,
    model::ProxyVersion,
};

/// Options of `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// YAML file of frontends to proxy (LB IP, ports, proxyProtocol), instead of
    /// watching the cluster: for debugging and running without an API server.
    /// Reloaded when it changes and on SIGHUP; a broken edit keeps the last good set.
    #[arg(long, env = "HAIRPIN_FRONTENDS")]
    pub frontends: Option<PathBuf>,

    /// kubeconfig to use instead of the in-cluster service account (or $KUBECONFIG).
    #[arg(long, env = "HAIRPIN_KUBECONFIG", conflicts_with = "frontends")]
    pub kubeconfig: Option<PathBuf>,

    /// This node's name (downward API `spec.nodeName`): the Lease identity and the
    /// Event reporter instance. Default: the host name.
    #[arg(long, env = "HAIRPIN_NODE_NAME")]
    pub node_name: Option<String>,

    /// Namespace of the agent's own objects (its Lease); downward API `metadata.namespace`.
    #[arg(long, env = "HAIRPIN_NAMESPACE", default_value = "hairpin-system")]
    pub namespace: String,

    /// The agent's own DaemonSet, `NAMESPACE/NAME`: on SIGTERM the agent reads it
    /// (`get`, one object) and removes the datapath only when it is gone or being
    /// deleted (an uninstall); otherwise (a rollout, a drain, a restart) it leaves
    /// the datapath to the next agent. Unset: no check, the datapath is kept, and
    /// `hairpin-agent cleanup` or the datapath's TTL removes it.
    #[arg(long, env = "HAIRPIN_DAEMONSET", conflicts_with = "frontends")]
    pub daemonset: Option<ObjectName>,

    /// Name of the Lease that elects the one agent writing cluster-wide objects (Events).
    #[arg(long, env = "HAIRPIN_LEASE_NAME", default_value = "hairpin-agent")]
    pub lease_name: String,

    /// Publish a Kubernetes Event on each Service whose decision changes (by the Lease holder).
    #[arg(long, env = "HAIRPIN_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,

    /// cgroup v2 directory to attach at. Default: the root of the node's cgroup v2
    /// hierarchy, found in /proc/self/mountinfo.
    #[arg(long, env = "HAIRPIN_CGROUP_PATH")]
    pub cgroup_path: Option<PathBuf>,

    /// The node's IPs (comma-separated, one per family): the PROXY source for host
    /// processes. In a DaemonSet, from the downward API `status.hostIPs`.
    #[arg(long = "node-ip", env = "HAIRPIN_NODE_IPS", value_delimiter = ',')]
    pub node_ips: Vec<IpAddr>,

    /// The relay's addresses, reachable from pods and the host: the first of each
    /// family holds the relay's listener (on a privileged port), and each gives the
    /// relay 64,512 slots (ports 1024-65535, which no socket binds: connects are sent
    /// there and handed to the listener), up to 4 per family. Default: the node-local
    /// 169.254.104.1 and .2, fd68:6169:7270:696e::1 and ::2 (for each family the
    /// node has an IP of), put on --listen-link, never the routable node IP: a peer
    /// off the node has no route to them.
    #[arg(
        long = "listen-address",
        env = "HAIRPIN_LISTEN_ADDRESSES",
        value_delimiter = ','
    )]
    pub listen_addresses: Vec<IpAddr>,

    /// Link to put the listen addresses on (as a /32 or /128), as node-local-dns
    /// does: created as a `dummy` link when missing (on kernels without the dummy
    /// type the addresses go on `lo`), or an existing link. Default: `hairpin0`
    /// when the default listen addresses are used; `none`: the addresses are used as
    /// they are (an address the node already has). `hairpin-agent cleanup` removes them.
    #[arg(long, env = "HAIRPIN_LISTEN_LINK")]
    pub listen_link: Option<String>,

    /// SO_MARK on the relay's upstream sockets; the programs skip sockets carrying it.
    #[arg(long, env = "HAIRPIN_BYPASS_MARK", default_value = DEFAULT_BYPASS_MARK_ARG, value_parser = parse_mark)]
    pub bypass_mark: u32,

    /// Capacity of the kernel's frontends map: the most (LB IP, port) pairs this node
    /// redirects. The kernel preallocates the entries; frontends beyond it are not
    /// proxied (fail open) and /status says why.
    #[arg(long, env = "HAIRPIN_MAX_FRONTENDS", default_value_t = hairpin_ebpf::MAX_FRONTENDS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_frontends: u32,

    /// Write the PROXY header inside the kernel, on the client's own socket, for
    /// frontends whose client speaks first: no listener, copy or process in the
    /// path, and connections outlive the agent. `auto`: where this kernel runs the
    /// programs; where it cannot, every frontend takes the relay path and `status`
    /// and `doctor` say why. `on`: the same, but the kernel path is required, so
    /// `doctor` fails where it is unavailable. `off`: every frontend takes the
    /// relay. Either way a socket the kernel path cannot take is relayed, and so are
    /// server-speaks-first ports and Services that ask for it (`hairpin.dev/path:
    /// relay`).
    #[arg(long, env = "HAIRPIN_KERNEL_PATH", value_enum, default_value_t = KernelPathMode::Auto)]
    pub kernel_path: KernelPathMode,

    /// Capacity of the kernel path's sockets map: connections between the end of
    /// their handshake and the acknowledgement of their first write, node-wide.
    #[arg(long, env = "HAIRPIN_KERNEL_PATH_SOCKETS", default_value_t = hairpin_ebpf::MAX_KERNEL_SOCKETS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub kernel_path_sockets: u32,

    /// Directory on the host's bpf filesystem where the datapath's links, programs
    /// and maps are pinned, so they outlive the agent: a restart, an upgrade, a crash
    /// or an OOM kill leaves the programs running, and the next agent adopts them and
    /// swaps its own in place. One agent owns it at a time (a second one waits).
    /// `none`: nothing pinned, the datapath goes with the process.
    #[arg(long, env = "HAIRPIN_BPF_PIN_DIR", default_value = DEFAULT_BPF_PIN_DIR)]
    pub bpf_pin_dir: PathBuf,

    /// Hands the pin directory to this account, `UID:GID` (the DaemonSet sets
    /// 60104:60104): directories 2770 and pins 660 owned by it, nothing for others.
    /// Opening a pin needs only file access to it, so a root process without
    /// capabilities that reaches the host's bpf filesystem could otherwise open the
    /// maps and redirect connections or stop the heartbeat. The agent (uid 0) reaches
    /// them through the group, which must be one of its supplementary groups; making
    /// them over needs CAP_CHOWN. Unset: uid 0 owns them, directories 0700.
    #[arg(long, env = "HAIRPIN_PIN_OWNER")]
    pub pin_owner: Option<crate::datapath::pin::PinOwner>,

    /// The dead-man switch: how long after the agent's last heartbeat (written every
    /// second) the connect programs still act. Past it, with no agent back, traffic
    /// goes as before hairpin. Long enough for an upgrade that pulls an image; at
    /// least 5 s (five beats).
    #[arg(long, env = "HAIRPIN_DATAPATH_TTL", default_value = "10m", value_parser = parse_datapath_ttl)]
    pub datapath_ttl: Duration,

    /// Outbound capture ports of mesh proxies, comma-separated (at most 4; `none`:
    /// none). A connect to a kernel-path frontend from a network namespace where a
    /// TCP socket listens on loopback at one of them takes the relay, which the
    /// mesh's proxy then dials: the LB gets exactly one header, naming the pod
    /// (`kernel_fallback_mesh`). 15001: Istio's sidecar and ambient's in-pod ztunnel
    /// (also Consul's, Kuma's and Open Service Mesh's transparent proxies); 4140:
    /// Linkerd's proxy.
    #[arg(long, env = "HAIRPIN_MESH_CAPTURE_PORTS", default_value = "15001,4140", value_parser = MeshPorts::parse)]
    pub mesh_capture_ports: MeshPorts,

    /// Whether the connect programs remember, per network namespace, that no mesh
    /// proxy listens on a capture port there, and skip the loopback probes on its
    /// later kernel-path connects (sock_ops sees every listen(2) in the attached
    /// cgroup and makes them probe again where a capture port starts listening).
    /// `auto`: only when attached at the root of the cgroup v2 hierarchy, where no
    /// listener escapes sock_ops; `on`: also below it, when every process that may
    /// listen on a capture port (a mesh's sidecar, ztunnel) runs inside the
    /// attached cgroup; `off`: probe on every kernel-path connect.
    #[arg(long, env = "HAIRPIN_MESH_LISTENER_CACHE", value_enum, default_value_t = MeshListenerCache::Auto)]
    pub(crate) mesh_listener_cache: MeshListenerCache,

    /// Where the connect links go among the other connect programs at the cgroup:
    /// `first` (before every other one where the kernel orders cgroup links; else at
    /// the cgroup's children when another program is at its connect hooks),
    /// `append` (after them, at the cgroup itself) or `children` (as on a kernel that
    /// does not order): for tests.
    #[arg(long, env = "HAIRPIN_LINK_ORDER", value_enum, default_value_t = LinkOrderMode::First, hide = true)]
    pub(crate) link_order: LinkOrderMode,

    /// The pin layout version to use (tests of an upgrade across layouts only).
    #[arg(long, env = "HAIRPIN_PIN_LAYOUT", default_value_t = hairpin_ebpf::PIN_LAYOUT, hide = true)]
    pub pin_layout: u32,

    /// Upstream connect timeout; the client is reset when it expires.
    #[arg(long, env = "HAIRPIN_CONNECT_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// TCP keepalive on both sides of relayed connections: idle time before the first
    /// probe; 3 unanswered probes, sent every min(this, 10s), drop the connection.
    /// 0 turns it off.
    #[arg(long, env = "HAIRPIN_RELAY_KEEPALIVE", default_value = "60s", value_parser = humantime::parse_duration)]
    pub relay_keepalive: Duration,

    /// How a relayed connection's bytes move once a way (client to LB, LB to client)
    /// has carried --relay-splice-after bytes: `auto`, the kernel's splice (a stream
    /// verdict sends what one socket receives out of the other) where the programs
    /// load, else splice(2) through a pipe; `kernel` or `pipe` (the default), only
    /// that; `off`, copied through the agent. On the bench splice(2) carried bulk
    /// transfers faster than the copy and the kernel's splice slower than either
    /// (BENCHMARKS.md). Either splice keeps the bytes out of user space.
    #[arg(long, env = "HAIRPIN_RELAY_SPLICE", value_enum, default_value_t = crate::relay::carry::SpliceMode::Pipe)]
    pub relay_splice: crate::relay::carry::SpliceMode,

    /// Bytes a way of a relayed connection carries as a copy before it is spliced:
    /// an exchange (a request and its answer) costs fewer syscalls copied than
    /// spliced, a transfer fewer spliced. 0 splices from the first byte.
    #[arg(long, env = "HAIRPIN_RELAY_SPLICE_AFTER", default_value_t = crate::relay::carry::DEFAULT_AFTER)]
    pub relay_splice_after: u64,

    /// How long SIGTERM waits for open connections after redirects are removed.
    #[arg(long, env = "HAIRPIN_DRAIN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// How often the frontends file is checked for changes.
    #[arg(long, env = "HAIRPIN_FRONTENDS_POLL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub frontends_poll: Duration,

    /// TCP address of the admin server's probes and metrics (/healthz, /readyz,
    /// /metrics). Node-local: the DaemonSet runs in the host network namespace.
    #[arg(long, env = "HAIRPIN_ADMIN_ADDRESS", default_value = crate::status::admin::DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: SocketAddr,

    /// A further address serving /metrics alone, for a Prometheus that scrapes the
    /// node's network: `node-ips:PORT` (each --node-ip in a private range; refused
    /// at start when none is, so /metrics never lands on a public address unasked)
    /// or `IP:PORT` exactly (`0.0.0.0:9902`: every address, the public one too).
    /// Unset: none; /metrics stays on --admin-address.
    #[arg(long, env = "HAIRPIN_METRICS_ADDRESS")]
    pub metrics_address: Option<crate::status::metrics_address::MetricsAddress>,

    /// Most connections both relays hold at once; past it new ones are reset at
    /// accept (counted in hairpin_relay_shed_total). About 23 KiB each: the
    /// default stays under the DaemonSet's 512 MiB memory limit.
    #[arg(long, env = "HAIRPIN_MAX_CONNECTIONS", default_value_t = 12_000)]
    pub max_connections: usize,

    /// Most connections the relays hold at once from one client: a pod's address, or,
    /// for the node's own processes (which share the node's addresses), the uid
    /// owning the client's socket; so one client cannot take them all.
    #[arg(
        long,
        env = "HAIRPIN_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = 2_000
    )]
    pub max_connections_per_source: usize,

    /// Unix socket of the admin server (mode 0600): everything, /status included,
    /// which only this socket serves; `hairpin-agent status` and the other node
    /// subcommands read it. Its directory is created; a stale socket left by a dead
    /// agent is replaced.
    #[arg(
        long,
        env = "HAIRPIN_ADMIN_SOCKET",
        default_value = crate::status::admin::DEFAULT_ADMIN_SOCKET
    )]
    pub admin_socket: PathBuf,

    /// Address the name relay listens on and /etc/hosts points names at. Default:
    /// the first listen address (else the first node IP).
    #[arg(long, env = "HAIRPIN_NAMES_ADDRESS")]
    pub names_address: Option<IpAddr>,

    /// Ports the name relay listens on (comma-separated); each connection is routed
    /// by TLS SNI or HTTP Host. Empty turns name routing off.
    #[arg(long, env = "HAIRPIN_NAMES_PORTS", default_value = "80,443", value_parser = parse_ports)]
    pub names_ports: Ports,

    /// How connects to the names ports reach the name relay. `auto`: nothing binds
    /// them, so a hostNetwork ingress can still bind `0.0.0.0:80` and `:443` later;
    /// the relay listens on ephemeral ports of the names address and the connect
    /// programs send the names ports there (where they are attached), or the agent's
    /// own nftables table (`table ip hairpin`, or `ip6`) DNATs them (where they are
    /// not). `off`: the relay binds the names ports as they are.
    #[arg(long, env = "HAIRPIN_NAMES_REDIRECT", value_enum, default_value_t = NamesRedirect::Auto)]
    pub names_redirect: NamesRedirect,

    /// Where pods reach the name relay through the `hairpin` ClusterIP Service
    /// (comma-separated SERVICE=LISTEN pairs): a hostNetwork endpoint is the node IP
    /// and the Service's targetPort, so the relay also listens on each node IP at
    /// LISTEN and routes those connections as if they came to SERVICE (the port the
    /// client dialled, and the LB port relayed to). Must match the Service's ports;
    /// empty or `off`: not listened on.
    #[arg(
        long,
        env = "HAIRPIN_NAMES_SERVICE_PORTS",
        default_value = "80=880,443=843",
        value_parser = parse_port_map
    )]
    pub names_service_ports: PortMap,

    /// Hosts file whose managed block points the proxied names at the name relay
    /// (in a DaemonSet, a hostPath mount of the node's /etc/hosts). Unset: not managed.
    #[arg(long, env = "HAIRPIN_HOSTS_FILE")]
    pub hosts_file: Option<PathBuf>,

    /// Which paths to use: `auto` (eBPF where it attaches, else the name relay with
    /// /etc/hosts), `ebpf` (eBPF only), `fallback` (no eBPF: the name relay only),
    /// `both` (eBPF and the name fallbacks).
    #[arg(long, env = "HAIRPIN_MODE", value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,

    /// Link to put --names-address on (as a /32 or /128): created as a `dummy` link
    /// when missing (on kernels without the dummy type the address goes on `lo`), or
    /// an existing link such as `lo`. Unset: the address is used as it is.
    /// `hairpin-agent cleanup` removes the address.
    #[arg(long, env = "HAIRPIN_NAMES_LINK", requires = "names_address")]
    pub names_link: Option<String>,

    /// CoreDNS sends pods' lookups of the routed names to this node's name relay
    /// (the `hairpin-agent coredns-writer` Deployment writes the rewrites; this
    /// DaemonSet never writes cluster DNS): run the name relay for them. `corefile`
    /// and `import` name how the writer writes; `off`: no CoreDNS rewrites.
    #[arg(long, env = "HAIRPIN_COREDNS", value_enum, default_value_t = CorednsMode::Off)]
    pub coredns: CorednsMode,

    /// Networks whose clients the relays serve (comma-separated CIDRs or addresses):
    /// this node's pod CIDRs. The node's own addresses and loopback are always
    /// allowed. Unset: this node's Node `spec.podCIDRs` (Kubernetes source); where
    /// the Node has none (the AWS VPC CNI, Azure CNI, Calico and Cilium cluster-pool
    /// IPAM), cannot be read, or with a frontends file: this node's pod networks
    /// read from its own links and routes (Calico, AWS VPC CNI, Azure CNI and
    /// Cilium endpoint host routes, Cilium's cilium_host range, a cni0/cbr0 bridge),
    /// followed as they change. A peer outside them is refused at once (fails
    /// closed, as the log, `status` and `doctor` say).
    #[arg(long, env = "HAIRPIN_ALLOWED_CLIENTS", value_delimiter = ',', value_parser = crate::relay::client_policy::parse_net)]
    pub allowed_clients: Vec<ipnet::IpNet>,

    /// What is proxied and which names are published: shared with `coredns-writer`,
    /// so the Corefile and the nodes decide alike.
    #[command(flatten)]
    pub decision: DecisionArgs,
}

/// The options that decide which frontends are proxied and which hostnames are
/// published, shared by `run` and `coredns-writer` (the same flags and env, so the
/// CoreDNS writer publishes exactly the names the agents route).
#[derive(clap::Args, Debug, Clone)]
pub struct DecisionArgs {
    /// PROXY version for LoadBalancer Services that neither our annotation
    /// (hairpin.dev/proxy-protocol) nor a known provider annotation decides.
    #[arg(long, env = "HAIRPIN_DEFAULT_PROXY_PROTOCOL", default_value = "off", value_parser = parse_default_version)]
    pub default_proxy_protocol: DefaultVersion,

    /// The ranges the cloud hands out for LoadBalancer addresses (comma-separated
    /// CIDRs): a Service whose `status.loadBalancer` names an address outside them is
    /// not redirected, and inside them no Node's report of its own addresses can
    /// refuse one (a Node's status is its kubelet's word). Unset: any address but the
    /// refused classes (loopback, link-local, multicast, this node's addresses,
    /// cluster IPs, --reserved-cidrs, every Node's addresses and pod CIDRs).
    #[arg(long, env = "HAIRPIN_LB_CIDRS", value_delimiter = ',', value_parser = crate::relay::client_policy::parse_net)]
    pub lb_cidrs: Vec<ipnet::IpNet>,

    /// Networks no LoadBalancer address may be in (comma-separated CIDRs): the pod and
    /// service networks, the nodes' network. Addresses in them are never redirected.
    #[arg(long, env = "HAIRPIN_RESERVED_CIDRS", value_delimiter = ',', value_parser = crate::relay::client_policy::parse_net)]
    pub reserved_cidrs: Vec<ipnet::IpNet>,

    /// The most frontends (LoadBalancer IP and port pairs) one namespace may have
    /// proxied: past it the namespace's newest Services' frontends are withheld
    /// (oldest first, as for names), each a Warning Event on its Service, and no
    /// other namespace loses one. All namespaces together share `--max-frontends`
    /// round robin.
    #[arg(long, env = "HAIRPIN_MAX_FRONTENDS_PER_NAMESPACE",
          default_value_t = crate::k8s::decide::service::DEFAULT_MAX_FRONTENDS_PER_NAMESPACE as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_frontends_per_namespace: u32,

    /// The cluster's own NAT64 prefixes (comma-separated IPv6 CIDRs of length 32, 40,
    /// 48, 56, 64 or 96, RFC 6052): an address inside one is also judged as the IPv4
    /// address it embeds, so a metadata endpoint or loopback cannot be named through
    /// the operator's NAT64. The well-known `64:ff9b::/96` and `64:ff9b:1::/48` are
    /// always decoded.
    #[arg(long, env = "HAIRPIN_NAT64_PREFIXES", value_delimiter = ',', value_parser = parse_nat64_prefix)]
    pub nat64_prefixes: Vec<ipnet::Ipv6Net>,

    /// Domains whose hostnames may be published (comma-separated, e.g.
    /// `example.com,shop.example.org`): a name is published in /etc/hosts and CoreDNS
    /// only when it equals a listed domain or ends with `.` and one. Empty (the
    /// default): no names are published, as `status` and `doctor` say. Whatever is
    /// listed, the cluster domain, `*.svc` names, `localhost`, single labels, this
    /// node's names, the API server, metadata endpoints and public suffixes
    /// (`*.com`) are refused.
    #[arg(long, env = "HAIRPIN_NAMES_DOMAINS", value_delimiter = ',')]
    pub names_domains: Vec<String>,

    /// Names of the API server never published (comma-separated), besides those
    /// found at startup: the kubeconfig's server host and the DNS names of the API
    /// server's serving certificate (a kubeadm controlPlaneEndpoint, a managed
    /// control plane's endpoint). For names the certificate does not carry.
    #[arg(long, env = "HAIRPIN_API_SERVER_NAMES", value_delimiter = ',')]
    pub api_server_names: Vec<String>,

    /// The cluster's DNS domain: it and every name under it are never published.
    #[arg(long, env = "HAIRPIN_CLUSTER_DOMAIN", default_value = crate::names::scope::DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
    /// Caps on published names, and the hosts file's write pace.
    #[command(flatten)]
    pub name_limits: super::name_limits::NameLimitArgs,
}

/// `off`, `v1` or `v2`.
#[derive(Clone, Copy, Debug)]
pub struct DefaultVersion(pub Option<ProxyVersion>);

pub(crate) fn parse_default_version(s: &str) -> Result<DefaultVersion, String> {
    match s {
        "off" | "none" => Ok(DefaultVersion(None)),
        other => other
            .parse()
            .map(|v| DefaultVersion(Some(v)))
            .map_err(|e: crate::model::UnknownWord| e.to_string()),
    }
}

/// [`DEFAULT_BYPASS_MARK`] as the default of every `--bypass-mark` flag, in hex as
/// `--help` shows it (`0x68`): formatted at compile time from the one definition.
pub(crate) const DEFAULT_BYPASS_MARK_ARG: &str = {
    const TEXT: [u8; hex_len(DEFAULT_BYPASS_MARK)] = hex_text(DEFAULT_BYPASS_MARK);
    match std::str::from_utf8(&TEXT) {
        Ok(s) => s,
        Err(_) => panic!("hex digits are ASCII"),
    }
};

/// The length of `v` as [`hex_text`] writes it: `0x` and its hex digits.
const fn hex_len(v: u32) -> usize {
    let (mut n, mut rest) = (3, v >> 4);
    while rest != 0 {
        n += 1;
        rest >>= 4;
    }
    n
}

/// `v` as `0x` and its lowercase hex digits without leading zeros (`{v:#x}`), in
/// the `N` = [`hex_len`] bytes it takes.
const fn hex_text<const N: usize>(v: u32) -> [u8; N] {
    let mut out = [b'0'; N];
    out[1] = b'x';
    let (mut i, mut rest) = (N, v);
    while i > 2 {
        i -= 1;
        out[i] = b"0123456789abcdef"[(rest & 0xf) as usize];
        rest >>= 4;
    }
    out
}

/// Parses `--datapath-ttl`, refusing one shorter than a few heartbeats
/// ([`crate::datapath::check_ttl`]).
pub(crate) fn parse_datapath_ttl(s: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    crate::datapath::check_ttl(ttl).map_err(|e| e.to_string())
}

/// Parses a mark in hex (`0x68`) or decimal, refusing 0 (every unmarked socket has it).
pub(crate) fn parse_mark(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| {
        format!("expected a mark such as {DEFAULT_BYPASS_MARK:#x} or {DEFAULT_BYPASS_MARK}: {e}")
    })?;
    if v == 0 {
        return Err("the bypass mark must not be 0: every unmarked socket has mark 0".into());
    }
    Ok(v)
}

/// TCP ports, comma-separated; empty or `off` means none (name routing off).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ports(pub Vec<u16>);

fn parse_ports(s: &str) -> Result<Ports, String> {
    let s = s.trim();
    if s.is_empty() || s == "off" {
        return Ok(Ports(Vec::new()));
    }
    s.split(',')
        .map(|p| match p.trim().parse::<u16>() {
            Ok(0) | Err(_) => Err(format!(
                "expected TCP ports such as 80,443 (or off), got {p:?}"
            )),
            Ok(n) => Ok(n),
        })
        .collect::<Result<Vec<u16>, String>>()
        .map(Ports)
}

/// The relays' default IPv4 listen address: link-local (169.254.0.0/16 is never
/// routed off a link), beside node-local-dns's 169.254.20.10.
pub(crate) const DEFAULT_LISTEN_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 104, 1);

/// The relays' default IPv6 listen address: a unique-local address ("hairpin" in
/// ASCII), since a link-local fe80:: address needs a zone pods cannot name.
pub(crate) const DEFAULT_LISTEN_V6: Ipv6Addr =
    Ipv6Addr::new(0xfd68, 0x6169, 0x7270, 0x696e, 0, 0, 0, 1);

/// The relay's second default IPv4 address: slots only (64,512 more), so that the
/// default `--max-frontends` fits in one family's slots.
pub(crate) const DEFAULT_SLOTS_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 104, 2);

/// The relay's second default IPv6 address: slots only, as [`DEFAULT_SLOTS_V4`].
pub(crate) const DEFAULT_SLOTS_V6: Ipv6Addr =
    Ipv6Addr::new(0xfd68, 0x6169, 0x7270, 0x696e, 0, 0, 0, 2);

/// Where the kernel path pins its sockets map: hairpin's directory of the host's bpf
/// filesystem, which the DaemonSet mounts.
pub(crate) const DEFAULT_BPF_PIN_DIR: &str = "/sys/fs/bpf/hairpin";

/// The link the default listen addresses go on.
pub(crate) const DEFAULT_LISTEN_LINK: &str = "hairpin0";

/// Every default listen address: the listeners' and the slots-only ones, both families.
pub fn default_listen_addresses() -> impl Iterator<Item = IpAddr> {
    [
        IpAddr::V4(DEFAULT_LISTEN_V4),
        IpAddr::V4(DEFAULT_SLOTS_V4),
        IpAddr::V6(DEFAULT_LISTEN_V6),
        IpAddr::V6(DEFAULT_SLOTS_V6),
    ]
    .into_iter()
}

/// Neither `--node-name` nor a host name to take for it.
#[derive(Debug, thiserror::Error)]
#[error("no --node-name and no host name: {0}")]
pub struct NoNodeName(pub nix::errno::Errno);

impl RunArgs {
    /// `--bpf-pin-dir`, unless `none`.
    pub fn pin_dir(&self) -> Option<&std::path::Path> {
        (self.bpf_pin_dir.as_os_str() != "none").then_some(self.bpf_pin_dir.as_path())
    }

    /// `--node-name`, else the host name (a hostNetwork pod's is the node's).
    pub(crate) fn node_name(&self) -> Result<String, NoNodeName> {
        match &self.node_name {
            Some(n) => Ok(n.clone()),
            None => Ok(nix::unistd::gethostname()
                .map_err(NoNodeName)?
                .to_string_lossy()
                .into_owned()),
        }
    }

    /// The link the listen addresses go on: `--listen-link` (`none`: no link), else
    /// [`DEFAULT_LISTEN_LINK`] when the default addresses are used.
    pub fn listen_link(&self) -> Option<&str> {
        match self.listen_link.as_deref() {
            Some("none" | "") => None,
            Some(link) => Some(link),
            None if self.listen_addresses.is_empty() => Some(DEFAULT_LISTEN_LINK),
            None => None,
        }
    }
}

/// `SERVICE=LISTEN` port pairs (see `--names-service-ports`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortMap(pub Vec<(u16, u16)>);

fn parse_port_map(s: &str) -> Result<PortMap, String> {
    let s = s.trim();
    if s.is_empty() || s == "off" {
        return Ok(PortMap(Vec::new()));
    }
    let port = |p: &str| match p.trim().parse::<u16>() {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    };
    let mut out: Vec<(u16, u16)> = Vec::new();
    for pair in s.split(',') {
        let parsed = pair
            .split_once('=')
            .and_then(|(svc, listen)| Some((port(svc)?, port(listen)?)));
        let Some((svc, listen)) = parsed else {
            return Err(format!(
                "expected SERVICE=LISTEN port pairs such as 80=880,443=843 (or off), got {:?}",
                pair.trim()
            ));
        };
        if out.iter().any(|(_, l)| *l == listen) {
            return Err(format!("listen port {listen} is given twice"));
        }
        // These listeners sit on the node IP and get the node's pods' requests
        // (cookies, Authorization): a port from 1024 up could be bound by any uid
        // while the agent restarts, and would receive them.
        if listen >= 1024 {
            return Err(format!(
                "listen port {listen} is unprivileged: any uid could bind it on the node IP \
                 while the agent restarts and receive the names' requests; pick one below 1024 \
                 such as 80=880,443=843"
            ));
        }
        out.push((svc, listen));
    }
    Ok(PortMap(out))
}

/// One `--nat64-prefixes` entry: an IPv6 network whose length RFC 6052 defines.
fn parse_nat64_prefix(s: &str) -> Result<ipnet::Ipv6Net, String> {
    let net: ipnet::Ipv6Net = s.trim().parse().map_err(|_| {
        format!("--nat64-prefixes: expected an IPv6 network such as 64:ff9b:1::/48, got {s:?}")
    })?;
    if !crate::k8s::decide::lb_address::NAT64_PREFIX_LENGTHS.contains(&net.prefix_len()) {
        return Err(format!(
            "--nat64-prefixes: {net}: expected a prefix length of 32, 40, 48, 56, 64 or 96 (RFC 6052 section 2.2)"
        ));
    }
    Ok(net.trunc())
}

#[cfg(test)]
mod tests;

/// `--link-order`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LinkOrderMode {
    /// Before every other connect program at the cgroup, where the kernel orders
    /// cgroup links.
    First,
    /// After every program already there, at the cgroup itself, as hairpin did on
    /// a kernel that does not order (tests).
    Append,
    /// As on a kernel that does not order: after every program already there, and
    /// at the cgroup's children when another program is at its connect hooks (tests).
    Children,
}

/// `--mesh-listener-cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum MeshListenerCache {
    /// On where the programs are attached at the cgroup v2 hierarchy's root.
    Auto,
    /// On wherever they are attached.
    On,
    /// Off: every kernel-path connect probes.
    Off,
}

impl MeshListenerCache {
    /// Whether the cache is on for programs attached at `cgroup`.
    pub(crate) fn on_at(self, cgroup: &std::path::Path) -> bool {
        match self {
            MeshListenerCache::Auto => crate::datapath::is_cgroup2_root(cgroup),
            MeshListenerCache::On => true,
            MeshListenerCache::Off => false,
        }
    }
}

/// `--mesh-capture-ports`: at most [`MESH_PORTS`] TCP ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshPorts(pub Vec<u16>);

impl MeshPorts {
    /// Parses `15001,4140`; empty or `none` is none.
    pub(crate) fn parse(s: &str) -> Result<MeshPorts, String> {
        let s = s.trim();
        if s.is_empty() || s == "none" {
            return Ok(MeshPorts(Vec::new()));
        }
        let ports = s
            .split(',')
            .map(|p| match p.trim().parse::<u16>() {
                Ok(0) | Err(_) => Err(format!(
                    "expected TCP ports such as 15001,4140 (or none), got {p:?}"
                )),
                Ok(n) => Ok(n),
            })
            .collect::<Result<Vec<u16>, String>>()?;
        if ports.len() > MESH_PORTS {
            return Err(format!(
                "at most {MESH_PORTS} mesh capture ports, got {}",
                ports.len()
            ));
        }
        Ok(MeshPorts(ports))
    }

    /// The ports as the programs' global holds them: unused slots 0.
    pub(crate) fn slots(&self) -> [u16; MESH_PORTS] {
        let mut out = [0; MESH_PORTS];
        for (slot, port) in out.iter_mut().zip(&self.0) {
            *slot = *port;
        }
        out
    }
}

/// `--names-redirect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NamesRedirect {
    /// Through the connect programs where attached, else the agent's nftables table.
    Auto,
    /// The name relay binds the names ports as they are.
    Off,
}
