//! The netlink edge: reads the node's links, addresses and routes (IPv4 and IPv6)
//! and follows their changes (`ip monitor link address route`), handing each new
//! [`PodNetworks`] to the caller. A change is seen within milliseconds: a CNI adds
//! a pod's route before the pod's containers start, so a pod is known before it can
//! connect. A full re-read every [`RESYNC`] covers notifications the kernel dropped
//! (a full socket buffer).

use std::{collections::HashMap, net::IpAddr, time::Duration};

use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::{
    Handle, MulticastGroup, RouteMessageBuilder,
    packet_route::{
        address::AddressAttribute,
        link::{LinkAttribute, LinkInfo},
        route::{RouteAddress, RouteAttribute, RouteType},
    },
};
use tracing::{debug, warn};

use super::{HostLink, HostRoute, PodNetworks, classify};

/// How often the whole table is read again regardless of notifications.
pub(crate) const RESYNC: Duration = Duration::from_secs(30);

/// Errors reading the node's routing state.
#[derive(Debug, thiserror::Error)]
pub enum PodnetError {
    /// The netlink socket could not be opened or subscribed.
    #[error(
        "failed to open a netlink route socket subscribed to link, address and route changes: {0}"
    )]
    Connect(#[source] std::io::Error),
    /// A dump failed.
    #[error("failed to read this node's {what} through netlink: {source}")]
    Dump {
        /// `links`, `addresses`, `IPv4 routes`, `IPv6 routes`.
        what: &'static str,
        /// rtnetlink's error.
        source: rtnetlink::Error,
    },
    /// The notification stream ended.
    #[error("the netlink notification stream of link, address and route changes ended")]
    Closed,
}

fn dump(what: &'static str) -> impl FnOnce(rtnetlink::Error) -> PodnetError {
    move |source| PodnetError::Dump { what, source }
}

/// Reads the node's links (with their addresses) and its routes of both families.
pub(crate) async fn read(handle: &Handle) -> Result<(Vec<HostLink>, Vec<HostRoute>), PodnetError> {
    let mut links: HashMap<u32, HostLink> = HashMap::new();
    let mut stream = handle.link().get().execute();
    while let Some(msg) = stream.try_next().await.map_err(dump("links"))? {
        let mut link = HostLink {
            name: String::new(),
            kind: None,
            addresses: Vec::new(),
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(k) = info {
                            link.kind = Some(k.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        links.insert(msg.header.index, link);
    }
    let mut stream = handle.address().get().execute();
    while let Some(msg) = stream.try_next().await.map_err(dump("addresses"))? {
        // IFA_LOCAL is the link's own address on point-to-point links, where
        // IFA_ADDRESS is the peer's; elsewhere both are the same.
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let addr = local.or_else(|| {
            msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            })
        });
        if let (Some(link), Some(addr)) = (links.get_mut(&msg.header.index), addr)
            && let Ok(net) = IpNet::new(addr, msg.header.prefix_len)
        {
            link.addresses.push(net);
        }
    }
    let mut routes = Vec::new();
    for (what, message) in [
        (
            "IPv4 routes",
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        ),
        (
            "IPv6 routes",
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ),
    ] {
        let mut stream = handle.route().get(message).execute();
        while let Some(msg) = stream.try_next().await.map_err(dump(what))? {
            let mut dst = None;
            let mut dev = None;
            let mut via = None;
            let mut table = u32::from(msg.header.table);
            for attr in &msg.attributes {
                match attr {
                    RouteAttribute::Destination(a) => dst = address(a),
                    RouteAttribute::Gateway(a) => via = address(a),
                    RouteAttribute::Oif(i) => dev = links.get(i).map(|l| l.name.clone()),
                    RouteAttribute::Table(t) => table = *t,
                    _ => {}
                }
            }
            let len = msg.header.destination_prefix_length;
            let dst = match dst {
                Some(a) => IpNet::new(a, len).ok(),
                // No destination attribute: the default route of the family.
                None if what == "IPv4 routes" => IpNet::new(IpAddr::from([0u8; 4]), 0).ok(),
                None => IpNet::new(IpAddr::from([0u16; 8]), 0).ok(),
            };
            let Some(dst) = dst else { continue };
            routes.push(HostRoute {
                dst,
                dev,
                via,
                unicast: msg.header.kind == RouteType::Unicast,
                table,
            });
        }
    }
    Ok((links.into_values().collect(), routes))
}

fn address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Follows this node's pod networks forever: `on_change` gets every new set (the
/// first read included) and every error; after an error the socket is opened again
/// with a backoff, the last set staying in force meanwhile.
pub async fn follow(mut on_change: impl FnMut(Result<&PodNetworks, &PodnetError>)) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let e = follow_once(&mut on_change).await;
        warn!(error = %e, retry_in = ?backoff, "this node's pod networks cannot be read; last known set kept");
        on_change(Err(&e));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn follow_once(
    on_change: &mut impl FnMut(Result<&PodNetworks, &PodnetError>),
) -> PodnetError {
    let groups = [
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
    ];
    let (conn, handle, mut events) = match rtnetlink::new_multicast_connection(&groups) {
        Ok(c) => c,
        Err(e) => return PodnetError::Connect(e),
    };
    let _conn = AbortOnDrop(tokio::spawn(conn));
    let mut last: Option<PodNetworks> = None;
    loop {
        let found = match read(&handle).await {
            Ok((links, routes)) => classify(&links, &routes),
            Err(e) => return e,
        };
        if last.as_ref() != Some(&found) {
            debug!(pods = found.hosts.len(), ranges = found.ranges.len(), shapes = %found.describe(), "this node's pod networks");
            on_change(Ok(&found));
            last = Some(found);
        }
        tokio::select! {
            event = events.next() => if event.is_none() { return PodnetError::Closed },
            () = tokio::time::sleep(RESYNC) => {}
        }
        // One read covers every notification already queued.
        while events.try_recv().is_ok() {}
    }
}
