//! `hairpin-agent health`: the DaemonSet's exec probes. One GET of `/healthz` (or
//! `/readyz` with `--ready`) over the agent's admin socket, exit 0 on 200.
//!
//! The probes used to be HTTP GETs to 127.0.0.1:9901, a TCP port any uid on the node
//! can connect to (holding every place the listener's connection caps allow, so the
//! kubelet's probe is refused and the agent restarted at will) or bind first while the
//! agent restarts (so the agent cannot start and the squatter answers its probes).
//! The admin socket is root's alone: no other uid can connect to it, bind it or
//! replace it (its directory is root's, and a live socket is never taken over).

use std::io::Write;

use super::{AdminArgs, Exit};

/// Arguments of `health`.
#[derive(clap::Args, Debug, Clone)]
pub struct HealthArgs {
    /// Ask `/readyz` (readiness) rather than `/healthz` (liveness).
    #[arg(long, env = "HAIRPIN_HEALTH_READY")]
    pub(crate) ready: bool,

    /// Where the agent's admin server is.
    #[command(flatten)]
    pub(crate) admin: AdminArgs,
}

/// Asks the agent and prints its answer (one line); the exit status is the probe's:
/// [`Exit::Ok`] on 200, [`Exit::NotReady`] on any other answer, [`Exit::Unreachable`]
/// when the socket does not answer.
pub fn probe(args: &HealthArgs) -> i32 {
    let path = if args.ready { "/readyz" } else { "/healthz" };
    let (code, line) = match args.admin.get(path) {
        Ok(r) if r.code == 200 => (Exit::Ok, format!("{path}: {}", r.body.trim())),
        Ok(r) => (
            Exit::NotReady,
            format!("{path}: {} {}", r.code, r.body.trim()),
        ),
        Err(e) => (Exit::Unreachable, format!("{path}: {e}")),
    };
    // The kubelet keeps the probe's output in the pod's events: escaped, one line.
    let _ = writeln!(std::io::stdout(), "{}", line.escape_debug());
    code.code()
}
