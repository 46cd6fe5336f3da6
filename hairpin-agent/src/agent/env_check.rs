//! Every `HAIRPIN_*` variable in the agent's environment must be one it reads: a typo
//! in the chart's `extraEnv` (`HAIRPIN_LB_CIDR` for `HAIRPIN_LB_CIDRS`) would
//! otherwise drop the setting without a word. The known set is clap's: each flag's
//! `env` name.

use std::ffi::OsString;

/// The prefix of the agent's variables.
const PREFIX: &str = "HAIRPIN_";

/// The agent's own build inputs, read when it is compiled (`build.rs` embeds the BPF
/// object, `main.rs` takes the version string): a developer's shell that builds and
/// runs it has them set. Nothing else of the workspace's tools reaches the agent: the
/// test harness starts every agent without the variables it inherited.
const BUILD_INPUTS: &[&str] = &["HAIRPIN_EBPF_OBJECT", "HAIRPIN_BUILD_VERSION"];

/// The variable the agent refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    /// A `HAIRPIN_*` name no flag reads.
    #[error(
        "environment variable {name} is not one hairpin-agent reads (did you mean {nearest}?): \
         remove it or correct its name; `hairpin-agent {subcommand} --help` lists each flag's variable"
    )]
    Unknown {
        /// The variable as set.
        name: String,
        /// The known variable nearest to it by edit distance.
        nearest: String,
        /// The subcommand being started.
        subcommand: String,
    },
}

/// Refuses the first `HAIRPIN_*` variable of `vars` (sorted by name) that is neither
/// in `known` (clap's env names) nor a Kubernetes service link (a Service named
/// `hairpin...` in the pod's namespace gives every pod `HAIRPIN_SERVICE_HOST`,
/// `HAIRPIN_PORT_80_TCP`, ...) nor one of the agent's own build inputs.
pub fn check_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    known: &[String],
    subcommand: &str,
) -> Result<(), EnvError> {
    let mut names: Vec<String> = vars
        .into_iter()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with(PREFIX))
        .collect();
    names.sort();
    for name in names {
        if known.contains(&name) || is_service_link(&name) || BUILD_INPUTS.contains(&name.as_str())
        {
            continue;
        }
        let nearest = known
            .iter()
            .min_by_key(|k| (distance(&name, k), k.as_str()))
            .cloned()
            .unwrap_or_default();
        return Err(EnvError::Unknown {
            name,
            nearest,
            subcommand: subcommand.to_string(),
        });
    }
    Ok(())
}

/// A variable the kubelet sets for a Service (`enableServiceLinks`, on by default):
/// `NAME_SERVICE_HOST`, `NAME_SERVICE_PORT[_PORTNAME]`, `NAME_PORT` and
/// `NAME_PORT_<port>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]`.
fn is_service_link(name: &str) -> bool {
    if name.ends_with("_SERVICE_HOST") || name.contains("_SERVICE_PORT") || name.ends_with("_PORT")
    {
        return true;
    }
    name.match_indices("_PORT_").any(|(i, sep)| {
        let tail: Vec<&str> = name[i + sep.len()..].split('_').collect();
        let port = tail[0];
        !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && tail
                .get(1)
                .is_some_and(|p| matches!(*p, "TCP" | "UDP" | "SCTP"))
            && match tail.len() {
                2 => true,
                3 => matches!(tail[2], "PROTO" | "PORT" | "ADDR"),
                _ => false,
            }
    })
}

/// Levenshtein distance between `a` and `b` (bytes: the names are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(names: &[&str]) -> Vec<(OsString, OsString)> {
        names
            .iter()
            .map(|n| (OsString::from(n), OsString::from("x")))
            .collect()
    }

    fn known() -> Vec<String> {
        [
            "HAIRPIN_LB_CIDRS",
            "HAIRPIN_LOG",
            "HAIRPIN_NODE_NAME",
            "HAIRPIN_MODE",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn a_typo_is_refused_naming_it_and_the_nearest_known_variable() {
        let err = check_env(vars(&["HAIRPIN_LB_CIDR", "PATH"]), &known(), "run").unwrap_err();
        assert_eq!(
            err,
            EnvError::Unknown {
                name: "HAIRPIN_LB_CIDR".into(),
                nearest: "HAIRPIN_LB_CIDRS".into(),
                subcommand: "run".into(),
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("HAIRPIN_LB_CIDR ") && text.contains("did you mean HAIRPIN_LB_CIDRS?"),
            "{text}"
        );
    }

    #[test]
    fn known_variables_service_links_and_other_prefixes_pass() {
        let ok = vars(&[
            "HAIRPIN_LB_CIDRS",
            "HAIRPIN_NODE_NAME",
            "HAIRPIN_SERVICE_HOST",
            "HAIRPIN_SERVICE_PORT",
            "HAIRPIN_SERVICE_PORT_HTTP",
            "HAIRPIN_PORT",
            "HAIRPIN_PORT_80_TCP",
            "HAIRPIN_PORT_80_TCP_PROTO",
            "HAIRPIN_PORT_80_TCP_PORT",
            "HAIRPIN_PORT_80_TCP_ADDR",
            "HAIRPIN_METRICS_SERVICE_HOST",
            "HAIRPIN_METRICS_PORT_9090_TCP_ADDR",
            "HAIRPIN_EBPF_OBJECT",
            "HAIRPIN_BUILD_VERSION",
            "KUBERNETES_SERVICE_HOST",
            "HAIRPINLB",
        ]);
        assert_eq!(check_env(ok, &known(), "run"), Ok(()));
    }

    #[test]
    fn the_test_harness_variables_are_not_the_agents() {
        // The harness strips them from every agent it starts; an operator's
        // `HAIRPIN_FOO_BIN` or `HAIRPIN_TEST_X` is a typo like any other.
        for name in [
            "HAIRPIN_AGENT_BIN",
            "HAIRPIN_ETCD_BIN",
            "HAIRPIN_TEST_KERNELS",
            "HAIRPIN_XTASK_ELEVATED",
            "HAIRPIN_K8S_VERSION",
            "HAIRPIN_HELM_PYTHON",
        ] {
            assert!(check_env(vars(&[name]), &known(), "run").is_err(), "{name}");
        }
    }

    #[test]
    fn what_only_looks_like_a_service_link_is_refused() {
        for name in [
            "HAIRPIN_PORTS",
            "HAIRPIN_PORT_80",
            "HAIRPIN_PORT_X_TCP",
            "HAIRPIN_PORT_80_TCP_HOST",
        ] {
            assert!(check_env(vars(&[name]), &known(), "run").is_err(), "{name}");
        }
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("HAIRPIN_LB_CIDR", "HAIRPIN_LB_CIDRS"), 1);
        assert_eq!(distance("HAIRPIN_MDOE", "HAIRPIN_MODE"), 2);
        assert_eq!(distance("", "ab"), 2);
    }
}
