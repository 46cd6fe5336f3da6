//! The manifests' env read the way the agent reads it: through its own clap options
//! (`RunArgs`, `CleanupArgs`), so a name that is no flag's, or a value its parser
//! refuses, fails here exactly as it would stop the agent.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsStr,
    path::PathBuf,
};

use clap::Parser;
use hairpin_agent::{
    agent::{CorednsWriterArgs, RunArgs},
    cli::{CleanupArgs, UninstallArgs},
};

use super::render::read;

/// `hairpin-agent run`'s options, as a parser of their own.
#[derive(Parser, Debug)]
#[command(name = "run")]
struct Run {
    #[command(flatten)]
    args: RunArgs,
}

/// `hairpin-agent coredns-writer`'s options.
#[derive(Parser, Debug)]
#[command(name = "coredns-writer")]
struct Writer {
    #[command(flatten)]
    args: CorednsWriterArgs,
}

/// `hairpin-agent cleanup`'s options.
#[derive(Parser, Debug)]
#[command(name = "cleanup")]
struct Cleanup {
    #[command(flatten)]
    args: CleanupArgs,
}

/// `hairpin-agent uninstall`'s options.
#[derive(Parser, Debug)]
#[command(name = "uninstall")]
struct Uninstall {
    #[command(flatten)]
    args: UninstallArgs,
}

/// The env parsed as `uninstall` parses it.
pub(crate) fn uninstall_args(env: &BTreeMap<String, String>, source: &str) -> UninstallArgs {
    parse::<Uninstall>(env, source).args
}

/// The env parsed as `run` parses it.
pub(crate) fn run_args(env: &BTreeMap<String, String>, source: &str) -> RunArgs {
    parse::<Run>(env, source).args
}

/// The env parsed as `coredns-writer` parses it.
pub(crate) fn writer_args(env: &BTreeMap<String, String>, source: &str) -> CorednsWriterArgs {
    parse::<Writer>(env, source).args
}

/// The env parsed as `cleanup` parses it.
pub(crate) fn cleanup_args(env: &BTreeMap<String, String>, source: &str) -> CleanupArgs {
    parse::<Cleanup>(env, source).args
}

/// Flags of the top-level command (`--log`, `--log-format`), which main.rs defines
/// for every subcommand: accepted, and not `run`'s or `cleanup`'s own.
pub(crate) fn global_env_names() -> BTreeSet<String> {
    let src = read("hairpin-agent/src/main.rs");
    let names: BTreeSet<String> = src
        // The flags' `env = "HAIRPIN_..."`, not a `cfg(target_env = "...")`.
        .match_indices("env = \"HAIRPIN_")
        .map(|(i, m)| {
            src[i + m.len() - "HAIRPIN_".len()..]
                .chars()
                .take_while(|c| *c != '"')
                .collect()
        })
        .collect();
    assert!(names.contains("HAIRPIN_LOG"), "main.rs: {names:?}");
    names
}

/// Turns each `HAIRPIN_*` variable into the flag that reads it (`--long=value`) and
/// parses with the agent's parser. The test process's own environment must not hold
/// any of them: clap would read it for the flags not given.
fn parse<P: Parser + std::fmt::Debug>(env: &BTreeMap<String, String>, source: &str) -> P {
    let cmd = P::command();
    let globals = global_env_names();
    let mut argv = vec![cmd.get_name().to_string()];
    for (name, value) in env {
        if globals.contains(name) {
            continue;
        }
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_env() == Some(OsStr::new(name)))
            .unwrap_or_else(|| {
                panic!(
                    "{source}: env {name} is not a flag of `hairpin-agent {}`: an unknown setting is \
                     ignored silently",
                    cmd.get_name()
                )
            });
        let long = arg.get_long().expect("every flag has a long name");
        if arg.get_action().takes_values() {
            argv.push(format!("--{long}={value}"));
        } else if !matches!(value.as_str(), "" | "0" | "false" | "no" | "off") {
            argv.push(format!("--{long}"));
        }
    }
    for arg in cmd.get_arguments() {
        if let Some(e) = arg.get_env() {
            assert!(
                std::env::var_os(e).is_none(),
                "unset {} in this test's environment: clap would read it",
                e.to_string_lossy()
            );
        }
    }
    let matches = cmd
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| panic!("{source}: the agent refuses this env ({argv:?}):\n{e}"));
    P::from_arg_matches(&matches).unwrap_or_else(|e| panic!("{source}: {e}"))
}

/// The agent binary, when built; on CI it must be.
pub(crate) fn agent_binary() -> Option<PathBuf> {
    let bin = std::env::var_os("HAIRPIN_AGENT_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.ancestors().nth(2)?.join("hairpin-agent"))
        })
        .filter(|p| p.exists());
    if bin.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no hairpin-agent binary (CI=true): run through `cargo xtask test`"
        );
        eprintln!("SKIPPED: no hairpin-agent binary; build it with `cargo build -p hairpin-agent`");
    }
    bin
}

/// The routes status/admin.rs serves (`.route("/path", ...)`).
pub(crate) fn admin_routes() -> BTreeSet<String> {
    let src = read("hairpin-agent/src/status/admin.rs");
    src.match_indices(".route(\"")
        .map(|(i, m)| {
            src[i + m.len()..]
                .split('"')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[test]
fn a_name_that_is_no_flag_and_a_value_the_agent_refuses_both_fail() {
    let env = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
    for (bad, why) in [
        (env("HAIRPIN_COREDNS_MODE", "import"), "not a flag"),
        (env("HAIRPIN_NAMES_SERVICE_PORTS", "80:880"), "bad value"),
        (env("HAIRPIN_COREDNS", "on"), "bad value"),
    ] {
        let r = std::panic::catch_unwind(|| run_args(&bad, "test"));
        assert!(r.is_err(), "{why}: {bad:?} must be refused");
    }
    let ok = run_args(&env("HAIRPIN_NAMES_SERVICE_PORTS", "off"), "test");
    assert!(ok.names_service_ports.0.is_empty());
}
