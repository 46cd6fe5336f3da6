//! Which names may be published at all: the operator's `--names-domains`, and the
//! names refused whatever that list says.
//!
//! Whoever may create an Ingress or a Gateway route in one namespace must not be able
//! to steer a name anyone else relies on: another tenant's Service
//! (`api.tenant-b.svc.cluster.local`), the node itself (`localhost`, its own name),
//! the API server, the cloud's metadata endpoint, or a whole public suffix (`*.com`).
//! A name is published only under a listed domain (equal to it, or ending in `.` and
//! it); an empty list publishes nothing. Every refusal names its [`ScopeRule`].
//!
//! Sans-IO: the node's names and the API server's host are handed in by startup.

use std::fmt;

use super::{caps::NameCaps, hostname::Hostname};

/// Metadata endpoints reached by name, refused as exact names (and under any
/// wildcard that would cover them). What was found, per cloud:
///
/// - GCP: `metadata.google.internal` (the documented URL, cloud-init
///   `DataSourceGCE.py` `MD_V1_URL`); `metadata` (GCE images' /etc/hosts line
///   `169.254.169.254 metadata.google.internal metadata`, e.g. nixpkgs
///   `nixos/modules/virtualisation/google-compute-config.nix`); `metadata.goog`
///   (the alias listed beside it by SSRF guards).
/// - AWS: `instance-data` and `instance-data.ec2.internal` (cloud-init
///   `DataSourceEc2.py` tried `http://instance-data.:8773` until 2026; older EC2
///   user guides use `http://instance-data/latest/meta-data/`). IMDS itself is
///   169.254.169.254 and fd00:ec2::254, addresses, not names.
/// - Azure: IMDS is documented only as the address 169.254.169.254 (and the
///   WireServer 168.63.129.16); `metadata.azure.com` appears in SSRF block lists,
///   not in Azure's docs, and is refused anyway as it costs nothing.
/// - Tencent Cloud: `metadata.tencentyun.com` (its documented metadata URL).
/// - OpenStack (169.254.169.254, fe80::a9fe:a9fe), DigitalOcean (169.254.169.254),
///   Hetzner (169.254.169.254, fe80::a9fe:a9fe), Oracle (169.254.169.254,
///   fd00:c1::a9fe:a9fe) and Alibaba (100.100.100.200): addresses only, per
///   cloud-init's `DataSource{OpenStack,DigitalOcean,Hetzner,Oracle,AliYun}.py`;
///   there is no name to refuse.
const METADATA_NAMES: &[&str] = &[
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.azure.com",
    "metadata.tencentyun.com",
];

/// Cloud-internal zones refused with everything under them: GCP's
/// `google.internal` (the metadata server and VMs' internal names), AWS's
/// `ec2.internal` and `compute.internal` (every EC2 node's private DNS name, e.g.
/// `ip-10-0-0-1.ec2.internal`, `ip-10-0-0-1.eu-west-1.compute.internal`): other
/// nodes' names, which this agent cannot list.
const CLOUD_INTERNAL_ZONES: &[&str] = &["google.internal", "ec2.internal", "compute.internal"];

/// `--cluster-domain`'s default: the domain of Services and Pods on most clusters.
pub(crate) const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Loopback names besides `localhost` and `*.localhost` that distributions put in
/// /etc/hosts (RHEL, Fedora); single-label ones are refused as single labels.
const LOOPBACK_NAMES: &[&str] = &[
    "localhost.localdomain",
    "localhost4.localdomain4",
    "localhost6.localdomain6",
];

/// The rule a name broke. [`ScopeRule::name`] is the stable name in messages,
/// logs and `/status`; [`ScopeRule::event_reason`] the Event's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScopeRule {
    /// `--names-domains` is empty: no name is published.
    NoDomains,
    /// Not equal to, nor under, any listed domain.
    OutsideDomains,
    /// `localhost`, `*.localhost` and the distributions' loopback names.
    Localhost,
    /// The cluster domain (`--cluster-domain`) or a name under it.
    ClusterDomain,
    /// A Service-style name: a label `svc` after the first (`x.ns.svc`, `*.svc.corp`).
    ServiceName,
    /// A cloud metadata endpoint's name, or a cloud-internal zone.
    Metadata,
    /// This node's name or host name, or a wildcard covering it.
    NodeName,
    /// The API server's host name, or a wildcard covering it.
    ApiServer,
    /// A public suffix itself (`co.uk`), or a wildcard directly under one (`*.com`).
    PublicSuffix,
    /// A single-label name (`intranet`), or a wildcard over one (`*.corp`).
    SingleLabel,
    /// A wildcard directly over a listed domain (`*.example.com` where
    /// `example.com` is listed) that the operator did not list itself: it would
    /// answer for every name of the domain no object claims, hosts outside the
    /// cluster included.
    WildcardOverDomain,
    /// Every name is withheld for now: the API server's certificate names are not
    /// known yet, and any name could be one of them.
    ApiServerPending,
}

