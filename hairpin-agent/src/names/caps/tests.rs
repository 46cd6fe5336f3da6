use std::net::IpAddr;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::*;
use crate::{
    model::{Frontend, Frontends, ProxyVersion},
    names::{
        claims::{Claim, NameSkipReason},
        corefile::{self, MAX_COREFILE_BYTES, Rewrite},
        hosts::{self, HostsBlock, MAX_HOSTS_FILE_BYTES},
        routes::resolve,
        scope::NameScope,
    },
};

const LB: &str = "203.0.113.10";

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + second).expect("timestamp"))
}

fn host(s: &str) -> Hostname {
    Hostname::parse(s).expect("hostname")
}

/// An Ingress `ns/name` created at `created` (seconds) naming `hosts` on [`LB`].
fn ingress(ns: &str, name: &str, created: Option<i64>, hosts: &[&str]) -> Vec<Claim> {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| Claim {
            created: created.map(at),
            source: format!("Ingress {ns}/{name}"),
            object: Some(ObjectId {
                api_version: "networking.k8s.io/v1".into(),
                kind: "Ingress".into(),
                namespace: ns.into(),
                name: name.into(),
                uid: None,
            }),
            field: format!("spec.rules[{i}].host"),
            host: host(h),
            lbs: vec![LB.parse().expect("ip")],
        })
        .collect()
}

/// `n` Ingresses in `ns`, one name each (`{prefix}{i}.example.com`), created a
/// second apart from `from`.
fn many(ns: &str, prefix: &str, n: usize, from: i64) -> Vec<Claim> {
    (0..n)
        .flat_map(|i| {
            ingress(
                ns,
                &format!("{prefix}{i}"),
                Some(from + i as i64),
                &[&format!("{prefix}{i}.example.com")],
            )
        })
        .collect()
}

/// A frontend, through serde so that fields added with a default need no change here.
fn frontend(ip: &str, version: ProxyVersion, source: &str) -> Frontend {
    serde_json::from_value(serde_json::json!({
        "ip": ip, "port": 443, "version": version, "source": {"file": {"path": source}},
    }))
    .expect("frontend")
}

fn frontends() -> Frontends {
    let mut set = Frontends::new();
    set.insert(frontend(LB, ProxyVersion::V1, "Service ingress/nginx"))
        .expect("frontend");
    set
}

fn scope(per_namespace: usize, total: usize) -> NameScope {
    NameScope::new(&["example.com"], "cluster.local")
        .expect("scope")
        .with_caps(NameCaps {
            per_namespace,
            total,
        })
}

fn published(routes: &crate::names::routes::NameRoutes) -> Vec<String> {
    routes.routes.iter().map(|r| r.host.to_string()).collect()
}

fn count_in(routes: &crate::names::routes::NameRoutes, prefix: &str) -> usize {
    routes
        .routes
        .iter()
        .filter(|r| r.host.as_str().starts_with(prefix))
        .count()
}

#[test]
fn a_namespace_over_its_cap_withholds_only_its_own_newest_names() {
    let mut claims = many("tenant-a", "a", 10, 0);
    // tenant-b's names are newer than all of tenant-a's: still untouched.
    claims.extend(many("tenant-b", "b", 2, 100));
    let got = resolve(claims, &frontends(), &scope(3, 100));
    assert_eq!(
        published(&got),
        [
            "a0.example.com",
            "a1.example.com",
            "a2.example.com",
            "b0.example.com",
            "b1.example.com"
        ]
    );
    assert_eq!(got.limits.withheld, 7);
    assert_eq!(
        got.limits.withheld_by_namespace,
        BTreeMap::from([("tenant-a".to_owned(), 7)])
    );
    assert_eq!(
        (got.limits.max_names_per_namespace, got.limits.max_names),
        (3, 100)
    );
    let capped: Vec<_> = got
        .skips
        .iter()
        .filter(|s| s.reason == NameSkipReason::Capped(CapRule::Namespace))
        .collect();
    assert_eq!(capped.len(), 7, "{:?}", got.skips);
    // The skip names the object, the field, the namespace and the rule, and is a
    // Warning Event on that object.
    let first = capped[0];
    assert_eq!(
        first.message,
        "Ingress tenant-a/a3: spec.rules[0].host: host a3.example.com withheld (rule \
         max-names-per-namespace): namespace tenant-a already publishes 3 older names, \
         the most --max-names-per-namespace allows"
    );
    assert_eq!(first.object.as_ref().map(|o| o.name.as_str()), Some("a3"));
    assert_eq!(
        first.reason.warning_rule(),
        Some("HostnameNamespaceCapReached")
    );
}

