//! Running the node subcommands (`status`, `check`, `doctor`, `dump`) as processes on
//! the simulated node, as an operator would on a real one.

use std::{path::PathBuf, process::Output};

use crate::{
    agent::{Agent, FrontendSpec, agent_bin},
    node::SimNode,
    sh::command_in,
};

/// The admin socket path for agents on `node`: one per node, since tests run in parallel
/// and the default (/run/hairpin/admin.sock) is shared by the whole machine.
pub fn admin_socket(node: &SimNode) -> PathBuf {
    node.dir.join("admin.sock")
}

/// Starts the agent on `node` with its admin socket under the node's scratch directory.
pub fn start_agent(node: &SimNode, specs: &[FrontendSpec]) -> Agent {
    let sock = admin_socket(node);
    Agent::start_with(
        node,
        specs,
        &["--admin-socket", sock.to_str().expect("utf-8 path")],
    )
}

/// What a subcommand printed and how it exited.
#[derive(Debug)]
pub struct CliRun {
    /// Exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CliRun {
    /// Standard output parsed as JSON; panics with the output when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!("not json ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr)
        })
    }
}

/// Runs `hairpin-agent cleanup` for the node scope as the uninstall's node cleanup
/// does (no listen link here, no API server), with JSON output; asserts it succeeded.
pub fn run_node_cleanup(node: &SimNode) -> CliRun {
    let run = node_cleanup(node, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    run
}

/// As [`run_node_cleanup`], with `extra` flags, whatever its exit status.
pub fn node_cleanup(node: &SimNode, extra: &[&str]) -> CliRun {
    let mut args = vec![
        "cleanup",
        "--scope",
        "node",
        "--listen-link",
        "none",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--output",
        "json",
    ];
    args.extend_from_slice(extra);
    run_cli(node, &args)
}

/// Each step of a `cleanup` or `uninstall` JSON report: its name and outcome.
pub fn steps(report: &serde_json::Value) -> Vec<(String, String)> {
    report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_string(),
                s["outcome"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Runs `hairpin-agent <args>` in the node namespace, in the host cgroup (so the
/// redirect applies to it as to any host process), talking to `node`'s admin socket.
pub fn run_cli(node: &SimNode, args: &[&str]) -> CliRun {
    let bin = agent_bin();
    let sock = admin_socket(node);
    let mut argv = vec![bin.to_str().expect("utf-8 path")];
    argv.extend_from_slice(args);
    let out: Output = command_in(&node.node_ns, Some(&node.host_cgroup()), &argv)
        .env("HAIRPIN_ADMIN_SOCKET", &sock)
        .env_remove("HAIRPIN_ADMIN_ADDRESS")
        // The node's own bpf filesystem, as its agents pin there.
        .env("HAIRPIN_BPF_PIN_DIR", node.pin_dir())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {argv:?}: {e}"));
    CliRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The frontends map's entries, from `hairpin-agent dump --output json`, as
/// `(frontend, field)`: `field` is `path` or `listener`.
pub fn dump_entries(node: &SimNode, field: &str) -> Vec<(String, String)> {
    let dump = run_cli(node, &["dump", "--output", "json"]).json();
    let maps = dump["maps"].as_array().expect("maps");
    let frontends = maps
        .iter()
        .find(|m| m["kind"] == "frontends")
        .unwrap_or_else(|| panic!("no frontends map: {dump}"));
    frontends["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().expect("string").to_string();
            (s("frontend"), s(field))
        })
        .collect()
}

/// The agent's `/status`, through `hairpin-agent status --output json`; the agent
/// must be reachable.
pub fn cli_status(node: &SimNode) -> serde_json::Value {
    let run = run_cli(node, &["status", "--output", "json"]);
    let mut report = run.json();
    assert_eq!(report["agent_reachable"], true, "{run:?}");
    report["status"].take()
}

/// The check `name` of a `doctor --output json` report.
pub fn doctor_check(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} check in {report}"))
}
