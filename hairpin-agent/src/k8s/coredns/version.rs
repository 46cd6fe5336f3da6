//! Which CoreDNS the cluster runs (its Deployment's image tag), and which rewrites
//! that CoreDNS can take.
//!
//! Wildcard names are written as `rewrite name regex FROM TO answer auto`
//! ([`crate::names::corefile`]). `answer auto` came with coredns/coredns#4473, first
//! released in v1.8.4 (`notes/coredns-1.8.4.md`; the v1.8.4 tag holds it, v1.8.3
//! does not). Before that:
//! - with `answer auto` the rule is a parse error: v1.8.3's `newNameRule` takes 3
//!   arguments or 3 + 4n ("response rewrites must consist only of a name rule with
//!   3 arguments and one or more answer rules with 3 arguments each"), so CoreDNS
//!   refuses the reload and a restarted CoreDNS does not start: cluster DNS is down;
//! - without it the regex rule rewrites the question and leaves the answers' owner
//!   name the hairpin Service's (v1.8.3 gives a regex rule an inactive response
//!   rule), which glibc's resolver and Go's discard as not matching the question:
//!   the wildcard names would stop resolving at all, worse than not rewritten (they
//!   then resolve to the LoadBalancer as before, without the hairpin).
//!
//! So below v1.8.4, or when the version cannot be read, wildcard rewrites are held
//! back and said so, and exact ones are written: `rewrite name exact FROM TO` has no
//! option and its answer is rewritten back to FROM in every release (v1.8.3's
//! `exactNameRule` carries an active response rule; later ones set auto).
//! "Unknown" counts as old because the two mistakes are not alike: writing a rule
//! the running CoreDNS cannot parse takes DNS down for every pod, holding a
//! wildcard back only costs those names the hairpin.

use std::fmt;

use k8s_openapi::api::apps::v1::Deployment;

use super::ObjectName;
use crate::names::corefile::Rewrite;

/// A CoreDNS release number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

/// The first CoreDNS whose rewrite plugin accepts `answer auto` (coredns/coredns#4473).
pub(crate) const ANSWER_AUTO_SINCE: Version = Version {
    major: 1,
    minor: 8,
    patch: 4,
};

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Version {
    /// The version in an image reference's tag: `registry.k8s.io/coredns/coredns:v1.11.1`,
    /// `rancher/mirrored-coredns-coredns:1.10.1`, EKS's `…/eks/coredns:v1.8.7-eksbuild.2`,
    /// AKS's `…/coredns:v1.9.4-hotfix.20240704`, with or without `@sha256:…`.
    /// `None` without a tag, for `latest`, or for a tag that does not start with
    /// `MAJOR.MINOR.PATCH` (an optional `v` first, then only a `-` or `+` suffix).
    pub(crate) fn from_image(image: &str) -> Option<Version> {
        let name = image.split('@').next()?;
        // A `:` before the last `/` is a registry port, not a tag.
        let (_, tag) = name.rsplit_once(':')?;
        if tag.contains('/') {
            return None;
        }
        let tag = tag.strip_prefix('v').unwrap_or(tag);
        let end = tag.find(['-', '+']).unwrap_or(tag.len());
        let mut parts = tag[..end].split('.');
        let mut number = || -> Option<u32> {
            let p = parts.next()?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok()
        };
        let version = Version {
            major: number()?,
            minor: number()?,
            patch: number()?,
        };
        parts.next().is_none().then_some(version)
    }
}

/// What the CoreDNS Deployment says about the running CoreDNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Its image names this version.
    Version {
        /// The image reference read.
        image: String,
        /// Its version.
        version: Version,
    },
    /// The version could not be read; why, naming the object and field.
    Unknown(String),
}

/// Reads the CoreDNS container's image from Deployment `o` (already fetched, or
/// `None` when it does not exist). The container is the one named `coredns`, else
/// the only one whose image's repository name contains `coredns`.
pub(crate) fn from_deployment(o: &ObjectName, deployment: Option<&Deployment>) -> Found {
    let Some(d) = deployment else {
        return Found::Unknown(format!("Deployment {o}: not found"));
    };
    let containers = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers.as_slice())
        .unwrap_or_default();
    let repo_is_coredns = |image: &str| {
        let repo = image.split('@').next().unwrap_or(image);
        let last = repo.rsplit('/').next().unwrap_or(repo);
        last.split(':').next().unwrap_or(last).contains("coredns")
    };
    let by_image: Vec<_> = containers
        .iter()
        .filter(|c| c.image.as_deref().is_some_and(repo_is_coredns))
        .collect();
    let container = containers
        .iter()
        .find(|c| c.name == "coredns")
        .or(match by_image.as_slice() {
            [one] => Some(*one),
            _ => None,
        });
    let Some(c) = container else {
        let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
        return Found::Unknown(format!(
            "Deployment {o}: spec.template.spec.containers: expected a container named coredns \
             or exactly one with a coredns image, found {names:?}"
        ));
    };
    let image = c.image.clone().unwrap_or_default();
    match Version::from_image(&image) {
        Some(version) => Found::Version { image, version },
        None => Found::Unknown(format!(
            "Deployment {o}: container {} image {image:?}: expected a version tag such as v1.11.1",
            c.name
        )),
    }
}

