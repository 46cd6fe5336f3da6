use super::*;

fn h(s: &str) -> Hostname {
    Hostname::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// The scope of a node `ip-10-0-0-1.ec2.internal`-style cluster with a custom host
/// name and an API server reached by name.
fn scope() -> NameScope {
    NameScope::new(
        &["example.com", "shop.example.org", "example.corp"],
        "cluster.local",
    )
    .expect("valid scope")
    .refuse_own(
        "worker-1.nodes.example.com",
        ScopeRule::NodeName,
        "this node's name",
    )
    .refuse_own("worker-1", ScopeRule::NodeName, "this node's host name")
    .refuse_own(
        "api.k8s.example.com",
        ScopeRule::ApiServer,
        "the API server's host",
    )
    .refuse_own("10.0.0.1", ScopeRule::ApiServer, "the API server's host")
}

fn rule(scope: &NameScope, name: &str) -> Option<ScopeRule> {
    scope.check(&h(name)).err().map(|r| r.rule)
}

#[test]
fn names_under_a_listed_domain_are_published() {
    let s = scope();
    for name in [
        "example.com",
        "shop.example.com",
        "*.apps.example.com",
        "shop.example.org",
        "a.shop.example.org",
        "*.a.shop.example.org",
        "app.example.corp",
        // `svc` as the first label is a host, not a Service name.
        "svc.example.com",
        // Near misses of refused names.
        "mylocalhost.example.com",
        "localhost-proxy.example.com",
        "metadata.example.com",
        "cluster.local.example.com",
    ] {
        assert_eq!(rule(&s, name), None, "{name}");
    }
}

#[test]
fn names_outside_the_listed_domains_are_refused_naming_the_domains() {
    let s = scope();
    for name in [
        "registry-1.docker.io",
        "example.org",
        "www.example.org",
        "notexample.com",
        "*.example.org",
        "example.com.evil.net",
    ] {
        assert_eq!(rule(&s, name), Some(ScopeRule::OutsideDomains), "{name}");
    }
    let r = s.check(&h("registry-1.docker.io")).expect_err("outside");
    assert_eq!(
        r.message,
        "host registry-1.docker.io refused (rule outside-domains): it is not under a domain \
         listed in --names-domains; expected a name under example.com, example.corp, shop.example.org"
    );
}

#[test]
fn an_empty_list_publishes_nothing_and_says_so() {
    let s = NameScope::new::<&str>(&[], "cluster.local").expect("empty is valid");
    assert_eq!(rule(&s, "shop.example.com"), Some(ScopeRule::NoDomains));
    assert_eq!(rule(&s, "*.apps.example.com"), Some(ScopeRule::NoDomains));
    assert_eq!(
        s.describe(),
        "none: --names-domains is empty, no names are published"
    );
    // Blank entries (a trailing comma, an empty env value) list nothing either.
    let blank = NameScope::new(&["", " "], "cluster.local").expect("blank");
    assert!(blank.domains().is_empty());
    // Always-refused names still name their own rule.
    assert_eq!(rule(&s, "localhost"), Some(ScopeRule::Localhost));
}

#[test]
fn the_cluster_domain_and_service_names_are_refused() {
    let s = scope();
    for name in [
        "kubernetes.default.svc.cluster.local",
        "api.tenant-b.svc.cluster.local",
        "*.tenant-b.svc.cluster.local",
        "cluster.local",
        "*.cluster.local",
        "10-0-0-1.default.pod.cluster.local",
    ] {
        assert_eq!(rule(&s, name), Some(ScopeRule::ClusterDomain), "{name}");
    }
    for name in [
        "kubernetes.default.svc",
        "*.svc",
        "api.tenant-b.svc",
        "api.tenant-b.svc.corp",
        "*.svc.example.com",
        "x.svc.example.com",
    ] {
        assert_eq!(rule(&s, name), Some(ScopeRule::ServiceName), "{name}");
    }
    // Another cluster domain moves the rule with it.
    let corp = NameScope::new(&["example.com"], "k8s.corp").expect("scope");
    assert_eq!(
        rule(&corp, "a.b.pod.k8s.corp"),
        Some(ScopeRule::ClusterDomain)
    );
    assert_eq!(
        rule(&corp, "kubernetes.default.svc.cluster.local"),
        Some(ScopeRule::ServiceName)
    );
    let r = s
        .check(&h("kubernetes.default.svc.cluster.local"))
        .expect_err("cluster domain");
    assert_eq!(
        r.message,
        "host kubernetes.default.svc.cluster.local refused (rule cluster-domain): names in the \
         cluster domain cluster.local belong to Services and Pods; expected a name outside cluster.local"
    );
}

#[test]
fn localhost_and_loopback_names_are_refused() {
    let s = scope();
    for name in [
        "localhost",
        "LOCALHOST.",
        "*.localhost",
        "app.localhost",
        "localhost.localdomain",
        "localhost6.localdomain6",
    ] {
        assert_eq!(rule(&s, name), Some(ScopeRule::Localhost), "{name}");
    }
}

#[test]
fn single_label_names_are_refused() {
    let s = scope();
    for name in ["intranet", "ip6-localhost", "corp", "*.corp", "*.internal"] {
        assert_eq!(rule(&s, name), Some(ScopeRule::SingleLabel), "{name}");
    }
}

#[test]
fn the_nodes_own_names_and_the_api_server_are_refused() {
    let s = scope();
    assert_eq!(
        rule(&s, "worker-1.nodes.example.com"),
        Some(ScopeRule::NodeName)
    );
    // A wildcard covering the node name steers it too.
    assert_eq!(rule(&s, "*.nodes.example.com"), Some(ScopeRule::NodeName));
    assert_eq!(rule(&s, "worker-2.nodes.example.com"), None);
    assert_eq!(rule(&s, "api.k8s.example.com"), Some(ScopeRule::ApiServer));
    assert_eq!(rule(&s, "*.k8s.example.com"), Some(ScopeRule::ApiServer));
    let r = s.check(&h("worker-1.nodes.example.com")).expect_err("node");
    assert_eq!(
        r.message,
        "host worker-1.nodes.example.com refused (rule node-name): worker-1.nodes.example.com is \
         this node's name; expected a name other than worker-1.nodes.example.com"
    );
}

#[test]
fn metadata_endpoints_and_cloud_internal_zones_are_refused() {
    let s = scope();
    for name in [
        "metadata.google.internal",
        "metadata",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "ip-10-0-0-2.ec2.internal",
        "ip-10-0-0-2.eu-west-1.compute.internal",
        "*.google.internal",
        "metadata.azure.com",
        "*.azure.com",
        "metadata.tencentyun.com",
    ] {
        assert_eq!(rule(&s, name), Some(ScopeRule::Metadata), "{name}");
    }
}

#[test]
fn public_suffixes_and_wildcards_directly_under_them_are_refused() {
    let s = scope();
    for name in [
        "*.com",
        "*.co.uk",
        "*.github.io",
        "co.uk",
        "github.io",
        "*.home.arpa",
        // A PSL wildcard rule (*.ck): every second-level name is a suffix.
        "foo.ck",
    ] {
        assert_eq!(rule(&s, name), Some(ScopeRule::PublicSuffix), "{name}");
    }
    // A registrable domain under them is not a suffix (it is outside the domains here).
    assert_eq!(rule(&s, "*.example.co.uk"), Some(ScopeRule::OutsideDomains));
    assert_eq!(
        rule(&s, "*.user.github.io"),
        Some(ScopeRule::OutsideDomains)
    );
    let r = s.check(&h("*.co.uk")).expect_err("suffix");
    assert_eq!(
        r.message,
        "host *.co.uk refused (rule public-suffix): it is a wildcard directly under the public \
         suffix co.uk; expected a name under a registrable domain (example.com, not com)"
    );
}

#[test]
fn the_issue_names_are_all_refused_even_when_their_domains_are_listed() {
    // An operator listing too much still cannot publish these.
    let s = NameScope::new(&["docker.io", "example.com"], "cluster.local").expect("scope");
    assert_eq!(rule(&s, "localhost"), Some(ScopeRule::Localhost));
    assert_eq!(
        rule(&s, "kubernetes.default.svc.cluster.local"),
        Some(ScopeRule::ClusterDomain)
    );
    assert_eq!(
        rule(&s, "metadata.google.internal"),
        Some(ScopeRule::Metadata)
    );
    // Listed on purpose: the operator's choice.
    assert_eq!(rule(&s, "registry-1.docker.io"), None);
}

#[test]
fn listed_domains_are_validated_once_naming_the_flag() {
    let err = |d: &str| {
        NameScope::new(&[d], "cluster.local")
            .expect_err(d)
            .to_string()
    };
    assert_eq!(
        err("com"),
        "--names-domains \"com\": expected a domain names may be published under, but it is \
         refused itself: host com refused (rule public-suffix): com is a public suffix; expected \
         a name under a registrable domain (example.com, not com)"
    );
    assert!(err("co.uk").contains("rule public-suffix"));
    assert!(err("cluster.local").contains("rule cluster-domain"));
    assert!(err("svc.cluster.local").contains("rule cluster-domain"));
    assert!(err("localhost").contains("rule localhost"));
    assert!(err("google.internal").contains("rule metadata-endpoint"));
    assert!(err("corp").contains("rule single-label"));
    assert!(err("*.com").contains("rule public-suffix"));
    assert!(err("a b.com").starts_with("--names-domains \"a b.com\": hostname"));
    let e = NameScope::new(&["example.com"], "bad_domain")
        .expect_err("cluster domain")
        .to_string();
    assert!(e.starts_with("--cluster-domain \"bad_domain\""), "{e}");
    // Normalised, deduplicated, sorted.
    let s = NameScope::new(
        &["Shop.Example.org.", "example.com", "example.com"],
        "cluster.local",
    )
    .expect("scope");
    assert_eq!(s.domains(), ["example.com", "shop.example.org"]);
    assert_eq!(
        s.describe(),
        "names under example.com, shop.example.org are published"
    );
}

#[test]
fn own_names_that_are_addresses_or_not_names_are_passed_over() {
    let s = NameScope::new(&["example.com"], "cluster.local")
        .expect("scope")
        .refuse_own("10.0.0.1", ScopeRule::ApiServer, "the API server's host")
        .refuse_own("", ScopeRule::NodeName, "this node's name")
        .refuse_own("a_b", ScopeRule::NodeName, "this node's name");
    assert_eq!(
        s,
        NameScope::new(&["example.com"], "cluster.local").expect("scope")
    );
}

/// Issue 22: `*.example.com` under a listed `example.com` would answer for every
/// name of the domain no object claims (hosts outside the cluster included):
/// refused unless the operator lists the wildcard itself, which also lists the
/// domain.
#[test]
fn a_wildcard_directly_over_a_listed_domain_needs_listing_itself() {
    let s = scope();
    for name in ["*.example.com", "*.shop.example.org", "*.example.corp"] {
        assert_eq!(
            rule(&s, name),
            Some(ScopeRule::WildcardOverDomain),
            "{name}"
        );
    }
    let r = s.check(&h("*.example.com")).expect_err("refused");
    assert_eq!(
        r.message,
        "host *.example.com refused (rule wildcard-over-domain): it is a wildcard directly over \
         the listed domain example.com: it would answer for every name of example.com no object \
         claims, hosts outside the cluster included; expected exact names, a wildcard under a \
         subdomain (*.apps.example.com), or *.example.com listed in --names-domains by the operator"
    );
    assert_eq!(
        ScopeRule::WildcardOverDomain.event_reason(),
        "HostnameRefusedWildcardOverDomain"
    );
    let listed = NameScope::new(&["*.example.com", "example.org"], "cluster.local").expect("scope");
    assert_eq!(listed.domains(), ["example.com", "example.org"]);
    assert_eq!(
        rule(&listed, "*.example.com"),
        None,
        "listed by the operator"
    );
    assert_eq!(
        rule(&listed, "shop.example.com"),
        None,
        "the domain is listed with it"
    );
    assert_eq!(
        rule(&listed, "*.example.org"),
        Some(ScopeRule::WildcardOverDomain)
    );
    assert_eq!(
        listed.describe(),
        "names under example.com, example.org are published (and the wildcards *.example.com)"
    );
    // A listed wildcard is checked as its domain is.
    for bad in ["*.co.uk", "*.cluster.local", "*.svc.example.com"] {
        assert!(NameScope::new(&[bad], "cluster.local").is_err(), "{bad}");
    }
}