impl ScopeRule {
    /// The rule's stable name: `cluster-domain`, `localhost`, ...
    pub(crate) fn name(self) -> &'static str {
        match self {
            ScopeRule::NoDomains => "no-domains",
            ScopeRule::OutsideDomains => "outside-domains",
            ScopeRule::Localhost => "localhost",
            ScopeRule::ClusterDomain => "cluster-domain",
            ScopeRule::ServiceName => "service-name",
            ScopeRule::Metadata => "metadata-endpoint",
            ScopeRule::NodeName => "node-name",
            ScopeRule::ApiServer => "api-server",
            ScopeRule::PublicSuffix => "public-suffix",
            ScopeRule::SingleLabel => "single-label",
            ScopeRule::WildcardOverDomain => "wildcard-over-domain",
            ScopeRule::ApiServerPending => "api-server-pending",
        }
    }

    /// The CamelCase reason of the Warning Event on the object that named the host.
    pub(crate) fn event_reason(self) -> &'static str {
        match self {
            ScopeRule::NoDomains => "HostnameNoDomainsListed",
            ScopeRule::OutsideDomains => "HostnameOutsideDomains",
            ScopeRule::Localhost => "HostnameRefusedLocalhost",
            ScopeRule::ClusterDomain => "HostnameRefusedClusterDomain",
            ScopeRule::ServiceName => "HostnameRefusedServiceName",
            ScopeRule::Metadata => "HostnameRefusedMetadataEndpoint",
            ScopeRule::NodeName => "HostnameRefusedNodeName",
            ScopeRule::ApiServer => "HostnameRefusedApiServer",
            ScopeRule::PublicSuffix => "HostnameRefusedPublicSuffix",
            ScopeRule::SingleLabel => "HostnameRefusedSingleLabel",
            ScopeRule::WildcardOverDomain => "HostnameRefusedWildcardOverDomain",
            ScopeRule::ApiServerPending => "HostnameWithheldApiServerPending",
        }
    }
}

impl fmt::Display for ScopeRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name the scope refused: the rule, and a sentence saying why and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The rule broken.
    pub rule: ScopeRule,
    /// `host X refused (rule R): why; expected ...`.
    pub message: String,
}

/// Why a `--names-domains` entry or `--cluster-domain` cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// Not a valid DNS name.
    #[error("{flag} {value:?}: {source}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it is not a name.
        source: super::hostname::HostnameError,
    },
    /// A listed domain that would let names through that are always refused.
    #[error("--names-domains {value:?}: expected a domain names may be published under, but {why}")]
    Refused {
        /// The value given.
        value: String,
        /// Which rule it breaks, in words.
        why: String,
    },
}

/// The operator's domains and the names this node must never publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameScope {
    domains: Vec<String>,
    /// The domains whose wildcard (`*.domain`) the operator listed itself.
    wildcards: Vec<String>,
    cluster_domain: String,
    /// (name, what it is): the node name, the host name, the API server's host.
    own: Vec<(String, ScopeRule, &'static str)>,
    /// How many of the names it lets through may be published.
    caps: NameCaps,
    /// Why every name is withheld for now ([`NameScope::withhold_all`]), if it is.
    withheld: Option<String>,
}

