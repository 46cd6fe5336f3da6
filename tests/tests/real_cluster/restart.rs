//! The API server and etcd killed and started again mid-run: the datapath keeps
//! serving while they are down (kube-proxy's rules and the agent's programs stay),
//! and afterwards the agent's watches come back and a change made then converges.

use std::time::{Duration, Instant};

use hairpin_tests::{
    client::from_pod,
    node::{KubeProxyMode, POD_IP4},
};

use crate::{From, RealNode, do_service, names, until_reply, vip};

#[test]
fn control_plane_restart_keeps_the_datapath_and_the_agent_converges_after() {
    let Some(mut rn) = RealNode::start(KubeProxyMode::Nftables) else {
        return;
    };
    rn.start_agent(&[]);
    rn.cluster
        .create_lb_service(&do_service("ingress-nginx", "before", &[]));
    rn.cluster
        .set_lb_ingress("ingress-nginx", "before", vip(&["203.0.113.10"]));
    until_reply(
        &rn.node,
        From::Pod,
        "203.0.113.10",
        Duration::from_secs(15),
        |r| names(r, POD_IP4),
    );
    rn.cluster.stop_control_plane();
    let down = Instant::now();
    // While the control plane is away (about five seconds), every request still
    // gets its header.
    let mut served = 0;
    while down.elapsed() < Duration::from_secs(5) {
        let r = from_pod(&rn.node, "http://203.0.113.10:80/");
        assert!(
            names(&r, POD_IP4),
            "during the outage: {r:?}\n{}",
            rn.agent().log()
        );
        served += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let back = rn.cluster.restart_control_plane();
    eprintln!(
        "control plane down {:.1} s, {served} requests served meanwhile; back in {:.1} s",
        down.elapsed().as_secs_f64() - back.as_secs_f64(),
        back.as_secs_f64()
    );
    let restarted = Instant::now();
    rn.cluster
        .create_lb_service(&do_service("ingress-nginx", "after", &[]));
    rn.cluster
        .set_lb_ingress("ingress-nginx", "after", vip(&["203.0.113.12"]));
    // Which of the two came back later: the agent's frontend or kube-proxy's rule.
    let (mut agent_at, mut proxy_at) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while agent_at.is_none() || proxy_at.is_none() {
        assert!(
            Instant::now() < deadline,
            "agent {agent_at:?}, kube-proxy {proxy_at:?}\n{}",
            rn.agent().log()
        );
        let s = hairpin_tests::agent::status(&rn.node);
        if agent_at.is_none()
            && s["frontends"]
                .as_array()
                .is_some_and(|fs| fs.iter().any(|f| f["ip"] == "203.0.113.12"))
        {
            agent_at = Some(restarted.elapsed());
        }
        if proxy_at.is_none() && rn.proxy.programs(&rn.node.node_ns, "203.0.113.12") {
            proxy_at = Some(restarted.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let converged = until_reply(
        &rn.node,
        From::Pod,
        "203.0.113.12",
        Duration::from_secs(60),
        |r| names(r, POD_IP4),
    );
    eprintln!(
        "after the restart: the agent proxied the new Service after {:.1} s, kube-proxy \
         programmed it after {:.1} s",
        agent_at.unwrap_or_default().as_secs_f64(),
        proxy_at.unwrap_or_default().as_secs_f64()
    );
    eprintln!(
        "after the restart: a new Service's first header {:.1} s after it was created \
         ({:.1} s after the API server was ready)",
        converged.as_secs_f64(),
        restarted.elapsed().as_secs_f64()
    );
}
