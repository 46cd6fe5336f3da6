//! What hairpin decided for one Service, in a shape `status` and a Kubernetes Event can use
//! directly: the frontends, why anything was left out, warnings, and which rule decided.

use std::fmt;

use crate::{
    model::{Frontend, Origin, ProxyVersion, ServiceName},
    status::{self, DecisionState},
};

use super::annotations::AnnotationError;

/// The largest Event message the API server accepts (`note` is limited to 1 KiB).
const EVENT_MESSAGE_MAX: usize = 1024;

/// Which rule turned the PROXY protocol on or off for a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Our own `hairpin.dev/proxy-protocol` annotation.
    Annotation,
    /// A cloud provider's annotation(s) from the provider table.
    Provider {
        /// The provider's name (`DigitalOcean`, `Hetzner`, ...).
        provider: &'static str,
        /// The annotation keys found on the Service.
        annotations: Vec<String>,
    },
    /// The agent-wide default (`Defaults::proxy_protocol`).
    Default,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Annotation => f.write_str("annotation hairpin.dev/proxy-protocol"),
            Rule::Provider {
                provider,
                annotations,
            } => {
                write!(f, "{provider} annotation {}", annotations.join(", "))
            }
            Rule::Default => f.write_str("the agent-wide default"),
        }
    }
}

/// Why a Service, one of its load-balancer ingress entries, or one of its ports was not proxied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// `spec.type` is not `LoadBalancer`.
    NotLoadBalancer,
    /// The rule that decided says PROXY is off.
    ProxyProtocolOff,
    /// `status.loadBalancer.ingress` is empty: the LB is not provisioned yet.
    NoLoadBalancerStatus,
    /// An ingress entry has a hostname but no IP (AWS ELB/NLB, IBM VPC ALB, ...); connects go
    /// through DNS to the real LB, which adds the header itself.
    HostnameOnly,
    /// An ingress entry has `ipMode: Proxy`; kube-proxy leaves it alone, traffic goes via the LB.
    IpModeProxy,
    /// An ingress entry's `ip` does not parse as an IP address.
    InvalidIngressIp,
    /// An ingress entry's IP is one no LoadBalancer may have (loopback, link-local,
    /// this node, a cluster IP, outside `--lb-cidrs`): redirecting it would take over
    /// traffic that is not the LoadBalancer's.
    UnsafeIngressIp,
    /// A port is UDP or SCTP; the PROXY header is a TCP thing here.
    NotTcp,
    /// A port number outside 1..=65535 (the API server rejects these; a hand-made or
    /// fake object may not).
    InvalidPort,
    /// A port was left out by `hairpin.dev/ports` or by the provider's own port selection.
    PortNotSelected,
    /// Another Service claims the same (IP, port) with a different version and won.
    Conflict,
    /// Past `--max-frontends-per-namespace` (the namespace's older frontends keep
    /// their place) or `--max-frontends` (shared round robin between namespaces).
    FrontendCap,
    /// Nothing was left to proxy once ingress entries and ports were filtered.
    NothingToProxy,
}

impl SkipReason {
    /// A stable CamelCase name for Event reasons and machine output.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SkipReason::NotLoadBalancer => "SkippedNotLoadBalancer",
            SkipReason::ProxyProtocolOff => "SkippedProxyProtocolOff",
            SkipReason::NoLoadBalancerStatus => "SkippedNoLoadBalancerStatus",
            SkipReason::HostnameOnly => "SkippedHostnameOnly",
            SkipReason::IpModeProxy => "SkippedIpModeProxy",
            SkipReason::InvalidIngressIp => "SkippedInvalidIngressIp",
            SkipReason::UnsafeIngressIp => "SkippedUnsafeIngressIp",
            SkipReason::NotTcp => "SkippedNotTcp",
            SkipReason::InvalidPort => "SkippedInvalidPort",
            SkipReason::PortNotSelected => "SkippedPortNotSelected",
            SkipReason::Conflict => "SkippedConflict",
            SkipReason::FrontendCap => "SkippedFrontendCap",
            SkipReason::NothingToProxy => "SkippedNothingToProxy",
        }
    }
}

/// One thing left out, with a sentence for humans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// Machine-readable reason.
    pub reason: SkipReason,
    /// Human sentence naming what was skipped and why.
    pub message: String,
}

/// The overall result for a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// At least one frontend is proxied.
    Proxied,
    /// Nothing is proxied, for this reason.
    Skipped(SkipReason),
    /// An annotation of ours is invalid; the Service is skipped until it is fixed.
    Invalid(AnnotationError),
}

