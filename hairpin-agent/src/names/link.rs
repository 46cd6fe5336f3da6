//! `--names-link`: puts the name relay's node-local address (a link-local /32 such
//! as 169.254.20.11, beside node-local-dns's 169.254.20.10) on a link through
//! rtnetlink, so it collides with nothing on the node and host processes reach it.
//!
//! The link is a `dummy` made here when missing, or any existing link (`lo`). A
//! kernel without the dummy type (CONFIG_DUMMY off) answers EOPNOTSUPP: then the
//! address goes on `lo`, with a warning. `hairpin-agent cleanup` removes it again;
//! SIGTERM does not, since the next agent (a rollout) serves the same address.

use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::{
    Handle, LinkDummy, LinkUnspec,
    packet_route::{
        address::AddressAttribute,
        link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
    },
};
use tracing::warn;

/// The link used when the dummy type is missing.
pub(crate) const LOOPBACK: &str = "lo";

/// Errors at the netlink boundary.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The netlink socket could not be opened.
    #[error("failed to open a netlink socket: {0}")]
    Connect(#[source] std::io::Error),
    /// A netlink request failed.
    #[error("failed to {op} on link {link}: {source}")]
    Netlink {
        /// What was being done: `look up`, `create dummy`, `set up`, `add address X`, ...
        op: String,
        /// The link's name.
        link: String,
        /// rtnetlink's error.
        source: rtnetlink::Error,
    },
}

/// What [`ensure`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LinkOutcome {
    /// The address was already on the link.
    Present {
        /// The link holding it.
        link: String,
    },
    /// The address was added to an existing link.
    Added {
        /// The link.
        link: String,
    },
    /// A dummy link was created and the address put on it.
    CreatedDummy {
        /// The new link.
        link: String,
    },
    /// The dummy type is missing: the address went on `lo` instead.
    OnLoopback {
        /// The link asked for.
        wanted: String,
    },
}

impl LinkOutcome {
    /// The link the address is on.
    pub(crate) fn link(&self) -> &str {
        match self {
            LinkOutcome::Present { link }
            | LinkOutcome::Added { link }
            | LinkOutcome::CreatedDummy { link } => link,
            LinkOutcome::OnLoopback { .. } => LOOPBACK,
        }
    }

    /// One line for logs and `/status`.
    pub(crate) fn note(&self, address: IpAddr) -> String {
        match self {
            LinkOutcome::Present { link } => format!("{address} already on {link}"),
            LinkOutcome::Added { link } => format!("added {address} to {link}"),
            LinkOutcome::CreatedDummy { link } => {
                format!("created dummy link {link} with {address}")
            }
            LinkOutcome::OnLoopback { wanted } => format!(
                "this kernel has no dummy link type: added {address} to {LOOPBACK} instead of {wanted}"
            ),
        }
    }
}

fn connect() -> Result<Handle, LinkError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(LinkError::Connect)?;
    tokio::spawn(conn);
    Ok(handle)
}

fn nl(op: impl Into<String>, link: &str) -> impl FnOnce(rtnetlink::Error) -> LinkError {
    let (op, link) = (op.into(), link.to_string());
    move |source| LinkError::Netlink { op, link, source }
}

async fn find(handle: &Handle, name: &str) -> Result<Option<LinkMessage>, LinkError> {
    match handle
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await
    {
        Ok(link) => Ok(link),
        // ENODEV: no link of that name.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(nl("look up", name)(e)),
    }
}

