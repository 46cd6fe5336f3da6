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
    until_reply(&rn.node, From::Pod, "203.0.113.10", Duration::from_secs(15), |r| {
        names(r, POD_IP4)
    });
    rn.cluster.stop_control_plane();
    let down = Instant::now();
    // While the control plane is away (about five seconds), every request still
    // gets its header.
    let mut served = 0;
    while down.elapsed() < Duration::from_secs(5) {
        let r = from_pod(&rn.node, "http://203.0.113.10:80/");
        assert!(names(&r, POD_IP4), "during the outage: {r:?}\n{}", rn.agent().log());
        served += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let back = rn.cluster.restart_control_plane();
    eprintln!("control plane down {:.1} s, {served} requests served meanwhile; back in {:.1} s",
        down.elapsed().as_secs_f64() - back.as_secs_f64(), back.as_secs_f64());
    let restarted = Instant::now();
    rn.cluster
        .create_lb_service(&do_service("ingress-nginx", "after", &[]));
    rn.cluster
        .set_lb_ingress("ingress-nginx", "after", vip(&["203.0.113.12"]));
    let converged = until_reply(&rn.node, From::Pod, "203.0.113.12", Duration::from_secs(60), |r| {
        names(r, POD_IP4)
    });
    eprintln!(
        "after the restart: a new Service's first header {:.1} s after it was created \
         ({:.1} s after the API server was ready)",
        converged.as_secs_f64(),
        restarted.elapsed().as_secs_f64()
    );
}
