//! The name relay: listeners for one node-local address (ports 80 and 443 by
//! default) that serve names rather than IPs. /etc/hosts and CoreDNS point the
//! proxied hostnames here; each connection is routed by its TLS SNI or
//! HTTP Host to the LoadBalancer that name belongs to, with the same PROXY header
//! the eBPF path's relay writes. Used where the programs cannot attach, and for
//! clients that use names.
//!
//! Where the connect programs are attached, nothing binds the names ports
//! themselves: each listener takes a privileged port on the names address (the
//! highest free one below 1024: no uid without CAP_NET_BIND_SERVICE can take it
//! while no agent runs, and it is never one of the node's ephemeral ports) and the
//! names address and port become one more entry of the frontends map
//! ([`NameRouting::redirects`]), so a connect to `169.254.104.1:80` is sent to it
//! like any relayed frontend. A host process (a hostNetwork ingress) that binds
//! `0.0.0.0:80` or `0.0.0.0:443` after names are published then binds normally.
//! Without the programs the listeners bind the names ports as they are.

mod conn;
pub(crate) mod http_host;
pub(crate) mod sni;

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use tokio::{sync::watch, time::timeout};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, error, info, info_span, warn};

use hairpin_ebpf::LISTENER_NAMES_FIRST;

use crate::{
    names::{
        hosts_writer::HostsWriter,
        nat,
        routes::{NameRoute, RouteTable},
    },
    relay::{ListenHook, ListenHookError, RelayConfig, listener},
    status::FailedListener,
    status::{AgentState, metrics::Metrics},
};

/// What the first bytes of a connection say about the name it is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peek {
    /// Not enough bytes yet to decide.
    NeedMore,
    /// The name the client asked for, as sent (the route lookup validates it).
    Name(String),
    /// A complete ClientHello without SNI, or request head without Host.
    NoName,
    /// Not this protocol, or malformed; says what was expected.
    Invalid(&'static str),
}

/// Name routing settings, validated once at startup.
#[derive(Clone, Debug)]
pub(crate) struct NameRoutingConfig {
    /// The node-local address the listeners bind and /etc/hosts names.
    pub address: IpAddr,
    /// The ports clients dial on [`address`](Self::address) (80 and 443 typically).
    pub ports: Vec<u16>,
    /// How connects to [`ports`](Self::ports) reach their listeners.
    pub redirect: Redirect,
    /// Further listeners, each with the port its connections are routed as: the
    /// node IPs at the `hairpin` Service's target ports, for pods (whose CoreDNS
    /// answer is the Service) and anything else dialling the Service.
    pub service_listeners: Vec<ServiceListener>,
    /// The hosts file to manage, if any.
    pub hosts_file: Option<PathBuf>,
    /// The hosts file is written at most once per this interval (`--hosts-min-interval`).
    pub hosts_min_interval: Duration,
    /// Where the hosts file writer reports (the names status), when anywhere.
    pub report_to: Option<AgentState>,
    /// How long a client may take to send its ClientHello or request head.
    pub peek_timeout: Duration,
}

/// How connects to the names ports reach the name relay's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// The listeners bind the names ports as they are (`--names-redirect off`): a
    /// host process cannot bind `0.0.0.0` on them while the relay runs.
    Bound,
    /// The connect programs are attached: the listeners take privileged ports
    /// ([`crate::relay::listener::bind_privileged`]) and the names address and
    /// ports are frontends-map entries
    /// ([`NameRouting::redirects`], inserted by the agent).
    ConnectPrograms,
    /// No programs: the listeners take privileged ports and the agent's nftables
    /// table DNATs the names ports to them ([`crate::names::nat`]). Where the table
    /// cannot be written, the listeners bind the ports as they are instead.
    Netfilter,
}

impl Redirect {
    /// For `status`: how the names ports are reached.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Redirect::Bound => "bound as they are",
            Redirect::ConnectPrograms => "redirected by the connect programs",
            Redirect::Netfilter => {
                "redirected by the agent's nftables table (table ip/ip6 hairpin)"
            }
        }
    }
}

/// A listener whose connections are routed as if they came to another port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServiceListener {
    /// Where to listen: a node IP and the Service's targetPort.
    pub bind: SocketAddr,
    /// The port the client dialled (the Service port), which is also the LB port.
    pub routes_as: u16,
}

/// What every connection needs.
struct Shared {
    relay: RelayConfig,
    metrics: Metrics,
    table: watch::Receiver<Arc<RouteTable>>,
    peek_timeout: Duration,
}

