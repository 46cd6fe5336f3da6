//! The simulated node the integration suites and the tools (`hairpin-tools`: the
//! bench and the demo) build: network namespaces, veths, kube-proxy-style iptables
//! DNAT, a cgroup v2 subtree, a real nginx and haproxy with the PROXY protocol on,
//! and the agent as a process.
//! Only addresses inside namespaces made here ever receive traffic.

pub mod agent;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod dataplanes;
pub mod fakeapi;
pub mod helm;
pub mod kube_source;
pub mod load;
pub mod mesh;
pub mod names_support;
pub mod node;
pub mod pod;
pub mod privileges;
pub mod repo;
pub mod servers;
pub mod sh;
pub mod socket_lb;
pub mod wait;
