//! The sk_msg program of the kernel path, on `HAIRPIN_SOCKETS`: puts a marked
//! socket's header (formatted by sock_ops) ahead of its first write, joined with that
//! write into one buffer when it fits a page, and counts every header it could not
//! write. It never drops a write: every return is `SK_PASS`.

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    bindings::sk_action::SK_PASS,
    helpers::{bpf_msg_pop_data, bpf_msg_pull_data, bpf_msg_push_data},
    macros::sk_msg,
    programs::SkMsgContext,
};
use hairpin_ebpf::{
    COALESCE_MAX, Counter, HEADER_ROOM, PENDING_FIRST_WRITE, PENDING_WRITTEN, PendingHeader,
};

use super::helpers::{count, pending_of};

#[sk_msg]
pub fn hairpin_sk_msg(ctx: SkMsgContext) -> u32 {
    let msg = ctx.msg;
    // SAFETY: the kernel hands sk_msg a valid context; `sk` is checked for null.
    let Some(p) = pending_of(unsafe { (*msg).__bindgen_anon_3.sk }) else {
        // No mark, nothing to put ahead (sock_ops puts only marked sockets in the
        // map; should one come here unmarked, its write goes as written).
        return SK_PASS;
    };
    if p.state != PENDING_FIRST_WRITE {
        // Not its first write (the header went out, or was given up before): a header
        // mid-stream would corrupt the connection.
        return SK_PASS;
    }
    // Whatever happens next, this was the first write: never a header mid-stream.
    p.state = PENDING_WRITTEN;
    let len = u32::from(p.len);
    if len == 0 || len as usize > HEADER_ROOM {
        count(Counter::KernelMissedWrite);
        event!(
            debug,
            "kernel_missed_write: the header of a connection to {:i} port {} could not be formatted: no header",
            p.family,
            p.dst,
            p.dst_port
        );
        return SK_PASS;
    }
    // SAFETY: helper calls on this context.
    let pushed = unsafe { bpf_msg_push_data(msg, 0, len, 0) };
    if pushed != 0 {
        count(Counter::KernelMissedPush);
        event!(
            debug,
            "kernel_missed_push: no room for the header of a connection to {:i} port {} (error {}): no header",
            p.family,
            p.dst,
            p.dst_port,
            pushed
        );
        return SK_PASS;
    }
    // The room is a buffer of its own, and TCP pushes each buffer as it goes: with
    // TCP_NODELAY the header would be a segment of its own and the server would read
    // it alone, then wait for the request. So a first write that fits one page
    // (header included; most requests and TLS ClientHellos) is pulled into one
    // buffer with its header, and goes out as the client wrote it. A larger one, or
    // no memory for the page, pulls the room alone (it already is one buffer: no
    // copy), and the header goes ahead as its own segment.
    let size = ctx.size();
    // SAFETY: as above; the pushed room is taken out again when it cannot be filled,
    // so the server never sees uninitialised bytes.
    unsafe {
        let joined = size > len && size <= COALESCE_MAX && bpf_msg_pull_data(msg, 0, size, 0) == 0;
        if (!joined && bpf_msg_pull_data(msg, 0, len, 0) != 0)
            || !copy_header(ctx.data(), ctx.data_end(), p)
        {
            bpf_msg_pop_data(msg, 0, len, 0);
            count(Counter::KernelMissedWrite);
            event!(
                debug,
                "kernel_missed_write: the header of a connection to {:i} port {} could not be copied: no header",
                p.family,
                p.dst,
                p.dst_port
            );
            return SK_PASS;
        }
    }
    count(Counter::KernelHeadersWritten);
    SK_PASS
}

/// Copies the header into the pulled room at `data`, eight bytes at a time and the
/// last (up to seven) one by one, checking each store against `data_end` as the
/// verifier needs. Unrolled by macros so that every offset, into the packet and into
/// the storage, is a constant: without CAP_PERFMON the verifier refuses packet
/// pointer arithmetic with a register ("pointer arithmetic with it prohibited for
/// !root"), and would explore a speculative path at every variable-offset access to
/// the storage. The header is the storage value's first field, so each 8-byte load
/// from it is aligned; the packet stores need not be (x86-64 and arm64 allow them).
#[inline(always)]
fn copy_header(data: usize, data_end: usize, p: &PendingHeader) -> bool {
    let len = usize::from(p.len);
    macro_rules! words {
        ($($i:literal)*) => {$(
            if $i + 8 > len {
                return copy_tail::<$i>(data, data_end, p, len);
            }
            if data + $i + 8 > data_end {
                return false;
            }
            // SAFETY: inside [data, data_end), checked just above; an aligned 8-byte
            // load inside the storage's `header`.
            unsafe {
                let word = read_volatile(p.header.as_ptr().add($i).cast::<u64>());
                write_volatile((data + $i) as *mut u64, word);
            }
        )*};
    }
    words!(0 8 16 24 32 40 48 56 64 72 80 88 96 104 112 120);
    const _: () = assert!(HEADER_ROOM == 128, "copy_header unrolls HEADER_ROOM bytes");
    true
}

/// The header's last `len - AT` bytes (fewer than eight), one at a time.
#[inline(always)]
fn copy_tail<const AT: usize>(data: usize, data_end: usize, p: &PendingHeader, len: usize) -> bool {
    macro_rules! bytes {
        ($($k:literal)*) => {$(
            if AT + $k >= len {
                return true;
            }
            if data + AT + $k + 1 > data_end {
                return false;
            }
            // SAFETY: inside [data, data_end), checked just above.
            unsafe { write_volatile((data + AT + $k) as *mut u8, p.header[AT + $k]) };
        )*};
    }
    bytes!(0 1 2 3 4 5 6);
    true
}
