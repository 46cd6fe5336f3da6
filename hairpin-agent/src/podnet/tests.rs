use std::{fs, path::PathBuf};

use super::{fixture::parse, *};

fn fixture(name: &str) -> fixture::Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cni")
        .join(format!("{name}.routes"));
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every CNI fixture: its pods are found, its off-node peers are not, and the rule
/// that found them is the one the CNI's shape names.
#[test]
fn each_cni_shape_finds_its_pods_and_nothing_off_the_node() {
    let cases: &[(&str, &[Shape])] = &[
        (
            "calico",
            &[Shape::PodVeths {
                cni: "calico",
                prefix: "cali",
            }],
        ),
        ("cilium", &[Shape::CiliumHost]),
        (
            "aws-vpc-cni",
            &[Shape::PodVeths {
                cni: "aws-vpc-cni",
                prefix: "eni",
            }],
        ),
        (
            "azure-cni",
            &[Shape::PodVeths {
                cni: "azure-cni",
                prefix: "azv",
            }],
        ),
        (
            "flannel-bridge",
            &[Shape::Bridge {
                link: "cni0".into(),
            }],
        ),
    ];
    for (name, shapes) in cases {
        let f = fixture(name);
        assert!(
            !f.pods.is_empty() && !f.off_node.is_empty(),
            "{name}: a fixture names pods and off-node peers"
        );
        let found = classify(&f.links, &f.routes);
        for (pod, link) in &f.pods {
            assert!(
                found.contains(*pod),
                "{name}: pod {pod} behind {link} not found in {found:?}"
            );
        }
        for peer in &f.off_node {
            assert!(
                !found.contains(*peer),
                "{name}: off-node {peer} taken as a pod: {found:?}"
            );
        }
        let got: Vec<&Shape> = found.shapes.keys().collect();
        assert_eq!(got, shapes.iter().collect::<Vec<_>>(), "{name}");
        assert!(!found.describe().is_empty());
    }
}

#[test]
fn exact_networks_of_two_shapes() {
    let calico = classify(&fixture("calico").links, &fixture("calico").routes);
    assert_eq!(
        calico.networks(),
        ["10.244.12.7/32", "10.244.12.9/32", "fd00:10:244:c::7/128"]
            .iter()
            .map(|n| n.parse::<IpNet>().expect("net"))
            .collect::<Vec<_>>()
    );
    assert_eq!(calico.describe(), "calico (cali* host routes): 3");
    let cilium = classify(&fixture("cilium").links, &fixture("cilium").routes);
    assert_eq!(
        cilium.networks(),
        ["10.0.1.0/24", "fd00:10:1::/64"]
            .iter()
            .map(|n| n.parse::<IpNet>().expect("net"))
            .collect::<Vec<_>>(),
        "the ranges holding the router IP, not the other nodes' ranges"
    );
    assert!(cilium.contains("::ffff:10.0.1.57".parse().expect("ip")));
}

fn one(links: &str, route: &str) -> PodNetworks {
    let f = parse(&format!("{links}\nroute {route}\n")).expect("fixture");
    classify(&f.links, &f.routes)
}

/// The near misses: each is a route some node has that must not count.
#[test]
fn near_misses_are_not_pods() {
    let veth = "link cali1 veth\nlink weave bridge addr 10.32.0.1/12\nlink azure0 bridge addr 10.224.0.4/16\nlink cilium_host veth addr 10.0.1.163/32\nlink cni0 bridge addr 10.244.1.1/24\nlink eth0 device addr 192.0.2.2/24\nlink tunl0 ipip";
    for route in [
        // A host route through a gateway, out of a veth.
        "10.244.3.3/32 via 10.244.3.1 dev cali1",
        // Not the main table (a CNI's per-ENI or WireGuard table).
        "10.244.3.4/32 dev cali1 table 2",
        // A blackhole host route.
        "blackhole 10.244.3.5/32",
        // A host route out of the uplink or a tunnel (not a veth).
        "192.0.2.77/32 dev eth0 scope link",
        "10.244.7.1/32 dev tunl0 scope link",
        // Weave's and Azure's bridge mode ranges are not node-only.
        "10.32.0.0/12 dev weave proto kernel scope link src 10.32.0.1",
        "10.224.0.0/16 dev azure0 proto kernel scope link src 10.224.0.4",
        // Cilium: another node's range, and a range through a foreign gateway.
        "10.0.2.0/24 via 10.0.1.163 dev cilium_host",
        "10.0.1.0/24 via 10.0.1.9 dev cilium_host",
        // The router IP itself.
        "10.0.1.163 dev cilium_host scope link",
        // A bridge route through a gateway, or one not holding the bridge's address.
        "10.244.1.0/24 via 10.244.1.9 dev cni0",
        "10.244.9.0/24 dev cni0",
        // Default routes, whatever their link.
        "default dev cni0",
        // Unknown link.
        "10.244.3.6/32 dev cali9 scope link",
    ] {
        let found = one(veth, route);
        assert_eq!(found, PodNetworks::default(), "{route}");
    }
    // A range wider than a node's is never taken, even on a pod bridge.
    let wide = one("link cni0 bridge addr 10.0.0.1/8", "10.0.0.0/8 dev cni0");
    assert_eq!(wide, PodNetworks::default());
    // A veth of another name still gives its pod, labelled as a plain veth
    // (kindnet's ptp plugin).
    let ptp = one("link veth1a2b veth", "10.244.0.5 dev veth1a2b scope host");
    assert_eq!(ptp.describe(), "veth (* host routes): 1");
}

#[test]
fn fixture_errors_name_the_line() {
    let e = parse("link eth0 device\nroute 10.0.0.0/8 dev eth0 bogus\n").expect_err("bad word");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.to_string().contains("bogus"), "{e}");
    let e = parse("pod 10.0.0.300 cali1\n").expect_err("bad address");
    assert!(e.to_string().contains("fixture line 1"), "{e}");
}
