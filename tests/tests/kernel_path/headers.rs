//! The header the kernel writes: its bytes (equal to the relay's encoder), v1 and v2,
//! IPv4 and IPv6, read by nginx and haproxy; with only the DaemonSet's capabilities;
//! in one segment with the first write; and destinations that are not proxied.

use super::*;

#[test]
fn pod_and_node_requests_get_the_header_from_the_kernel_v1_v2_v4_v6() {
    require_privileges!();
    let (node, _nginx, agent) = kernel_path_node();
    let cases = [
        ("203.0.113.10", POD_IP4, NODE_UPLINK4),
        ("2001:db8:ffff::10", POD_IP6, NODE_UPLINK6),
        ("203.0.113.12", POD_IP4, NODE_UPLINK4),
        ("2001:db8:ffff::12", POD_IP6, NODE_UPLINK6),
    ];
    for (lb, pod_ip, node_ip) in cases {
        let pod = from_pod(&node, &url(lb, 80, "/"));
        assert_true_client("pod", &pod, pod_ip, lb, &agent);
        let host = from_host(&node, &url(lb, 80, "/"));
        assert_true_client("node", &host, node_ip, lb, &agent);
    }
    let access = eventually(
        || nginx_access_log(&node),
        |a| a.lines().count() == 2 * cases.len(),
    );
    assert_eq!(access.lines().count(), 2 * cases.len(), "{access}");
    assert!(!nginx_error_log(&node).contains("broken header"));
    // The kernel wrote every header: the relay accepted nothing and no connect was
    // rewritten to it.
    assert!(
        !agent.log().contains("accepted"),
        "the relay must not see these:\n{}",
        agent.log()
    );
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 8, "{s}");
    assert_eq!(kernel_counter(&s, "redirected"), 0, "{s}");
    assert_no_misses(&s);
    // Every socket that entered the sockets map left it: the fill the connect
    // programs compare with the map's limit is back to zero.
    assert_eq!(kernel_counter(&s, "kernel_sockets_entered"), 8, "{s}");
    assert_eq!(wait_counter(&node, "kernel_sockets_left", 8), 8, "{s}");
}

#[test]
fn a_dual_stack_socket_reaching_an_ipv4_lb_through_a_mapped_address_gets_a_tcp4_header() {
    require_privileges!();
    let (node, _nginx, agent) = kernel_path_node();
    // curl opens an AF_INET6 socket for ::ffff:203.0.113.10: connect6 marks it with
    // the IPv4 frontend, and its (mapped) local address becomes a TCP4 source.
    let target = "http://[::ffff:203.0.113.10]:80/";
    assert_true_client(
        "pod",
        &from_pod(&node, target),
        POD_IP4,
        "203.0.113.10",
        &agent,
    );
    assert_true_client(
        "node",
        &from_host(&node, target),
        NODE_UPLINK4,
        "203.0.113.10",
        &agent,
    );
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 2, "{s}");
    assert_no_misses(&s);
}

#[test]
fn haproxy_accept_proxy_takes_the_kernels_v1_and_v2_headers() {
    require_privileges!();
    let node = SimNode::new();
    let haproxy = start_haproxy(&node);
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    // 203.0.113.11 is proxied with v1, 2001:db8:ffff::11 with v2.
    for (lb, pod_ip, node_ip) in [
        ("203.0.113.11", POD_IP4, NODE_UPLINK4),
        ("2001:db8:ffff::11", POD_IP6, NODE_UPLINK6),
    ] {
        assert_true_client(
            "pod",
            &from_pod(&node, &url(lb, 80, "/")),
            pod_ip,
            lb,
            &agent,
        );
        assert_true_client(
            "node",
            &from_host(&node, &url(lb, 80, "/")),
            node_ip,
            lb,
            &agent,
        );
    }
    let needles = [
        format!("haproxy client={POD_IP4}:"),
        format!("haproxy client={NODE_UPLINK4}:"),
        format!("haproxy client={POD_IP6}:"),
        format!("haproxy client={NODE_UPLINK6}:"),
        "dst=203.0.113.11:80 status=200".to_string(),
        "dst=2001:db8:ffff::11:80 status=200".to_string(),
    ];
    let log = eventually(|| haproxy.log(), |l| needles.iter().all(|n| l.contains(n)));
    for needle in &needles {
        assert!(log.contains(needle), "haproxy log lacks {needle:?}:\n{log}");
    }
    assert!(!agent.log().contains("accepted"), "{}", agent.log());
}