/// The rewrites this CoreDNS can take, and a warning naming what was held back:
/// every rewrite from [`ANSWER_AUTO_SINCE`] on; below it or when unknown, the
/// exact ones only (see the module docs for why).
pub(crate) fn usable(rewrites: Vec<Rewrite>, found: &Found) -> (Vec<Rewrite>, Option<String>) {
    let why = match found {
        Found::Version { version, .. } if *version >= ANSWER_AUTO_SINCE => {
            return (rewrites, None);
        }
        Found::Version { image, version } => format!(
            "CoreDNS {version} (image {image}) is older than {ANSWER_AUTO_SINCE}, the first whose rewrite \
             plugin accepts `answer auto` (an older one refuses the whole Corefile)"
        ),
        Found::Unknown(reason) => format!(
            "the CoreDNS version is unknown ({reason}), and a CoreDNS older than {ANSWER_AUTO_SINCE} \
             refuses the whole Corefile over `answer auto`"
        ),
    };
    let (wildcards, exact): (Vec<Rewrite>, Vec<Rewrite>) =
        rewrites.into_iter().partition(|r| r.host().is_wildcard());
    if wildcards.is_empty() {
        return (exact, None);
    }
    const SHOWN: usize = 5;
    let mut names: Vec<String> = wildcards
        .iter()
        .take(SHOWN)
        .map(|r| r.host().to_string())
        .collect();
    if wildcards.len() > SHOWN {
        names.push(format!("and {} more", wildcards.len() - SHOWN));
    }
    let fix = match found {
        Found::Version { .. } => format!("upgrade CoreDNS to {ANSWER_AUTO_SINCE} or later"),
        Found::Unknown(_) => "give the CoreDNS Deployment a version tag, or name its ConfigMap \
                              with --coredns-configmap (the Deployment is looked up by the same \
                              namespace/name)"
            .to_string(),
    };
    let message = format!(
        "{} wildcard name(s) not rewritten in CoreDNS ({}): {why}; exact names are rewritten; {fix}",
        wildcards.len(),
        names.join(", ")
    );
    (exact, Some(message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::hostname::Hostname;

    fn v(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn versions_are_read_from_image_tags() {
        for (image, want) in [
            ("registry.k8s.io/coredns/coredns:v1.11.1", Some(v(1, 11, 1))),
            ("rancher/mirrored-coredns-coredns:1.10.1", Some(v(1, 10, 1))),
            (
                "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/coredns:v1.8.7-eksbuild.2",
                Some(v(1, 8, 7)),
            ),
            (
                "mcr.microsoft.com/oss/kubernetes/coredns:v1.9.4-hotfix.20240704",
                Some(v(1, 9, 4)),
            ),
            ("coredns/coredns:1.8.3@sha256:abc123", Some(v(1, 8, 3))),
            ("localhost:5000/coredns:v1.12.0", Some(v(1, 12, 0))),
            ("docker.io/coredns/coredns:1.8.4+build", Some(v(1, 8, 4))),
            ("localhost:5000/coredns", None),
            ("coredns/coredns", None),
            ("coredns/coredns:latest", None),
            ("coredns/coredns@sha256:abc123", None),
            ("coredns/coredns:1.8", None),
            ("coredns/coredns:1.8.4.1", None),
            ("coredns/coredns:v1..4", None),
            ("coredns/coredns:1.x.4", None),
            ("", None),
        ] {
            assert_eq!(Version::from_image(image), want, "{image}");
        }
        assert!(v(1, 8, 4) >= ANSWER_AUTO_SINCE && v(1, 10, 0) > v(1, 9, 4));
        assert!(v(1, 8, 3) < ANSWER_AUTO_SINCE && v(0, 9, 9) < ANSWER_AUTO_SINCE);
        assert_eq!(ANSWER_AUTO_SINCE.to_string(), "1.8.4");
    }

    fn deployment(containers: &[(&str, &str)]) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "spec": {
                "selector": {},
                "template": {"spec": {"containers": containers
                    .iter()
                    .map(|(name, image)| serde_json::json!({"name": name, "image": image}))
                    .collect::<Vec<_>>()}}
            }
        }))
        .expect("deployment")
    }

    #[test]
    fn the_coredns_container_is_found_by_name_or_image() {
        let o: ObjectName = "kube-system/coredns".parse().expect("name");
        let found = |c: &[(&str, &str)]| from_deployment(&o, Some(&deployment(c)));
        assert_eq!(
            found(&[("coredns", "registry.k8s.io/coredns/coredns:v1.11.1")]),
            Found::Version {
                image: "registry.k8s.io/coredns/coredns:v1.11.1".into(),
                version: v(1, 11, 1)
            }
        );
        // RKE2's chart names its container after the chart.
        assert!(matches!(
            found(&[
                ("autoscaler", "rancher/hardened-cluster-autoscaler:v1.8.10"),
                ("rke2-coredns", "rancher/hardened-coredns:v1.11.1-build20240305"),
            ]),
            Found::Version { version, .. } if version == v(1, 11, 1)
        ));
        assert_eq!(
            found(&[("a", "x/coredns:1.9.0"), ("b", "y/coredns:1.10.0")]),
            Found::Unknown(
                "Deployment kube-system/coredns: spec.template.spec.containers: expected a \
                 container named coredns or exactly one with a coredns image, found [\"a\", \"b\"]"
                    .into()
            )
        );
        assert_eq!(
            found(&[("coredns", "coredns/coredns:latest")]),
            Found::Unknown(
                "Deployment kube-system/coredns: container coredns image \"coredns/coredns:latest\": \
                 expected a version tag such as v1.11.1"
                    .into()
            )
        );
        assert_eq!(
            from_deployment(&o, None),
            Found::Unknown("Deployment kube-system/coredns: not found".into())
        );
    }

    fn rw(host: &str) -> Rewrite {
        Rewrite::new(
            Hostname::parse(host).expect("host"),
            Hostname::parse("hairpin.hairpin-system.svc.cluster.local").expect("target"),
        )
        .expect("rewrite")
    }

    #[test]
    fn wildcards_are_held_back_below_1_8_4_or_when_unknown() {
        let all = vec![rw("a.example.com"), rw("*.apps.example.com")];
        let at = |version| Found::Version {
            image: format!("coredns/coredns:{version}"),
            version,
        };
        assert_eq!(usable(all.clone(), &at(v(1, 8, 4))), (all.clone(), None));
        assert_eq!(usable(all.clone(), &at(v(1, 11, 1))), (all.clone(), None));

        let (kept, warning) = usable(all.clone(), &at(v(1, 8, 3)));
        assert_eq!(kept, vec![rw("a.example.com")]);
        assert_eq!(
            warning.as_deref(),
            Some(
                "1 wildcard name(s) not rewritten in CoreDNS (*.apps.example.com): CoreDNS 1.8.3 \
                 (image coredns/coredns:1.8.3) is older than 1.8.4, the first whose rewrite plugin \
                 accepts `answer auto` (an older one refuses the whole Corefile); exact names are \
                 rewritten; upgrade CoreDNS to 1.8.4 or later"
            )
        );
        let (kept, warning) = usable(
            all,
            &Found::Unknown("Deployment kube-system/coredns: not found".into()),
        );
        assert_eq!(kept, vec![rw("a.example.com")]);
        let warning = warning.expect("warning");
        assert!(
            warning.contains(
                "the CoreDNS version is unknown (Deployment kube-system/coredns: not found)"
            ) && warning.contains("--coredns-configmap"),
            "{warning}"
        );
        // Nothing held back, nothing to say, whatever the version.
        assert_eq!(
            usable(vec![rw("a.example.com")], &at(v(1, 6, 0))),
            (vec![rw("a.example.com")], None)
        );
        let many: Vec<Rewrite> = (0..7).map(|i| rw(&format!("*.w{i}.example.com"))).collect();
        let (kept, warning) = usable(many, &at(v(1, 7, 0)));
        assert!(kept.is_empty());
        assert!(warning.expect("warning").starts_with("7 wildcard name(s) not rewritten in CoreDNS (*.w0.example.com, *.w1.example.com, *.w2.example.com, *.w3.example.com, *.w4.example.com, and 2 more)"));
    }
}
