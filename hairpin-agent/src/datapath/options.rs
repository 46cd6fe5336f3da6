//! What to load ([`LoadOptions`]): the relay path's settings, and the kernel path's
//! when asked for; given by the agent's flags, validated before.
//!
//! Owns the options' shape and their defaults. Never loads anything (load.rs does).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::Duration,
};

use hairpin_ebpf::{
    DEFAULT_MESH_PORTS, MAX_FRONTENDS, MAX_KERNEL_SOCKETS, MAX_SPLICE_SOCKETS, MESH_PORTS,
    PIN_LAYOUT,
};

use super::liveness::DEFAULT_TTL;
use super::pin::PinOwner;
use super::slots::SlotAddrs;

/// What to load: the relay path's settings, and the kernel path's when asked for.
#[derive(Clone, Debug)]
pub(crate) struct LoadOptions {
    /// SO_MARK of the relay's upstream sockets, which the connect programs skip.
    pub bypass_mark: u32,
    /// Capacity of the frontends map (preallocated).
    pub max_frontends: u32,
    /// Whether to try the kernel path.
    pub kernel_path: bool,
    /// Capacity of the sockets map (allocated as used): established sockets whose
    /// header is not out yet.
    pub max_kernel_sockets: u32,
    /// The node's IPv4 address: the header's source for a socket whose own address
    /// is loopback or the LB address (as the relay names host processes).
    pub node_ipv4: Option<Ipv4Addr>,
    /// The node's IPv6 address, likewise.
    pub node_ipv6: Option<Ipv6Addr>,
    /// Where links, programs and maps are pinned (on a bpf filesystem) so the
    /// datapath outlives this process; `None`: they go with it.
    pub pin_dir: Option<PathBuf>,
    /// The pin layout (`hairpin_ebpf::PIN_LAYOUT` but in tests of an upgrade).
    pub pin_layout: u32,
    /// Who the pin directory is handed to (`--pin-owner`); `None`: uid 0, 0700.
    pub pin_owner: Option<PinOwner>,
    /// How long the connect programs act after the last heartbeat.
    pub ttl: Duration,
    /// The relay's slot addresses (the listen addresses), fixed in the object: the
    /// only addresses a connect is ever rewritten to.
    pub slot_addrs: SlotAddrs,
    /// Capacity of the relay's splice maps (two sockets per spliced connection).
    pub splice_sockets: u32,
    /// Where the connect links go among the other programs at the cgroup
    /// (`--link-order`).
    pub link_order: super::order::LinkOrderWanted,
    /// The outbound capture ports of mesh proxies the kernel-path connect programs
    /// look for in the client's network namespace (host byte order; 0: unused).
    pub mesh_ports: [u16; MESH_PORTS],
    /// Whether the connect programs may skip the mesh probes for a network
    /// namespace known to have no capture listener (`--mesh-listener-cache`).
    pub mesh_cache: bool,
}

impl LoadOptions {
    /// The relay path only, with `bypass_mark` and room for [`MAX_FRONTENDS`].
    pub(crate) fn relay(bypass_mark: u32) -> LoadOptions {
        LoadOptions {
            bypass_mark,
            max_frontends: MAX_FRONTENDS,
            kernel_path: false,
            max_kernel_sockets: MAX_KERNEL_SOCKETS,
            node_ipv4: None,
            node_ipv6: None,
            pin_dir: None,
            pin_layout: PIN_LAYOUT,
            pin_owner: None,
            ttl: DEFAULT_TTL,
            slot_addrs: SlotAddrs::default(),
            splice_sockets: MAX_SPLICE_SOCKETS,
            link_order: super::order::LinkOrderWanted::First,
            mesh_ports: DEFAULT_MESH_PORTS,
            mesh_cache: false,
        }
    }
}
