//! The vocabulary every part of the agent shares: the frontends hairpin proxies
//! (which LoadBalancer IP and TCP port need a PROXY header, and which version),
//! the agent's `--mode`, and the paths that lead clients to a relay.
//!
//! Plain data; depends on nothing else in the crate.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use serde::{Deserialize, Serialize};

/// A word that is none of a value's spellings (an annotation, a frontends file
/// field or a flag).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}, got {got:?}")]
pub struct UnknownWord {
    /// The spellings it may take, as a reader would list them.
    pub expected: &'static str,
    /// What was given (trimmed and lowercased where the value is).
    pub got: String,
}

impl UnknownWord {
    fn new(expected: &'static str, got: &str) -> UnknownWord {
        UnknownWord {
            expected,
            got: got.to_owned(),
        }
    }
}

/// PROXY protocol version an ingress expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyVersion {
    /// The human-readable text header (`PROXY TCP4 ...\r\n`).
    V1,
    /// The binary header.
    V2,
}

impl ProxyVersion {
    /// The version's number as one byte, `1` or `2`: the header byte of a kernel-path
    /// frontend map value (`hairpin_ebpf::HEADER_V1`/`HEADER_V2`, the same numbers)
    /// and what the relay keeps per listener. The one encoding of a version as a byte.
    pub(crate) const fn number(self) -> u8 {
        match self {
            ProxyVersion::V1 => 1,
            ProxyVersion::V2 => 2,
        }
    }

    /// The version [`ProxyVersion::number`] gives `n`, if any.
    pub(crate) const fn from_number(n: u8) -> Option<ProxyVersion> {
        match n {
            1 => Some(ProxyVersion::V1),
            2 => Some(ProxyVersion::V2),
            _ => None,
        }
    }
}

impl fmt::Display for ProxyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyVersion::V1 => "v1",
            ProxyVersion::V2 => "v2",
        })
    }
}

impl FromStr for ProxyVersion {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "v1" | "1" => Ok(ProxyVersion::V1),
            "v2" | "2" => Ok(ProxyVersion::V2),
            other => Err(UnknownWord::new("v1 or v2", other)),
        }
    }
}

/// Which side of a frontend's connections sends the first bytes.
///
/// The kernel path writes the header ahead of the client's first write, so it can
/// serve only frontends whose client speaks first (HTTP, TLS); on a port whose
/// server speaks first (SMTP, IMAP, FTP, MySQL, PostgreSQL's SSL request aside) the
/// client waits for a banner that the server, waiting for its header, never sends.
/// Those frontends always take the relay path, which writes the header at accept.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FirstSpeaker {
    /// The client writes first (HTTP, TLS): the default.
    #[default]
    Client,
    /// The server writes first (a banner or greeting): the relay path only.
    Server,
}

impl fmt::Display for FirstSpeaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FirstSpeaker::Client => "client",
            FirstSpeaker::Server => "server",
        })
    }
}

impl FromStr for FirstSpeaker {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "client" => Ok(FirstSpeaker::Client),
            "server" => Ok(FirstSpeaker::Server),
            other => Err(UnknownWord::new("client or server", other)),
        }
    }
}

/// Which path a frontend asks for (`hairpin.dev/path`, `path` in the frontends
/// file): the agent's choice, or the relay always.
///
/// The kernel path's known misses (a blocking send() issued while the socket is
/// still connecting; `sendto(MSG_FASTOPEN)` without CAP_PERFMON) cannot be caught
/// from BPF: a workload that hits one asks for the relay, which writes the header
/// at accept whatever the client does.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PathChoice {
    /// The kernel path where this node runs it and the client speaks first, the
    /// relay otherwise: the default.
    #[default]
    Auto,
    /// The relay, also where the kernel path is on.
    Relay,
}

impl fmt::Display for PathChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathChoice::Auto => "auto",
            PathChoice::Relay => "relay",
        })
    }
}

impl FromStr for PathChoice {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(PathChoice::Auto),
            "relay" => Ok(PathChoice::Relay),
            other => Err(UnknownWord::new("auto or relay", other)),
        }
    }
}

/// A Service by name: `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServiceName {
    /// The namespace (`default` when the object had none, as kubectl reads it).
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ServiceName {
    /// The Service `name` in `namespace`.
    pub(crate) fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceName {
        ServiceName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The text `namespace/name`, byte by byte, without building it.
    fn key(&self) -> impl Iterator<Item = u8> + '_ {
        self.namespace
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(self.name.bytes())
    }
}

/// Ordered as `namespace/name` reads (`a-b/x` before `a/x`): the order `status`
/// lists decisions in and the tie-break between two Services of the same age.
impl Ord for ServiceName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(other.key())
    }
}

