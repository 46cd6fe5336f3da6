//! Provider value parsing, row by row, against what each CCM does.

use super::*;

fn eval(pairs: &[(&str, &str)], class: Option<&str>) -> Option<ProviderSelection> {
    let notes = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    evaluate("ns/svc", &notes, class, &[80, 443])
}

fn ports(selection: &ProviderSelection) -> Vec<(i32, ProxyVersion)> {
    selection.ports.iter().map(|(p, v)| (*p, *v)).collect()
}

#[test]
fn no_provider_annotation_means_no_selection() {
    assert_eq!(eval(&[("unrelated/annotation", "true")], None), None);
}

#[test]
fn go_bool_spellings_follow_strconv_parse_bool() {
    for on in ["1", "t", "T", "TRUE", "true", "True"] {
        let s = eval(
            &[("load-balancer.hetzner.cloud/uses-proxyprotocol", on)],
            None,
        )
        .expect("hetzner");
        assert_eq!(s.ports.len(), 2, "{on}");
    }
    let s = eval(
        &[("load-balancer.hetzner.cloud/uses-proxyprotocol", "yes")],
        None,
    )
    .expect("hetzner");
    assert!(s.ports.is_empty());
    assert!(
        s.warnings[0].contains("does not accept"),
        "{:?}",
        s.warnings
    );
}

#[test]
fn aws_star_is_v1_on_classic_elb_and_v2_on_nlb() {
    let key = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
    let classic = eval(&[(key, "*")], None).expect("aws");
    assert_eq!(
        ports(&classic),
        [(80, ProxyVersion::V1), (443, ProxyVersion::V1)]
    );
    let nlb = eval(
        &[
            (key, "*"),
            ("service.beta.kubernetes.io/aws-load-balancer-type", "nlb"),
        ],
        None,
    );
    assert_eq!(nlb.expect("aws").ports[&443], ProxyVersion::V2);
    let class = eval(&[(key, "*")], Some("service.k8s.aws/nlb")).expect("aws");
    assert_eq!(class.ports[&80], ProxyVersion::V2);
}

#[test]
fn scaleway_reads_one_and_zero_as_ports_and_both_lists_conflict() {
    let v1 = "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v1";
    let v2 = "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v2";
    assert!(eval(&[(v1, "1")], None).expect("scw").ports.is_empty());
    let s = eval(&[(v1, "false"), (v2, "*")], None).expect("scw");
    assert_eq!(ports(&s), [(80, ProxyVersion::V2), (443, ProxyVersion::V2)]);
    let both = eval(&[(v1, "80, 443"), (v2, "443")], None).expect("scw");
    assert_eq!(
        ports(&both),
        [(80, ProxyVersion::V1), (443, ProxyVersion::V1)]
    );
    assert!(
        both.warnings
            .iter()
            .any(|w| w.contains("port 443 is PROXY v1")),
        "{:?}",
        both.warnings
    );
}

#[test]
fn linode_per_port_beats_default_beats_deprecated() {
    let s = eval(
        &[
            (
                "service.beta.kubernetes.io/linode-loadbalancer-port-443",
                r#"{"proxy-protocol":"v1"}"#,
            ),
            (
                "service.beta.kubernetes.io/linode-loadbalancer-default-proxy-protocol",
                "none",
            ),
            (
                "service.beta.kubernetes.io/linode-loadbalancer-proxy-protocol",
                "v2",
            ),
        ],
        None,
    )
    .expect("linode");
    assert_eq!(ports(&s), [(443, ProxyVersion::V1)]);
    let bad = eval(
        &[(
            "service.beta.kubernetes.io/linode-loadbalancer-proxy-protocol",
            "v3",
        )],
        None,
    );
    assert!(bad.expect("linode").warnings[0].contains("expected none, v1 or v2"));
}

#[test]
fn ibm_feature_list_and_aws_target_group_attributes() {
    let ibm = eval(
        &[(
            "service.kubernetes.io/ibm-load-balancer-cloud-provider-enable-features",
            "nlb, proxy-protocol",
        )],
        None,
    );
    assert_eq!(ibm.expect("ibm").ports[&80], ProxyVersion::V1);
    let tg = "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
    assert_eq!(
        eval(&[(tg, "stickiness.enabled=true")], None)
            .expect("aws")
            .ports
            .len(),
        0
    );
    assert_eq!(
        eval(&[(tg, "proxy_protocol_v2.enabled=true")], None)
            .expect("aws")
            .ports[&443],
        ProxyVersion::V2
    );
}

#[test]
fn several_providers_and_unconfirmed_versions_warn() {
    let s = eval(
        &[
            (
                "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol",
                "true",
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol",
                "*",
            ),
        ],
        None,
    )
    .expect("two providers");
    assert_eq!(s.provider, "DigitalOcean");
    assert!(
        s.warnings[0].contains("DigitalOcean, AWS"),
        "{:?}",
        s.warnings
    );
    let vultr = eval(
        &[(
            "service.beta.kubernetes.io/vultr-loadbalancer-proxy-protocol",
            "true",
        )],
        None,
    );
    assert!(vultr.expect("vultr").warnings[0].contains("not confirmed"));
}

#[test]
fn every_row_is_documented() {
    for row in PROVIDER_ANNOTATIONS {
        assert!(row.source.starts_with("https://"), "{}", row.key);
        assert!(
            !row.on_values.is_empty() && !row.version.is_empty(),
            "{}",
            row.key
        );
    }
}
