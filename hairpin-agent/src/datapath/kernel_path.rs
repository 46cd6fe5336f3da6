//! The kernel path's programs: sock_ops and sk_msg, and the connect programs that
//! mark sockets instead of rewriting them. Whether this kernel can run them is found
//! by loading them: a program type the kernel lacks, a helper it refuses or a
//! verifier rejection each leave the kernel path unavailable with the reason, and
//! the relay path works as before.

use std::{fmt, net::SocketAddr, sync::Arc, time::Duration};

use hairpin_ebpf::SlotRef;

use aya::{
    Ebpf,
    programs::{CgroupSockAddr, CgroupSockopt, ProgramError, ProgramType, SkMsg, SockOps},
    sys::is_program_supported,
};
use hairpin_ebpf::{
    FrontendKey, HEADER_RELAY_CHOSEN, HEADER_RELAY_SERVER_FIRST, HEADER_V1, HEADER_V2,
    PROG_CONNECT4, PROG_CONNECT4_KERNEL, PROG_CONNECT4_KERNEL_PERFMON, PROG_CONNECT6,
    PROG_CONNECT6_KERNEL, PROG_CONNECT6_KERNEL_PERFMON, PROG_SETSOCKOPT, PROG_SK_MSG,
    PROG_SOCK_OPS, Redirect,
};

use super::btf::BtfError;
use super::counters::Fill;
use super::error::DatapathError;
use super::lifecycle::decide;
use super::lifecycle::state::{Drain, DrainSeen};
use crate::{
    model::{FirstSpeaker, PathChoice, ProxyVersion},
    status::KernelPathReason,
};

// The programs read a kernel-path frontend's header byte as the version's number.
const _: () = assert!(
    ProxyVersion::V1.number() == HEADER_V1 && ProxyVersion::V2.number() == HEADER_V2,
    "the frontend map's header bytes are the PROXY version numbers"
);

/// How the kernel path stands on this node.
#[derive(Clone, Debug)]
pub(crate) enum KernelPath {
    /// `--kernel-path off`: every frontend takes the relay path.
    Off,
    /// Asked for, but this kernel cannot run it (why: its kind is what `status`
    /// reports and `doctor` matches on): every frontend takes the relay path.
    Unavailable(Arc<KernelPathUnavailable>),
    /// The programs are loaded: frontends whose client speaks first get their
    /// header written by the kernel, on the client's own socket.
    On,
}

impl KernelPath {
    /// Whether kernel-path frontends get in-kernel headers.
    pub(crate) fn is_on(&self) -> bool {
        matches!(self, KernelPath::On)
    }

    /// The connect programs to load and attach: the marking ones when on.
    pub(super) fn connect_programs(&self) -> [&'static str; 2] {
        if self.is_on() {
            [PROG_CONNECT4_KERNEL, PROG_CONNECT6_KERNEL]
        } else {
            [PROG_CONNECT4, PROG_CONNECT6]
        }
    }

    /// The frontend map's value for `slot` with header `version`: a kernel header
    /// when on, the client speaks first and the frontend asks for no `path` but
    /// `auto`; the relay otherwise, with the reason in the header byte for `dump` (a
    /// server that speaks first before a relay asked for: the relay is then
    /// required, not chosen). The slot stays in the value, the fallback for a socket
    /// the kernel path cannot take.
    pub(super) fn value(
        &self,
        slot: SlotRef,
        version: ProxyVersion,
        first: FirstSpeaker,
        path: PathChoice,
    ) -> Redirect {
        let v = version.number();
        match (self, first, path) {
            (KernelPath::On, FirstSpeaker::Server, _) => Redirect::server_first(slot, v),
            (KernelPath::On, FirstSpeaker::Client, PathChoice::Relay) => {
                Redirect::relay_chosen(slot, v)
            }
            (KernelPath::On, FirstSpeaker::Client, PathChoice::Auto) => Redirect::kernel(slot, v),
            _ => Redirect::new(slot, v),
        }
    }

