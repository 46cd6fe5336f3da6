//! The fake API server's ConfigMaps (get, create, update with resourceVersion
//! conflict checking), Node, DaemonSet and Deployment lookups (pod CIDRs,
//! node-local-dns, the CoreDNS version), DaemonSet and Deployment deletion as the
//! garbage collector's propagation policies do it (foreground: marked deleting,
//! removed once the test, as the controller, says its pods are gone), Lease
//! deletion (for `cleanup`), and the Namespace and RBAC objects the uninstall
//! deletes or patches. Additive to the watch layer's Services and Ingresses.

use std::sync::{Arc, Mutex};

use axum::{http::Method, response::Response};
use serde_json::{Value, json};

use super::{FakeApi, State, respond, status};
use axum::http::StatusCode;

impl FakeApi {
    /// Adds or replaces a ConfigMap as another writer would (a new resourceVersion).
    pub fn put_configmap(&self, mut cm: Value) {
        let mut st = self.state.lock().expect("fake API state");
        st.rv += 1;
        cm["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let key = key(&cm);
        st.configmaps.insert(key, cm);
    }

    /// The ConfigMap `namespace/name` as stored.
    pub fn configmap(&self, key: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("fake API state")
            .configmaps
            .get(key)
            .cloned()
    }

    /// Adds or replaces a DaemonSet (looked up, never watched).
    pub fn put_daemonset(&self, ds: Value) {
        let key = key(&ds);
        self.state
            .lock()
            .expect("fake API state")
            .daemonsets
            .insert(key, ds);
    }

    /// Removes the DaemonSet `namespace/name`, as its deletion completing does: a
    /// later `get` is a 404.
    pub fn remove_daemonset(&self, key: &str) {
        self.state
            .lock()
            .expect("fake API state")
            .daemonsets
            .remove(key);
    }

    /// The DaemonSet `namespace/name` as stored.
    pub fn daemonset(&self, key: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("fake API state")
            .daemonsets
            .get(key)
            .cloned()
    }

    /// The Deployment `namespace/name` as stored.
    pub fn deployment(&self, key: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("fake API state")
            .deployments
            .get(key)
            .cloned()
    }

    /// Removes the Deployment `namespace/name`, as its deletion completing does.
    pub fn remove_deployment(&self, key: &str) {
        self.state
            .lock()
            .expect("fake API state")
            .deployments
            .remove(key);
    }

    /// Adds a Namespace (looked up and deleted, never watched).
    pub fn put_namespace(&self, mut ns: Value) {
        let name = ns["metadata"]["name"].as_str().unwrap_or("").to_string();
        ns["metadata"]["uid"] = json!(format!("uid-namespace-{name}"));
        self.state
            .lock()
            .expect("fake API state")
            .namespaces
            .insert(name, ns);
    }

    /// The Namespace `name` as stored (`None` once deleted).
    pub fn namespace(&self, name: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("fake API state")
            .namespaces
            .get(name)
            .cloned()
    }

    /// Adds a ClusterRole, ClusterRoleBinding, Role or RoleBinding (patched, never
    /// watched), keyed `Kind/namespace/name` (`-` for cluster-scoped).
    pub fn put_rbac(&self, o: Value) {
        let k = rbac_key(&o);
        self.state.lock().expect("fake API state").rbac.insert(k, o);
    }

    /// An RBAC object by `Kind/namespace/name`.
    pub fn rbac(&self, key: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("fake API state")
            .rbac
            .get(key)
            .cloned()
    }

    /// Adds a Lease `namespace/name`, as its holder would have created it.
    pub fn put_lease(&self, key: &str) {
        let (ns, name) = key.split_once('/').expect("namespace/name");
        let mut st = self.state.lock().expect("fake API state");
        st.rv += 1;
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": st.rv.to_string()},
            "spec": {"holderIdentity": "a-previous-holder"}});
        st.leases.insert(key.to_string(), lease);
    }

    /// Adds a Deployment (looked up, never watched).
    pub fn put_deployment(&self, d: Value) {
        let key = key(&d);
        self.state
            .lock()
            .expect("fake API state")
            .deployments
            .insert(key, d);
    }

    /// Adds a Node: read with `get` (this node's pod CIDRs) and in the Node list
    /// and watch (every Node's addresses and names).
    pub fn put_node(&self, node: Value) {
        let name = node["metadata"]["name"].as_str().unwrap_or("").to_string();
        self.state
            .lock()
            .expect("fake API state")
            .nodes
            .insert(name, node.clone());
        let mut listed = node;
        listed["kind"] = "Node".into();
        self.apply(listed);
    }

    /// Just before the next update of ConfigMap `key` is checked, sets its
    /// `data.<field>` to `value` as a concurrent writer, so that update gets 409.
    pub fn change_before_next_update(&self, key: &str, field: &str, value: &str) {
        let mut data = json!({});
        data[field] = json!(value);
        self.state.lock().expect("fake API state").concurrent = Some((key.to_string(), data));
    }

    /// ConfigMap updates refused with 409 Conflict so far.
    pub fn conflicts(&self) -> u64 {
        self.state.lock().expect("fake API state").conflicts
    }
}

