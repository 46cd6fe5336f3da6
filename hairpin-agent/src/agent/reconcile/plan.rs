//! What to change, decided without touching anything: from the frontends live now,
//! the ones that failed, and the ones wanted, a list of [`Step`]s in the order the
//! executor must take them.

use std::{collections::BTreeMap, net::SocketAddr};

use super::{Active, Failed};
use crate::model::{Frontend, Frontends};

/// Why an apply runs: something changed, or failed frontends are due for a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The source delivered a new set (or the first one): everything is tried.
    Change,
    /// The retry timer fired: only transient failures are tried again; a permanent
    /// one waits for a change.
    Retry,
}

/// One change, performed by the executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Remove the redirect to the frontend at this address, then stop its listener.
    Retire(SocketAddr),
    /// A live frontend's header version or source changed: new connections use it.
    Update(Frontend),
    /// Start a listener for the frontend, then redirect connects to it.
    Start(Frontend),
}

/// The steps that turn `live` into `desired`: retirements first (they free ports
/// and map entries the starts may need), then updates, then starts, each in
/// address order. With `redirecting` false (no datapath on this node) nothing is
/// started: a listener nothing redirects to would only hold a port.
pub fn plan(
    live: &BTreeMap<SocketAddr, Active>,
    failed: &BTreeMap<SocketAddr, Failed>,
    desired: &Frontends,
    redirecting: bool,
    trigger: Trigger,
) -> Vec<Step> {
    let wanted = |addr: &SocketAddr| redirecting && desired.contains(addr);
    let mut steps: Vec<Step> = live
        .keys()
        .filter(|a| !wanted(a))
        .map(|a| Step::Retire(*a))
        .collect();
    if !redirecting {
        return steps;
    }
    for f in desired {
        match live.get(&f.addr()) {
            Some(a) if a.frontend != *f => steps.push(Step::Update(f.clone())),
            Some(_) => {}
            None => {
                let waits = trigger == Trigger::Retry
                    && failed
                        .get(&f.addr())
                        .is_some_and(|x| x.error.is_permanent() && x.frontend == *f);
                if !waits {
                    steps.push(Step::Start(f.clone()));
                }
            }
        }
    }
    // Retirements came first by construction; keep updates ahead of starts.
    steps.sort_by_key(|s| match s {
        Step::Retire(_) => 0,
        Step::Update(_) => 1,
        Step::Start(_) => 2,
    });
    steps
}
