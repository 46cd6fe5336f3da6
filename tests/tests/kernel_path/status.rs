//! What the agent says about the kernel path: status and metrics and their counters,
//! the counters read without CAP_SYS_ADMIN, the programs' diagnostic events.

use super::*;

#[test]
fn status_and_metrics_show_the_kernel_path_and_its_counters() {
    require_privileges!();
    let (node, _nginx, _agent) = kernel_path_node();
    assert!(from_pod(&node, &url("203.0.113.10", 80, "/")).ok());
    let s = status(&node);
    assert_eq!(s["kernel_path"]["configured"], "on", "{s}");
    assert_eq!(s["kernel_path"]["state"], "on", "{s}");
    assert!(s["kernel_path"]["sockets_map_id"].is_u64(), "{s}");
    let frontends = s["frontends"].as_array().expect("frontends");
    assert_eq!(frontends.len(), 6, "{s}");
    for f in frontends {
        assert_eq!(f["state"], "active", "{f}");
        assert_eq!(f["path"], "kernel", "{f}");
    }
    let programs = program_names(&s);
    assert_eq!(
        programs,
        [
            "hairpin_connect4_kernel_perfmon",
            "hairpin_connect6_kernel_perfmon",
            "hairpin_sockops",
            "hairpin_setsockopt",
            "hairpin_sk_msg"
        ],
        "{s}"
    );
    let metrics = admin_get(&node, "/metrics");
    for line in [
        "hairpin_kernel_events_total{event=\"kernel_headers_written\"} 1",
        "hairpin_kernel_events_total{event=\"kernel_marked\"} 1",
        "hairpin_kernel_events_total{event=\"kernel_missed_push\"} 0",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
}

#[test]
fn with_the_kernel_path_off_status_says_so_and_frontends_take_the_relay() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let agent = Agent::start(&node, &all_frontends());
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "off", "{s}");
    for f in s["frontends"].as_array().expect("frontends") {
        assert_eq!(f["path"], "ebpf", "{f}");
    }
    assert_eq!(kernel_counter(&s, "redirected"), 1, "{s}");
    assert_eq!(kernel_counter(&s, "kernel_marked"), 0, "{s}");
}

/// Drops `caps` from this thread's effective set (capabilities are per thread).
fn drop_effective_caps(caps: &[u32]) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data words, as the ABI says.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()),
            0
        );
        for cap in caps {
            data[(cap / 32) as usize].effective &= !(1 << (cap % 32));
        }
        assert_eq!(
            libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()),
            0,
            "capset: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn the_counters_read_through_the_agents_own_descriptor_without_cap_sys_admin() {
    require_privileges!();
    let Some(object) = hairpin_agent::datapath::embedded_object() else {
        panic!("the agent was built without its BPF object: run cargo xtask build-ebpf first");
    };
    // A thread of its own: dropping capabilities affects this thread only.
    std::thread::spawn(move || {
        let d = hairpin_agent::datapath::Datapath::load(object, hairpin_ebpf::DEFAULT_BYPASS_MARK)
            .expect("load");
        let id = d
            .kernel_ids()
            .counters_map_id
            .expect("the counters map has an id");
        let reader = d.counters_reader().expect("a reader");
        // As the DaemonSet runs the agent: CAP_BPF and CAP_NET_ADMIN, no
        // CAP_SYS_ADMIN (21) and no CAP_PERFMON (38).
        drop_effective_caps(&[21, 38]);
        let by_id = hairpin_agent::datapath::read_counters(id);
        assert!(
            by_id.is_err(),
            "opening a map by id needs CAP_SYS_ADMIN: {by_id:?}"
        );
        let names: Vec<&str> = reader.read().into_iter().map(|(n, _)| n).collect();
        assert!(
            names.contains(&"kernel_fallback_full") && names.contains(&"kernel_missed_insert"),
            "{names:?}"
        );
    })
    .join()
    .expect("the reader works without CAP_SYS_ADMIN");
}

// ---- The programs' diagnostic events (aya-log) --------------------------------------

/// The agent's log lines that came from the programs through aya-log.
fn program_events(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("hairpin_ebpf")).collect()
}

#[test]
fn the_programs_log_a_fallback_naming_the_frontend_and_nothing_on_the_common_path() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    // Per-connect events are debug: asked for here (`--log info`, the default,
    // shows none of them).
    let agent = Agent::start_logging(
        &node,
        &all_frontends(),
        "info,hairpin_ebpf=debug",
        &["--kernel-path", "on", "--kernel-path-sockets", "1"],
    );
    // An established connection that has not written yet holds the one slot.
    let mut holder = silent_connection(&node);
    assert_eq!(wait_counter(&node, "kernel_sockets_entered", 1), 1);
    assert!(program_events(&agent.log()).is_empty(), "{}", agent.log());
    // The next connect goes to the relay, and the connect program says so.
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    let log = eventually(|| agent.log(), |l| !program_events(l).is_empty());
    let events = program_events(&log);
    assert_eq!(events.len(), 1, "{log}");
    assert!(
        events[0].contains(" DEBUG ")
            && events[0].contains("kernel_fallback_full")
            && events[0].contains("203.0.113.10 port 80"),
        "{log}"
    );
    // A slot frees; the next connection takes the kernel path and its header is
    // written: nothing more from the programs.
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(wait_counter(&node, "kernel_sockets_left", 1), 1);
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    assert_eq!(kernel_counter(&status(&node), "kernel_headers_written"), 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(program_events(&agent.log()).len(), 1, "{}", agent.log());
    drop(agent);

    // The relay path: a redirected connect logs nothing at the default level. (The
    // counters are the node datapath's, adopted from the agent before.)
    let agent = Agent::start_logging(&node, &all_frontends(), "info", &["--kernel-path", "off"]);
    let before = kernel_counter(&status(&node), "redirected");
    let reply = from_pod(&node, &url("203.0.113.10", 80, "/"));
    assert_true_client("pod", &reply, POD_IP4, "203.0.113.10", &agent);
    assert_eq!(kernel_counter(&status(&node), "redirected"), before + 1);
    std::thread::sleep(Duration::from_millis(300));
    assert!(program_events(&agent.log()).is_empty(), "{}", agent.log());
}