    /// Why a frontend whose `first` side speaks first and that asks for `path` takes
    /// the path it takes, when the kernel path was asked for (`None` when it is off:
    /// everything is relayed). The same order as [`KernelPath::value`].
    pub(crate) fn why(&self, first: FirstSpeaker, path: PathChoice) -> Option<String> {
        match (self, first, path) {
            (KernelPath::Off, _, _) => None,
            (KernelPath::Unavailable(_), _, _) => {
                Some("relay: the kernel path is unavailable on this node".into())
            }
            (KernelPath::On, FirstSpeaker::Server, _) => Some(
                "relay: the server speaks first (the kernel writes the header only ahead of \
                 the client's first bytes)"
                    .into(),
            ),
            (KernelPath::On, FirstSpeaker::Client, PathChoice::Relay) => {
                Some("relay: the Service asks for it (hairpin.dev/path: relay)".into())
            }
            (KernelPath::On, FirstSpeaker::Client, PathChoice::Auto) => {
                Some("kernel: the client speaks first".into())
            }
        }
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelPath::Off => f.write_str("off"),
            KernelPath::Unavailable(why) => write!(f, "unavailable: {why}"),
            KernelPath::On => f.write_str("on"),
        }
    }
}

/// What a frontends map value does with a connect, for `dump`: `kernel v1`,
/// `kernel v2`, `relay`, `relay (server speaks first)` or `relay (hairpin.dev/path)`.
pub(super) fn describe(value: &Redirect) -> &'static str {
    match value.header {
        HEADER_V1 => "kernel v1",
        HEADER_V2 => "kernel v2",
        HEADER_RELAY_SERVER_FIRST => "relay (server speaks first)",
        HEADER_RELAY_CHOSEN => "relay (hairpin.dev/path)",
        _ => "relay",
    }
}

/// The frontends map `id` with what each entry does: frontend, its slot and
/// [`describe`]'s words, in frontend order.
pub(crate) fn read_frontend_paths(
    id: u32,
) -> Result<Vec<(SocketAddr, SlotRef, &'static str)>, super::kernel_objects::KernelObjectsError> {
    use aya::maps::{HashMap, Map, MapData};
    let error = |op, source| super::kernel_objects::KernelObjectsError::Map {
        op,
        id,
        source: Box::new(source),
    };
    let data = MapData::from_id(id).map_err(|e| error("open", e))?;
    let map = Map::from_map_data(data).map_err(|e| error("open", e))?;
    let map: HashMap<MapData, FrontendKey, Redirect> =
        HashMap::try_from(map).map_err(|e| error("read", e))?;
    let mut out: Vec<_> = map
        .iter()
        .filter_map(Result::ok)
        .map(|(k, v)| (k.socket_addr(), v.slot(), describe(&v)))
        .collect();
    out.sort();
    Ok(out)
}

/// How often the fill is read while waiting.
const FILL_POLL: Duration = Duration::from_millis(20);

/// After the connect programs detached (sock_ops and sk_msg still on), waits until
/// the sockets map is empty, every socket's header out or the socket closed, and no
/// marked socket can still be connecting (for at most [`decide::HANDSHAKE_SETTLE`]), or
/// until `deadline`. `read` gives the fill. The sockets still in the map at the
/// deadline are established and not yet written: the datapath is being removed, so
/// they never get their header (the map and sk_msg go). Logged as such; their count
/// is returned. (A datapath kept for the next agent is not drained at all.)
pub(crate) async fn drain_kernel_sockets(
    read: impl Fn() -> Fill,
    deadline: tokio::time::Instant,
) -> u64 {
    let started = tokio::time::Instant::now();
    let first = read();
    tracing::info!(
        in_map = first.in_map,
        connecting = first.connecting,
        "waiting for kernel-path sockets to write their header"
    );
    let mut fill = first;
    loop {
        let now = tokio::time::Instant::now();
        let seen = DrainSeen {
            fill,
            waited: now.duration_since(started),
            past_deadline: now >= deadline,
        };
        match decide::drain(&seen) {
            Drain::Done => {
                tracing::info!(
                    waited_ms = seen.waited.as_millis() as u64,
                    "kernel-path sockets map empty: every header is out"
                );
                return 0;
            }
            Drain::GiveUp { unwritten } => {
                if unwritten > 0 {
                    tracing::warn!(
                        unwritten,
                        "drain deadline reached: kernel-path sockets established but not yet \
                         written go without their PROXY header"
                    );
                }
                return unwritten;
            }
            Drain::Wait => {}
        }
        tokio::time::sleep(FILL_POLL.min(deadline - now)).await;
        fill = read();
    }
}