/// The running name relay and hosts-file writer.
pub(crate) struct NameRouting {
    cfg: NameRoutingConfig,
    shared: Arc<Shared>,
    table: watch::Sender<Arc<RouteTable>>,
    /// By the address clients dial: the bound listener.
    listeners: BTreeMap<SocketAddr, Bound>,
    /// By requested bind address: why it could not be bound, until it is. The run
    /// loop retries these with backoff; each error is logged once.
    failed: BTreeMap<SocketAddr, String>,
    /// How many routes the hosts file left out last time: a change is said once.
    withheld: usize,
    /// The hosts file's writer, when one is managed.
    hosts: Option<HostsWriter>,
    connections: TaskTracker,
    /// Called with each redirected listener before it is used (its liveness entry).
    on_listen: Option<ListenHook>,
    /// How the names ports are reached now ([`NameRoutingConfig::redirect`], or
    /// [`Redirect::Bound`] once the nftables table could not be written).
    redirect: Redirect,
    /// Why the configured redirect was given up, if it was.
    redirect_error: Option<String>,
    /// The ports the nftables table sends where, as last written.
    nat_written: Vec<nat::PortRedirect>,
}

/// One bound name relay listener.
struct Bound {
    /// The address the kernel reports it bound.
    local: SocketAddr,
    /// Its index in the relays' listener map, when redirected.
    index: u8,
    /// The port its connections are routed as.
    routes_as: u16,
    /// Reached through the frontends map rather than bound at the dialled address.
    redirected: bool,
    stop: CancellationToken,
}

/// One wanted listener: the address clients dial, the one to bind, the port its
/// connections route as, and (redirected) its index in the relays' listener map.
struct Wanted {
    dialled: SocketAddr,
    bind: SocketAddr,
    routes_as: u16,
    index: u8,
}

impl NameRouting {
    /// A name relay with no routes and no listeners yet.
    pub(crate) fn new(cfg: NameRoutingConfig, relay: RelayConfig, metrics: Metrics) -> NameRouting {
        let (table, rx) = watch::channel(Arc::new(RouteTable::default()));
        let hosts = cfg.hosts_file.clone().map(|path| {
            HostsWriter::spawn(
                path,
                cfg.address,
                cfg.hosts_min_interval,
                metrics.clone(),
                cfg.report_to.clone(),
            )
        });
        let shared = Arc::new(Shared {
            relay,
            metrics,
            table: rx,
            peek_timeout: cfg.peek_timeout,
        });
        let redirect = cfg.redirect;
        NameRouting {
            cfg,
            shared,
            table,
            listeners: BTreeMap::new(),
            failed: BTreeMap::new(),
            withheld: 0,
            hosts,
            connections: TaskTracker::new(),
            on_listen: None,
            redirect,
            redirect_error: None,
            nat_written: Vec::new(),
        }
    }

    /// Calls `hook` with every redirected listener started from now on, before its
    /// redirect is handed out (the connect programs send connects only to a
    /// listener in their liveness map).
    pub(crate) fn on_listen(&mut self, hook: ListenHook) {
        self.on_listen = Some(hook);
    }

    /// The names address clients dial.
    pub(crate) fn address(&self) -> IpAddr {
        self.cfg.address
    }

    /// Addresses the listeners are bound to.
    pub(crate) fn listeners(&self) -> Vec<SocketAddr> {
        self.listeners.values().map(|b| b.local).collect()
    }

    /// How the names ports are reached now, and why the configured way was given
    /// up (the nftables table could not be written), if it was.
    pub(crate) fn redirect(&self) -> (Redirect, Option<&str>) {
        (self.redirect, self.redirect_error.as_deref())
    }

    /// The redirected listeners: each names address and port clients dial, and the
    /// listener it is sent to (through a relay slot handed to that listener under
    /// [`Redirect::ConnectPrograms`], nftables rules under [`Redirect::Netfilter`]).
    pub(crate) fn redirects(&self) -> Vec<(SocketAddr, SocketAddr)> {
        self.listeners
            .iter()
            .filter(|(_, b)| b.redirected)
            .map(|(dialled, b)| (*dialled, b.local))
            .collect()
    }

