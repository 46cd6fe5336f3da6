//! hairpin's kernel programs, one file per hook, as Cilium keeps `bpf_sock.c`
//! apart from its sockops and sk_msg programs.
//!
//! - [`connect`]: the cgroup connect4/connect6 programs (relay-only, kernel path,
//!   kernel path with CAP_PERFMON): look the frontend up, decide, rewrite or mark.
//! - [`sock_ops`]: the kernel path at the end of a marked socket's handshake (format
//!   its header, put it in the sockets map) and after its first write (take it out).
//! - [`sk_msg`]: the kernel path's header, written ahead of a marked socket's first
//!   bytes.
//! - [`mesh`]: the connect programs' check for a mesh proxy's capture listener, and
//!   its cache per network namespace, which sock_ops keeps up to date.
//! - [`setsockopt`]: notes which sockets asked for TCP Fast Open.
//! - [`slots`]: the relay's slots as the connect programs check them, and the
//!   sk_lookup program that hands a connection to a slot to its relay listener.
//! - [`sk_skb`]: the relay's splice: a relayed socket's received bytes go out of its
//!   peer in the kernel.
//! - [`header`]: formats the PROXY v1/v2 header into a socket's storage (for sock_ops).
//! - [`maps`]: the maps and the loader's globals, the ABI shared with the agent
//!   (names and layouts from `hairpin_ebpf`; a pinned datapath is adopted by them).
//! - [`helpers`]: what several hooks share: counters, a socket's pending header.
//! - [`events`]: the diagnostic events' records (aya-log's format, a size the
//!   verifier knows).
//!
//! The kernel path: connect marks the socket (socket storage: version and original
//! destination) and leaves the destination alone; sock_ops, when the handshake is
//! done, formats the header from the socket's own address and puts the socket in
//! `HAIRPIN_SOCKETS`; sk_msg puts the header ahead of the first write; sock_ops takes
//! the socket out of the map at the next RTT callback (a sockhash delete is refused
//! inside sk_msg). Every way a marked connection can end up without its header is
//! counted.
//!
//! Every program fails open: a connect is never rejected, an option never refused,
//! a write never dropped; a bug or a full map degrades to the pre-hairpin behaviour.

/// A diagnostic event to aya-log's ring buffer, naming the frontend (its address
/// words and port in network byte order, as in [`hairpin_ebpf::FrontendKey`] and
/// [`hairpin_ebpf::PendingHeader`]) with `{:i} port {}` in `$fmt`, then at most one
/// more argument (an error number, printed where `$fmt` has a third `{}`). One format
/// string serves both families: the address goes out as 4 or 16 bytes, and user
/// space prints either. Written by [`events::write`] as aya-log's macros write it,
/// with a record size the verifier knows (see [`events`]).
///
/// Only on the rare paths (fallbacks, misses, failures), never on a plain redirect
/// or a header written. Each event is its own `#[inline(never)]` function, a BPF
/// subprogram with its own stack frame: inlined, the record building (a ring buffer
/// reservation filled at constant offsets) reshuffles the caller's stack slots, and
/// without CAP_PERFMON the verifier refuses a scalar written over a spilled pointer.
/// The level check reads aya-log's read-only global, which the loader sets from the
/// agent's `--log`, so the verifier drops the events below it.
macro_rules! event {
    ($level:ident, $fmt:literal, $family:expr, $addr:expr, $port:expr) => {
        event!($level, $fmt, $family, $addr, $port, 0)
    };
    ($level:ident, $fmt:literal, $family:expr, $addr:expr, $port:expr, $arg:expr) => {{
        #[inline(never)]
        fn emit(family: u8, addr: &[u32; 4], port: u16, arg: i64) {
            use $crate::programs::{events, helpers::ip6_octets};
            const MESSAGE: events::Message = events::message($fmt);
            /// This event's own copy of the record writer (see [`events::write`]).
            struct Site;
            let level = event_level!($level);
            let port = u16::from_be(port);
            let (module, file, line) = (module_path!(), file!(), line!());
            if family == hairpin_ebpf::AF_INET {
                let ip = addr[0].to_ne_bytes();
                events::write::<Site, 4>(level, module, file, line, &MESSAGE, ip, port, arg);
            } else {
                let ip = ip6_octets(addr);
                events::write::<Site, 16>(level, module, file, line, &MESSAGE, ip, port, arg);
            }
        }
        emit($family, &$addr, $port, $arg);
    }};
}

/// aya-log's level for [`event!`]'s first argument.
macro_rules! event_level {
    (error) => {
        ::aya_log_ebpf::macro_support::Level::Error
    };
    (warn) => {
        ::aya_log_ebpf::macro_support::Level::Warn
    };
    (info) => {
        ::aya_log_ebpf::macro_support::Level::Info
    };
    (debug) => {
        ::aya_log_ebpf::macro_support::Level::Debug
    };
    (trace) => {
        ::aya_log_ebpf::macro_support::Level::Trace
    };
}

/// The log target of every event, whichever hook's file sends it: the one the docs
/// name and `--log` filters on (aya-log would take each file's module path).
const EVENTS_TARGET: &str = "hairpin_ebpf::programs";

mod connect;
mod events;
mod header;
mod helpers;
mod maps;
mod mesh;
mod setsockopt;
mod sk_msg;
mod sk_skb;
mod slots;
mod sock_ops;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// The kernel reads this section at load: "Dual MIT/GPL" is in its list of
/// GPL-compatible licenses (`license_is_gpl_compatible`), so GPL-only helpers stay
/// available. It matches the crate's `MIT OR GPL-2.0-only`.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
