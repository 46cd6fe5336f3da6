//! The Kubernetes object a claim, a skip or a cap names: a leaf both the claims and
//! the caps use, so neither has to import the other for it.

/// The Kubernetes object a claim or skip came from, enough for an Event's
/// `regarding` reference.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    /// `networking.k8s.io/v1`, `gateway.networking.k8s.io/v1`, ...
    pub api_version: String,
    /// `Ingress`, `HTTPRoute`, `TLSRoute`, `Gateway`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid, when the object carries one.
    pub uid: Option<String>,
}
