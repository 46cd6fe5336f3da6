//! A recorded Kubernetes API server for the watch layer: it serves the objects a
//! test gives it (recorded from real clusters, see hairpin-agent/tests/fixtures)
//! through the real list and watch protocol over HTTP, and lets the test script
//! what a real API server does to watchers: modify, delete, 410 Gone, dropped
//! connections and outages, each at the step a test chooses. It serves recorded
//! objects and nothing more (no admission, no validation): the real API server,
//! etcd, kube-proxy and CoreDNS are `cluster`'s, run by the `real_cluster` suite;
//! this one stays for faults a real server cannot be made to show on cue.

use std::{
    collections::{BTreeMap, HashMap},
    net::{SocketAddr, TcpListener},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Body,
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::Response,
};
use futures::stream;
use serde_json::{Value, json};
use tokio::sync::broadcast;

mod objects;

/// kubeadm's Corefile, as `kubectl -n kube-system get cm coredns -o yaml` shows it:
/// the cluster's CoreDNS before hairpin.
pub const KUBEADM_COREFILE: &str = ".:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
";

/// Resources the fake serves, by URL collection path.
const KINDS: [(&str, &str); 5] = [
    ("/api/v1/services", "ServiceList"),
    ("/apis/networking.k8s.io/v1/ingresses", "IngressList"),
    // Served only after `serve_gateway_api` (a cluster with the CRDs installed).
    ("/apis/gateway.networking.k8s.io/v1/gateways", "GatewayList"),
    (
        "/apis/gateway.networking.k8s.io/v1/httproutes",
        "HTTPRouteList",
    ),
    // Every Node, listed and watched (its addresses and names are refused).
    ("/api/v1/nodes", "NodeList"),
];

/// The Gateway API group version the fake can serve (standard channel, v1).
const GATEWAY_V1: &str = "/apis/gateway.networking.k8s.io/v1";

/// The `apiVersion` of a collection's list: `v1` or `group/version`.
fn api_version_of(coll: &str) -> &str {
    match coll.strip_prefix("/apis/") {
        Some(rest) => rest.rsplit_once('/').map_or(rest, |(gv, _)| gv),
        None => "v1",
    }
}

#[derive(Clone, Debug)]
enum WatchMsg {
    Event {
        kind: &'static str,
        ty: &'static str,
        object: Value,
    },
    /// Drop every open watch connection.
    Disconnect,
    /// Tell open watches their resourceVersion is too old.
    Gone,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// collection path -> (namespace/name -> object)
    objects: HashMap<&'static str, BTreeMap<String, Value>>,
    /// Every change, for watches resuming from a resourceVersion.
    history: Vec<(u64, &'static str, &'static str, Value)>,
    /// Watches from before this resourceVersion get 410 Gone.
    compacted_before: u64,
    down: bool,
    /// Whether the Gateway API kinds are served (their CRDs "installed").
    gateway_api: bool,
    /// Every Event object POSTed or PATCHed.
    events: Vec<Value>,
    /// Leases by namespace/name.
    leases: BTreeMap<String, Value>,
    /// Requests seen, as `METHOD path?query`.
    requests: Vec<String>,
    /// ConfigMaps by namespace/name (see `objects`).
    configmaps: BTreeMap<String, Value>,
    /// Nodes by name, for lookups only.
    nodes: BTreeMap<String, Value>,
    /// DaemonSets by namespace/name, for lookups only.
    daemonsets: BTreeMap<String, Value>,
    /// Deployments by namespace/name, for lookups only (the CoreDNS version).
    deployments: BTreeMap<String, Value>,
    /// A change another writer makes just before the next ConfigMap update lands.
    concurrent: Option<(String, Value)>,
    /// ConfigMap updates refused with 409.
    conflicts: u64,
    /// Bearer tokens whose account's RBAC is gone: every request gets 403.
    revoked: std::collections::BTreeSet<String>,
    /// Namespaces by name (looked up and deleted by the uninstall).
    namespaces: BTreeMap<String, Value>,
    /// Cluster-scoped and kube-system RBAC objects by `kind/namespace/name`, for
    /// the uninstall's ownerReferences patches.
    rbac: BTreeMap<String, Value>,
}

/// The running fake. Dropping it stops the server.
pub struct FakeApi {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    tx: broadcast::Sender<WatchMsg>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        // Tests drop the fake from inside their own runtime, where a blocking
        // shutdown would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl FakeApi {
    /// Serves on 127.0.0.1 of the calling process's network namespace.
    pub fn start() -> FakeApi {
        FakeApi::serve(TcpListener::bind("127.0.0.1:0").expect("bind fake API"))
    }