impl KernelPathUnavailable {
    /// Its kind, for `status` and `doctor`.
    pub(crate) fn kind(&self) -> KernelPathReason {
        match self {
            KernelPathUnavailable::NoProgramType(_) => KernelPathReason::NoProgramType,
            KernelPathUnavailable::Probe { .. } => KernelPathReason::ProbeFailed,
            KernelPathUnavailable::Missing(_) => KernelPathReason::NotInObject,
            KernelPathUnavailable::Load { .. } => KernelPathReason::Refused,
            KernelPathUnavailable::LinkFailed(_) => KernelPathReason::LinkFailed,
        }
    }
}

/// Why this kernel cannot run the kernel path: the reason `status` and `doctor` show.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KernelPathUnavailable {
    /// The kernel lacks a program type the kernel path needs.
    #[error("this kernel has no {0} programs")]
    NoProgramType(&'static str),
    /// Probing for a program type failed.
    #[error("probing {name} programs failed: {source}")]
    Probe {
        /// `sock_ops` or `sk_msg`.
        name: &'static str,
        /// aya's error.
        source: ProgramError,
    },
    /// The eBPF object lacks one of the kernel path's programs.
    #[error("the eBPF object has no program {0}")]
    Missing(&'static str),
    /// A program did not load (the verifier's last words, and a note on CAP_PERFMON).
    #[error("{name} did not load: {detail}{note}")]
    Load {
        /// The program.
        name: &'static str,
        /// The load error, shortened to the verifier log's last lines.
        detail: String,
        /// Why the verifier may have been stricter, or empty.
        note: &'static str,
    },
    /// A kernel path hook could not be linked after the programs loaded.
    #[error(transparent)]
    LinkFailed(DatapathError),
}

/// Loads the kernel path's programs into `ebpf` (not attached): sk_msg, sock_ops,
/// setsockopt and the marking connect programs, the ones that also send MPTCP
/// subflows and Fast Open sockets to the relay where the kernel lets this process
/// use their helpers (CAP_PERFMON) and `fast_open_fields` says the loader found
/// tcp_sock's Fast Open fields (else why not). On any other failure, unloads what
/// it loaded and says why. The connect programs loaded.
pub(super) fn load(
    ebpf: &mut Ebpf,
    fast_open_fields: Result<(), BtfError>,
) -> Result<[&'static str; 2], KernelPathUnavailable> {
    for (kind, name) in [
        (ProgramType::SockOps, "sock_ops"),
        (ProgramType::SkMsg, "sk_msg"),
    ] {
        match is_program_supported(kind) {
            Ok(true) => {}
            Ok(false) => return Err(KernelPathUnavailable::NoProgramType(name)),
            Err(source) => return Err(KernelPathUnavailable::Probe { name, source }),
        }
    }
    let connect = match load_each(ebpf, fast_open_fields) {
        Ok(connect) => connect,
        Err(e) => {
            unload(ebpf);
            return Err(e);
        }
    };
    // What the verifier walked, per program: the headroom left below its limit.
    for name in [
        connect[0],
        connect[1],
        PROG_SOCK_OPS,
        PROG_SK_MSG,
        PROG_SETSOCKOPT,
    ] {
        let info = ebpf.program(name).and_then(|p| p.info().ok());
        tracing::debug!(
            program = name,
            verified_instructions = info.and_then(|i| i.verified_instruction_count()),
            "kernel path program loaded"
        );
    }
    Ok(connect)
}

fn load_each(
    ebpf: &mut Ebpf,
    fast_open_fields: Result<(), BtfError>,
) -> Result<[&'static str; 2], KernelPathUnavailable> {
    let missing = KernelPathUnavailable::Missing;
    let failed = |name: &'static str, e: ProgramError| {
        tracing::debug!(program = name, error = %e, "kernel path program did not load");
        KernelPathUnavailable::Load {
            name,
            detail: short(&e),
            note: perfmon_note(has_perfmon()),
        }
    };
    let p: &mut SkMsg = program(ebpf, PROG_SK_MSG).ok_or_else(|| missing(PROG_SK_MSG))?;
    p.load().map_err(|e| failed(PROG_SK_MSG, e))?;
    let p: &mut SockOps = program(ebpf, PROG_SOCK_OPS).ok_or_else(|| missing(PROG_SOCK_OPS))?;
    p.load().map_err(|e| failed(PROG_SOCK_OPS, e))?;
    let p: &mut CgroupSockopt =
        program(ebpf, PROG_SETSOCKOPT).ok_or_else(|| missing(PROG_SETSOCKOPT))?;
    p.load().map_err(|e| failed(PROG_SETSOCKOPT, e))?;
    let perfmon = [PROG_CONNECT4_KERNEL_PERFMON, PROG_CONNECT6_KERNEL_PERFMON];
    let refused = match fast_open_fields {
        Err(why) => Some(format!(
            "tcp_sock's Fast Open fields were not found in the kernel's BTF: {why}"
        )),
        Ok(()) => {
            let mut refused = None;
            for name in perfmon {
                let p: &mut CgroupSockAddr = program(ebpf, name).ok_or_else(|| missing(name))?;
                if let Err(e) = p.load() {
                    refused = Some(format!("{name} did not load: {}", short(&e)));
                    break;
                }
            }
            refused
        }
    };
    let Some(why) = refused else {
        return Ok(perfmon);
    };
    for name in perfmon {
        if let Some(p) = program::<CgroupSockAddr>(ebpf, name) {
            let _ = p.unload();
        }
    }
    tracing::warn!(reason = %why, "{PERFMON_FALLBACK}");
    let connect = [PROG_CONNECT4_KERNEL, PROG_CONNECT6_KERNEL];
    for name in connect {
        let p: &mut CgroupSockAddr = program(ebpf, name).ok_or_else(|| missing(name))?;
        p.load().map_err(|e| failed(name, e))?;
    }
    Ok(connect)
}

