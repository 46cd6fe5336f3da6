//! `hairpin-agent run`: the DaemonSet's agent, from startup to shutdown.
//!
//! [`Agent::start`] takes the source first (a bad file or kubeconfig changes
//! nothing), then the admin server (the probes answer while the datapath waits for
//! the pin directory), then the datapath as `--mode` allows, then the name relay as
//! the resulting [`mode::Plan`] says. [`Agent::apply`] makes what
//! the source wants live, [`Agent::wait`] waits for the next reason to apply, and
//! [`Agent::shutdown`] removes the redirects before it lets connections drain.
//!
//! Owns the order of those steps and turning flags into typed configs for the parts
//! below it (k8s, names, relay, datapath, status); owns no protocol or kernel code
//! of its own.

pub(crate) mod args;
pub(crate) mod clients;
pub(crate) mod coredns_writer;
pub(crate) mod env_check;
pub(crate) mod frontends_file;
pub(crate) mod limits;
pub(crate) mod mode;
pub(crate) mod name_limits;
pub(crate) mod reconcile;
pub(crate) mod report;
pub(crate) mod slot_addresses;
pub(crate) mod source;
mod startup;

pub use args::{RunArgs, default_listen_addresses};
pub use coredns_writer::{CorednsWriterArgs, run as run_coredns_writer};
pub use env_check::check_env;
pub use frontends_file::{
    FrontendsFileError, parse as parse_frontends_file, parse_routes as parse_frontends_file_routes,
};
pub(crate) use startup::{SignalError, StartError};

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{signal::unix::Signal, time::Interval};
use tracing::{debug, info, warn};

use crate::k8s::desired::{Desired, DesiredRx, ToApply, ToReport};
use mode::Plan;
use reconcile::{Backoff, Reconciler, Trigger};
use report::NamePaths;

