//! The node subcommands: `status`, `check`, `doctor`, `dump`, `cleanup`, and the
//! cluster's `uninstall`. They talk to
//! the agent on this node through its admin server and to the kernel directly, so
//! they still say something useful when the agent is down.

pub mod admin_client;
pub mod check;
pub mod cleanup;
pub mod dns;
pub mod doctor;
pub mod dump;
pub mod kube_proxy;
pub mod probe;
pub mod status;
pub mod table;
pub mod uninstall;

use std::io::{IsTerminal, Write};

use serde::Serialize;

pub use admin_client::{AdminArgs, AdminClientError};

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
pub fn colour_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Prints `text` on stdout.
pub fn print_text(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}