/// What the agent says when the connect programs that need CAP_PERFMON do not load.
pub(super) const PERFMON_FALLBACK: &str = "the kernel path's connect programs cannot \
    read the socket itself (bpf_skc_to_mptcp_sock, bpf_skc_to_tcp_sock and \
    bpf_probe_read_kernel need CAP_PERFMON, and tcp_sock's offsets from the kernel's \
    BTF): MPTCP subflows go without a header (kernel_missed_insert), and so do \
    sendto(MSG_FASTOPEN) connections and sockets that set TCP_FASTOPEN_CONNECT before \
    the agent attached, once the client holds a Fast Open cookie \
    (kernel_missed_data_first); TCP_FASTOPEN_CONNECT set from now on still goes to \
    the relay (kernel_fallback_fastopen)";

/// CAP_PERFMON (38) in this thread's effective set; None when it cannot be read.
fn has_perfmon() -> Option<bool> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    let eff = u64::from_str_radix(eff.trim(), 16).ok()?;
    Some(eff & (1 << 38) != 0)
}

/// What a load failure adds when the loader has no CAP_PERFMON: the programs are
/// written to verify without it (the DaemonSet does not grant it), but the verifier
/// is stricter then, so a refusal there is most likely that.
fn perfmon_note(perfmon: Option<bool>) -> &'static str {
    match perfmon {
        Some(false) => {
            " (the agent has no CAP_PERFMON, under which the verifier is stricter: \
             speculative paths, pointer arithmetic; the programs are meant to verify \
             without it, so this is a bug to report)"
        }
        _ => "",
    }
}

/// Unloads whichever kernel-path programs are loaded (none is attached yet).
fn unload(ebpf: &mut Ebpf) {
    if let Some(p) = program::<SkMsg>(ebpf, PROG_SK_MSG) {
        let _ = p.unload();
    }
    if let Some(p) = program::<SockOps>(ebpf, PROG_SOCK_OPS) {
        let _ = p.unload();
    }
    if let Some(p) = program::<CgroupSockopt>(ebpf, PROG_SETSOCKOPT) {
        let _ = p.unload();
    }
    for name in [
        PROG_CONNECT4_KERNEL,
        PROG_CONNECT6_KERNEL,
        PROG_CONNECT4_KERNEL_PERFMON,
        PROG_CONNECT6_KERNEL_PERFMON,
    ] {
        if let Some(p) = program::<CgroupSockAddr>(ebpf, name) {
            let _ = p.unload();
        }
    }
}

/// Program `name` as type `T`, if the object has it with that type.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Option<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    ebpf.program_mut(name)?.try_into().ok()
}

/// A load error in one line: the syscall's error and the verifier's last words
/// (its whole log goes to the debug log).
fn short(e: &ProgramError) -> String {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let tail = &tail[tail.len().saturating_sub(2)..];
            if tail.is_empty() {
                io_error.to_string()
            } else {
                format!("{io_error} (verifier: {})", tail.join(" / "))
            }
        }
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
