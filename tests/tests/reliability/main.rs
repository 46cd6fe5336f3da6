//! Load and faults on the simulated node, with the real programs attached and the
//! real agent binary: many connections held at once and a burst of a million, an
//! upstream resetting, a client vanishing, the agent killed and restarted, the API
//! server gone for minutes, a listener port that cannot be had, and more frontends
//! than the map holds. Figures are printed (run with `--nocapture`) and collected
//! in RELIABILITY.md.
//!
//! The traffic is `hairpin-load` (src/bin/hairpin-load/): an upstream in the
//! ingress namespace that answers with the PROXY header it received, and clients in
//! the pod namespace and cgroup. The heavy and the timed cases take [`serial`], so
//! they never share the two CPUs with each other; the rest run beside them.
//!
//! One test binary, a module per concern: `volume` (held connections, the burst),
//! `relay_faults`, `agent_loss`, `api_outage`, `fail_open` and `flood` (the name
//! relay past its caps).

use std::{
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use hairpin_tests::{
    agent::{Agent, FrontendSpec, NAMES_UNDER_EXAMPLE_COM, frontends_yaml_with_hosts, spec},
    cli::{cli_status, doctor_check, dump_entries, run_cli},
    client::{from_host, from_pod, url},
    fakeapi::{FakeApi, digitalocean_service},
    load::{
        Helper, LOAD_LB4, LOAD_LB6, PeakSampler, UPSTREAM_PORT, addr, footprint, held_connections,
        load_lbs, monotonic_ns, nofile_limits, pod_client, raise_nofile, start_upstream,
        wait_for_fds, wait_for_rss,
    },
    names_support::curl_resolved_from_pod,
    node::{NODE_IP4, POD_IP4, POD_IP6, RELAY_IP4, SimNode},
    require_privileges,
    servers::{nginx_error_log, start_nginx},
    sh::run_in,
    wait::wait_until,
};
use nix::sys::signal::Signal;

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by the cases that load the machine or time something.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A node with the load upstream behind LOAD_LB4/LOAD_LB6, namespaces tuned as the
/// bench tunes them (wide ephemeral range, short conntrack TIME_WAIT).
fn load_node() -> SimNode {
    let node = SimNode::with_lbs(&load_lbs());
    node.tune_for_load();
    node
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The relay path, which these cases load.
const RELAY: &[&str] = &["--kernel-path", "off"];

mod agent_loss;
mod api_outage;
mod fail_open;
mod flood;
mod relay_faults;
mod volume;
