use super::*;

#[test]
fn a_datapath_ttl_below_five_beats_is_refused() {
    assert_eq!(parse_datapath_ttl("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_datapath_ttl("5s"), Ok(Duration::from_secs(5)));
    let e = parse_datapath_ttl("2s").expect_err("2 s");
    assert!(e.starts_with("2s is shorter than 5 heartbeats"), "{e}");
    assert!(parse_datapath_ttl("soon").is_err());
}

#[test]
fn nat64_prefixes_take_only_the_lengths_rfc_6052_defines() {
    assert_eq!(
        parse_nat64_prefix("2001:db8:64:aa::/64")
            .expect("a /64")
            .to_string(),
        "2001:db8:64:aa::/64"
    );
    let e = parse_nat64_prefix("2001:db8::/36").expect_err("a /36");
    assert!(e.contains("32, 40, 48, 56, 64 or 96"), "{e}");
    let e = parse_nat64_prefix("10.0.0.0/8").expect_err("IPv4");
    assert!(e.contains("expected an IPv6 network"), "{e}");
}

#[test]
fn ports_parse_and_empty_or_off_means_none() {
    assert_eq!(parse_ports("80,443"), Ok(Ports(vec![80, 443])));
    assert_eq!(parse_ports(""), Ok(Ports(vec![])));
    assert_eq!(parse_ports("off"), Ok(Ports(vec![])));
    assert!(
        parse_ports("80,http")
            .expect_err("named port")
            .contains("\"http\"")
    );
    assert!(parse_ports("0").is_err());
}

#[test]
fn service_port_pairs_parse_and_bad_ones_say_what_was_expected() {
    assert_eq!(
        parse_port_map("80=880, 443=843"),
        Ok(PortMap(vec![(80, 880), (443, 843)]))
    );
    assert_eq!(parse_port_map("off"), Ok(PortMap(vec![])));
    assert_eq!(parse_port_map(""), Ok(PortMap(vec![])));
    let e = parse_port_map("80:880").expect_err("wrong separator");
    assert!(
        e.contains("SERVICE=LISTEN") && e.contains("\"80:880\""),
        "{e}"
    );
    assert!(parse_port_map("80=0").is_err());
    // The listeners sit on the node IP: only privileged ports, which no uid
    // without CAP_NET_BIND_SERVICE can take while the agent restarts.
    let e = parse_port_map("80=10080").expect_err("unprivileged listen port");
    assert!(e.contains("10080") && e.contains("below 1024"), "{e}");
    assert!(
        parse_port_map("80=880,443=880")
            .expect_err("same listen port")
            .contains("880")
    );
}

#[test]
fn marks_parse_in_hex_and_decimal_and_zero_is_refused() {
    assert_eq!(parse_mark("0x68"), Ok(0x68));
    assert_eq!(parse_mark("104"), Ok(104));
    assert!(parse_mark("0").is_err());
    assert!(parse_mark("0xzz").is_err());
}

#[test]
fn the_default_mark_reads_back_as_the_programs_default_and_shows_in_hex() {
    assert_eq!(DEFAULT_BYPASS_MARK_ARG, format!("{DEFAULT_BYPASS_MARK:#x}"));
    assert_eq!(parse_mark(DEFAULT_BYPASS_MARK_ARG), Ok(DEFAULT_BYPASS_MARK));
    assert_eq!(
        [0, 0xf, 0x10, 0x68, u32::MAX].map(hex_len),
        [3, 3, 4, 4, 10]
    );
    assert_eq!(&hex_text::<3>(0), b"0x0");
    assert_eq!(&hex_text::<4>(0x10), b"0x10");
    assert_eq!(&hex_text::<10>(0xffff_0000), b"0xffff0000");
}
