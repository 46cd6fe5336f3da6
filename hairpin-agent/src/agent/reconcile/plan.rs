//! What to change, decided without touching anything: from the frontends live now,
//! the ones that failed, and the ones wanted, a list of [`Step`]s in the order the
//! executor must take them.

use std::{collections::BTreeMap, net::SocketAddr};

use super::{Active, Failed};
use crate::model::{Frontend, Frontends};

/// Why an apply runs: something changed, or failed frontends are due for a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The source delivered a new set (or the first one): everything is tried.
    Change,
    /// The retry timer fired: only transient failures are tried again; a permanent
    /// one waits for a change.
    Retry,
}

/// One step, performed by the executor: a change, or a frontend left as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Remove the redirect to the frontend at this address, then stop its listener.
    Retire(SocketAddr),
    /// A live frontend's header version or source changed: new connections use it.
    Update(Frontend),
    /// Start a listener for the frontend, then redirect connects to it.
    Start(Frontend),
    /// Leave the frontend asked for at this address as it is, for this reason.
    Hold(SocketAddr, Hold),
}

/// Why a frontend asked for is left as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// It is live, as it is asked for.
    Unchanged,
    /// It failed for a reason retrying cannot fix (see
    /// [`FrontendError::is_permanent`](super::FrontendError::is_permanent)): a
    /// retry leaves it until the next change.
    WaitsForChange,
    /// No datapath on this node: nothing would redirect to a listener, which would
    /// only hold a port.
    NoDatapath,
}

/// The steps that turn `live` into `desired`: retirements first (they free ports
/// and map entries the starts may need), then updates, then starts, each in
/// address order; then a hold for every frontend asked for and left as it is.
/// With `redirecting` false (no datapath on this node) nothing is started.
pub(crate) fn plan(
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
    for f in desired {
        steps.push(step_for(f, live, failed, redirecting, trigger));
    }
    // Retirements came first by construction; keep updates ahead of starts, and
    // the holds (nothing to do) last.
    steps.sort_by_key(|s| match s {
        Step::Retire(_) => 0,
        Step::Update(_) => 1,
        Step::Start(_) => 2,
        Step::Hold(..) => 3,
    });
    steps
}

/// What to do with one frontend asked for.
fn step_for(
    f: &Frontend,
    live: &BTreeMap<SocketAddr, Active>,
    failed: &BTreeMap<SocketAddr, Failed>,
    redirecting: bool,
    trigger: Trigger,
) -> Step {
    let addr = f.addr();
    if !redirecting {
        return Step::Hold(addr, Hold::NoDatapath);
    }
    match live.get(&addr) {
        Some(a) if a.frontend != *f => Step::Update(f.clone()),
        Some(_) => Step::Hold(addr, Hold::Unchanged),
        None => {
            let waits = trigger == Trigger::Retry
                && failed
                    .get(&addr)
                    .is_some_and(|x| x.error.is_permanent() && x.frontend == *f);
            if waits {
                Step::Hold(addr, Hold::WaitsForChange)
            } else {
                Step::Start(f.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        agent::reconcile::{FrontendError, tests::fe},
        model::{LivePath, ProxyVersion},
    };

    fn set(frontends: &[&Frontend]) -> Frontends {
        let mut s = Frontends::new();
        for f in frontends {
            s.insert((*f).clone()).expect("one per address");
        }
        s
    }

    fn live(frontends: &[&Frontend]) -> BTreeMap<SocketAddr, Active> {
        frontends
            .iter()
            .map(|f| {
                let a = Active::for_test((*f).clone(), "127.0.0.1:40000", LivePath::Relay);
                (f.addr(), a)
            })
            .collect()
    }

    fn failed(f: &Frontend, error: FrontendError) -> BTreeMap<SocketAddr, Failed> {
        BTreeMap::from([(
            f.addr(),
            Failed {
                frontend: f.clone(),
                error,
            },
        )])
    }

    const A: &str = "203.0.113.10:80";
    const B: &str = "203.0.113.10:443";
    const C: &str = "203.0.113.11:80";

    #[test]
    fn a_new_frontend_is_started_and_a_live_one_asked_for_as_it_is_held() {
        let (a, b) = (fe(A, ProxyVersion::V1), fe(B, ProxyVersion::V1));
        let steps = plan(
            &live(&[&a]),
            &BTreeMap::new(),
            &set(&[&a, &b]),
            true,
            Trigger::Change,
        );
        assert_eq!(
            steps,
            [
                Step::Start(b.clone()),
                Step::Hold(a.addr(), Hold::Unchanged)
            ]
        );
    }

    #[test]
    fn a_changed_version_is_an_update_and_one_no_longer_asked_for_retires_first() {
        let (a, b, c) = (
            fe(A, ProxyVersion::V1),
            fe(B, ProxyVersion::V1),
            fe(C, ProxyVersion::V2),
        );
        let a2 = fe(A, ProxyVersion::V2);
        let steps = plan(
            &live(&[&a, &b]),
            &BTreeMap::new(),
            &set(&[&a2, &c]),
            true,
            Trigger::Change,
        );
        assert_eq!(
            steps,
            [Step::Retire(b.addr()), Step::Update(a2), Step::Start(c)]
        );
    }

    #[test]
    fn a_permanent_failure_is_held_on_a_retry_and_tried_again_on_a_change() {
        let a = fe(A, ProxyVersion::V1);
        let full = failed(&a, crate::agent::reconcile::tests::map_full());
        let want = set(&[&a]);
        let retry = plan(&BTreeMap::new(), &full, &want, true, Trigger::Retry);
        assert_eq!(retry, [Step::Hold(a.addr(), Hold::WaitsForChange)]);
        let change = plan(&BTreeMap::new(), &full, &want, true, Trigger::Change);
        assert_eq!(change, [Step::Start(a.clone())]);
        // A transient one is retried with backoff.
        let busy = failed(&a, crate::agent::reconcile::tests::no_slot());
        let retry = plan(&BTreeMap::new(), &busy, &want, true, Trigger::Retry);
        assert_eq!(retry, [Step::Start(a.clone())]);
        // A permanent failure of another version is a different frontend: tried.
        let other = failed(
            &fe(A, ProxyVersion::V2),
            crate::agent::reconcile::tests::map_full(),
        );
        let retry = plan(&BTreeMap::new(), &other, &want, true, Trigger::Retry);
        assert_eq!(retry, [Step::Start(a)]);
    }

    #[test]
    fn without_a_datapath_everything_live_retires_and_nothing_starts() {
        let (a, b) = (fe(A, ProxyVersion::V1), fe(B, ProxyVersion::V1));
        let steps = plan(
            &live(&[&a]),
            &BTreeMap::new(),
            &set(&[&a, &b]),
            false,
            Trigger::Change,
        );
        assert_eq!(
            steps,
            [
                Step::Retire(a.addr()),
                Step::Hold(a.addr(), Hold::NoDatapath),
                Step::Hold(b.addr(), Hold::NoDatapath),
            ]
        );
    }

    #[test]
    fn nothing_asked_for_and_nothing_live_is_no_step() {
        let steps = plan(
            &BTreeMap::new(),
            &BTreeMap::new(),
            &Frontends::new(),
            true,
            Trigger::Change,
        );
        assert!(steps.is_empty());
    }
}