    /// Serves on 127.0.0.1 inside network namespace `netns` (a name under
    /// /run/netns), so an agent running there reaches it on its own loopback.
    pub fn start_in_netns(netns: &str) -> FakeApi {
        let netns = netns.to_string();
        // A socket belongs to the namespace it was created in: create it from a
        // short-lived thread that joins the namespace, then serve it from here.
        let listener = std::thread::spawn(move || {
            crate::sh::enter_netns(&netns);
            TcpListener::bind("127.0.0.1:0").expect("bind fake API in netns")
        })
        .join()
        .expect("netns thread");
        FakeApi::serve(listener)
    }

    fn serve(listener: TcpListener) -> FakeApi {
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let state = Arc::new(Mutex::new(State {
            rv: 1000,
            ..State::default()
        }));
        let (tx, _) = broadcast::channel(1024);
        let (st, t) = (state.clone(), tx.clone());
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let app = axum::Router::new().fallback(
                move |method: Method, uri: Uri, headers: HeaderMap, body: axum::body::Bytes| {
                    let (st, t) = (st.clone(), t.clone());
                    async move {
                        if let Some(refused) = forbidden(&st, &headers, &method, &uri) {
                            return refused;
                        }
                        handle(st, t, method, uri, body)
                    }
                },
            );
            let _ = axum::serve(listener, app).await;
        });
        FakeApi {
            addr,
            state,
            tx,
            runtime: Some(runtime),
        }
    }

    /// A kube client of this server, as the agent's own is built from a kubeconfig.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("the fake API's URL"));
        kube::Client::try_from(config).expect("a client of the fake API")
    }

    /// The server URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes `node`'s kubeconfig (in its directory) pointing at this server; its path.
    pub fn node_kubeconfig(&self, node: &crate::node::SimNode) -> std::path::PathBuf {
        let path = node.dir.join("kubeconfig");
        self.write_kubeconfig(&path);
        path
    }

    /// Writes a kubeconfig pointing at this server.
    pub fn write_kubeconfig(&self, path: &Path) {
        self.write_kubeconfig_as(path, "fake-token");
    }

    /// Writes a kubeconfig pointing at this server with bearer token `token`: the
    /// account [`FakeApi::revoke`] names.
    pub fn write_kubeconfig_as(&self, path: &Path, token: &str) {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user:\n    token: {token}\n",
            self.url()
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// The account of `token` loses its RBAC, as when its Roles and bindings are
    /// deleted: from now on every request with it gets 403.
    pub fn revoke(&self, token: &str) {
        self.state
            .lock()
            .expect("fake API state")
            .revoked
            .insert(token.to_string());
    }

    /// Serves the Gateway API's v1 kinds (Gateway, HTTPRoute) from now on, as a
    /// cluster with its CRDs installed does; without it their discovery is a 404.
    pub fn serve_gateway_api(&self) {
        self.state.lock().expect("fake API state").gateway_api = true;
    }

    /// Adds or replaces an object (a Service, an Ingress, a Gateway or an
    /// HTTPRoute), notifying watchers.
    pub fn apply(&self, mut object: Value) {
        let coll = collection_of(&object);
        let key = key_of(&object);
        let mut st = self.state.lock().expect("fake API state");
        st.rv += 1;
        let rv = st.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let objects = st.objects.entry(coll).or_default();
        let ty = if objects.insert(key, object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.history.push((rv, coll, ty, object.clone()));
        let _ = self.tx.send(WatchMsg::Event {
            kind: coll,
            ty,
            object,
        });
    }

    /// Deletes the object with `object`'s kind, namespace and name.
    pub fn delete(&self, object: &Value) {
        let coll = collection_of(object);
        let mut st = self.state.lock().expect("fake API state");
        let Some(mut gone) = st.objects.entry(coll).or_default().remove(&key_of(object)) else {
            return;
        };
        st.rv += 1;
        let rv = st.rv;
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.history.push((rv, coll, "DELETED", gone.clone()));
        let _ = self.tx.send(WatchMsg::Event {
            kind: coll,
            ty: "DELETED",
            object: gone,
        });
    }

    /// Compacts history and answers open watches with 410 Gone, as etcd compaction does.
    pub fn expire_watches(&self) {
        let mut st = self.state.lock().expect("fake API state");
        st.compacted_before = st.rv + 1;
        st.history.clear();
        let _ = self.tx.send(WatchMsg::Gone);
    }

    /// Drops every open watch connection without a word.
    pub fn disconnect_watches(&self) {
        let _ = self.tx.send(WatchMsg::Disconnect);
    }

    /// Makes every request fail as during an etcd outage (and drops watches) until set back.
    pub fn set_down(&self, down: bool) {
        self.state.lock().expect("fake API state").down = down;
        if down {
            self.disconnect_watches();
        }
    }

    /// Event objects written so far.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().expect("fake API state").events.clone()
    }

    /// Leases as stored.
    pub fn leases(&self) -> BTreeMap<String, Value> {
        self.state.lock().expect("fake API state").leases.clone()
    }

    /// Requests received so far (`GET /api/v1/services?watch=true...`).
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().expect("fake API state").requests.clone()
    }
}