impl PartialOrd for ServiceName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What asked for a frontend. Carried as it is from the source to `/status`; its
/// text (`Service ns/name`, `file PATH (name)`) is only for people.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A LoadBalancer Service.
    Service(ServiceName),
    /// An entry of the frontends file.
    File {
        /// The file (one allocation shared by every frontend the file lists).
        path: std::sync::Arc<std::path::Path>,
        /// The entry's `name`, when it has one (shared by the entry's ports).
        #[serde(default)]
        entry: Option<std::sync::Arc<str>>,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Service(s) => write!(f, "Service {s}"),
            Origin::File {
                path,
                entry: Some(n),
            } => write!(f, "file {} ({n})", path.display()),
            Origin::File { path, entry: None } => write!(f, "file {}", path.display()),
        }
    }
}

/// One proxied frontend: connects to `ip:port` get a PROXY `version` header.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frontend {
    /// The LoadBalancer's external IP.
    pub ip: IpAddr,
    /// The TCP port on that IP.
    pub port: u16,
    /// The header version the ingress behind it expects.
    pub version: ProxyVersion,
    /// What asked for it (shown in `status` and logs as `Service ns/name`, `file PATH`).
    pub source: Origin,
    /// Which side speaks first; a server-speaks-first frontend always takes the
    /// relay path, also with the kernel path on.
    #[serde(default)]
    pub first_speaker: FirstSpeaker,
    /// The path asked for; `relay` keeps the frontend on the relay path, also with
    /// the kernel path on.
    #[serde(default)]
    pub path: PathChoice,
}

impl Frontend {
    /// The LoadBalancer address, `ip:port`.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

/// The frontends to proxy, at most one per LoadBalancer address.
///
/// Which frontend owns an `ip:port` is decided once, by the source that produced
/// the set and with that source's rule (the oldest Service in the cluster; in the
/// frontends file a second entry is an error). Everything downstream reads the
/// decision from here instead of deciding again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontends(BTreeMap<SocketAddr, Frontend>);

impl Frontends {
    /// No frontends.
    pub(crate) fn new() -> Frontends {
        Frontends::default()
    }

    /// Adds `frontend`; when its address is already owned, leaves the set as it
    /// is and returns the owner, for the caller's rule to report (or merge into).
    pub(crate) fn insert(&mut self, frontend: Frontend) -> Result<(), &mut Frontend> {
        use std::collections::btree_map::Entry;
        match self.0.entry(frontend.addr()) {
            Entry::Vacant(v) => {
                v.insert(frontend);
                Ok(())
            }
            Entry::Occupied(o) => Err(o.into_mut()),
        }
    }

    /// Takes the frontend at `addr` out (a cap withheld every claim of it).
    pub(crate) fn remove(&mut self, addr: &SocketAddr) -> Option<Frontend> {
        self.0.remove(addr)
    }

    /// The frontend that owns `addr`.
    #[cfg(test)]
    pub(crate) fn get(&self, addr: &SocketAddr) -> Option<&Frontend> {
        self.0.get(addr)
    }

    /// Whether `addr` is owned.
    pub(crate) fn contains(&self, addr: &SocketAddr) -> bool {
        self.0.contains_key(addr)
    }

    /// The frontends on LoadBalancer IP `ip`, in port order.
    pub(crate) fn on_ip(&self, ip: IpAddr) -> impl Iterator<Item = &Frontend> {
        self.0
            .range(SocketAddr::new(ip, 0)..=SocketAddr::new(ip, u16::MAX))
            .map(|(_, f)| f)
    }

    /// The frontends in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Frontend> {
        self.0.values()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a Frontends {
    type Item = &'a Frontend;
    type IntoIter = std::collections::btree_map::Values<'a, SocketAddr, Frontend>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.values()
    }
}

/// `--mode`: which paths the agent may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// eBPF where it attaches; where it does not, the name relay with /etc/hosts.
    Auto,
    /// eBPF only: no name relay, no hosts file, no CoreDNS. Fails when it cannot attach.
    Ebpf,
    /// No eBPF at all (nothing loaded or attached): the name relay only.
    Fallback,
    /// eBPF and the name fallbacks together. Fails when eBPF cannot attach.
    Both,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Auto => "auto",
            Mode::Ebpf => "ebpf",
            Mode::Fallback => "fallback",
            Mode::Both => "both",
        })
    }
}

impl Mode {
    /// Whether the programs are loaded and attached at all.
    pub(crate) fn tries_ebpf(self) -> bool {
        self != Mode::Fallback
    }

    /// Whether a load or attach failure stops the agent (rather than falling back).
    pub(crate) fn requires_ebpf(self) -> bool {
        matches!(self, Mode::Ebpf | Mode::Both)
    }

    /// Whether CoreDNS may be written in this mode (`ebpf` touches no DNS).
    pub fn allows_names(self) -> bool {
        self != Mode::Ebpf
    }
}