    /// As [`redirects`](Self::redirects), with each listener's index in the relays'
    /// listener map (what a slot for the names port is handed to).
    pub(crate) fn redirect_indexes(&self) -> Vec<(SocketAddr, u8)> {
        self.listeners
            .iter()
            .filter(|(_, b)| b.redirected)
            .map(|(dialled, b)| (*dialled, b.index))
            .collect()
    }

    /// Why the hosts file was not written by the last [`update`](Self::update)
    /// (for `/status`), `None` when it was (or is not managed).
    pub(crate) fn hosts_error(&self) -> Option<String> {
        self.hosts.as_ref().and_then(HostsWriter::error)
    }

    /// Listeners that could not be bound, with their last error; retried on every
    /// [`update`](Self::update) until they are.
    pub(crate) fn failed_listeners(&self) -> Vec<FailedListener> {
        self.failed
            .iter()
            .map(|(address, error)| FailedListener {
                address: *address,
                error: error.clone(),
            })
            .collect()
    }

    /// The routes the hosts file may name: none of their ports may be a names port
    /// whose listener is not bound (taken by another process). /etc/hosts cannot
    /// point a name somewhere per port, so such a name stays on its pre-hairpin
    /// path rather than reaching an address that refuses it on that port.
    fn servable(&self, routes: &[NameRoute]) -> Vec<NameRoute> {
        let address = self.cfg.address;
        let unbound: Vec<u16> = self
            .cfg
            .ports
            .iter()
            .copied()
            .filter(|p| !self.listeners.contains_key(&SocketAddr::new(address, *p)))
            .collect();
        routes
            .iter()
            .filter(|r| !r.ports.iter().any(|p| unbound.contains(p)))
            .cloned()
            .collect()
    }

    /// Routes new connections by `routes` and asks the hosts file writer for the
    /// block to match (written at once or, within `--hosts-min-interval` of the
    /// last write, at its end: see [`crate::names::hosts_writer`]).
    ///
    /// Listeners start with the first non-empty set, so an agent without names never
    /// takes ports 80/443 on the node. A port that cannot be bound is logged and
    /// left out and tried again on the next call (the run loop calls again with
    /// backoff while [`failed_listeners`](Self::failed_listeners) is not empty);
    /// the hosts file names the relay for a name only while every names port it
    /// uses has a listener, so a name is never pointed at an address that refuses it.
    pub(crate) fn update(&mut self, routes: &[NameRoute]) {
        if !routes.is_empty() {
            self.start_listeners();
            if self.redirect == Redirect::Netfilter {
                self.write_nat();
            }
        }
        self.table.send_replace(Arc::new(RouteTable::new(routes)));
        if self.hosts.is_none() {
            return;
        }
        let published = self.servable(routes);
        let withheld = routes.len() - published.len();
        if withheld != self.withheld && withheld > 0 {
            warn!(
                withheld,
                "hosts file: names with a port the name relay cannot serve are left out"
            );
        }
        self.withheld = withheld;
        if let Some(hosts) = self.hosts.as_mut() {
            hosts.set(&published);
        }
    }

    /// Writes the nftables table for the redirected listeners when they changed.
    /// Where it cannot be written, the names ports are bound as they are instead.
    fn write_nat(&mut self) {
        let wanted: Vec<nat::PortRedirect> = self
            .redirects()
            .into_iter()
            .map(|(dialled, listener)| nat::PortRedirect {
                dialled: dialled.port(),
                listener: listener.port(),
            })
            .collect();
        if wanted == self.nat_written {
            return;
        }
        match nat::apply(self.cfg.address, &wanted) {
            Ok(()) => {
                info!(address = %self.cfg.address, ports = ?wanted, "names ports redirected by the agent's nftables table");
                self.nat_written = wanted;
            }
            Err(e) => {
                let why = format!("the nftables table cannot be written: {e}");
                error!(error = %why, "the name relay binds the names ports as they are instead; a host process cannot bind 0.0.0.0 on them while it runs");
                self.redirect = Redirect::Bound;
                self.redirect_error = Some(why);
                self.listeners.retain(|_, b| {
                    if b.redirected {
                        b.stop.cancel();
                    }
                    !b.redirected
                });
                self.start_listeners();
            }
        }
    }