#[test]
fn the_kernels_header_bytes_equal_the_relays_encoder() {
    require_privileges!();
    let node = capture_node();
    let agent = Agent::start_with(&node, &capture_specs(), KERNEL_PATH_ON);
    assert_capture_headers_equal_the_relays_encoder(&node, || agent.log());
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_no_misses(&s);
}

#[test]
fn with_only_the_daemonsets_capabilities_the_kernel_path_loads_and_writes_v1_and_v2_headers() {
    require_privileges!();
    let node = capture_node();
    let agent = CappedAgent::start(&node, &capture_specs(), KERNEL_PATH_ON, &DAEMONSET_CAPS);
    let want = DAEMONSET_CAPS
        .iter()
        .fold(0u64, |m, c| m | (1 << cap_number(c)));
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(agent.caps(set), want, "{set}: only {DAEMONSET_CAPS:?}");
    }
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}\n{}", agent.log());
    let programs = program_names(&s);
    // bpf_skc_to_mptcp_sock, bpf_skc_to_tcp_sock and bpf_probe_read_kernel need
    // CAP_PERFMON: the connect programs that use them fall back to the plain marking
    // ones, and the agent says what that leaves uncovered.
    assert_eq!(
        programs,
        [
            "hairpin_connect4_kernel",
            "hairpin_connect6_kernel",
            "hairpin_sockops",
            "hairpin_setsockopt",
            "hairpin_sk_msg"
        ],
        "{s}"
    );
    let log = agent.log();
    assert!(
        log.contains("need CAP_PERFMON")
            && log.contains("sendto(MSG_FASTOPEN) connections")
            && log.contains("(kernel_missed_data_first)"),
        "{log}"
    );
    // Pinning needs no capability beyond these (and write access to the directory).
    assert!(
        s["kernel_path"]["sockets_map_pin"]
            .as_str()
            .is_some_and(|p| Path::new(p).exists()),
        "the sockets map is pinned under the DaemonSet's capabilities: {s}\n{}",
        agent.log()
    );
    assert_capture_headers_equal_the_relays_encoder(&node, || agent.log());
    // /metrics and /status read the counters through the agent's own map
    // descriptor (opening the map by id would need CAP_SYS_ADMIN).
    assert_eq!(
        kernel_counter(&status(&node), "kernel_headers_written"),
        8,
        "status shows the kernel counters without CAP_SYS_ADMIN"
    );
    let metrics = admin_get(&node, "/metrics");
    let event = |name: &str| format!("hairpin_kernel_events_total{{event=\"{name}\"}} ");
    assert!(
        metrics.contains(&format!("{}8\n", event("kernel_headers_written"))),
        "{metrics}"
    );
    for miss in [
        "kernel_missed_insert",
        "kernel_missed_data_first",
        "kernel_missed_push",
        "kernel_missed_write",
    ] {
        assert!(
            metrics.contains(&format!("{}0\n", event(miss))),
            "{miss}: {metrics}"
        );
    }
}

#[test]
fn destinations_that_are_not_proxied_are_untouched() {
    require_privileges!();
    let (node, _nginx, agent) = kernel_path_node();
    // Another port of a proxied IP, and another IP: the plain server would answer
    // 400 to a header it does not expect.
    for target in [url("203.0.113.10", 81, "/"), url("203.0.113.99", 80, "/")] {
        assert_plain_server_answers(&node, &target);
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 0, "{s}");
    assert!(!agent.log().contains("accepted"), "{}", agent.log());
}