fn key(o: &Value) -> String {
    let m = &o["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

fn rbac_key(o: &Value) -> String {
    format!(
        "{}/{}/{}",
        o["kind"].as_str().unwrap_or(""),
        o["metadata"]["namespace"].as_str().unwrap_or("-"),
        o["metadata"]["name"].as_str().unwrap_or("")
    )
}

fn not_found(kind: &str, name: &str) -> Response {
    status(404, "NotFound", &format!("{kind} \"{name}\" not found"))
}

/// Answers ConfigMap, DaemonSet, Deployment and Lease-deletion requests; `None` for others.
pub(super) fn handle(
    st: &Arc<Mutex<State>>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "configmaps", rest @ ..] => {
            Some(configmap(st, method, ns, rest.first().copied(), body))
        }
        ["api", "v1", "nodes", name] if method == Method::GET => {
            let s = st.lock().expect("fake API state");
            Some(match s.nodes.get(*name) {
                Some(n) => respond(StatusCode::OK, n.clone()),
                None => not_found("nodes", name),
            })
        }
        ["apis", "apps", "v1", "namespaces", ns, "daemonsets", name] => Some(workload(
            st,
            method,
            &format!("{ns}/{name}"),
            "daemonsets.apps",
            body,
            |s| &mut s.daemonsets,
        )),
        ["apis", "apps", "v1", "namespaces", ns, "deployments", name] => Some(workload(
            st,
            method,
            &format!("{ns}/{name}"),
            "deployments.apps",
            body,
            |s| &mut s.deployments,
        )),
        ["api", "v1", "namespaces", name] => Some(namespace(st, method, name)),
        ["apis", "rbac.authorization.k8s.io", "v1", rest @ ..] if method == Method::PATCH => {
            Some(patch_rbac(st, rest, body))
        }
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
            name,
        ] if method == Method::DELETE => {
            let mut s = st.lock().expect("fake API state");
            Some(match s.leases.remove(&format!("{ns}/{name}")) {
                Some(_) => respond(
                    StatusCode::OK,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ),
                None => not_found("leases.coordination.k8s.io", name),
            })
        }
        _ => None,
    }
}