/// What hairpin decided for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The Service.
    pub service: ServiceName,
    /// The overall result.
    pub outcome: Outcome,
    /// The frontends to proxy, sorted.
    pub frontends: Vec<Frontend>,
    /// The rule that decided on or off; `None` when the Service was skipped before that.
    pub rule: Option<Rule>,
    /// Ingress entries and ports left out, each with its reason.
    pub skips: Vec<Skip>,
    /// Things an operator should look at that did not stop the decision.
    pub warnings: Vec<String>,
}

impl Decision {
    /// A decision for `service` that proxies nothing yet.
    pub(crate) fn new(service: ServiceName) -> Decision {
        Decision {
            service,
            outcome: Outcome::Proxied,
            frontends: Vec::new(),
            rule: None,
            skips: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The decision as `/status` lists it.
    pub fn to_status(&self) -> status::Decision {
        status::Decision {
            object: Origin::Service(self.service.clone()).to_string(),
            state: match self.outcome {
                Outcome::Proxied => DecisionState::Proxied,
                Outcome::Skipped(_) => DecisionState::Skipped,
                Outcome::Invalid(_) => DecisionState::Invalid,
            },
            reason: self.reason().to_string(),
            message: self.summary(),
        }
    }

    /// A stable CamelCase string for a Kubernetes Event's `reason`.
    pub fn reason(&self) -> &'static str {
        match &self.outcome {
            Outcome::Proxied => "Proxied",
            Outcome::Skipped(reason) => reason.as_str(),
            Outcome::Invalid(_) => "InvalidAnnotation",
        }
    }

    /// Whether the Event should be `Warning` rather than `Normal`.
    pub fn is_warning(&self) -> bool {
        matches!(self.outcome, Outcome::Invalid(_))
            || matches!(
                self.outcome,
                Outcome::Skipped(
                    SkipReason::Conflict | SkipReason::UnsafeIngressIp | SkipReason::FrontendCap
                )
            )
            || self.skips.iter().any(|s| {
                matches!(
                    s.reason,
                    SkipReason::UnsafeIngressIp | SkipReason::FrontendCap
                )
            })
            || !self.warnings.is_empty()
    }

    /// One message fit for an Event: what happens, why, and any warnings, at most 1 KiB.
    pub fn summary(&self) -> String {
        let mut text = match &self.outcome {
            Outcome::Proxied => {
                let versions: Vec<ProxyVersion> = {
                    let mut v: Vec<_> = self.frontends.iter().map(|f| f.version).collect();
                    v.dedup();
                    v
                };
                let list: Vec<String> = self
                    .frontends
                    .iter()
                    .map(|f| {
                        format!(
                            "{} ({})",
                            std::net::SocketAddr::new(f.ip, f.port),
                            f.version
                        )
                    })
                    .collect();
                let version = match versions.as_slice() {
                    [one] => format!("PROXY {one}"),
                    _ => "PROXY headers".to_string(),
                };
                let rule = self
                    .rule
                    .as_ref()
                    .map_or(String::new(), |r| format!(", decided by {r}"));
                format!(
                    "hairpin adds {version} to in-cluster connections to {}{rule}",
                    list.join(", ")
                )
            }
            Outcome::Skipped(reason) => {
                // The skip that carries the overall reason says it best; ports skipped on the
                // way there are details.
                let why = self
                    .skips
                    .iter()
                    .find(|s| s.reason == *reason)
                    .or(self.skips.last())
                    .map_or("no reason recorded", |s| s.message.as_str());
                format!("hairpin does not proxy this Service: {why}")
            }
            Outcome::Invalid(error) => format!("hairpin skips this Service: {error}"),
        };
        if matches!(self.outcome, Outcome::Proxied) && !self.skips.is_empty() {
            let skipped: Vec<&str> = self.skips.iter().map(|s| s.message.as_str()).collect();
            text.push_str(&format!("; skipped: {}", skipped.join("; ")));
        }
        if !self.warnings.is_empty() {
            text.push_str(&format!("; warning: {}", self.warnings.join("; ")));
        }
        truncate(text, EVENT_MESSAGE_MAX)
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut cut = max.saturating_sub(3);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str("...");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_char_boundaries_and_the_limit() {
        let text = "é".repeat(800);
        let cut = truncate(text, EVENT_MESSAGE_MAX);
        assert!(cut.len() <= EVENT_MESSAGE_MAX && cut.ends_with("..."));
        assert_eq!(truncate("short".into(), EVENT_MESSAGE_MAX), "short");
    }

    #[test]
    fn reasons_are_stable_camel_case() {
        assert_eq!(SkipReason::IpModeProxy.as_str(), "SkippedIpModeProxy");
        let d = Decision {
            service: ServiceName::new("a", "b"),
            outcome: Outcome::Proxied,
            frontends: vec![],
            rule: None,
            skips: vec![],
            warnings: vec![],
        };
        assert_eq!(d.reason(), "Proxied");
        assert!(!d.is_warning());
    }
}