#[test]
fn a_host_socket_whose_source_is_the_lb_address_itself_names_the_node_ip() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // As kube-proxy's IPVS mode binds LB addresses on kube-ipvs0: the LB address is
    // local, so a host socket connecting to it takes it as its source. The header
    // names --node-ip instead, as the relay does for host processes.
    hairpin_tests::sh::run_in(
        &node.node_ns,
        &["ip", "addr", "add", "203.0.113.10/32", "dev", "lo"],
    );
    let agent = Agent::start_with(&node, &all_frontends(), KERNEL_PATH_ON);
    let host = from_host(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client(
        "node",
        &host,
        hairpin_tests::node::NODE_IP4,
        "203.0.113.10",
        &agent,
    );
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
}

/// The pushed header is a buffer of its own, and TCP pushes each buffer with
/// TCP_NODELAY (curl sets it, as most clients do): unless sk_msg joins it with the
/// client's first write, the server gets the header as a segment of its own, reads it
/// alone and waits for the request (two packets more per connection; the connection
/// rate measured the same either way). A first write that fits a page leaves in one
/// segment with its header; a larger one still gets the exact header ahead of all its
/// bytes.
#[test]
fn the_header_and_a_first_write_that_fits_a_page_leave_in_one_segment() {
    require_privileges!();
    let node = capture_node();
    let agent = Agent::start_with(&node, &capture_specs(), KERNEL_PATH_ON);
    let cases = [
        (CAPTURE_LB4, 80, ProxyVersion::V1),
        (CAPTURE_LB4, 81, ProxyVersion::V2),
        (CAPTURE_LB6, 80, ProxyVersion::V1),
        (CAPTURE_LB6, 81, ProxyVersion::V2),
    ];
    // Past one page with the header: the room and the request go as two buffers.
    let pad = format!("X-Pad: {}", "p".repeat(6000));
    let captured = segment_capture_server(&node.ingress_ns, 2 * cases.len(), false);
    for (lb, port, version) in cases {
        let v6 = lb.contains(':');
        let client: IpAddr = (if v6 { POD_IP6 } else { POD_IP4 }).parse().expect("ip");
        let lb_ip: IpAddr = lb.parse().expect("lb ip");
        for large in [false, true] {
            let u = url(lb, port, "/");
            let mut argv = vec!["curl", "-sS", "--max-time", "10"];
            if large {
                argv.extend(["-H", pad.as_str()]);
            }
            argv.push(&u);
            let reply = Reply::from_output(
                command_in(&node.pod_ns, Some(&node.pod_cgroup()), &argv)
                    .output()
                    .expect("run curl"),
            );
            assert!(
                reply.ok(),
                "{lb}:{port} large={large}: {reply:?}\n{}",
                agent.log()
            );
            let (got, segments) = captured
                .recv_timeout(Duration::from_secs(5))
                .expect("a captured connection");
            let want = encoders_header(&got, version, v6, client, SocketAddr::new(lb_ip, port));
            let want = want.as_slice();
            assert!(
                got.starts_with(want) && got[want.len()..].starts_with(b"GET / HTTP/1.1\r\n"),
                "{lb}:{port} {version} large={large}: got\n  {:?}\nwant the header\n  {:?}",
                got.escape_ascii().to_string(),
                want.escape_ascii().to_string()
            );
            if large {
                assert!(
                    got.windows(pad.len()).any(|w| w == pad.as_bytes()),
                    "{lb}:{port} {version}: the large request arrived cut"
                );
            } else {
                assert!(
                    got.len() < 4096,
                    "{lb}:{port}: a small request: {}",
                    got.len()
                );
                assert_eq!(
                    segments, 1,
                    "{lb}:{port} {version}: header and request must arrive in one segment, came in {segments}"
                );
            }
        }
    }
    let s = status(&node);
    assert_eq!(kernel_counter(&s, "kernel_headers_written"), 8, "{s}");
    assert_no_misses(&s);
}