fn configmap(
    st: &Arc<Mutex<State>>,
    method: &Method,
    ns: &str,
    name: Option<&str>,
    body: &[u8],
) -> Response {
    let mut s = st.lock().expect("fake API state");
    let body: Value = serde_json::from_slice(body).unwrap_or(json!({}));
    match (method.as_str(), name) {
        ("GET", Some(n)) => match s.configmaps.get(&format!("{ns}/{n}")) {
            Some(cm) => respond(StatusCode::OK, cm.clone()),
            None => not_found("configmaps", n),
        },
        ("POST", None) => {
            let n = body["metadata"]["name"].as_str().unwrap_or("").to_string();
            if s.configmaps.contains_key(&format!("{ns}/{n}")) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("configmaps \"{n}\" already exists"),
                );
            }
            s.rv += 1;
            let mut cm = body;
            cm["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            cm["metadata"]["namespace"] = json!(ns);
            s.configmaps.insert(format!("{ns}/{n}"), cm.clone());
            respond(StatusCode::CREATED, cm)
        }
        ("PUT", Some(n)) => {
            let k = format!("{ns}/{n}");
            if let Some((target, data)) = s.concurrent.take_if(|(t, _)| *t == k) {
                s.rv += 1;
                let rv = s.rv;
                if let Some(cm) = s.configmaps.get_mut(&target) {
                    for (field, value) in data.as_object().into_iter().flatten() {
                        cm["data"][field] = value.clone();
                    }
                    cm["metadata"]["resourceVersion"] = json!(rv.to_string());
                }
            }
            let Some(current) = s.configmaps.get(&k) else {
                return not_found("configmaps", n);
            };
            // Optimistic concurrency exactly as the API server: an update must carry
            // the resourceVersion it read (an empty one would be an unconditional write).
            if current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"] {
                s.conflicts += 1;
                return status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on configmaps \"{n}\": the object has been modified; \
                         please apply your changes to the latest version and try again"
                    ),
                );
            }
            s.rv += 1;
            let mut cm = body;
            cm["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            s.configmaps.insert(k, cm.clone());
            respond(StatusCode::OK, cm)
        }
        _ => status(405, "MethodNotAllowed", "unsupported configmap request"),
    }
}

/// GET, or DELETE with the garbage collector's propagation: `Foreground` marks the
/// object deleting (deletionTimestamp, the foregroundDeletion finalizer) and keeps
/// it until the test removes it, as the controller does once its pods are gone;
/// anything else removes it at once, as a background deletion does.
fn workload(
    st: &Arc<Mutex<State>>,
    method: &Method,
    key: &str,
    kind: &str,
    body: &[u8],
    store: impl Fn(&mut State) -> &mut std::collections::BTreeMap<String, Value>,
) -> Response {
    let mut s = st.lock().expect("fake API state");
    let name = key.rsplit('/').next().unwrap_or("");
    match *method {
        Method::GET => match store(&mut s).get(key) {
            Some(o) => respond(StatusCode::OK, o.clone()),
            None => not_found(kind, name),
        },
        Method::DELETE => {
            let opts: Value = serde_json::from_slice(body).unwrap_or(json!({}));
            let foreground = opts["propagationPolicy"] == "Foreground";
            let Some(o) = store(&mut s).get_mut(key) else {
                return not_found(kind, name);
            };
            if foreground {
                o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                o["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
                let o = o.clone();
                return respond(StatusCode::OK, o);
            }
            store(&mut s).remove(key);
            respond(
                StatusCode::OK,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )
        }
        _ => status(405, "MethodNotAllowed", "unsupported workload request"),
    }
}

fn namespace(st: &Arc<Mutex<State>>, method: &Method, name: &str) -> Response {
    let mut s = st.lock().expect("fake API state");
    match *method {
        Method::GET => match s.namespaces.get(name) {
            Some(n) => respond(StatusCode::OK, n.clone()),
            None => not_found("namespaces", name),
        },
        Method::DELETE => match s.namespaces.remove(name) {
            Some(n) => respond(StatusCode::OK, n),
            None => not_found("namespaces", name),
        },
        _ => status(405, "MethodNotAllowed", "unsupported namespace request"),
    }
}

/// A JSON merge patch of an RBAC object's metadata (all the uninstall sends).
fn patch_rbac(st: &Arc<Mutex<State>>, rest: &[&str], body: &[u8]) -> Response {
    let (kind, ns, name) = match rest {
        ["clusterroles", n] => ("ClusterRole", "-", *n),
        ["clusterrolebindings", n] => ("ClusterRoleBinding", "-", *n),
        ["namespaces", ns, "roles", n] => ("Role", *ns, *n),
        ["namespaces", ns, "rolebindings", n] => ("RoleBinding", *ns, *n),
        _ => return status(404, "NotFound", "the fake serves no such RBAC path"),
    };
    let patch: Value = serde_json::from_slice(body).unwrap_or(json!({}));
    let mut s = st.lock().expect("fake API state");
    let Some(o) = s.rbac.get_mut(&format!("{kind}/{ns}/{name}")) else {
        return not_found(kind, name);
    };
    for (field, value) in patch["metadata"].as_object().into_iter().flatten() {
        o["metadata"][field] = value.clone();
    }
    respond(StatusCode::OK, o.clone())
}
