//! How many names may be published: at most `--max-names-per-namespace` per
//! namespace and `--max-names` in all, so that no tenant can grow the hosts block
//! and the Corefile until they stop being written for everyone (both files refuse
//! to grow past 1 MiB).
//!
//! Pure and deterministic, so every node withholds the same names:
//! - **Per namespace.** A namespace's names are taken oldest first: each name at
//!   the creationTimestamp of the oldest object in the namespace claiming it
//!   (objects without one last), then by name. Names past the cap are withheld,
//!   in that namespace only: another namespace's names are never looked at. An
//!   object that flaps (deleted and created again) comes back as the newest, so it
//!   can only push its own namespace's newest names out, never older ones.
//! - **In all: round robin.** What the namespaces keep is taken in rounds: round
//!   `k` takes each namespace's `k`-th name. The round the cap falls in takes its
//!   oldest names first (the same order as within a namespace). So every namespace
//!   keeps at least `min(its names, the cap / the number of namespaces)` (max-min
//!   fairness): a namespace with many names can only bring the others down to
//!   that share, never starve them. A fixed split (the per-namespace cap times the
//!   number of namespaces) would need the number of namespaces in advance, and
//!   ordering by age alone would let the oldest namespace take every slot.
//!
//! A name counts where it is claimed (by an object that has a proxied LB), whether
//! it later wins a conflict or not; a withheld name neither is published nor wins
//! a conflict, as a name the scope refuses. Names from the frontends file count
//! under one pseudo-namespace, [`FRONTENDS_FILE_NAMESPACE`].
//!
//! Worst case per name (the tests below build it): a line of the hosts block is at
//! most 294 bytes (a 39-character IPv6 relay address, a tab, a 253-character name,
//! a newline) and a Corefile line at most 484 bytes (a wildcard over 125 escaped
//! dots, the default `--coredns-target`, four spaces of indentation, the marker and
//! CRLF). At the default [`DEFAULT_MAX_NAMES`] of 2,000 that is at most 588,072
//! bytes of hosts block and 968,000 bytes of Corefile lines, under the 1 MiB both
//! files are refused at, with 80 KiB left for the rest of a Corefile.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{hostname::Hostname, object::ObjectId};
use crate::status::NameLimitsStatus;

/// `--max-names-per-namespace`'s default.
pub(crate) const DEFAULT_MAX_NAMES_PER_NAMESPACE: usize = 200;

/// `--max-names`'s default: as many names as fit both files under 1 MiB in the
/// worst case (see the module's documentation).
pub(crate) const DEFAULT_MAX_NAMES: usize = 2000;

/// The pseudo-namespace names from the frontends file count under (no namespace
/// is spelled with parentheses or spaces, so it never collides with one).
pub(crate) const FRONTENDS_FILE_NAMESPACE: &str = "(frontends file)";

/// The caps, validated (each at least 1) by the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NameCaps {
    /// Names one namespace may publish.
    pub per_namespace: usize,
    /// Names published in all.
    pub total: usize,
}

impl Default for NameCaps {
    fn default() -> NameCaps {
        NameCaps {
            per_namespace: DEFAULT_MAX_NAMES_PER_NAMESPACE,
            total: DEFAULT_MAX_NAMES,
        }
    }
}

/// Which cap withheld a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CapRule {
    /// Its namespace already publishes `--max-names-per-namespace` older names.
    Namespace,
    /// `--max-names` names are published, this one's turn in the round robin came
    /// after the last of them.
    Global,
}

impl CapRule {
    /// The rule's stable name in messages, logs and `/status`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CapRule::Namespace => "max-names-per-namespace",
            CapRule::Global => "max-names",
        }
    }

    /// The CamelCase reason of the Warning Event on the object that named the host.
    pub(crate) fn event_reason(self) -> &'static str {
        match self {
            CapRule::Namespace => "HostnameNamespaceCapReached",
            CapRule::Global => "HostnameGlobalCapReached",
        }
    }
}

/// The namespace a claim or skip counts under: its object's, or
/// [`FRONTENDS_FILE_NAMESPACE`] for the frontends file.
pub(crate) fn namespace_of(object: Option<&ObjectId>) -> &str {
    object.map_or(FRONTENDS_FILE_NAMESPACE, |o| o.namespace.as_str())
}