#[test]
fn the_global_cap_is_shared_round_robin_so_a_big_namespace_cannot_starve_the_others() {
    // tenant-a is the oldest and asks for 100 names; b and c ask for 3 each.
    let mut claims = many("tenant-a", "a", 100, 0);
    claims.extend(many("tenant-b", "b", 3, 1000));
    claims.extend(many("tenant-c", "c", 3, 2000));
    let got = resolve(claims, &frontends(), &scope(200, 10));
    assert_eq!(got.routes.len(), 10);
    assert_eq!(count_in(&got, "b"), 3, "{:?}", published(&got));
    assert_eq!(count_in(&got, "c"), 3, "{:?}", published(&got));
    assert_eq!(count_in(&got, "a"), 4, "{:?}", published(&got));
    assert_eq!(
        got.limits.withheld_by_namespace,
        BTreeMap::from([("tenant-a".to_owned(), 96)])
    );
    let global = got
        .skips
        .iter()
        .find(|s| s.reason == NameSkipReason::Capped(CapRule::Global))
        .expect("a global cap skip");
    assert!(
        global.message.contains("(rule max-names)")
            && global
                .message
                .contains("namespace tenant-a publishes 4 of them"),
        "{}",
        global.message
    );
    assert_eq!(
        global.reason.warning_rule(),
        Some("HostnameGlobalCapReached")
    );

    // Ten namespaces of 5 under a cap of 12: every namespace keeps one, then the
    // round that does not fit goes to its oldest names.
    let mut claims = Vec::new();
    for n in 0..10 {
        claims.extend(many(&format!("ns{n}"), &format!("n{n}x"), 5, n * 10));
    }
    let got = resolve(claims, &frontends(), &scope(200, 12));
    assert_eq!(got.routes.len(), 12);
    for n in 0..10 {
        let kept = count_in(&got, &format!("n{n}x"));
        let want = if n < 2 { 2 } else { 1 };
        assert_eq!(kept, want, "ns{n}: {:?}", published(&got));
    }
}

#[test]
fn the_order_is_by_age_then_name_whatever_order_the_claims_come_in() {
    let mut claims = many("tenant-a", "a", 6, 0);
    // A name claimed by an old and a new object counts at its oldest claim.
    claims.extend(ingress("tenant-a", "late", Some(500), &["a5.example.com"]));
    // Two objects created in the same second: by name.
    claims.extend(ingress("tenant-a", "same-1", Some(1), &["zz.example.com"]));
    // No creationTimestamp: after every dated one.
    claims.extend(ingress("tenant-a", "undated", None, &["aa.example.com"]));
    let expect = [
        "a0.example.com",
        "a1.example.com",
        "zz.example.com",
        "a2.example.com",
    ];
    let forward = resolve(claims.clone(), &frontends(), &scope(4, 100));
    claims.reverse();
    let backward = resolve(claims.clone(), &frontends(), &scope(4, 100));
    let mut want: Vec<&str> = expect.to_vec();
    want.sort_unstable();
    assert_eq!(published(&forward), want);
    assert_eq!(forward, backward);

    // An object that flaps (deleted, created again: now the newest) moves to the
    // back of its own namespace; the other namespace's names stay as they were.
    let mut claims = many("tenant-a", "a", 4, 0);
    claims.extend(many("tenant-b", "b", 3, 10));
    let before = resolve(claims.clone(), &frontends(), &scope(3, 100));
    let flapped: Vec<Claim> = claims
        .into_iter()
        .map(|mut c| {
            if c.source == "Ingress tenant-a/a0" {
                c.created = Some(at(10_000));
            }
            c
        })
        .collect();
    let after = resolve(flapped, &frontends(), &scope(3, 100));
    let b = |r: &crate::names::routes::NameRoutes| {
        published(r)
            .into_iter()
            .filter(|h| h.starts_with('b'))
            .collect::<Vec<_>>()
    };
    assert_eq!(b(&before), b(&after));
    assert!(published(&before).contains(&"a0.example.com".to_owned()));
    assert!(!published(&after).contains(&"a0.example.com".to_owned()));
    assert!(published(&after).contains(&"a3.example.com".to_owned()));
}

