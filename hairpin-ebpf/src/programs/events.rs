//! The programs' diagnostic events ([`event!`](super::event)), written to aya-log's
//! ring buffer as the records aya-log's own macros write (aya-log's field types, the
//! same fields in the same order), so the agent's aya-log reader prints them as
//! before, but with a record size the verifier knows.
//!
//! aya-log-ebpf 0.2's macros pass the record's size through `core::hint::black_box`,
//! which spills it as a u16 to a stack slot not 8-byte aligned. Linux 6.1 tracks a
//! spilled constant only in an aligned slot (`check_stack_write_fixed_off`:
//! `!(off % BPF_REG_SIZE)`), so it reads the size back as any u16 and walks every
//! ring buffer reservation from 64 bytes up, also the ones smaller than the record.
//! There each field's bound check is known to fail; without CAP_PERFMON
//! (`bypass_spec_v1` false) `check_cond_jmp_op` also walks the check's fall-through
//! as a speculative path (`sanitize_speculative_path`, the compared registers
//! unknown), which stores past the reservation: "invalid access to memory,
//! mem_size=64 off=64 size=1", and the program does not load. Here the size is a
//! constant LLVM folds, the reservation is the one size that fits, and every bound
//! check folds away: straight stores at constant offsets.

use aya_log_ebpf::macro_support::{
    AYA_LOGS, Argument, DisplayHint, Field, Header, Level, LogValueLength, level_enabled,
};

use super::EVENTS_TARGET;

/// An event's message split around its parameters at compile time: `{:i}` (the
/// address), `{}` (the port), then optionally `{}` (an error number).
pub struct Message {
    /// The text before the address.
    pub before_addr: &'static str,
    /// The text between the address and the port.
    pub before_port: &'static str,
    /// The text after the port (up to the error number, if the message has one).
    pub after_port: &'static str,
    /// The text after the error number, when the message prints one.
    pub after_error: Option<&'static str>,
}

/// Where `pat` first occurs in `s` at or after `from`, or `s.len()`.
const fn find(s: &[u8], pat: &[u8], from: usize) -> usize {
    let mut i = from;
    while i + pat.len() <= s.len() {
        let mut j = 0;
        while j < pat.len() && s[i + j] == pat[j] {
            j += 1;
        }
        if j == pat.len() {
            return i;
        }
        i += 1;
    }
    s.len()
}

/// Splits an event's format string (`... {:i} ... {} ...`, optionally `... {} ...`
/// after) as aya-log's format parser does.
pub const fn message(fmt: &'static str) -> Message {
    let b = fmt.as_bytes();
    let addr = find(b, b"{:i}", 0);
    let port = find(b, b"{}", addr + 4);
    assert!(
        port < b.len(),
        "an event's message names the address, then the port"
    );
    let error = find(b, b"{}", port + 2);
    assert!(
        find(b, b"{{", 0) == b.len() && find(b, b"}}", 0) == b.len(),
        "an event's message has no escaped braces"
    );
    let (before_addr, rest) = fmt.split_at(addr);
    let (_, rest) = rest.split_at(4);
    let (before_port, rest) = rest.split_at(port - addr - 4);
    let (_, rest) = rest.split_at(2);
    if error < b.len() {
        let (after_port, rest) = rest.split_at(error - port - 2);
        let (_, after_error) = rest.split_at(2);
        assert!(
            find(after_error.as_bytes(), b"{", 0) == after_error.len(),
            "an event's message has at most three parameters"
        );
        Message {
            before_addr,
            before_port,
            after_port,
            after_error: Some(after_error),
        }
    } else {
        Message {
            before_addr,
            before_port,
            after_port: rest,
            after_error: None,
        }
    }
}

impl Message {
    /// How many values the record carries (aya-log's `num_args`): each non-empty
    /// piece of text, and a display hint and a value per parameter.
    const fn values(&self) -> u32 {
        let mut n = texts(self.before_addr) + 2 + texts(self.before_port) + 2;
        n += texts(self.after_port);
        if let Some(after) = self.after_error {
            n += 2 + texts(after);
        }
        n
    }
}