impl NameScope {
    /// The default scope: no domain listed, so nothing is published, in the default
    /// cluster domain.
    pub fn none() -> NameScope {
        NameScope {
            domains: Vec::new(),
            wildcards: Vec::new(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
            own: Vec::new(),
            caps: NameCaps::default(),
            withheld: None,
        }
    }

    /// A scope publishing names under `domains` (each a DNS name, neither a public
    /// suffix nor in the cluster domain nor otherwise always refused), refusing
    /// `cluster_domain` and everything under it. An entry `*.example.com` lists
    /// `example.com` and also lets the wildcard `*.example.com` itself be published,
    /// which is otherwise refused ([`ScopeRule::WildcardOverDomain`]). Validated
    /// once, at startup.
    pub fn new<S: AsRef<str>>(
        domains: &[S],
        cluster_domain: &str,
    ) -> Result<NameScope, ScopeError> {
        let cluster = Hostname::parse(cluster_domain).map_err(|source| ScopeError::Invalid {
            flag: "--cluster-domain",
            value: cluster_domain.to_owned(),
            source,
        })?;
        if cluster.is_wildcard() {
            return Err(ScopeError::Invalid {
                flag: "--cluster-domain",
                value: cluster_domain.to_owned(),
                source: super::hostname::HostnameError::MisplacedWildcard {
                    input: cluster_domain.to_owned(),
                },
            });
        }
        let mut scope = NameScope {
            domains: Vec::new(),
            wildcards: Vec::new(),
            cluster_domain: cluster.as_str().to_owned(),
            own: Vec::new(),
            caps: NameCaps::default(),
            withheld: None,
        };
        for value in domains {
            let value = value.as_ref().trim();
            if value.is_empty() {
                continue;
            }
            let host = Hostname::parse(value).map_err(|source| ScopeError::Invalid {
                flag: "--names-domains",
                value: value.to_owned(),
                source,
            })?;
            let refused = |why: String| ScopeError::Refused {
                value: value.to_owned(),
                why,
            };
            // The always-refused rules apply to the domain itself (and to a listed
            // wildcard): a domain that is a public suffix would let every tenant
            // publish `anything.com`.
            if let Some(r) = scope.refused(&host) {
                return Err(refused(format!("it is refused itself: {}", r.message)));
            }
            let base = host.base().to_owned();
            if host.is_wildcard() {
                let domain = Hostname::parse(&base).map_err(|source| ScopeError::Invalid {
                    flag: "--names-domains",
                    value: value.to_owned(),
                    source,
                })?;
                if let Some(r) = scope.refused(&domain) {
                    return Err(refused(format!("it is refused itself: {}", r.message)));
                }
                if !scope.wildcards.contains(&base) {
                    scope.wildcards.push(base.clone());
                }
            }
            if !scope.domains.contains(&base) {
                scope.domains.push(base);
            }
        }
        scope.domains.sort();
        scope.wildcards.sort();
        Ok(scope)
    }

    /// Also refuses `name` (and wildcards covering it) under `rule`, described as
    /// `what` (`this node's name`): the node name, the host name, the API server.
    /// Values that are empty, IP addresses or not DNS names are passed over.
    pub(crate) fn refuse_own(
        mut self,
        name: &str,
        rule: ScopeRule,
        what: &'static str,
    ) -> NameScope {
        if let Ok(h) = Hostname::parse(name)
            && !h.is_wildcard()
            && !self.own.iter().any(|(n, _, _)| n == h.as_str())
        {
            self.own.push((h.as_str().to_owned(), rule, what));
        }
        self
    }

    /// The same scope withholding every name it would let through, for `why`
    /// ([`ScopeRule::ApiServerPending`]): the always-refused rules still name
    /// themselves first.
    pub(crate) fn withhold_all(mut self, why: String) -> NameScope {
        self.withheld = Some(why);
        self
    }

    /// The same scope publishing at most `caps` names (the defaults otherwise).
    pub(crate) fn with_caps(mut self, caps: NameCaps) -> NameScope {
        self.caps = caps;
        self
    }

    /// The caps on how many names are published.
    pub(crate) fn caps(&self) -> NameCaps {
        self.caps
    }

    /// The listed domains, sorted.
    pub(crate) fn domains(&self) -> &[String] {
        &self.domains
    }

    /// One sentence for `/status` and `doctor`: the domains, or that none is listed.
    pub(crate) fn describe(&self) -> String {
        if self.domains.is_empty() {
            return "none: --names-domains is empty, no names are published".to_owned();
        }
        let mut s = format!("names under {} are published", self.domains.join(", "));
        if !self.wildcards.is_empty() {
            let listed: Vec<String> = self.wildcards.iter().map(|w| format!("*.{w}")).collect();
            s.push_str(&format!(" (and the wildcards {})", listed.join(", ")));
        }
        s
    }

    /// `Ok` when `host` may be published, else the rule it breaks. The always-refused
    /// rules are checked first, so a refusal names the most specific rule.
    pub fn check(&self, host: &Hostname) -> Result<(), Refusal> {
        if let Some(r) = self.refused(host) {
            return Err(r);
        }
        if let Some(why) = &self.withheld {
            return Err(refusal(
                host,
                ScopeRule::ApiServerPending,
                why,
                "the agent to read the API server's certificate (it retries until it can)",
            ));
        }
        if self.domains.is_empty() {
            return Err(refusal(
                host,
                ScopeRule::NoDomains,
                "--names-domains is empty, so no names are published",
                "the operator to list the domain in --names-domains",
            ));
        }
        if host.is_wildcard()
            && self.domains.iter().any(|d| d == host.base())
            && !self.wildcards.iter().any(|d| d == host.base())
        {
            return Err(refusal(
                host,
                ScopeRule::WildcardOverDomain,
                &format!(
                    "it is a wildcard directly over the listed domain {}: it would answer for \
                     every name of {} no object claims, hosts outside the cluster included",
                    host.base(),
                    host.base()
                ),
                &format!(
                    "exact names, a wildcard under a subdomain (*.apps.{}), or {host} listed \
                     in --names-domains by the operator",
                    host.base()
                ),
            ));
        }
        if self.domains.iter().any(|d| under(host, d)) {
            return Ok(());
        }
        Err(refusal(
            host,
            ScopeRule::OutsideDomains,
            "it is not under a domain listed in --names-domains",
            &format!("a name under {}", self.domains.join(", ")),
        ))
    }

    /// The always-refused rules, whatever the domains.
    fn refused(&self, host: &Hostname) -> Option<Refusal> {
        let base = host.base();
        if under(host, "localhost") || LOOPBACK_NAMES.iter().any(|n| covers(host, n)) {
            return Some(refusal(
                host,
                ScopeRule::Localhost,
                "loopback names must keep resolving to this machine",
                "a name that is not localhost",
            ));
        }
        if under(host, &self.cluster_domain) {
            return Some(refusal(
                host,
                ScopeRule::ClusterDomain,
                &format!(
                    "names in the cluster domain {} belong to Services and Pods",
                    self.cluster_domain
                ),
                &format!("a name outside {}", self.cluster_domain),
            ));
        }
        if host.as_str().split('.').skip(1).any(|l| l == "svc") {
            return Some(refusal(
                host,
                ScopeRule::ServiceName,
                "a `svc` label after the first is a Service name (`name.namespace.svc`)",
                "a name without a `svc` label",
            ));
        }
        if METADATA_NAMES.iter().any(|n| covers(host, n))
            || CLOUD_INTERNAL_ZONES.iter().any(|z| under(host, z))
        {
            return Some(refusal(
                host,
                ScopeRule::Metadata,
                "cloud metadata endpoints and cloud-internal zones (nodes' own names) are never redirected",
                "a name that is not a metadata endpoint",
            ));
        }
        for (name, rule, what) in &self.own {
            if covers(host, name) {
                return Some(refusal(
                    host,
                    *rule,
                    &format!("{name} is {what}"),
                    &format!("a name other than {name}"),
                ));
            }
        }
        if is_public_suffix(base) {
            let why = if host.is_wildcard() {
                format!("it is a wildcard directly under the public suffix {base}")
            } else {
                format!("{base} is a public suffix")
            };
            return Some(refusal(
                host,
                ScopeRule::PublicSuffix,
                &why,
                "a name under a registrable domain (example.com, not com)",
            ));
        }
        if !base.contains('.') {
            return Some(refusal(
                host,
                ScopeRule::SingleLabel,
                "single-label names are resolved through search domains",
                "a name with at least two labels (app.example.com)",
            ));
        }
        None
    }
}

fn refusal(host: &Hostname, rule: ScopeRule, why: &str, expected: &str) -> Refusal {
    Refusal {
        rule,
        message: format!("host {host} refused (rule {rule}): {why}; expected {expected}"),
    }
}

/// Whether `host` is `zone` or under it; a wildcard by its base (`*.a.b` is under `a.b`).
fn under(host: &Hostname, zone: &str) -> bool {
    let base = host.base();
    base == zone
        || base
            .strip_suffix(zone)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// Whether `host` would answer for the exact name `name`: equal to it, or a wildcard
/// whose base is `name`'s parent (wildcards match one label).
fn covers(host: &Hostname, name: &str) -> bool {
    if host.is_wildcard() {
        name.split_once('.')
            .is_some_and(|(_, parent)| parent == host.base())
    } else {
        host.as_str() == name
    }
}

/// Whether `name` is itself a suffix on the Public Suffix List (ICANN or private
/// section), through the `psl` crate's compiled list. Unlisted top-level labels
/// (`corp`, `internal`) are not: the list's implicit `*` rule does not count.
fn is_public_suffix(name: &str) -> bool {
    psl::suffix(name.as_bytes()).is_some_and(|s| s.is_known() && s.as_bytes() == name.as_bytes())
}

#[cfg(test)]
mod tests;