#[test]
fn names_refused_or_not_proxied_do_not_count_and_a_withheld_name_cannot_win_a_conflict() {
    // tenant-a's oldest claims: refused (not under example.com) and on an LB that
    // is not proxied. Neither takes a slot.
    let mut claims = ingress("tenant-a", "refused", Some(0), &["x.example.org"]);
    let mut unproxied = ingress("tenant-a", "plain", Some(1), &["plain.example.com"]);
    unproxied[0].lbs = vec!["203.0.113.99".parse().expect("ip")];
    claims.extend(unproxied);
    claims.extend(many("tenant-a", "a", 2, 10));
    // tenant-a's third name, past its cap of 2, is also asked for by an older
    // object on another (proxied) LB in tenant-b: tenant-b keeps it, since the
    // withheld claim never reaches the conflict.
    let mut frontends = frontends();
    frontends
        .insert(frontend(
            "203.0.113.11",
            ProxyVersion::V2,
            "Service other/lb",
        ))
        .expect("frontend");
    claims.extend(ingress(
        "tenant-a",
        "third",
        Some(20),
        &["shared.example.com"],
    ));
    let mut b = ingress("tenant-b", "b", Some(30), &["shared.example.com"]);
    b[0].lbs = vec!["203.0.113.11".parse::<IpAddr>().expect("ip")];
    claims.extend(b);
    let got = resolve(claims, &frontends, &scope(2, 100));
    let shared: Vec<_> = got
        .routes
        .iter()
        .filter(|r| r.host.as_str() == "shared.example.com")
        .map(|r| (r.lb.to_string(), r.source.clone()))
        .collect();
    assert_eq!(
        shared,
        [("203.0.113.11".to_owned(), "Ingress tenant-b/b".to_owned())]
    );
    assert_eq!(count_in(&got, "a"), 2);
    assert_eq!(got.limits.withheld, 1);
    assert!(
        !got.skips
            .iter()
            .any(|s| s.reason == NameSkipReason::Conflict),
        "{:?}",
        got.skips
    );
}

#[test]
fn names_from_the_frontends_file_count_under_their_own_pseudo_namespace() {
    let claims: Vec<Claim> = (0..5)
        .map(|i| Claim {
            created: None,
            source: "file frontends.yaml (nginx)".into(),
            object: None,
            field: format!("frontends[0].hosts[{i}]"),
            host: host(&format!("f{i}.example.com")),
            lbs: vec![LB.parse().expect("ip")],
        })
        .chain(many("tenant-a", "a", 2, 0))
        .collect();
    let got = resolve(claims, &frontends(), &scope(3, 100));
    assert_eq!(count_in(&got, "f"), 3);
    assert_eq!(count_in(&got, "a"), 2);
    assert_eq!(
        got.limits.withheld_by_namespace,
        BTreeMap::from([(FRONTENDS_FILE_NAMESPACE.to_owned(), 2)])
    );
    let skip = got
        .skips
        .iter()
        .find(|s| matches!(s.reason, NameSkipReason::Capped(_)))
        .expect("skip");
    assert!(skip.object.is_none());
    assert!(
        skip.message
            .contains("namespace (frontends file) already publishes 3"),
        "{}",
        skip.message
    );
}