/// How many values a piece of text is: none when empty, as aya-log's parser skips it.
const fn texts(s: &str) -> u32 {
    if s.is_empty() { 0 } else { 1 }
}

/// Writes one event at `level` to aya-log's ring buffer, dropped when the agent's
/// `--log` is above `level` (a read-only global: the verifier drops the code) or the
/// ring buffer is full. `Site` is a type of the calling event's own: every event gets
/// its own copy of this code (and of aya-log's field writers it calls), which LLVM
/// inlines into the event's subprogram with every length a constant, as aya-log's
/// macros get by expanding at each call.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "one call per event site, from event!, with aya-log's record fields"
)]
pub fn write<Site, const N: usize>(
    level: Level,
    module: &'static str,
    file: &'static str,
    line: u32,
    message: &Message,
    addr: [u8; N],
    port: u16,
    error: i64,
) {
    if level_enabled(level) {
        let _: Option<()> =
            record::<Site, N>(level, module, file, line, message, addr, port, error);
    }
}

/// [`write`]'s record: measured, reserved at the power of two aya-log's reader
/// expects (from 64 bytes), filled, submitted (or discarded if it did not fit).
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "write's arguments, passed through"
)]
fn record<Site, const N: usize>(
    level: Level,
    module: &'static str,
    file: &'static str,
    line: u32,
    message: &Message,
    addr: [u8; N],
    port: u16,
    error: i64,
) -> Option<()> {
    let header = Header::new(EVENTS_TARGET, level, module, file, line, message.values())?;
    let mut size = size_of::<LogValueLength>();
    let mut measure = |s: &[u8]| {
        size += s.len();
        Some(())
    };
    header.with_bytes(&mut measure)?;
    values(message, addr, port, error, &mut measure)?;
    let size = LogValueLength::try_from(size).ok()?;
    let mut capacity: LogValueLength = 64;
    while capacity < size {
        capacity <<= 1;
        if capacity > 8192 {
            return None;
        }
    }
    let mut buf = AYA_LOGS.reserve_bytes(capacity.into(), 0)?;
    let mut pos = 0;
    let mut put = |s: &[u8]| {
        let dst = buf.get_mut(pos..)?.get_mut(..s.len())?;
        dst.copy_from_slice(s);
        pos += s.len();
        Some(())
    };
    let written = put(size.to_ne_bytes().as_ref())
        .and_then(|()| header.with_bytes(&mut put))
        .and_then(|()| values(message, addr, port, error, &mut put));
    match written {
        Some(()) => buf.submit(0),
        None => buf.discard(0),
    }
    Some(())
}

/// The record's values after its header, in the message's order.
#[inline(always)]
fn values<const N: usize>(
    message: &Message,
    addr: [u8; N],
    port: u16,
    error: i64,
    op: &mut impl FnMut(&[u8]) -> Option<()>,
) -> Option<()> {
    text(message.before_addr, op)?;
    value(DisplayHint::Ip, op)?;
    value(addr, op)?;
    text(message.before_port, op)?;
    value(DisplayHint::Default, op)?;
    value(port, op)?;
    text(message.after_port, op)?;
    if let Some(after) = message.after_error {
        value(DisplayHint::Default, op)?;
        value(error, op)?;
        text(after, op)?;
    }
    Some(())
}

/// A piece of the message's text (none when empty, as aya-log's parser skips it).
#[inline(always)]
fn text(s: &str, op: &mut impl FnMut(&[u8]) -> Option<()>) -> Option<()> {
    if s.is_empty() {
        return Some(());
    }
    value(s, op)
}

/// One value as aya-log writes it: kind, length, bytes.
#[inline(always)]
fn value(v: impl Argument, op: &mut impl FnMut(&[u8]) -> Option<()>) -> Option<()> {
    let (kind, bytes) = v.as_argument();
    Field::new(kind, bytes)?.with_bytes(op)
}