/// What a node runs to bring in-cluster clients their header (`--mode`'s outcome,
/// `status`'s `mode.live`): the programs attached, the hosts block, CoreDNS. Not a
/// frontend's path ([`LivePath`]): with the programs attached, each frontend takes
/// the relay path or the kernel path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NodePath {
    /// The programs are attached at the node's cgroup: a connect to a proxied
    /// LoadBalancer IP is marked for the kernel path or redirected to the relay.
    /// Named `ebpf` in `/status`, flags and logs (the documented value).
    #[serde(rename = "ebpf")]
    Programs,
    /// The node's /etc/hosts block points names at the name relay.
    Hosts,
    /// CoreDNS rewrites point pods' names at the hairpin Service (the name relay).
    Coredns,
}

impl NodePath {
    /// The name used in `/status`, flags and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NodePath::Programs => "ebpf",
            NodePath::Hosts => "hosts",
            NodePath::Coredns => "coredns",
        }
    }

    /// The frontend path it is, for the paths through the name relay (`None`: the
    /// programs, whose frontends each take the relay or the kernel path).
    pub(crate) fn name_path(self) -> Option<LivePath> {
        match self {
            NodePath::Programs => None,
            NodePath::Hosts => Some(LivePath::Hosts),
            NodePath::Coredns => Some(LivePath::Coredns),
        }
    }
}

impl fmt::Display for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A path that gets a frontend's in-cluster clients their header: the kernel, or a
/// relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LivePath {
    /// The relay path: the connect programs redirect the frontend's LoadBalancer IP
    /// to its relay listener, which writes the header. Named `ebpf` in `/status`,
    /// flags and logs (the documented value).
    #[serde(rename = "ebpf")]
    Relay,
    /// The kernel path: the connect programs leave the destination alone and the
    /// kernel writes the header on the client's own socket (a socket the kernel path
    /// cannot take is redirected to the per-frontend relay).
    Kernel,
    /// The node's /etc/hosts block points names at the name relay.
    Hosts,
    /// CoreDNS rewrites point pods' names at the hairpin Service (the name relay).
    Coredns,
}

impl LivePath {
    /// The name used in `/status`, flags and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LivePath::Relay => "ebpf",
            LivePath::Kernel => "kernel",
            LivePath::Hosts => "hosts",
            LivePath::Coredns => "coredns",
        }
    }

    /// Whether this path goes through the name relay (every path but the relay and
    /// kernel paths does).
    #[cfg(test)]
    pub(crate) fn is_name_path(self) -> bool {
        !matches!(self, LivePath::Relay | LivePath::Kernel)
    }
}

impl fmt::Display for LivePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LivePath {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ebpf" => Ok(LivePath::Relay),
            "kernel" => Ok(LivePath::Kernel),
            "hosts" => Ok(LivePath::Hosts),
            "coredns" => Ok(LivePath::Coredns),
            other => Err(UnknownWord::new("ebpf, kernel, hosts or coredns", other)),
        }
    }
}

/// `--kernel-path`: whether the kernel writes headers for frontends whose client
/// speaks first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelPathMode {
    /// The kernel path where this kernel runs its programs; elsewhere every
    /// frontend takes the relay path, and `status` and `doctor` say why: the default.
    Auto,
    /// As `auto`, and the kernel path is required: where this kernel cannot run it
    /// the frontends still take the relay path (headers are still written), but
    /// `status` says it was required and `doctor` fails.
    On,
    /// Every frontend takes the relay path: the kernel path's programs are not loaded.
    Off,
}

impl KernelPathMode {
    /// Whether the kernel path's programs are loaded (`auto` and `on`).
    pub fn loads(self) -> bool {
        self != KernelPathMode::Off
    }

    /// Whether this node failing to run the kernel path is a failure (`on`) rather
    /// than the relay taking over as planned (`auto`).
    pub(crate) fn requires(self) -> bool {
        self == KernelPathMode::On
    }
}

impl fmt::Display for KernelPathMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelPathMode::Auto => "auto",
            KernelPathMode::On => "on",
            KernelPathMode::Off => "off",
        })
    }
}

/// The paths that reach one frontend, in `/status` as one string: `ebpf,hosts`, or
/// `none` when nothing leads clients to a relay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Paths(pub Vec<LivePath>);

impl Paths {}

impl From<Vec<LivePath>> for Paths {
    fn from(v: Vec<LivePath>) -> Paths {
        Paths(v)
    }
}

impl fmt::Display for Paths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(p.as_str())?;
        }
        Ok(())
    }
}

impl FromStr for Paths {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" || s.is_empty() {
            return Ok(Paths::default());
        }
        s.split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(Paths)
    }
}

impl Serialize for Paths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Paths {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