#[test]
fn withhold_counts_a_name_once_per_namespace_and_in_each_namespace_claiming_it() {
    let a = host("a.example.com");
    let b = host("b.example.com");
    let w = withhold(
        [
            ("x", &a, Some(&at(0))),
            ("x", &a, Some(&at(5))),
            ("x", &b, Some(&at(1))),
            ("y", &a, Some(&at(2))),
        ],
        NameCaps {
            per_namespace: 1,
            total: 10,
        },
    );
    assert_eq!(w.rule("x", &a), None);
    assert_eq!(w.rule("x", &b), Some(CapRule::Namespace));
    assert_eq!(w.rule("y", &a), None);
    assert_eq!(
        w.kept,
        BTreeMap::from([("x".to_owned(), 1), ("y".to_owned(), 1)])
    );
}

/// The 1 MiB limit of both files (issue 14): at the default `--max-names`, the
/// longest lines a tenant can make cannot fill either.
#[test]
fn at_the_default_global_cap_the_worst_case_hosts_block_and_corefile_stay_under_1_mib() {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let tag = |i: usize| -> String {
        [i / 1296, (i / 36) % 36, i % 36]
            .iter()
            .map(|&d| ALNUM[d] as char)
            .collect()
    };

    // /etc/hosts: exact names of 253 characters, to the longest relay address.
    let relay: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"
        .parse()
        .expect("ip");
    assert_eq!(relay.to_string().len(), 39);
    let longest = |i: usize| {
        let first = format!("{}{}", tag(i), "a".repeat(60));
        let name = format!(
            "{first}.{}.{}.{}.com",
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(57)
        );
        assert_eq!(name.len(), 253);
        host(&name)
    };
    let (block, _) = HostsBlock::from_entries((0..DEFAULT_MAX_NAMES).map(|i| (relay, longest(i))));
    assert_eq!(block.len(), DEFAULT_MAX_NAMES);
    let written = hosts::apply(b"", &block).expect("block fits");
    // 2,000 lines of 294 bytes, and the two marker lines.
    assert_eq!(written.len(), 588_072);
    assert!(written.len() < MAX_HOSTS_FILE_BYTES);

    // The Corefile: wildcards over as many dots as a name can hold (each escaped
    // in the regex), to the default --coredns-target, in a CRLF Corefile.
    let target = host("hairpin.hairpin-system.svc.cluster.local");
    let dotted = |i: usize| {
        // `*.` + 3 tag characters + 124 one-letter labels: 253 characters.
        let t = tag(i);
        let mut name = format!(
            "*.{}",
            t.chars().map(String::from).collect::<Vec<_>>().join(".")
        );
        while name.len() < 251 {
            name.push_str(".q");
        }
        name.push_str(".z");
        assert_eq!(name.len(), 253, "{name}");
        host(&name)
    };
    let rewrites: Vec<Rewrite> = (0..DEFAULT_MAX_NAMES)
        .map(|i| Rewrite::new(dotted(i), target.clone()).expect("rewrite"))
        .collect();
    let base = ".:53 {\r\n    errors\r\n    forward . /etc/resolv.conf\r\n}\r\n";
    let edited = corefile::apply(base, &rewrites).expect("edit");
    let added = edited.len() - base.len();
    // 2,000 lines of at most 484 bytes.
    assert_eq!(added, 968_000);
    assert!(
        added < MAX_COREFILE_BYTES - 64 * 1024,
        "{added} bytes leave under 64 KiB for the rest of the Corefile"
    );
    let import = corefile::render_import(&rewrites);
    assert!(import.len() < added);
}