/// What [`withhold`] decided: the withheld claims by namespace, and the report.
/// `K` is what is claimed: a hostname here, a LoadBalancer address for frontends
/// (`k8s::decide::desired`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Withheld<K = Hostname> {
    /// (namespace, claim) -> the cap that withheld it.
    pub names: BTreeMap<(String, K), CapRule>,
    /// How many claims each namespace keeps after the caps.
    pub kept: BTreeMap<String, usize>,
}

impl<K> Default for Withheld<K> {
    fn default() -> Self {
        Withheld {
            names: BTreeMap::new(),
            kept: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Withheld<K> {
    /// The cap withholding `claim` in `namespace`, if any.
    pub(crate) fn rule(&self, namespace: &str, claim: &K) -> Option<CapRule> {
        // Lookups by borrowed parts would need a different key; claims are few.
        self.names
            .get(&(namespace.to_owned(), claim.clone()))
            .copied()
    }
}

impl Withheld {
    /// `/status`'s view: the caps, and how many names each namespace over one
    /// has withheld.
    pub(crate) fn report(&self, caps: NameCaps) -> NameLimitsStatus {
        let mut by_namespace: BTreeMap<String, usize> = BTreeMap::new();
        for (ns, _) in self.names.keys() {
            *by_namespace.entry(ns.clone()).or_default() += 1;
        }
        NameLimitsStatus {
            max_names_per_namespace: caps.per_namespace,
            max_names: caps.total,
            withheld: self.names.len(),
            withheld_by_namespace: by_namespace,
        }
    }

    /// One sentence for the skip of a withheld claim of `host` in `namespace`.
    pub(crate) fn message(
        &self,
        rule: CapRule,
        namespace: &str,
        host: &Hostname,
        caps: NameCaps,
    ) -> String {
        match rule {
            CapRule::Namespace => format!(
                "host {host} withheld (rule {}): namespace {namespace} already publishes \
                 {} older names, the most --max-names-per-namespace allows",
                rule.name(),
                caps.per_namespace
            ),
            CapRule::Global => format!(
                "host {host} withheld (rule {}): {} names are published in all, the most \
                 --max-names allows, shared round robin between namespaces; namespace \
                 {namespace} publishes {} of them",
                rule.name(),
                caps.total,
                self.kept.get(namespace).copied().unwrap_or(0)
            ),
        }
    }
}

/// Applies `caps` to what `claims` ask for: (namespace, claim, the claiming
/// object's creationTimestamp), one entry per claim (a claim made twice in a
/// namespace counts once, at its oldest). Generic over what is claimed: the names
/// here, the LoadBalancer addresses of `k8s::decide::desired` under the frontend caps.
pub(crate) fn withhold<'a, K: Ord + Clone + 'a>(
    claims: impl IntoIterator<Item = (&'a str, &'a K, Option<&'a Time>)>,
    caps: NameCaps,
) -> Withheld<K> {
    // namespace -> claim -> the oldest claim's time (None: no timestamp, newest).
    let mut per_ns: BTreeMap<&str, BTreeMap<&K, Option<&Time>>> = BTreeMap::new();
    for (ns, host, created) in claims {
        let oldest = per_ns.entry(ns).or_default().entry(host).or_insert(created);
        if age_key(created) < age_key(*oldest) {
            *oldest = created;
        }
    }
    let mut out = Withheld::default();
    // (rank in its namespace, age, name, namespace) of every name the per-namespace
    // cap keeps: sorted, this is the round robin.
    let mut rounds = BTreeSet::new();
    for (ns, names) in &per_ns {
        let mut ordered: Vec<(&K, Option<&Time>)> = names.iter().map(|(h, t)| (*h, *t)).collect();
        ordered.sort_by(|a, b| (age_key(a.1), a.0).cmp(&(age_key(b.1), b.0)));
        for (rank, (host, created)) in ordered.into_iter().enumerate() {
            if rank < caps.per_namespace {
                rounds.insert((rank, age_key(created), host, *ns));
            } else {
                out.names
                    .insert(((*ns).to_owned(), host.clone()), CapRule::Namespace);
            }
        }
    }
    for (i, (_, _, host, ns)) in rounds.into_iter().enumerate() {
        if i < caps.total {
            *out.kept.entry(ns.to_owned()).or_default() += 1;
        } else {
            out.names
                .insert((ns.to_owned(), host.clone()), CapRule::Global);
        }
    }
    out
}

/// Oldest first; a claim without a creationTimestamp after every one with.
fn age_key(t: Option<&Time>) -> (bool, Option<&Time>) {
    (t.is_none(), t)
}

#[cfg(test)]
mod tests;
