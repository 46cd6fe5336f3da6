//! Which paths carry in-cluster clients to the relay on this node: the eBPF
//! redirect, the /etc/hosts block, CoreDNS rewrites (both through the name relay).
//!
//! Pure: the configured [`Mode`], what the datapath attempt came to and what is
//! configured in, a [`Plan`] out. The agent follows the plan and `/status` shows it.

use crate::{
    model::{LivePath, Mode, NodePath},
    status::EbpfFailure,
};

/// What loading and attaching the programs came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EbpfOutcome {
    /// Not tried (`--mode fallback`).
    NotTried,
    /// Attached.
    Attached,
    /// Tried and failed, with the reason and its kind (only `--mode auto` continues).
    Failed(String, EbpfFailure),
}

/// What is configured in, besides the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Configured {
    /// `--hosts-file` is set.
    pub hosts_file: bool,
    /// `--coredns` is not `off`.
    pub coredns: bool,
}

/// The paths to run, with the reason in one sentence for `/status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The programs are attached and redirect LB IPs.
    pub ebpf: bool,
    /// The name relay listens (behind the hosts block and the CoreDNS rewrites).
    pub name_relay: bool,
    /// The managed /etc/hosts block points names at the name relay.
    pub hosts: bool,
    /// CoreDNS rewrites point pods' names at the hairpin Service.
    pub coredns: bool,
    /// Why, in one sentence.
    pub reason: String,
}

impl Plan {
    /// The live paths, in a fixed order: the programs, hosts, CoreDNS.
    pub(crate) fn live(&self) -> Vec<NodePath> {
        [
            (self.ebpf, NodePath::Programs),
            (self.hosts, NodePath::Hosts),
            (self.coredns, NodePath::Coredns),
        ]
        .into_iter()
        .filter_map(|(on, path)| on.then_some(path))
        .collect()
    }

    /// The live paths that go through the name relay.
    pub(crate) fn name_paths(&self) -> Vec<LivePath> {
        self.live()
            .into_iter()
            .filter_map(NodePath::name_path)
            .collect()
    }
}

/// Decides the paths for `mode` after the datapath attempt `ebpf`.
pub(crate) fn plan(mode: Mode, ebpf: &EbpfOutcome, cfg: Configured) -> Plan {
    let attached = *ebpf == EbpfOutcome::Attached;
    let names_reason = |why: &str| {
        let mut parts = Vec::new();
        if cfg.hosts_file {
            parts.push("the /etc/hosts block");
        }
        if cfg.coredns {
            parts.push("CoreDNS rewrites");
        }
        if parts.is_empty() {
            format!(
                "{why}; no --hosts-file and --coredns off, so only clients that resolve names to the name relay themselves reach it"
            )
        } else {
            format!(
                "{why}; {} point names at the name relay",
                parts.join(" and ")
            )
        }
    };
    match (mode, ebpf) {
        (Mode::Ebpf, _) => Plan {
            ebpf: attached,
            name_relay: false,
            hosts: false,
            coredns: false,
            reason: "--mode ebpf: programs attached; no name relay, hosts file or CoreDNS".into(),
        },
        (Mode::Fallback, _) => Plan {
            ebpf: false,
            name_relay: true,
            hosts: cfg.hosts_file,
            coredns: cfg.coredns,
            reason: names_reason("--mode fallback: no programs loaded"),
        },
        (Mode::Both, _) => Plan {
            ebpf: attached,
            name_relay: true,
            hosts: cfg.hosts_file,
            coredns: cfg.coredns,
            reason: names_reason("--mode both: programs attached"),
        },
        (Mode::Auto, EbpfOutcome::Attached) => Plan {
            ebpf: true,
            // CoreDNS is cluster-wide: pods on this node are sent to this node's
            // name relay whatever this node's datapath, so it must listen here too.
            name_relay: cfg.coredns,
            hosts: false,
            coredns: cfg.coredns,
            reason: if cfg.coredns {
                "--mode auto: programs attached; CoreDNS rewrites point pods' names at the name relay; \
                 the /etc/hosts block is kept for nodes where eBPF cannot attach"
                    .into()
            } else {
                "--mode auto: programs attached; the /etc/hosts fallback is kept for nodes where eBPF cannot attach"
                    .into()
            },
        },
        (Mode::Auto, EbpfOutcome::Failed(why, _)) => Plan {
            ebpf: false,
            name_relay: true,
            hosts: cfg.hosts_file,
            coredns: cfg.coredns,
            reason: names_reason(&format!(
                "--mode auto: eBPF could not be used ({why}), falling back"
            )),
        },
        (Mode::Auto, EbpfOutcome::NotTried) => Plan {
            ebpf: false,
            name_relay: true,
            hosts: cfg.hosts_file,
            coredns: cfg.coredns,
            reason: names_reason("--mode auto: eBPF not tried"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Configured = Configured {
        hosts_file: true,
        coredns: true,
    };

    #[test]
    fn auto_uses_hosts_only_where_ebpf_fails() {
        let live = plan(Mode::Auto, &EbpfOutcome::Attached, ALL);
        assert_eq!(live.live(), [NodePath::Programs, NodePath::Coredns]);
        assert!(live.name_relay, "CoreDNS sends this node's pods here");
        let no_dns = Configured {
            coredns: false,
            ..ALL
        };
        let ebpf_only = plan(Mode::Auto, &EbpfOutcome::Attached, no_dns);
        assert_eq!(ebpf_only.live(), [NodePath::Programs]);
        assert!(!ebpf_only.name_relay);
        let failed = plan(
            Mode::Auto,
            &EbpfOutcome::Failed("EPERM".into(), EbpfFailure::Other),
            no_dns,
        );
        assert_eq!(failed.live(), [NodePath::Hosts]);
        assert!(failed.name_relay);
        assert!(failed.reason.contains("EPERM"), "{}", failed.reason);
        assert!(failed.reason.contains("falling back"), "{}", failed.reason);
    }

    #[test]
    fn explicit_modes() {
        assert_eq!(
            plan(Mode::Ebpf, &EbpfOutcome::Attached, ALL).live(),
            [NodePath::Programs]
        );
        assert_eq!(
            plan(Mode::Fallback, &EbpfOutcome::NotTried, ALL).live(),
            [NodePath::Hosts, NodePath::Coredns]
        );
        assert_eq!(
            plan(Mode::Both, &EbpfOutcome::Attached, ALL).live(),
            [NodePath::Programs, NodePath::Hosts, NodePath::Coredns]
        );
        let none = Configured {
            hosts_file: false,
            coredns: false,
        };
        let bare = plan(Mode::Fallback, &EbpfOutcome::NotTried, none);
        assert!(bare.live().is_empty() && bare.name_relay);
        assert!(bare.reason.contains("no --hosts-file"), "{}", bare.reason);
        assert!(!Mode::Fallback.tries_ebpf() && Mode::Both.requires_ebpf());
        assert!(!Mode::Auto.requires_ebpf() && !Mode::Ebpf.allows_names());
    }
}
