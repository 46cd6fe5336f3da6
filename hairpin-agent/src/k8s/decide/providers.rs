//! The cloud providers' own PROXY-protocol annotations on Services, as data.
//!
//! Each row says which annotation a provider's cloud controller manager (CCM) reads, which
//! values turn the PROXY protocol on, which header version that provider's load balancer then
//! sends, and where the fact comes from. Where a fact could not be confirmed the row says so
//! in `confidence`, and a decision that relies on such a row carries a warning telling the
//! operator to pin the version with `hairpin.dev/proxy-protocol`.
//!
//! Not in the table, on purpose:
//! - Exoscale: the exoscale-cloud-controller-manager annotation list (strategy, protocol,
//!   name, health checks, instance pool) has no PROXY-protocol setting; its Network Load
//!   Balancer passes packets through with the client address kept, so nothing needs a header.
//!   Source: <https://github.com/exoscale/exoscale-cloud-controller-manager> (docs/service-loadbalancer.md).
//! - OVHcloud: Managed Kubernetes on Kubernetes >= 1.32 uses the "Public Cloud Load Balancer",
//!   which is OpenStack Octavia driven by the OpenStack CCM, so the OpenStack row covers it
//!   (<https://support.us.ovhcloud.com/hc/en-us/articles/32583163140755>). The older
//!   "Load Balancer for Managed Kubernetes" annotations were not confirmed and are left out.
//! - UpCloud and GKE/AKS: not researched here / no PROXY-protocol annotation known.

use crate::model::ProxyVersion;

/// How well a row's facts are backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confidence {
    /// Read in the provider's CCM source or its official docs.
    High,
    /// The annotation is confirmed; the header version comes from secondary evidence.
    Medium,
    /// The header version could not be confirmed; decisions using it carry a warning.
    Unconfirmed,
}

/// How a row's annotation value is read. Each variant mirrors the provider CCM's own parsing,
/// so hairpin agrees with the load balancer the CCM actually configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueRule {
    /// Go `strconv.ParseBool`: `1 t T TRUE true True` turn PROXY on for every port; the false
    /// spellings turn it off; anything else is ignored by the CCM (so: off, with a warning).
    GoBool(ProxyVersion),
    /// Exact values that turn PROXY on; every other value is off (the CCM's `default:` branch).
    Exact(&'static [(&'static str, ProxyVersion)]),
    /// Like `Exact`, compared lowercase, but `none` is an explicit off and other values are
    /// rejected by the CCM (Linode).
    NoneOrVersion,
    /// Scaleway: a Go bool (except `1`/`0`, which are port numbers there), `*` for every port,
    /// or a comma-separated list of Service ports.
    BoolStarOrPorts(ProxyVersion),
    /// A comma-separated feature list that turns PROXY on when it holds this token (IBM).
    FeatureToken(&'static str, ProxyVersion),
    /// AWS: `*` turns it on; classic ELBs send v1, NLBs (`aws-load-balancer-type: nlb` or
    /// `external`, or `loadBalancerClass: service.k8s.aws/nlb`) send v2.
    AwsStar,
    /// AWS Load Balancer Controller target group attributes (`k=v,k=v`):
    /// `proxy_protocol_v2.enabled=true` turns v2 on.
    AwsTargetGroupAttributes,
    /// Linode per-port JSON (`{"proxy-protocol": "v2", ...}`) under `<key><port>`.
    LinodePortJson,
}

/// One provider annotation that can turn the PROXY protocol on.
#[derive(Clone, Copy, Debug)]
pub struct ProviderAnnotation {
    /// The provider, as shown in `status` and Events.
    pub provider: &'static str,
    /// The annotation key (for `LinodePortJson`, the prefix before the port number).
    pub key: &'static str,
    /// How the value is read.
    pub rule: ValueRule,
    /// The values that mean "on", for humans (`status`, docs).
    pub on_values: &'static str,
    /// The version the provider's LB sends, for humans.
    pub version: &'static str,
    /// Where the facts come from.
    pub source: &'static str,
    /// How well the facts are backed.
    pub confidence: Confidence,
}

const AWS_LB_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
const AWS_NLB_CLASS: &str = "service.k8s.aws/nlb";