fn collection_of(object: &Value) -> &'static str {
    match object["kind"].as_str() {
        Some("Service") => KINDS[0].0,
        Some("Ingress") => KINDS[1].0,
        Some("Gateway") => KINDS[2].0,
        Some("HTTPRoute") => KINDS[3].0,
        Some("Node") => KINDS[4].0,
        other => panic!(
            "the fake API serves Services, Ingresses, Gateways, HTTPRoutes and Nodes, not {other:?}"
        ),
    }
}

fn key_of(object: &Value) -> String {
    let m = &object["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

fn respond(code: StatusCode, body: Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    respond(
        StatusCode::from_u16(code).expect("status code"),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// 403 for a request whose bearer token was revoked, as the API server answers an
/// account without RBAC; `None` lets it through.
fn forbidden(
    st: &Arc<Mutex<State>>,
    headers: &HeaderMap,
    method: &Method,
    uri: &Uri,
) -> Option<Response> {
    let token = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let mut s = st.lock().expect("fake API state");
    if !s.revoked.contains(token) {
        return None;
    }
    s.requests
        .push(format!("{method} {uri} (forbidden: {token})"));
    Some(status(
        403,
        "Forbidden",
        &format!(
            "{token} cannot {method} {}: its RBAC was deleted",
            uri.path()
        ),
    ))
}

fn handle(
    st: Arc<Mutex<State>>,
    tx: broadcast::Sender<WatchMsg>,
    method: Method,
    uri: Uri,
    body: axum::body::Bytes,
) -> Response {
    let path = uri.path().to_string();
    {
        let mut s = st.lock().expect("fake API state");
        s.requests.push(format!("{method} {uri}"));
        if s.down {
            // What an API server answers while etcd is unreachable. (503 would be
            // retried inside kube's client and never reach the watcher.)
            return status(500, "InternalError", "etcdserver: request timed out");
        }
    }
    let gateway_api = st.lock().expect("fake API state").gateway_api;
    if path == GATEWAY_V1 && gateway_api {
        let resource = |name: &str, kind: &str| {
            json!({"name": name, "singularName": "", "namespaced": true, "kind": kind,
                   "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]})
        };
        return respond(
            StatusCode::OK,
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                   "groupVersion": "gateway.networking.k8s.io/v1",
                   "resources": [resource("gateways", "Gateway"), resource("httproutes", "HTTPRoute")]}),
        );
    }
    let served = |c: &str| gateway_api || !c.starts_with(GATEWAY_V1);
    if let Some((coll, list_kind)) = KINDS.iter().find(|(c, _)| *c == path && served(c)) {
        let q = query(&uri);
        if q.get("watch").is_some_and(|v| v == "true" || v == "1") {
            let from: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return watch(&st, &tx, coll, from, FieldSelector::of(&q));
        }
        let selector = FieldSelector::of(&q);
        let s = st.lock().expect("fake API state");
        let items: Vec<Value> = s
            .objects
            .get(coll)
            .map(|m| {
                m.values()
                    .filter(|o| selector.selects(o))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        return respond(
            StatusCode::OK,
            json!({"kind": list_kind, "apiVersion": api_version_of(coll),
                   "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        );
    }
    if path.starts_with("/apis/events.k8s.io/v1/namespaces/") && path.contains("/events") {
        let mut ev: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
        let mut s = st.lock().expect("fake API state");
        s.rv += 1;
        ev["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        s.events.push(ev.clone());
        return respond(
            if method == Method::POST {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            ev,
        );
    }
    if let Some(response) = objects::handle(&st, &method, &path, &body) {
        return response;
    }
    if let Some(rest) = path.strip_prefix("/apis/coordination.k8s.io/v1/namespaces/") {
        return lease(&st, &method, rest, &body);
    }
    status(
        404,
        "NotFound",
        &format!("the fake API server does not serve {path}"),
    )
}

fn lease(st: &Arc<Mutex<State>>, method: &Method, rest: &str, body: &[u8]) -> Response {
    // rest = "<ns>/leases[/<name>]"
    let mut parts = rest.split('/');
    let ns = parts.next().unwrap_or("");
    let _ = parts.next();
    let name = parts.next();
    let mut s = st.lock().expect("fake API state");
    let body: Value = serde_json::from_slice(body).unwrap_or(json!({}));
    let key = |n: &str| format!("{ns}/{n}");
    match (method.as_str(), name) {
        ("GET", Some(n)) => match s.leases.get(&key(n)) {
            Some(l) => respond(StatusCode::OK, l.clone()),
            None => status(
                404,
                "NotFound",
                &format!("leases.coordination.k8s.io \"{n}\" not found"),
            ),
        },
        ("POST", None) => {
            let n = body["metadata"]["name"].as_str().unwrap_or("").to_string();
            if s.leases.contains_key(&key(&n)) {
                return status(409, "AlreadyExists", "lease already exists");
            }
            s.rv += 1;
            let mut l = body;
            l["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            s.leases.insert(key(&n), l.clone());
            respond(StatusCode::CREATED, l)
        }
        ("PUT", Some(n)) => {
            let current = s
                .leases
                .get(&key(n))
                .map(|l| l["metadata"]["resourceVersion"].clone());
            if current != Some(body["metadata"]["resourceVersion"].clone()) {
                return status(409, "Conflict", "the object has been modified");
            }
            s.rv += 1;
            let mut l = body;
            l["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            s.leases.insert(key(n), l.clone());
            respond(StatusCode::OK, l)
        }
        _ => status(405, "MethodNotAllowed", "unsupported lease request"),
    }
}

fn line(ty: &str, object: &Value) -> axum::body::Bytes {
    let mut s = json!({"type": ty, "object": object}).to_string();
    s.push('\n');
    s.into()
}

fn gone_line(rv: u64) -> axum::body::Bytes {
    line(
        "ERROR",
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {rv}"), "reason": "Expired", "code": 410}),
    )
}

/// A `fieldSelector` of one `path=value` term (all the agent sends), e.g.
/// `spec.nodeName=sim-node`; none selects everything.
#[derive(Clone, Debug, Default)]
struct FieldSelector(Option<(String, String)>);

impl FieldSelector {
    fn of(q: &HashMap<String, String>) -> FieldSelector {
        let Some(raw) = q.get("fieldSelector") else {
            return FieldSelector(None);
        };
        let decoded = raw
            .replace("%3D", "=")
            .replace("%3d", "=")
            .replace("%2F", "/");
        let (path, value) = decoded.split_once('=').unwrap_or_else(|| {
            panic!("the fake API takes path=value field selectors, not {raw:?}")
        });
        FieldSelector(Some((path.to_string(), value.to_string())))
    }

    fn selects(&self, object: &Value) -> bool {
        let Some((path, value)) = &self.0 else {
            return true;
        };
        let mut at = object;
        for part in path.split('.') {
            at = &at[part];
        }
        at.as_str().unwrap_or("") == value
    }
}

/// A watch: history after `from`, then live changes, until disconnected or expired.
fn watch(
    st: &Arc<Mutex<State>>,
    tx: &broadcast::Sender<WatchMsg>,
    coll: &'static str,
    from: u64,
    selector: FieldSelector,
) -> Response {
    let s = st.lock().expect("fake API state");
    let rx = tx.subscribe();
    let live_selector = selector.clone();
    let streaming = |first: Vec<axum::body::Bytes>, rx: Option<broadcast::Receiver<WatchMsg>>| {
        let backlog = stream::iter(first.into_iter().map(Ok::<_, std::io::Error>));
        let live = stream::unfold(rx, move |rx| {
            let selector = live_selector.clone();
            async move {
                let mut rx = rx?;
                loop {
                    match tokio::time::timeout(Duration::from_secs(300), rx.recv()).await {
                        Ok(Ok(WatchMsg::Event {
                            kind, ty, object, ..
                        })) if kind == coll && selector.selects(&object) => {
                            return Some((Ok(line(ty, &object)), Some(rx)));
                        }
                        Ok(Ok(WatchMsg::Event { .. })) => continue,
                        Ok(Ok(WatchMsg::Gone)) => return Some((Ok(gone_line(from)), None)),
                        Ok(Ok(WatchMsg::Disconnect)) | Ok(Err(_)) | Err(_) => return None,
                    }
                }
            }
        });
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(futures::StreamExt::chain(backlog, live)))
            .expect("watch response")
    };
    if from != 0 && from < s.compacted_before {
        return streaming(vec![gone_line(from)], None);
    }
    let backlog: Vec<_> = s
        .history
        .iter()
        .filter(|(rv, k, _, o)| *k == coll && *rv > from && selector.selects(o))
        .map(|(_, _, ty, o)| line(ty, o))
        .collect();
    streaming(backlog, Some(rx))
}

/// Loads a YAML fixture (a `kubectl get -o yaml` object) as JSON.
pub fn fixture(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// A recording of the agent's fixtures (`daemonsets/hairpin.yaml`) as JSON.
pub fn recorded(rel: &str) -> Value {
    fixture(&crate::repo::agent_fixture(rel))
}

/// ingress-nginx on DigitalOcean with the PROXY protocol on, as recorded: its LB IP
/// is the simulated node's 203.0.113.10.
pub fn digitalocean_service() -> Value {
    recorded("services/digitalocean.yaml")
}
