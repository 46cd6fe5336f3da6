//! The Kubernetes source both binaries run (`k8s::watch_cluster`), started against
//! the fake API server, and waiting on what it sends. Every wait has a deadline.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use hairpin_agent::{
    k8s::{self, Desired, DesiredRx, KubeSource},
    names::NameScope,
    status::Metrics,
};

use crate::fakeapi::FakeApi;

/// The source watching `api`, deciding with `defaults` and publishing names within
/// `scope` (the API server's certificate names known at once, and none); its metrics.
pub fn start(api: &FakeApi, defaults: k8s::Defaults, scope: NameScope) -> (KubeSource, Metrics) {
    let metrics = Metrics::default();
    let decide = k8s::Decide {
        defaults,
        scope,
        cert_names: k8s::known_cert_names(Vec::new()),
    };
    let source = k8s::watch_cluster(api.client(), decide, metrics.clone(), Arc::new(|_, _| {}));
    (source, metrics)
}

/// What the source sends now; it has synced.
pub fn now(rx: &DesiredRx) -> Arc<Desired> {
    rx.borrow().clone().expect("synced")
}

/// Waits until the source has synced and `pred` holds for what it sends, or fails
/// after `within`, naming `what` and the last thing sent.
pub async fn until(
    rx: &mut DesiredRx,
    within: Duration,
    what: &str,
    pred: impl Fn(&Desired) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        if rx.borrow_and_update().as_deref().is_some_and(&pred) {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, rx.changed()).await.is_err() {
            panic!(
                "{what}: not within {within:?}; last sent: {:?}",
                *rx.borrow()
            );
        }
    }
}