/// Whether an AWS Service gets a Network Load Balancer (v2 only) rather than a classic ELB (v1 only).
pub(crate) fn aws_is_nlb(
    annotations: &std::collections::BTreeMap<String, String>,
    class: Option<&str>,
) -> bool {
    let lb_type = annotations
        .get(AWS_LB_TYPE)
        .map(|v| v.trim().to_ascii_lowercase());
    matches!(lb_type.as_deref(), Some("nlb" | "external" | "nlb-ip"))
        || class == Some(AWS_NLB_CLASS)
}

/// The table. Order matters twice: within a provider the first row that speaks for a port wins
/// (Linode: per-port JSON, then the default, then the deprecated key, as its CCM does); across
/// providers the first provider with any annotation present decides, with a warning if others
/// are present too (charts often carry several clouds' annotations at once).
pub const PROVIDER_ANNOTATIONS: &[ProviderAnnotation] = &[
    ProviderAnnotation {
        provider: "DigitalOcean",
        key: "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol",
        rule: ValueRule::GoBool(ProxyVersion::V1),
        on_values: "true",
        version: "v1 (DigitalOcean LBs implement v1 only; no v2 setting exists)",
        source: "https://github.com/digitalocean/digitalocean-cloud-controller-manager/blob/master/docs/controllers/services/annotations.md ; https://docs.digitalocean.com/glossary/proxy/",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Hetzner",
        key: "load-balancer.hetzner.cloud/uses-proxyprotocol",
        rule: ValueRule::GoBool(ProxyVersion::V1),
        on_values: "true (strconv.ParseBool)",
        // The key and its parsing are in hcloud-cloud-controller-manager
        // internal/annotation/load_balancer.go and name.go. The version is not stated in the
        // docs found; users' reports show the text header (`PROXY TCP4 ...`). HCCM >= v1.21
        // also sets ipMode: Proxy when PROXY is on, which hairpin then skips.
        version: "v1 (from user reports of the text header)",
        source: "https://github.com/hetznercloud/hcloud-cloud-controller-manager/blob/main/internal/annotation/load_balancer.go ; https://blog.bitahoy.com/kubernetes/loadbalancer/2022/09/09/kubernetes-proxy-protocol.html",
        confidence: Confidence::Medium,
    },
    ProviderAnnotation {
        provider: "AWS",
        key: "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol",
        rule: ValueRule::AwsStar,
        on_values: "*",
        version: "v1 on classic ELB, v2 on NLB",
        source: "https://kubernetes-sigs.github.io/aws-load-balancer-controller/latest/guide/service/annotations/ ; https://github.com/kubernetes/kubernetes/pull/24569",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "AWS",
        key: "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes",
        rule: ValueRule::AwsTargetGroupAttributes,
        on_values: "proxy_protocol_v2.enabled=true in the list",
        version: "v2",
        source: "https://kubernetes-sigs.github.io/aws-load-balancer-controller/latest/guide/service/annotations/",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "OpenStack",
        key: "loadbalancer.openstack.org/proxy-protocol",
        // getProxyProtocolFromServiceAnnotation: "true"|"v1" -> PROXY, "v2" -> PROXYV2, else none.
        rule: ValueRule::Exact(&[
            ("true", ProxyVersion::V1),
            ("v1", ProxyVersion::V1),
            ("v2", ProxyVersion::V2),
        ]),
        on_values: "true | v1 | v2",
        version: "v1 for true/v1, v2 for v2",
        source: "https://github.com/kubernetes/cloud-provider-openstack/blob/master/pkg/openstack/loadbalancer.go (getProxyProtocolFromServiceAnnotation)",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Scaleway",
        key: "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v1",
        rule: ValueRule::BoolStarOrPorts(ProxyVersion::V1),
        on_values: "true | * | comma-separated Service ports",
        version: "v1",
        source: "https://github.com/scaleway/scaleway-cloud-controller-manager/blob/master/docs/loadbalancer-annotations.md",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Scaleway",
        key: "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v2",
        rule: ValueRule::BoolStarOrPorts(ProxyVersion::V2),
        on_values: "true | * | comma-separated Service ports",
        version: "v2",
        source: "https://github.com/scaleway/scaleway-cloud-controller-manager/blob/master/docs/loadbalancer-annotations.md",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Scaleway",
        // Deprecated; the CCM reads it only when neither of the two above enables a port.
        key: "service.beta.kubernetes.io/scw-loadbalancer-send-proxy-v2",
        rule: ValueRule::BoolStarOrPorts(ProxyVersion::V2),
        on_values: "true | comma-separated Service ports",
        version: "v2",
        source: "https://github.com/scaleway/scaleway-cloud-controller-manager/blob/master/scaleway/loadbalancers.go (getSendProxyV2)",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Linode",
        key: "service.beta.kubernetes.io/linode-loadbalancer-port-",
        rule: ValueRule::LinodePortJson,
        on_values: "{\"proxy-protocol\": \"v1\" | \"v2\"} under linode-loadbalancer-port-<port>",
        version: "as given",
        source: "https://github.com/linode/linode-cloud-controller-manager/blob/main/docs/configuration/annotations.md",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Linode",
        key: "service.beta.kubernetes.io/linode-loadbalancer-default-proxy-protocol",
        rule: ValueRule::NoneOrVersion,
        on_values: "v1 | v2 (none = off)",
        version: "as given",
        source: "https://github.com/linode/linode-cloud-controller-manager/blob/main/docs/configuration/annotations.md",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Linode",
        // Deprecated in favour of default-proxy-protocol, still read after it.
        key: "service.beta.kubernetes.io/linode-loadbalancer-proxy-protocol",
        rule: ValueRule::NoneOrVersion,
        on_values: "v1 | v2 (none = off)",
        version: "as given",
        source: "https://github.com/linode/linode-cloud-controller-manager/blob/main/docs/configuration/annotations.md",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "IBM",
        key: "service.kubernetes.io/ibm-load-balancer-cloud-provider-enable-features",
        // The VPC CCM sets the pool's proxy protocol to v1 ("we don't support v2"). VPC ALBs
        // publish a hostname, so such Services are usually skipped as hostname-only anyway.
        rule: ValueRule::FeatureToken("proxy-protocol", ProxyVersion::V1),
        on_values: "a feature list containing proxy-protocol",
        version: "v1",
        source: "https://cloud.ibm.com/docs/containers?topic=containers-vpc-lbaas ; IBM cloud-provider-vpc-controller pool setup (LoadBalancerPoolProxyProtocolV1Const)",
        confidence: Confidence::Medium,
    },
    ProviderAnnotation {
        provider: "Civo",
        key: "kubernetes.civo.com/loadbalancer-enable-proxy-protocol",
        rule: ValueRule::Exact(&[
            ("send-proxy", ProxyVersion::V1),
            ("send-proxy-v2", ProxyVersion::V2),
        ]),
        on_values: "send-proxy | send-proxy-v2",
        version: "v1 for send-proxy, v2 for send-proxy-v2",
        source: "https://github.com/civo/civo-cloud-controller-manager (loadbalancer tests) ; https://www.civo.com/docs/kubernetes/load-balancers",
        confidence: Confidence::High,
    },
    ProviderAnnotation {
        provider: "Vultr",
        key: "service.beta.kubernetes.io/vultr-loadbalancer-proxy-protocol",
        rule: ValueRule::GoBool(ProxyVersion::V1),
        on_values: "true (strconv.ParseBool)",
        version: "unconfirmed; assumed v1",
        source: "https://github.com/vultr/vultr-cloud-controller-manager/blob/master/vultr/loadbalancers.go (getProxyProtocol)",
        confidence: Confidence::Unconfirmed,
    },
    ProviderAnnotation {
        provider: "Oracle Cloud",
        key: "service.beta.kubernetes.io/oci-load-balancer-connection-proxy-protocol-version",
        rule: ValueRule::Exact(&[("1", ProxyVersion::V1), ("2", ProxyVersion::V2)]),
        on_values: "1 | 2",
        version: "as given",
        source: "https://github.com/oracle/oci-cloud-controller-manager/blob/master/pkg/cloudprovider/providers/oci/load_balancer_spec.go",
        confidence: Confidence::Medium,
    },
    ProviderAnnotation {
        provider: "Oracle Cloud",
        key: "oci-network-load-balancer.oraclecloud.com/is-ppv2-enabled",
        rule: ValueRule::GoBool(ProxyVersion::V2),
        on_values: "true",
        version: "v2",
        source: "https://docs.oracle.com/en-us/iaas/Content/ContEng/Tasks/contengconfiguringloadbalancersnetworkloadbalancers-subtopic.htm",
        confidence: Confidence::High,
    },
];
