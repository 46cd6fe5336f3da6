//! Each CNI fixture as a shape: built, served, refused, flooded and re-routed, once per
//! family it has pods and off-node peers of.

use super::*;

fn shape(name: &str, with_flood: bool) {
    shape_in(name, Family::V4, with_flood);
}

fn shape_in(name: &str, family: Family, with_flood: bool) {
    let f = fixture(name);
    let mut ns = Namespaces::new();
    let built = build(&f, &mut ns, family);
    let host_len = family.host_len();
    let stop = CancellationToken::new();
    let (reads, relay) = start_relay(&built.node, family, stop.clone());
    let first = reads
        .recv_timeout(Duration::from_secs(10))
        .expect("routes read");
    for (ip, _) in &built.pods {
        assert!(
            first.contains(*ip),
            "{name}: pod {ip} not found in the node's routes: {first:?}"
        );
    }
    for (ip, _) in &built.off_node {
        assert!(
            !first.contains(*ip),
            "{name}: off-node {ip} taken for a pod: {first:?}"
        );
    }
    assert!(
        !built.pods.is_empty() && !built.off_node.is_empty(),
        "{name}: nothing to try"
    );

    for (ip, pod) in &built.pods {
        match connect_from(pod, *ip, built.target) {
            Outcome::Served(got) => assert_eq!(got.trim(), format!("served {ip}"), "{name}"),
            other => panic!("{name}: pod {ip} not served: {other:?}"),
        }
    }
    for (ip, off) in &built.off_node {
        match connect_from(off, *ip, built.target) {
            Outcome::Refused(took) => {
                eprintln!("{name}: off-node {ip} refused in {took:?}");
                assert!(
                    took < AT_ONCE,
                    "{name}: off-node {ip} refused only after {took:?}"
                );
            }
            other => panic!("{name}: off-node {ip} served: {other:?}"),
        }
    }

    if with_flood {
        let (ip, off) = &built.off_node[0];
        let started = Instant::now();
        let (release, flooding) = flood(off, *ip, built.target, FLOOD);
        let opened = started.elapsed();
        let (pod_ip, pod) = &built.pods[0];
        let served = connect_from(pod, *pod_ip, built.target);
        drop(release);
        let reset = flooding.join().expect("flood thread");
        assert!(
            matches!(served, Outcome::Served(_)),
            "{name}: with {FLOOD} off-node connections held open by their client and a cap of \
             {CAP}, the pod must be served: {served:?}"
        );
        assert_eq!(
            reset, FLOOD,
            "{name}: every flood connection was closed by the relay"
        );
        eprintln!("{name}: {FLOOD} off-node connections opened and refused in {opened:?}");
    }

    // A pod's route gone: refused at once; back: served (followed over netlink).
    let (ip, pod) = &built.pods[0];
    let link = &f.pods.iter().find(|(p, _)| p == ip).expect("pod").1;
    let host_route = f.routes.iter().any(|r| {
        r.dst.addr() == *ip && r.dst.prefix_len() == host_len && r.dev.as_deref() == Some(link)
    });
    if host_route {
        change_host_route(&built.node, family, "del", (ip, link), &[]);
        let gone = wait_for(&reads, |n| !n.contains(*ip));
        assert!(gone, "{name}: the route's removal was not followed");
        assert!(matches!(
            connect_from(pod, *ip, built.target),
            Outcome::Refused(_)
        ));
        change_host_route(&built.node, family, "add", (ip, link), &["scope", "link"]);
        assert!(
            wait_for(&reads, |n| n.contains(*ip)),
            "{name}: the route's return was not followed"
        );
        assert!(matches!(
            connect_from(pod, *ip, built.target),
            Outcome::Served(_)
        ));
    }
    stop.cancel();
    relay.join().expect("relay thread");
}

fn wait_for(reads: &mpsc::Receiver<PodNetworks>, ok: impl Fn(&PodNetworks) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match reads.recv_timeout(left) {
            Ok(n) if ok(&n) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

#[test]
fn calico() {
    require_privileges!();
    shape("calico", true);
}

#[test]
fn cilium() {
    require_privileges!();
    shape("cilium", false);
}

#[test]
fn aws_vpc_cni() {
    require_privileges!();
    shape("aws-vpc-cni", true);
}

#[test]
fn azure_cni() {
    require_privileges!();
    shape("azure-cni", false);
}

#[test]
fn flannel_bridge() {
    require_privileges!();
    shape("flannel-bridge", false);
}

#[test]
fn calico_ipv6() {
    require_privileges!();
    shape_in("calico", Family::V6, true);
}

#[test]
fn cilium_ipv6() {
    require_privileges!();
    shape_in("cilium", Family::V6, false);
}