fn prefix(address: IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

async fn has_address(
    handle: &Handle,
    index: u32,
    address: IpAddr,
) -> Result<bool, rtnetlink::Error> {
    let mut addrs = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .set_address_filter(address)
        .execute();
    Ok(addrs.try_next().await?.is_some())
}

/// Makes sure `address`/32 (or /128) is on link `name`, creating a dummy link of
/// that name when there is none.
pub(crate) async fn ensure(name: &str, address: IpAddr) -> Result<LinkOutcome, LinkError> {
    let handle = connect()?;
    let (link, outcome) = match find(&handle, name).await? {
        Some(link) => (link, None),
        None => {
            let created = handle
                .link()
                .add(LinkDummy::new(name).up().build())
                .execute()
                .await;
            match created {
                Ok(()) => {
                    let link = find(&handle, name)
                        .await?
                        .ok_or_else(|| LinkError::Netlink {
                            op: "find the dummy link just created".into(),
                            link: name.to_string(),
                            source: rtnetlink::Error::RequestFailed,
                        })?;
                    (
                        link,
                        Some(LinkOutcome::CreatedDummy {
                            link: name.to_string(),
                        }),
                    )
                }
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EOPNOTSUPP => {
                    warn!(link = name, %address, "this kernel has no dummy link type (CONFIG_DUMMY off): using {LOOPBACK}");
                    let lo = find(&handle, LOOPBACK)
                        .await?
                        .ok_or_else(|| LinkError::Netlink {
                            op: "find the loopback link".into(),
                            link: LOOPBACK.into(),
                            source: rtnetlink::Error::RequestFailed,
                        })?;
                    (
                        lo,
                        Some(LinkOutcome::OnLoopback {
                            wanted: name.to_string(),
                        }),
                    )
                }
                Err(e) => return Err(nl("create dummy", name)(e)),
            }
        }
    };
    let index = link.header.index;
    let on = link_name(&link).unwrap_or_else(|| name.to_string());
    // A link that exists may be down (a dummy left by an earlier agent): bring it up.
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(nl("set up", &on))?;
    if has_address(&handle, index, address)
        .await
        .map_err(nl("list addresses", &on))?
    {
        return Ok(outcome.unwrap_or(LinkOutcome::Present { link: on }));
    }
    handle
        .address()
        .add(index, address, prefix(address))
        .execute()
        .await
        .map_err(nl(format!("add address {address}"), &on))?;
    Ok(outcome.unwrap_or(LinkOutcome::Added { link: on }))
}

fn link_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

fn is_dummy(link: &LinkMessage) -> bool {
    link.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.contains(&LinkInfo::Kind(InfoKind::Dummy)),
        _ => false,
    })
}

/// What [`remove`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Removed {
    /// Links the address was removed from.
    pub address_from: Vec<String>,
    /// The dummy link deleted, when it was ours and held nothing else.
    pub deleted_link: Option<String>,
}

/// Removes `address` from link `name` (and from `lo`, where [`ensure`] puts it on
/// kernels without dummy links); deletes `name` when it is a dummy link left
/// without addresses. Idempotent: nothing there is not an error.
pub(crate) async fn remove(name: &str, address: IpAddr) -> Result<Removed, LinkError> {
    let handle = connect()?;
    let mut removed = Removed::default();
    let mut names = vec![name];
    if name != LOOPBACK {
        names.push(LOOPBACK);
    }
    for n in names {
        let Some(link) = find(&handle, n).await? else {
            continue;
        };
        let index = link.header.index;
        let mut addrs = handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut mine = Vec::new();
        let mut others = 0usize;
        while let Some(msg) = addrs.try_next().await.map_err(nl("list addresses", n))? {
            let matches = msg.attributes.iter().any(|a| {
                matches!(a, AddressAttribute::Local(ip) | AddressAttribute::Address(ip) if *ip == address)
            });
            if matches {
                mine.push(msg);
            } else {
                others += 1;
            }
        }
        if let Some(msg) = mine.into_iter().next() {
            handle
                .address()
                .del(msg)
                .execute()
                .await
                .map_err(nl(format!("remove address {address}"), n))?;
            removed.address_from.push(n.to_string());
        }
        if n == name && n != LOOPBACK && others == 0 && is_dummy(&link) {
            handle
                .link()
                .del(index)
                .execute()
                .await
                .map_err(nl("delete dummy", n))?;
            removed.deleted_link = Some(n.to_string());
        }
    }
    Ok(removed)
}
