//! Which paths carry in-cluster clients to the relay on this node: the eBPF
//! redirect, the /etc/hosts block, CoreDNS rewrites (both through the name relay).
//!
//! Pure: the configured [`Mode`], what the datapath attempt came to and what is
//! configured in, a [`Plan`] out. `run` follows the plan and `/status` shows it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// `--mode`: which paths the agent may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// eBPF where it attaches; where it does not, the name relay with /etc/hosts.
    Auto,
    /// eBPF only: no name relay, no hosts file, no CoreDNS. Fails when it cannot attach.
    Ebpf,
    /// No eBPF at all (nothing loaded or attached): the name relay only.
    Fallback,
    /// eBPF and the name fallbacks together. Fails when eBPF cannot attach.
    Both,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Auto => "auto",
            Mode::Ebpf => "ebpf",
            Mode::Fallback => "fallback",
            Mode::Both => "both",
        })
    }
}

impl Mode {
    /// Whether the programs are loaded and attached at all.
    pub fn tries_ebpf(self) -> bool {
        self != Mode::Fallback
    }

    /// Whether a load or attach failure stops the agent (rather than falling back).
    pub fn requires_ebpf(self) -> bool {
        matches!(self, Mode::Ebpf | Mode::Both)
    }

    /// Whether CoreDNS may be written in this mode (`ebpf` touches no DNS).
    pub fn allows_names(self) -> bool {
        self != Mode::Ebpf
    }
}

/// What loading and attaching the programs came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EbpfOutcome {
    /// Not tried (`--mode fallback`).
    NotTried,
    /// Attached.
    Attached,
    /// Tried and failed, with the reason (only `--mode auto` continues).
    Failed(String),
}

/// What is configured in, besides the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Configured {
    /// `--hosts-file` is set.
    pub hosts_file: bool,
    /// `--coredns` is not `off`.
    pub coredns: bool,
}

/// The paths to run, with the reason in one sentence for `/status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
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
    /// The live paths by name, in a fixed order: `ebpf`, `hosts`, `coredns`.
    pub fn live(&self) -> Vec<String> {
        [
            (self.ebpf, "ebpf"),
            (self.hosts, "hosts"),
            (self.coredns, "coredns"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| name.to_string())
        .collect()
    }
}

/// Decides the paths for `mode` after the datapath attempt `ebpf`.
pub fn plan(mode: Mode, ebpf: &EbpfOutcome, cfg: Configured) -> Plan {
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
        (Mode::Auto, EbpfOutcome::Failed(why)) => Plan {
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
        assert_eq!(live.live(), ["ebpf", "coredns"]);
        assert!(live.name_relay, "CoreDNS sends this node's pods here");
        let no_dns = Configured {
            coredns: false,
            ..ALL
        };
        let ebpf_only = plan(Mode::Auto, &EbpfOutcome::Attached, no_dns);
        assert_eq!(ebpf_only.live(), ["ebpf"]);
        assert!(!ebpf_only.name_relay);
        let failed = plan(Mode::Auto, &EbpfOutcome::Failed("EPERM".into()), no_dns);
        assert_eq!(failed.live(), ["hosts"]);
        assert!(failed.name_relay);
        assert!(failed.reason.contains("EPERM"), "{}", failed.reason);
        assert!(failed.reason.contains("falling back"), "{}", failed.reason);
    }

    #[test]
    fn explicit_modes() {
        assert_eq!(
            plan(Mode::Ebpf, &EbpfOutcome::Attached, ALL).live(),
            ["ebpf"]
        );
        assert_eq!(
            plan(Mode::Fallback, &EbpfOutcome::NotTried, ALL).live(),
            ["hosts", "coredns"]
        );
        assert_eq!(
            plan(Mode::Both, &EbpfOutcome::Attached, ALL).live(),
            ["ebpf", "hosts", "coredns"]
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
