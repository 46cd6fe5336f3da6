//! The node subcommands: `status`, `check`, `doctor`, `dump`, `cleanup`, `health` (the
//! DaemonSet's probes), and the
//! cluster's `uninstall`. They talk to
//! the agent on this node through its admin server and to the kernel directly, so
//! they still say something useful when the agent is down.

pub(crate) mod admin_client;
pub(crate) mod check;
pub(crate) mod cleanup;
pub(crate) mod dns;
pub(crate) mod doctor;
pub(crate) mod dump;
pub(crate) mod health;
pub(crate) mod kube_proxy;
pub(crate) mod probe;
pub(crate) mod status;
pub(crate) mod table;
pub(crate) mod uninstall;

use std::io::{IsTerminal, Write};

use serde::Serialize;

pub(crate) use admin_client::{AdminArgs, AgentArgs};
// The subcommands as the binary runs them: each one's flags and its verb.
pub use check::{CheckArgs, check_target};
pub use cleanup::{CleanupArgs, Scope, clean_up};
pub use doctor::{DoctorArgs, diagnose};
pub use dump::{DumpArgs, dump_maps};
pub use health::{HealthArgs, probe};
pub use status::{StatusArgs, show_status};
pub use uninstall::{Owned, Step, UninstallArgs, Workload, WorkloadKind, uninstall};

/// The exit status of every subcommand: one meaning each, never shared between
/// meanings, so a script can branch on it (the README's table lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// What was asked is fine: the agent is ready, in-cluster requests work, no
    /// check failed, everything was removed.
    Ok,
    /// A problem was found: the target needs the PROXY header and does not get it
    /// (`check`), a check failed (`doctor`), something could not be removed
    /// (`cleanup`, `uninstall`), no map was found (`dump`).
    Broken,
    /// The command line was wrong (clap's own status for a usage error).
    Usage,
    /// The agent answered and is not ready (`status`).
    NotReady,
    /// The agent could not be reached (`status`; the kernel's view is printed).
    Unreachable,
    /// Could not tell: nothing resolved or answered (`check`).
    Unknown,
    /// The command itself failed (its output could not be written, a runtime could
    /// not start): nothing is known about the node.
    Failed,
}

impl Exit {
    /// The process exit status.
    pub fn code(self) -> i32 {
        match self {
            Exit::Ok => 0,
            Exit::Broken => 1,
            Exit::Usage => 2,
            Exit::NotReady => 3,
            Exit::Unreachable => 4,
            Exit::Unknown => 5,
            Exit::Failed => 6,
        }
    }

    /// Every status, for the tests and the README's table.
    pub const ALL: [Exit; 7] = [
        Exit::Ok,
        Exit::Broken,
        Exit::Usage,
        Exit::NotReady,
        Exit::Unreachable,
        Exit::Unknown,
        Exit::Failed,
    ];
}

/// How a subcommand prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned tables for a person; colour only on a terminal.
    Text,
    /// One JSON document with stable field names, for scripts.
    Json,
}

/// Errors of the subcommands themselves (not of what they inspect, which they report).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Writing the output failed (a closed pipe).
    #[error("failed to write output: {0}")]
    Write(#[from] std::io::Error),
    /// Encoding JSON failed.
    #[error("failed to encode the json output: {0}")]
    Json(#[from] serde_json::Error),
    /// The target argument did not parse.
    #[error(transparent)]
    Target(#[from] check::BadTarget),
}

/// Whether stdout gets ANSI colour: only a terminal does, never a pipe or a file.
pub(crate) fn colour_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Prints `text` on stdout.
pub(crate) fn print_text(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}
