//! Issue 21: on SIGTERM the agent tells an uninstall from a restart by reading its
//! own DaemonSet (`k8s/owner.rs`), here through real HTTP from the fake API server
//! serving the DaemonSet as the API server returns it: present (a rollout: keep the
//! datapath), with a deletionTimestamp (a foreground deletion: remove it), 404 (a
//! background deletion: remove it); an API server that fails or does not answer
//! keeps it, within the time limit. Each scenario has a deadline.

use std::time::Duration;

use hairpin_agent::k8s::{
    ObjectName, OwnerError, OwnerState, Teardown, daemonset_state, daemonset_state_within,
    on_sigterm,
};
use hairpin_tests::fakeapi::{FakeApi, recorded};
use serde_json::Value;

fn daemonset(name: &str) -> Value {
    recorded(&format!("daemonsets/{name}"))
}

fn client(url: &str) -> kube::Client {
    let config = kube::Config::new(url.parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

fn own() -> ObjectName {
    "hairpin-system/hairpin".parse().expect("name")
}

/// Every call here answers in well under this.
const DEADLINE: Duration = Duration::from_secs(10);

// Fake API: records every request, to show the check reads its own DaemonSet by name and nothing else.
#[tokio::test]
async fn a_present_daemonset_keeps_the_datapath_and_a_deleted_one_removes_it() {
    let api = FakeApi::start();
    let c = client(&api.url());
    api.put_daemonset(daemonset("hairpin.yaml"));
    let state = tokio::time::timeout(DEADLINE, daemonset_state(&c, "hairpin-system", "hairpin"))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(state, OwnerState::Present);
    let fate = tokio::time::timeout(DEADLINE, on_sigterm(Some(&c), Some(&own())))
        .await
        .expect("in time");
    assert_eq!(fate, Teardown::Keep);

    // `kubectl delete ds/hairpin --cascade=foreground`: the pods go first.
    api.put_daemonset(daemonset("hairpin-deleting.yaml"));
    let state = daemonset_state(&c, "hairpin-system", "hairpin")
        .await
        .expect("read");
    assert_eq!(state, OwnerState::Deleting);
    assert_eq!(on_sigterm(Some(&c), Some(&own())).await, Teardown::Remove);

    // A background deletion (plain `kubectl delete`, `helm uninstall`): already gone.
    api.remove_daemonset("hairpin-system/hairpin");
    let state = daemonset_state(&c, "hairpin-system", "hairpin")
        .await
        .expect("read");
    assert_eq!(state, OwnerState::Gone);
    assert_eq!(on_sigterm(Some(&c), Some(&own())).await, Teardown::Remove);

    // Exactly one GET of that one object per question: no list, no watch.
    let reads: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.contains("daemonsets"))
        .collect();
    assert_eq!(reads.len(), 6, "{reads:?}");
    assert!(
        reads
            .iter()
            .all(|r| r == "GET /apis/apps/v1/namespaces/hairpin-system/daemonsets/hairpin"),
        "{reads:?}"
    );
}

// Fake API: records every request, to show the check reads its own DaemonSet by name and nothing else.
#[tokio::test]
async fn another_name_is_not_this_agents_daemonset() {
    // A DaemonSet of the same name in another namespace, or another name here, says
    // nothing about this agent's.
    let api = FakeApi::start();
    let c = client(&api.url());
    let mut elsewhere = daemonset("hairpin.yaml");
    elsewhere["metadata"]["namespace"] = "kube-system".into();
    api.put_daemonset(elsewhere);
    assert_eq!(
        daemonset_state(&c, "hairpin-system", "hairpin")
            .await
            .expect("read"),
        OwnerState::Gone
    );
    assert_eq!(
        daemonset_state(&c, "kube-system", "hairpin")
            .await
            .expect("read"),
        OwnerState::Present
    );
}

// Fake API: a failing answer (500) on cue.
#[tokio::test]
async fn an_api_server_that_fails_keeps_the_datapath_and_the_error_names_the_daemonset() {
    let api = FakeApi::start();
    let c = client(&api.url());
    api.put_daemonset(daemonset("hairpin-deleting.yaml"));
    api.set_down(true);
    let err = tokio::time::timeout(DEADLINE, daemonset_state(&c, "hairpin-system", "hairpin"))
        .await
        .expect("in time")
        .expect_err("the API server is down");
    assert!(matches!(err, OwnerError::Get { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "daemonset hairpin-system/hairpin: cannot read it to tell an uninstall from a restart: "
        ),
        "{text}"
    );
    // Deleting, but unreadable: kept (the TTL and `cleanup` are the backstop).
    assert_eq!(on_sigterm(Some(&c), Some(&own())).await, Teardown::Keep);
}

#[tokio::test]
async fn an_api_server_that_does_not_answer_is_given_up_on_in_time() {
    // Accepts connections (the kernel's backlog) and never answers a byte.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let c = client(&url);
    let limit = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        DEADLINE,
        daemonset_state_within(&c, "hairpin-system", "hairpin", limit),
    )
    .await
    .expect("within the test's deadline")
    .expect_err("no answer");
    let waited = started.elapsed();
    assert!(
        waited >= limit && waited < limit + Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(
        err.to_string(),
        "daemonset hairpin-system/hairpin: the API server did not answer within 0.3s; expected \
         its state to tell an uninstall from a restart"
    );
    drop(silent);
}