    /// The listeners to run: the names ports (bound as they are, or on privileged
    /// ports when redirected: port 0 here) and the Service target ports.
    fn wanted(&self) -> Vec<Wanted> {
        let address = self.cfg.address;
        let names = self.cfg.ports.iter().zip(0u8..).map(|(&port, i)| Wanted {
            index: LISTENER_NAMES_FIRST.saturating_add(i),
            dialled: SocketAddr::new(address, port),
            bind: SocketAddr::new(
                address,
                if self.redirect == Redirect::Bound {
                    port
                } else {
                    0
                },
            ),
            routes_as: port,
        });
        let service = self.cfg.service_listeners.iter().map(|l| Wanted {
            index: 0,
            dialled: l.bind,
            bind: l.bind,
            routes_as: l.routes_as,
        });
        names.chain(service).collect()
    }

    fn start_listeners(&mut self) {
        for want in self.wanted() {
            if self.listeners.contains_key(&want.dialled) {
                continue;
            }
            match self.start_listener(&want) {
                Ok(bound) => {
                    let retried = self.failed.remove(&want.dialled).is_some();
                    let (local, routes_as) = (bound.local, bound.routes_as);
                    if bound.redirected {
                        info!(%local, dialled = %want.dialled, retried,
                            "name relay listening (connects to the names port are redirected here)");
                    } else if local.port() == routes_as {
                        info!(%local, retried, "name relay listening");
                    } else {
                        info!(%local, routes_as, retried, "name relay listening (Service target port)");
                    }
                    self.listeners.insert(want.dialled, bound);
                }
                Err(e) => {
                    let why = e.to_string();
                    // Said once per address and reason, not on every retry.
                    if self.failed.get(&want.dialled) != Some(&why) {
                        error!(addr = %want.dialled, error = %why, "name relay cannot listen; names on this port are not routed until it can (retrying)");
                    }
                    self.failed.insert(want.dialled, why);
                }
            }
        }
    }

    /// Binds one listener, registers it when it is redirected, and starts its
    /// accept loop.
    fn start_listener(&self, want: &Wanted) -> Result<Bound, ListenFailed> {
        let redirected = want.bind != want.dialled;
        let listener = if redirected {
            // A privileged port, never an ephemeral one: the table (or the frontends
            // entry) sending the names port here may outlive this agent, and a port
            // any uid could bind would then receive the names' plaintext HTTP.
            listener::bind_privileged(
                want.bind.ip(),
                self.shared.relay.keepalive,
                &self.cfg.ports,
                &listener::reserved_ports(),
            )
        } else {
            listener::bind(want.bind, self.shared.relay.keepalive)
        }
        .map_err(ListenFailed::Bind)?;
        let local = listener.local_addr().unwrap_or(want.bind);
        if redirected && let Some(hook) = &self.on_listen {
            use std::os::fd::AsFd;
            hook(want.index, local, listener.as_fd())
                .map_err(|source| ListenFailed::Register { local, source })?;
        }
        let stop = CancellationToken::new();
        let shared = self.shared.clone();
        let routes_as = want.routes_as;
        let serve = move |client, peer, local| {
            conn::serve(client, peer, local, routes_as, shared.clone())
                .instrument(info_span!("name_conn", client = %peer))
        };
        tokio::spawn(
            listener::accept_loop(
                listener,
                local,
                stop.clone(),
                self.shared
                    .relay
                    .admission(&self.shared.metrics, &self.connections),
                serve,
            )
            .instrument(info_span!("name_listener", %local)),
        );
        Ok(Bound {
            local,
            index: want.index,
            routes_as,
            redirected,
            stop,
        })
    }

    /// Stops the listeners and waits up to `deadline` for open connections. The
    /// hosts file keeps its block (see [`crate::names::hosts_writer`]), written first if a change
    /// was still waiting for `--hosts-min-interval`.
    pub(crate) async fn drain(&mut self, deadline: Duration) {
        if let Some(hosts) = self.hosts.as_mut() {
            hosts.shutdown().await;
        }
        for (_, bound) in std::mem::take(&mut self.listeners) {
            bound.stop.cancel();
        }
        self.connections.close();
        if timeout(deadline, self.connections.wait()).await.is_err() {
            warn!("name relay: drain deadline reached");
        }
    }
}

/// Why a name relay listener is not up (retried).
#[derive(Debug, thiserror::Error)]
enum ListenFailed {
    /// The address could not be bound.
    #[error("{0}")]
    Bind(std::io::Error),
    /// A redirected listener could not be registered as live, so nothing would be
    /// sent to it.
    #[error("listener {local} not registered as live: {source}")]
    Register {
        /// The listener's address.
        local: SocketAddr,
        /// The hook owner's error.
        source: ListenHookError,
    },
}

#[cfg(test)]
mod proptests;
