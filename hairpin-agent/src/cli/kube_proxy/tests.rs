use super::*;

const IPTABLES: &str = include_str!("../../../tests/fixtures/kube-proxy/iptables-save-nat.txt");
const NFT: &str = include_str!("../../../tests/fixtures/kube-proxy/nft-ruleset.txt");

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[test]
fn iptables_mode_lists_cluster_and_loadbalancer_ips_with_their_comments() {
    let (chain, rules) = parse_iptables_save(IPTABLES);
    assert!(chain);
    let lb: Vec<_> = rules
        .iter()
        .filter(|r| r.ip == ip("203.0.113.10"))
        .collect();
    assert_eq!(lb.len(), 1);
    assert_eq!(lb[0].port, Some(80));
    assert_eq!(lb[0].mode, Mode::Iptables);
    assert_eq!(
        lb[0].rule,
        "ingress-nginx/ingress-nginx-controller:http loadbalancer IP"
    );
    let ips: Vec<String> = rules.iter().map(|r| r.ip.to_string()).collect();
    assert_eq!(
        ips,
        ["10.96.0.1", "10.96.0.10", "10.96.118.40", "203.0.113.10"]
    );
    // The nodeports jump has no -d: not a destination.
    assert!(rules.iter().all(|r| r.port.is_some()));
}

#[test]
fn iptables_without_kube_proxy_has_no_chain_and_no_rules() {
    let text = "*nat\n:PREROUTING ACCEPT [0:0]\n-A POSTROUTING -o eth0 -j MASQUERADE\nCOMMIT\n";
    assert_eq!(parse_iptables_save(text), (false, vec![]));
}

#[test]
fn quoted_comments_stay_one_word() {
    assert_eq!(
        shell_words(r#"-d 1.2.3.4/32 -m comment --comment "a b:c loadbalancer IP" -j X"#),
        [
            "-d",
            "1.2.3.4/32",
            "-m",
            "comment",
            "--comment",
            "a b:c loadbalancer IP",
            "-j",
            "X"
        ]
    );
}

#[test]
fn nftables_mode_reads_service_ips_elements_of_kube_proxy_tables_only() {
    let (table, rules) = parse_nft_ruleset(NFT);
    assert!(table);
    let found: Vec<(String, Option<u16>)> =
        rules.iter().map(|r| (r.ip.to_string(), r.port)).collect();
    assert_eq!(
        found,
        [
            ("10.96.0.1".to_string(), Some(443)),
            ("10.96.118.40".to_string(), Some(80)),
            ("203.0.113.10".to_string(), Some(80)),
            ("203.0.113.10".to_string(), Some(443)),
            ("2001:db8:ffff::10".to_string(), Some(80)),
        ],
        "udp elements and other tables are not kube-proxy tcp frontends"
    );
    assert!(rules[2].rule.starts_with("external-CG5I4G2R-ingress-nginx"));
    assert_eq!(parse_nft_ruleset("table ip filter {\n}\n"), (false, vec![]));
}

#[test]
fn ipvs_addresses_cover_every_port() {
    let text = "7: kube-ipvs0    inet 10.96.0.1/32 scope global kube-ipvs0\\       valid_lft forever preferred_lft forever\n\
                7: kube-ipvs0    inet 203.0.113.10/32 scope global kube-ipvs0\\       valid_lft forever preferred_lft forever\n\
                7: kube-ipvs0    inet6 2001:db8:ffff::10/128 scope global \\       valid_lft forever preferred_lft forever\n";
    let rules = parse_ipvs_addrs(text);
    assert_eq!(rules.len(), 3);
    let kp = KubeProxy {
        modes: vec![Mode::Ipvs],
        rules,
        notes: vec![],
        read: true,
    };
    assert_eq!(kp.matching(ip("203.0.113.10"), 8443).len(), 1);
    assert!(kp.matching(ip("203.0.113.11"), 80).is_empty());
}

#[test]
fn matching_honours_ports() {
    let (_, rules) = parse_iptables_save(IPTABLES);
    let kp = KubeProxy {
        modes: vec![Mode::Iptables],
        rules,
        notes: vec![],
        read: true,
    };
    assert_eq!(kp.matching(ip("203.0.113.10"), 80).len(), 1);
    assert!(kp.matching(ip("203.0.113.10"), 81).is_empty());
}
