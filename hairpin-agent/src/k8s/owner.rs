//! Whether the agent is being uninstalled: its own DaemonSet (`--daemonset`), read
//! once on SIGTERM.
//!
//! The datapath outlives the agent so that a rollout, a node drain or a crash leaves
//! no gap: a SIGTERM keeps it for the next agent. Only an uninstall should take it
//! away, and the one thing that tells an uninstall from a rollout is the DaemonSet
//! itself: gone (`kubectl delete`, `helm uninstall`: background deletion removes it
//! before its pods) or being deleted (`--cascade=foreground` sets
//! `metadata.deletionTimestamp` and deletes the pods first). Anything else, or no
//! answer, keeps the datapath: a successor adopts it, and `hairpin-agent cleanup` or
//! the datapath's TTL removes what an uninstall the agent could not see left.

use std::{fmt, time::Duration};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::{Api, Client};
use tracing::{info, warn};

use super::coredns::ObjectName;

/// How long the read may take: SIGTERM's grace period (30 s in the DaemonSet) also
/// has to cover the relay's drain, so an API server that does not answer must not
/// hold the agent.
pub(crate) const OWNER_TIMEOUT: Duration = Duration::from_secs(5);

/// How the agent's DaemonSet stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// It exists and is not being deleted: a rollout, a drain or a restart.
    Present,
    /// `metadata.deletionTimestamp` is set: a foreground deletion, whose pods go
    /// before the DaemonSet.
    Deleting,
    /// The API server says 404: deleted (background deletion removes the
    /// DaemonSet first and its pods after).
    Gone,
}

impl OwnerState {
    /// Whether the agents are being uninstalled (the DaemonSet gone or going), so
    /// that nothing of the datapath should stay behind.
    pub(crate) fn is_uninstall(self) -> bool {
        matches!(self, OwnerState::Deleting | OwnerState::Gone)
    }
}

impl fmt::Display for OwnerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OwnerState::Present => "present",
            OwnerState::Deleting => "being deleted",
            OwnerState::Gone => "gone",
        })
    }
}

/// Why the DaemonSet's state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// The API call failed: 403 without the Role's `get` on this DaemonSet (a
    /// Role deleted before the agent stopped, or another name than the Role's
    /// `resourceNames`), 401 once the ServiceAccount is gone, or no API server.
    #[error("daemonset {daemonset}: cannot read it to tell an uninstall from a restart: {source}")]
    Get {
        /// `namespace/name`.
        daemonset: ObjectName,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// No answer in time.
    #[error(
        "daemonset {daemonset}: the API server did not answer within {}s; expected its \
         state to tell an uninstall from a restart",
        timeout.as_secs_f32()
    )]
    Timeout {
        /// `namespace/name`.
        daemonset: ObjectName,
        /// How long it waited.
        timeout: Duration,
    },
}

/// Reads the DaemonSet `namespace/name` once (`get`), within [`OWNER_TIMEOUT`].
pub async fn daemonset_state(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<OwnerState, OwnerError> {
    daemonset_state_within(client, namespace, name, OWNER_TIMEOUT).await
}

/// [`daemonset_state`] with its own time limit.
pub async fn daemonset_state_within(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<OwnerState, OwnerError> {
    let daemonset = || ObjectName {
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    let api = Api::<DaemonSet>::namespaced(client.clone(), namespace);
    match tokio::time::timeout(timeout, api.get_opt(name)).await {
        Err(_) => Err(OwnerError::Timeout {
            daemonset: daemonset(),
            timeout,
        }),
        Ok(Err(source)) => Err(OwnerError::Get {
            daemonset: daemonset(),
            source,
        }),
        Ok(Ok(None)) => Ok(OwnerState::Gone),
        Ok(Ok(Some(ds))) => Ok(state_of(&ds)),
    }
}

/// The state of a DaemonSet the API server returned.
pub(crate) fn state_of(ds: &DaemonSet) -> OwnerState {
    if ds.metadata.deletion_timestamp.is_some() {
        OwnerState::Deleting
    } else {
        OwnerState::Present
    }
}

/// What SIGTERM does with the datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Leave it attached and pinned for the next agent.
    Keep,
    /// Detach and unpin it: the agents are being uninstalled.
    Remove,
}

/// Decides, on SIGTERM, whether to remove the datapath, and logs why: `Remove` only
/// when `daemonset` is set, `client` reaches the API server, and the DaemonSet is
/// gone or being deleted. No `--daemonset` (`daemonset` `None`), no Kubernetes
/// source (`client` `None`: the frontends file, whose service manager's restart
/// should keep it), or no answer: `Keep`.
pub async fn on_sigterm(client: Option<&Client>, daemonset: Option<&ObjectName>) -> Teardown {
    let Some(ds) = daemonset else {
        info!(
            "no --daemonset: the datapath is kept for the next agent (`hairpin-agent cleanup` \
             or its TTL removes it after an uninstall)"
        );
        return Teardown::Keep;
    };
    let Some(client) = client else {
        info!(daemonset = %ds, "no API server (frontends file): the datapath is kept for the next agent");
        return Teardown::Keep;
    };
    match daemonset_state(client, &ds.namespace, &ds.name).await {
        Ok(state) if state.is_uninstall() => {
            info!(daemonset = %ds, %state, "the agent's DaemonSet is {state}: an uninstall, the datapath is removed");
            Teardown::Remove
        }
        Ok(state) => {
            info!(daemonset = %ds, %state,
                "the agent's DaemonSet is present: a rollout or restart, the datapath is kept for the next agent");
            Teardown::Keep
        }
        Err(e) => {
            warn!(error = %e,
                "the datapath is kept for the next agent; after an uninstall `hairpin-agent cleanup` \
                 or its TTL removes it");
            Teardown::Keep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(yaml: &str) -> DaemonSet {
        yaml_serde::from_str(yaml).expect("daemonset yaml")
    }

    #[test]
    fn a_deletion_timestamp_is_an_uninstall_and_its_absence_is_not() {
        let present = ds("apiVersion: apps/v1\nkind: DaemonSet\n\
             metadata: {name: hairpin, namespace: hairpin-system, uid: 5b0c, generation: 3}\n");
        assert_eq!(state_of(&present), OwnerState::Present);
        assert!(!OwnerState::Present.is_uninstall());
        let deleting = ds("apiVersion: apps/v1\nkind: DaemonSet\n\
             metadata: {name: hairpin, namespace: hairpin-system, \
             deletionTimestamp: '2026-11-25T23:50:00Z', deletionGracePeriodSeconds: 0, \
             finalizers: [foregroundDeletion]}\n");
        assert_eq!(state_of(&deleting), OwnerState::Deleting);
        assert!(OwnerState::Deleting.is_uninstall() && OwnerState::Gone.is_uninstall());
        assert_eq!(OwnerState::Deleting.to_string(), "being deleted");
    }

    #[tokio::test]
    async fn without_a_daemonset_or_a_client_the_datapath_is_kept() {
        assert_eq!(on_sigterm(None, None).await, Teardown::Keep);
        let name: ObjectName = "hairpin-system/hairpin".parse().expect("name");
        assert_eq!(on_sigterm(None, Some(&name)).await, Teardown::Keep);
    }

    #[test]
    fn errors_name_the_daemonset_and_what_was_expected() {
        let e = OwnerError::Timeout {
            daemonset: "hairpin-system/hairpin".parse().expect("name"),
            timeout: OWNER_TIMEOUT,
        };
        assert_eq!(
            e.to_string(),
            "daemonset hairpin-system/hairpin: the API server did not answer within 5s; expected \
             its state to tell an uninstall from a restart"
        );
    }
}
