//! Services hairpin must leave alone, read back through the real API: `ipMode:
//! Proxy` (kube-proxy programs nothing for it, the LB adds the header), a
//! hostname-only LB, and a Service without a PROXY annotation; each gets the Event
//! the README promises.

use std::time::{Duration, Instant};

use hairpin_tests::{
    agent::status,
    node::{KubeProxyMode, NGINX_PLAIN_PORT},
};
use serde_json::json;

use crate::{From, RealNode, do_service, until_reply, vip};

/// Waits for an Event with `reason` on Service `ns/name`; its note.
fn wait_event(rn: &RealNode, ns: &str, name: &str, reason: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = rn.cluster.service_events(ns, name);
        if let Some((_, _, note)) = events.iter().find(|(_, r, _)| r == reason) {
            return note.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} Event on {ns}/{name}: {events:?}\nagent:\n{}",
            rn.agent().log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn ip_mode_proxy_hostname_only_and_unannotated_services_are_left_alone_with_events() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Iptables) else {
        return;
    };
    rn.start_agent(&[]);
    let c = &rn.cluster;
    c.create_lb_service(&do_service("apps", "proxy-mode", &[]));
    c.create_lb_service(&do_service("apps", "hostname-only", &[]));
    let mut plain = do_service("apps", "unannotated", &[]);
    plain.annotations.clear();
    plain.target_port = NGINX_PLAIN_PORT;
    c.create_lb_service(&plain);
    c.set_lb_ingress(
        "apps",
        "proxy-mode",
        json!([{"ip": "203.0.113.11", "ipMode": "Proxy"}]),
    );
    c.set_lb_ingress(
        "apps",
        "hostname-only",
        json!([{"hostname": "lb-1234.example.com"}]),
    );
    c.set_lb_ingress("apps", "unannotated", vip(&["203.0.113.99"]));
    let proxy = wait_event(&rn, "apps", "proxy-mode", "SkippedIpModeProxy");
    let hostname = wait_event(&rn, "apps", "hostname-only", "SkippedHostnameOnly");
    let off = wait_event(&rn, "apps", "unannotated", "SkippedProxyProtocolOff");
    eprintln!("Events: {proxy:?}; {hostname:?}; {off:?}");
    // The unannotated LB answers plainly through kube-proxy, with no header.
    until_reply(
        &rn.node,
        From::Pod,
        "203.0.113.99",
        Duration::from_secs(15),
        |r| r.ok() && r.body.starts_with("plain remote="),
    );
    // Nothing of the three is a frontend.
    let s = status(&rn.node);
    let frontends = s["frontends"].as_array().cloned().unwrap_or_default();
    assert!(frontends.is_empty(), "{s}");
    // kube-proxy (>= 1.30) programs nothing for the ipMode: Proxy address.
    assert!(
        !rn.proxy.programs(&rn.node.node_ns, "203.0.113.11"),
        "{}",
        rn.proxy.log()
    );
}