use crate::{
    datapath::{
        Datapath, FrontendsMap, Pin, SlotTable, drain_kernel_sockets,
        lifecycle::{Removal, Stop, StopSeen, decide},
    },
    k8s::{
        coredns::ObjectName,
        owner::{self, Teardown},
    },
    model::LivePath,
    names::relay::NameRouting,
    relay::Relay,
    status::{AgentState, admin::AdminServer, metrics::Metrics},
};

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> Result<(), StartError> {
    let mut agent = match Agent::start(args).await {
        Ok(agent) => agent,
        // Asked to stop before it owned anything: a stop, not a failure (exit 0).
        Err(StartError::Stopped { signal }) => {
            info!(signal, "agent stopped before it started");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut trigger = Trigger::Change;
    loop {
        agent.apply(trigger);
        match agent.wait().await {
            Wake::Changed => trigger = Trigger::Change,
            Wake::Retry => trigger = Trigger::Retry,
            Wake::Stop => break,
        }
    }
    agent.shutdown().await;
    Ok(())
}

/// Why [`Agent::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The source delivered a new desired state.
    Changed,
    /// Failed frontends or name listeners are due for a retry.
    Retry,
    /// SIGTERM, SIGINT, or the source ended.
    Stop,
}

/// The running agent.
pub(crate) struct Agent {
    state: AgentState,
    metrics: Metrics,
    desired: DesiredRx,
    /// What was applied last, to tell a change that only reports from one to apply.
    applied: Option<Arc<Desired>>,
    source_name: String,
    plan: Plan,
    /// The frontends map's and the slots map's one writer.
    reconciler: Reconciler<FrontendsMap, SlotTable>,
    /// The relay's listeners, and the connections they relay.
    relay: Relay,
    /// The relay's listeners and the families it does not serve (a listener that
    /// could not bind, no sk_lookup program): their relayed frontends are listed as
    /// failed. `None` without a datapath.
    relay_status: Option<crate::status::RelayStatus>,
    /// What it takes to try a failed relay listener again.
    relay_retry: Option<startup::RelayRetry>,
    /// The datapath, for its lifecycle (kept or removed on SIGTERM) and counters;
    /// its frontends map belongs to the reconciler.
    datapath: Option<Datapath>,
    names: Option<NameRouting>,
    admin: Option<AdminServer>,
    drain_timeout: Duration,
    signals: (Signal, Signal),
    ready: bool,
    retry: Backoff,
    retry_in: Option<Duration>,
    heartbeat: Interval,
    /// The datapath's heartbeat task (see `datapath::Heartbeat`); stops with the agent.
    beating: Option<tokio::task::AbortHandle>,
    /// Tells the heartbeat task that the first apply is done, so it starts beating
    /// (sent once, then `None`).
    first_applied: Option<tokio::sync::oneshot::Sender<()>>,
    /// The API server, to ask on SIGTERM whether this agent's DaemonSet is going
    /// (`None` with the frontends file).
    kube: Option<kube::Client>,
    /// `--daemonset`: whose deletion is an uninstall.
    daemonset: Option<ObjectName>,
    /// The addresses this agent put on links (the relays' listen addresses, the
    /// names address), removed on an uninstall.
    link_addresses: Vec<(String, IpAddr)>,
}

/// Decides what SIGTERM does with a datapath that is `pinned` or not
/// ([`decide::stop`]): removed only when nothing is pinned (it goes with the process
/// anyway) or the API server says the DaemonSet is gone or being deleted
/// ([`owner::on_sigterm`], which keeps it when in doubt: a kept datapath never breaks
/// traffic, it goes inert at the TTL and `cleanup` removes it; a removed one would
/// leave every connect without hairpin until the next agent starts).
pub(crate) async fn decide_removal(
    pinned: bool,
    kube: Option<&kube::Client>,
    daemonset: Option<&ObjectName>,
) -> Stop {
    let uninstall = matches!(owner::on_sigterm(kube, daemonset).await, Teardown::Remove);
    decide::stop(&StopSeen { pinned, uninstall })
}

impl Agent {
    /// Makes what the source says now live (nothing before it first synced), and
    /// reports it; arms the retry timer while something can still come right.
    pub(crate) fn apply(&mut self, trigger: Trigger) {
        let Some(next) = self.desired.borrow_and_update().clone() else {
            return;
        };
        self.report_only(&next.report);
        let started = Instant::now();
        self.reconciler.apply(&next.apply.frontends, trigger);
        let (relay_ip, failed_names) = self.apply_names(&next.apply);
        let failed_listeners = failed_names + self.retry_relay();
        if !self.ready {
            self.reconciler.forget_earlier_entries();
            self.complete_handover();
            // Only now does this agent vouch for the datapath: the entries are what
            // its source lists, an earlier agent's stale ones gone.
            if let Some(first) = self.first_applied.take() {
                let _ = first.send(());
            }
        }
        let took = started.elapsed();
        self.report(&next.apply, relay_ip, took);
        // A frontend that failed transiently (a port taken) and a name relay
        // listener that could not bind are retried on their own, with backoff,
        // instead of waiting for the next change.
        self.retry_in = if !self.reconciler.has_transient_failures() && failed_listeners == 0 {
            self.retry.reset();
            None
        } else {
            let d = self.retry.next_delay();
            debug!(failed = self.reconciler.failed().len(), failed_listeners, retry_in = ?d,
                "failed frontends and listeners will be retried");
            Some(d)
        };
        self.applied = Some(next);
        if !self.ready {
            self.ready = true;
            info!(
                live = ?self.plan.live(),
                frontends = self.reconciler.active().count(),
                failed = self.reconciler.failed().len(),
                "agent ready"
            );
        }
    }

    /// After the first apply, with this agent's frontends live: the connect links
    /// of another layout's datapath being handed over get this agent's programs
    /// (see `datapath::lifecycle`), and `/status` lists the links as they are now.
    fn complete_handover(&mut self) {
        let Some(d) = self.datapath.as_mut() else {
            return;
        };
        if d.complete_handover() {
            let ids = d.kernel_ids();
            let adopted = d
                .attachment()
                .map(|a| a.adopted_status())
                .unwrap_or_default();
            self.state.update(|s| {
                if let Some(a) = s.attachment.as_mut() {
                    a.ids = ids;
                }
                if let Some(l) = s.lifecycle.as_mut() {
                    l.adopted = adopted;
                }
            });
        }
    }

    /// Where the connect links are at the root's child cgroups (a kernel that cannot
    /// order cgroup links, beside a socket load balancer): links the children made
    /// since, forgets those removed, and says so in `/status` and the metrics.
    fn rescan_children(&mut self) {
        let Some(d) = self.datapath.as_mut() else {
            return;
        };
        let (new, gone) = d.rescan_children();
        if new + gone == 0 {
            return;
        }
        let ids = d.kernel_ids();
        self.state.update(|s| {
            if let Some(a) = s.attachment.as_mut() {
                a.ids = ids;
            }
        });
        startup::report_link_order(d, &self.state, &self.metrics);
    }

    /// Whether the source's new value differs from the one applied last only in
    /// what is reported (a Service's decision, the cluster DNS): then it is
    /// reported, and nothing is applied nor the retry timer restarted.
    fn only_reported_changed(&mut self) -> bool {
        let Some(next) = self.desired.borrow_and_update().clone() else {
            return false;
        };
        if !self
            .applied
            .as_ref()
            .is_some_and(|last| last.apply == next.apply)
        {
            return false;
        }
        self.report_only(&next.report);
        self.applied = Some(next);
        true
    }

    /// Lists what the source only reports in `/status` and metrics: the decisions,
    /// the cluster DNS, and the names left out or withheld by the caps.
    fn report_only(&self, next: &ToReport) {
        let decisions = next.decisions.iter().map(|d| d.to_status()).collect();
        self.state.update(|st| {
            st.decisions = decisions;
            st.cluster_dns = next.cluster_dns.clone();
            if let Some(names) = st.names.as_mut() {
                names.skips = next.route_skips.iter().map(|k| k.message.clone()).collect();
                names.limits = Some(next.name_limits.clone());
            }
        });
        if self.names.is_some() {
            self.metrics.set_names_withheld(next.name_limits.withheld);
        }
    }

    /// Tries the relay's failed listeners again (after the first apply: the first
    /// try was at start), and says in `/status` and the metrics how they stand; how
    /// many are still worth retrying.
    fn retry_relay(&mut self) -> usize {
        let (Some(status), Some(retry)) = (self.relay_status.as_mut(), self.relay_retry.as_ref())
        else {
            return 0;
        };
        if startup::RelayRetry::pending(status) == 0 {
            return 0;
        }
        if self.ready {
            // The error may have changed too: said as it stands.
            retry.retry(&mut self.relay, status);
            let now = status.clone();
            self.metrics.set_relay_unserved(now.unserved.len());
            self.state.update(|s| s.relay = Some(now));
        }
        startup::RelayRetry::pending(status)
    }

    /// Routes names and starts name listeners; the relay's address and how many
    /// listeners are still failing.
    fn apply_names(&mut self, next: &ToApply) -> (Option<IpAddr>, usize) {
        let Some(n) = self.names.as_mut() else {
            return (None, 0);
        };
        n.update(&next.routes);
        let (how, redirect_error) = n.redirect();
        let redirects = n.redirects();
        if how == crate::names::relay::Redirect::ConnectPrograms {
            self.reconciler.redirect_names(n.redirect_indexes());
        }
        let (how, redirect_error) = (how.describe(), redirect_error.map(str::to_string));
        let listeners = n.listeners();
        let failed = n.failed_listeners();
        let hosts_error = n.hosts_error();
        let (relay_ip, count) = (listeners.first().map(|a| a.ip()), failed.len());
        self.state.update(|s| {
            if let Some(st) = s.names.as_mut() {
                st.listeners = listeners;
                st.redirects = redirects
                    .iter()
                    .map(|&(dialled, listener)| crate::status::NameRedirect { dialled, listener })
                    .collect();
                st.redirect = Some(how.to_string());
                st.redirect_error = redirect_error.clone();
                st.failed_listeners = failed;
                st.hosts_error = hosts_error;
                st.routes = next.routes.len();
            }
        });
        (relay_ip, count)
    }

    fn report(&self, next: &ToApply, relay_ip: Option<IpAddr>, took: Duration) {
        let rec = &self.reconciler;
        self.metrics.observe_reconcile(took);
        let name_paths: Vec<LivePath> = self.plan.name_paths();
        let paths = NamePaths::new(name_paths, &next.routes, relay_ip);
        let reconciled = report::Reconciled {
            active: rec.active(),
            failed: rec.failed(),
            held: rec.held(),
        };
        let mut statuses = report::frontend_statuses(reconciled, &next.frontends, &paths);
        let unserved = self
            .relay_status
            .as_ref()
            .map_or(0, |r| report::mark_unserved(&mut statuses, &r.unserved));
        self.metrics.set_frontends(
            rec.active().count() - unserved,
            rec.failed().len() + unserved,
        );
        self.state.record_frontends(statuses, took);
        self.state.source_synced(&self.source_name);
        // How long a change takes to apply at scale: `cargo xtask bench` reads this.
        info!(
            frontends = rec.active().count(),
            failed = rec.failed().len(),
            routes = next.routes.len(),
            elapsed_ms = took.as_secs_f64() * 1e3,
            "reconcile finished"
        );
        limits::release_free_memory();
    }

    /// Waits for the next reason to apply, beating while idle so `/healthz` can
    /// tell a stuck loop.
    pub(crate) async fn wait(&mut self) -> Wake {
        let retry_in = self.retry_in;
        let retry_timer = async {
            match retry_in {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(retry_timer);
        loop {
            self.state.beat();
            tokio::select! {
                _ = self.signals.0.recv() => { info!("SIGTERM"); return Wake::Stop }
                _ = self.signals.1.recv() => { info!("SIGINT"); return Wake::Stop }
                changed = self.desired.changed() => {
                    if changed.is_err() { return Wake::Stop }
                    if self.only_reported_changed() { continue }
                    self.retry.reset();
                    return Wake::Changed;
                }
                () = &mut retry_timer => {
                    debug!("retrying failed frontends and listeners");
                    return Wake::Retry;
                }
                _ = self.heartbeat.tick() => self.rescan_children(),
            }
        }
    }

    /// Stops what depends on this process and lets the connections already relayed
    /// finish, within `--drain-timeout`. The name relay drains alongside; its
    /// hosts-file block and link address stay for the next agent (`hairpin-agent
    /// cleanup` removes them). The relay's listeners close, so they leave the
    /// liveness map and no connect is sent to them any more.
    ///
    /// A pinned datapath is kept for the next agent unless this is an uninstall
    /// (see [`decide_removal`]): the kernel path's programs keep writing headers
    /// with no process in the path, until the next agent adopts them or the TTL
    /// passes. Removed, the connect programs detach first; sock_ops and sk_msg stay
    /// until the sockets map is empty (every established marked socket has written
    /// its header, or closed), alongside the relay's drain and within the same
    /// deadline; then every link and pin goes.
    pub(crate) async fn shutdown(mut self) {
        let deadline = self.drain_timeout;
        let until = tokio::time::Instant::now() + deadline;
        let mut kernel_sockets = None;
        let pinned = self
            .datapath
            .as_ref()
            .is_some_and(|d| matches!(d.pin(), Pin::Pinned(_)));
        let removal = decide_removal(pinned, self.kube.as_ref(), self.daemonset.as_ref()).await;
        match removal {
            Stop::Keep => info!(reason = %removal, "datapath kept"),
            Stop::Remove(_) => info!(reason = %removal, "datapath removed"),
        }
        if let Some(d) = self.datapath.as_mut().filter(|_| removal.removes()) {
            if d.detach_connect() {
                // Read through this process's own descriptor: opening the map by id
                // needs CAP_SYS_ADMIN, which the DaemonSet does not grant.
                match d.counters_reader() {
                    Ok(r) => kernel_sockets = Some(r),
                    Err(e) => warn!(error = %e,
                        "the kernel path's sockets cannot be counted: sock_ops detaches now, and \
                         sockets that have not written yet may go without their header"),
                }
            }
            self.state.set_attachment(None);
            info!("redirects removed");
        }
        let kernel_drain = async {
            match &kernel_sockets {
                Some(r) => drain_kernel_sockets(|| r.fill(), until).await,
                None => 0,
            }
        };
        let names_drain = async {
            if let Some(n) = self.names.as_mut() {
                n.drain(deadline).await;
            }
        };
        let (left, (), unwritten) =
            tokio::join!(self.relay.drain(deadline), names_drain, kernel_drain);
        if let Some(d) = self.datapath.as_mut() {
            if removal.removes() {
                d.uninstall();
            }
            let counters: Vec<String> = d
                .counters()
                .into_iter()
                .map(|(c, n)| format!("{}={n}", c.name()))
                .collect();
            info!(counters = %counters.join(" "), "kernel counters");
        }
        if let Some(beating) = self.beating.take() {
            beating.abort();
        }
        if removal == Stop::Remove(Removal::Uninstall) {
            if let Some(address) = self.names.as_ref().map(NameRouting::address) {
                match crate::names::nat::remove(address) {
                    Ok(true) => info!("uninstall: the names ports' nftables table removed"),
                    Ok(false) => {}
                    Err(e) => {
                        warn!(error = %e, "uninstall: the names ports' nftables table could not be removed")
                    }
                }
            }
            for (link, address) in &self.link_addresses {
                match crate::names::link::remove(link, *address).await {
                    Ok(_) => info!(%link, %address, "uninstall: address removed"),
                    Err(e) => {
                        warn!(%link, %address, error = %e, "uninstall: the address could not be removed")
                    }
                }
            }
        }
        if let Some(admin) = self.admin.take() {
            admin.shutdown().await;
        }
        info!(left, kernel_unwritten = unwritten, "agent stopped");
    }
}
