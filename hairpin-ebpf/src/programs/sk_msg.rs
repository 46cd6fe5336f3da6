//! The sk_msg program of the kernel path, on `HAIRPIN_SOCKETS`: puts a marked
//! socket's header (formatted by sock_ops) ahead of its first write, joined with that
//! write into one buffer when it fits a page, and counts every header it could not
//! write. It never drops a write: every return is `SK_PASS`.

use core::ptr::write_volatile;

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

/// Copies the header into the pulled room at `data`, checking every byte against
/// `data_end` as the verifier needs. Unrolled by a macro so that every offset, into
/// the packet and into the storage, is a constant: without CAP_PERFMON the verifier
/// refuses packet pointer arithmetic with a register ("pointer arithmetic with it
/// prohibited for !root"), and would explore a speculative path at every
/// variable-offset access to the storage.
#[inline(always)]
fn copy_header(data: usize, data_end: usize, p: &PendingHeader) -> bool {
    let len = usize::from(p.len);
    macro_rules! bytes {
        ($($i:literal)*) => {$(
            if $i >= len {
                return true;
            }
            if data + $i + 1 > data_end {
                return false;
            }
            // SAFETY: inside [data, data_end), checked just above.
            unsafe { write_volatile((data + $i) as *mut u8, p.header[$i]) };
        )*};
    }
    bytes!(
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
        60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87
        88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111
        112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127
    );
    const _: () = assert!(HEADER_ROOM == 128, "copy_header unrolls HEADER_ROOM bytes");
    true
}
