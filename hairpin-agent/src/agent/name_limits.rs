//! The flags that bound names and their churn: how many names are published
//! (per namespace and in all, applied in [`crate::names::caps`]) and how often
//! the hosts file is written ([`crate::names::hosts_writer`]).

use std::time::Duration;

use crate::names::caps::{DEFAULT_MAX_NAMES, DEFAULT_MAX_NAMES_PER_NAMESPACE, NameCaps};

/// Caps on published names, and the hosts file's write pace.
#[derive(clap::Args, Debug, Clone)]
pub struct NameLimitArgs {
    /// Most hostnames one namespace may publish (Ingress, Gateway and route names;
    /// the frontends file counts as one namespace). Past it, the namespace's newest
    /// names are withheld, with a Warning Event on their objects; other namespaces
    /// are not affected.
    #[arg(long, env = "HAIRPIN_MAX_NAMES_PER_NAMESPACE",
          default_value_t = DEFAULT_MAX_NAMES_PER_NAMESPACE as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_names_per_namespace: u32,

    /// Most hostnames published in all, shared round robin between namespaces.
    /// The default keeps the hosts block and the CoreDNS rewrites under 1 MiB
    /// with the longest names; each name above it may cost up to 294 bytes of
    /// /etc/hosts and 484 of Corefile.
    #[arg(long, env = "HAIRPIN_MAX_NAMES",
          default_value_t = DEFAULT_MAX_NAMES as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_names: u32,

    /// The hosts file is written at most once per this interval: a burst of
    /// changes becomes one write of the latest block (the first change of a quiet
    /// period is written at once).
    #[arg(long, env = "HAIRPIN_HOSTS_MIN_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub hosts_min_interval: Duration,
}

impl NameLimitArgs {
    /// The caps, as names resolution takes them.
    pub(crate) fn limits(&self) -> NameCaps {
        NameCaps {
            per_namespace: self.max_names_per_namespace as usize,
            total: self.max_names as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        limits: NameLimitArgs,
    }

    #[test]
    fn defaults_and_zero_is_refused() {
        let cli = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(cli.limits.limits(), NameCaps::default());
        assert_eq!(cli.limits.hosts_min_interval, Duration::from_secs(2));
        let cli = Cli::try_parse_from([
            "x",
            "--max-names-per-namespace",
            "3",
            "--max-names",
            "10",
            "--hosts-min-interval",
            "500ms",
        ])
        .expect("set");
        assert_eq!(
            cli.limits.limits(),
            NameCaps {
                per_namespace: 3,
                total: 10
            }
        );
        assert_eq!(cli.limits.hosts_min_interval, Duration::from_millis(500));
        assert!(Cli::try_parse_from(["x", "--max-names", "0"]).is_err());
    }
}
