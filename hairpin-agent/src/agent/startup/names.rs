//! The addresses the agent listens on and the name relay: the relays' listen
//! addresses and the names address put on their links, the names scope, and the
//! name relay's configuration.
//!
//! Owns turning the names and listen flags into typed configs. Never routes a name
//! nor binds a listener itself (`names`, `relay` do).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tracing::info;

use super::{NodeIps, StartError};
use crate::agent::{
    args::{DEFAULT_LISTEN_V4, DEFAULT_LISTEN_V6, NamesRedirect, RunArgs},
    mode::Plan,
    reconcile::ListenAddresses,
};
use crate::{
    names::{
        link::{self as names_link},
        relay::{NameRouting, NameRoutingConfig, Redirect, ServiceListener},
        scope::{NameScope, ScopeRule},
    },
    relay::RelayConfig,
    status::{AgentState, ListenStatus, NamesStatus, metrics::Metrics},
};

/// Puts the listen addresses on their link and lists them in `/status`.
pub(super) async fn publish_listen_addresses(
    args: &RunArgs,
    listen: ListenAddresses,
    state: &AgentState,
) -> Result<(), StartError> {
    let note = listen_on_link(args, listen).await?;
    state.update(|s| {
        s.listen = Some(ListenStatus {
            addresses: [listen.v4, listen.v6].into_iter().flatten().collect(),
            link: args.listen_link().map(str::to_string),
            note,
        })
    });
    Ok(())
}

/// Which names may be published: `--names-domains` and `--cluster-domain`, validated
/// once, refusing this node's names too (the API server's is added with the client).
pub(super) fn names_scope(args: &RunArgs) -> Result<NameScope, StartError> {
    let mut scope = NameScope::new(&args.decision.names_domains, &args.decision.cluster_domain)?
        .with_caps(args.decision.name_limits.limits());
    if let Ok(node) = args.node_name() {
        scope = scope.refuse_own(&node, ScopeRule::NodeName, "this node's name");
    }
    if let Ok(host) = nix::unistd::gethostname() {
        scope = scope.refuse_own(
            &host.to_string_lossy(),
            ScopeRule::NodeName,
            "this node's host name",
        );
    }
    Ok(scope)
}

/// The name relay, when the plan runs one and ports are configured. It listens
/// only once a route exists, so an agent without names never takes ports 80/443.
#[expect(
    clippy::too_many_arguments,
    reason = "startup wiring: each is one already-validated piece"
)]
pub(super) async fn start_names(
    args: &RunArgs,
    scope: &NameScope,
    plan: &Plan,
    listen: ListenAddresses,
    node: NodeIps,
    relay: &RelayConfig,
    metrics: &Metrics,
    state: &AgentState,
) -> Result<Option<NameRouting>, StartError> {
    let Some(address) = args.names_address.or(listen.v4).or(listen.v6) else {
        return Ok(None);
    };
    if !plan.name_relay || (args.names_ports.0.is_empty() && args.names_service_ports.0.is_empty())
    {
        return Ok(None);
    }
    let link_note = names_on_link(args, address).await?;
    let hosts_file = args.hosts_file.clone().filter(|_| plan.hosts);
    state.update(|s| {
        s.names = Some(NamesStatus {
            address: Some(address),
            link: args.names_link.clone(),
            link_note,
            hosts_file: hosts_file.clone(),
            domains: scope.domains().to_vec(),
            scope: scope.describe(),
            ..NamesStatus::default()
        })
    });
    Ok(Some(NameRouting::new(
        NameRoutingConfig {
            address,
            ports: args.names_ports.0.clone(),
            redirect: match (args.names_redirect, plan.ebpf) {
                (NamesRedirect::Off, _) => Redirect::Bound,
                (NamesRedirect::Auto, true) => Redirect::ConnectPrograms,
                (NamesRedirect::Auto, false) => Redirect::Netfilter,
            },
            service_listeners: service_listeners(args, node.v4, node.v6),
            hosts_file,
            hosts_min_interval: args.decision.name_limits.hosts_min_interval,
            report_to: Some(state.clone()),
            peek_timeout: Duration::from_secs(5),
        },
        relay.clone(),
        metrics.clone(),
    )))
}

/// The name relay's listeners for the `hairpin` Service: every node IP at each
/// target port (a hostNetwork pod's endpoints are the node's IPs).
pub(super) fn service_listeners(
    args: &RunArgs,
    node_v4: Option<IpAddr>,
    node_v6: Option<IpAddr>,
) -> Vec<ServiceListener> {
    let mut out = Vec::new();
    for ip in [node_v4, node_v6].into_iter().flatten() {
        for &(routes_as, listen) in &args.names_service_ports.0 {
            out.push(ServiceListener {
                bind: SocketAddr::new(ip, listen),
                routes_as,
            });
        }
    }
    out
}

/// Where the relays listen: `--listen-address`, else the node-local defaults for
/// each family this node has an IP of.
pub(super) fn listen_addresses(
    args: &RunArgs,
    node_v4: Option<IpAddr>,
    node_v6: Option<IpAddr>,
) -> ListenAddresses {
    if args.listen_addresses.is_empty() {
        return ListenAddresses {
            v4: node_v4.map(|_| IpAddr::V4(DEFAULT_LISTEN_V4)),
            v6: node_v6.map(|_| IpAddr::V6(DEFAULT_LISTEN_V6)),
        };
    }
    ListenAddresses {
        v4: args.listen_addresses.iter().find(|i| i.is_ipv4()).copied(),
        v6: args.listen_addresses.iter().find(|i| i.is_ipv6()).copied(),
    }
}

/// Puts the listen addresses on the listen link (see `--listen-link`); returns
/// what was done, one line per address.
pub(super) async fn listen_on_link(
    args: &RunArgs,
    listen: ListenAddresses,
) -> Result<Option<String>, StartError> {
    let Some(link) = args.listen_link() else {
        return Ok(None);
    };
    let mut notes = Vec::new();
    for address in [listen.v4, listen.v6].into_iter().flatten() {
        let outcome =
            names_link::ensure(link, address)
                .await
                .map_err(|source| StartError::ListenLink {
                    link: link.to_string(),
                    address,
                    source: Box::new(source),
                })?;
        let note = outcome.note(address);
        info!(link = outcome.link(), %address, "{note}");
        notes.push(note);
    }
    Ok(Some(notes.join("; ")))
}

/// The addresses the agent puts on links: the relays' listen addresses on
/// `--listen-link`, and the names address on `--names-link`.
pub(super) fn link_addresses(args: &RunArgs, listen: ListenAddresses) -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    if let Some(link) = args.listen_link() {
        out.extend(
            [listen.v4, listen.v6]
                .into_iter()
                .flatten()
                .map(|a| (link.to_string(), a)),
        );
    }
    if let (Some(link), Some(address)) = (&args.names_link, args.names_address) {
        out.push((link.clone(), address));
    }
    out
}

/// Puts the names address on `--names-link` when set; returns what was done.
pub(super) async fn names_on_link(
    args: &RunArgs,
    address: IpAddr,
) -> Result<Option<String>, StartError> {
    let Some(link) = &args.names_link else {
        return Ok(None);
    };
    let outcome =
        names_link::ensure(link, address)
            .await
            .map_err(|source| StartError::NamesLink {
                link: link.clone(),
                address,
                source: Box::new(source),
            })?;
    let note = outcome.note(address);
    info!(link = outcome.link(), %address, "{note}");
    Ok(Some(note))
}
