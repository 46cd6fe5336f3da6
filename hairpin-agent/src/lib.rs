//! hairpin-agent: the per-node DaemonSet that makes in-cluster traffic to the
//! cluster's own PROXY-protocol LoadBalancers carry the header the ingress expects.
//!
//! One folder per concern; imports point one way, from the top of this list down:
//!
//! - [`cli`]: the node subcommands an operator runs (`status`, `check`, `doctor`, `dump`, `cleanup`).
//! - [`agent`]: startup and the run loop; turns what a source wants into what is live.
//! - [`k8s`]: pure decisions over API objects, and the thin edges that watch and write them.
//! - [`names`]: hostnames, the /etc/hosts block, the Corefile text, and the name relay.
//! - [`podnet`]: this node's pod networks, read from its own links and routes.
//! - [`relay`]: listeners, the PROXY header and the proxy loop both relays share.
//! - [`datapath`]: the BPF programs and their map, and reading them back from the kernel.
//! - [`status`]: what the agent reports (`/status`, metrics, the admin server).
//! - `model`: the vocabulary every part shares; it depends on nothing.
//! - `tls`: the one TLS client that takes any certificate (`check`, the API server's
//!   certificate names); a leaf like `model`.
//!
//! The library's face is what the binary, the suites, the fuzz targets and the
//! tools name, one path per item: each concern's module re-exports its part
//! (`names::Hostname`, `k8s::Desired`, `cli::UninstallArgs`), and keeps public a
//! submodule only where its verbs read best qualified (`names::corefile::apply`,
//! `k8s::lease::run`). The shared vocabulary is at the root ([`ProxyVersion`],
//! [`Mode`], [`KernelPathMode`]). Everything else is `pub(crate)` or less; what only
//! the suites need is behind the `testing` feature.

pub mod agent;
pub mod cli;
pub mod datapath;
pub mod k8s;
pub(crate) mod logs;
pub(crate) mod model;
pub mod names;
pub mod podnet;
pub mod relay;
pub mod status;
pub(crate) mod tls;

pub use model::{KernelPathMode, Mode, Origin, PathChoice, ProxyVersion};
