//! What several hooks share: the counters, a socket's pending header (the mark the
//! connect programs leave for sock_ops and sk_msg) and the address bytes of the
//! diagnostic events.

use core::ptr::null_mut;

use aya_ebpf::{bindings::bpf_sock, helpers::bpf_sk_storage_get};
use hairpin_ebpf::{Counter, FrontendKey, PendingHeader, SlotKey};

use super::maps;

/// The 16 bytes of an IPv6 address held as words in network byte order.
#[inline(always)]
pub(super) fn ip6_octets(w: &[u32; 4]) -> [u8; 16] {
    let [a, b, c, d] = [
        w[0].to_ne_bytes(),
        w[1].to_ne_bytes(),
        w[2].to_ne_bytes(),
        w[3].to_ne_bytes(),
    ];
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

/// Adds one to the counter `c` on this CPU.
#[inline(always)]
pub(super) fn count(c: Counter) {
    if let Some(v) = array_value::<_, u64>(&maps::HAIRPIN_COUNTERS, c as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *v += 1 };
    }
}

/// The socket's storage, if connect marked it. One lookup in the socket's own
/// (usually empty) storage list: the cost every other socket pays.
#[inline(always)]
pub(super) fn pending_of(sk: *mut bpf_sock) -> Option<&'static mut PendingHeader> {
    if sk.is_null() {
        // A callback without a full socket (sock_ops may have none): no storage.
        return None;
    }
    // SAFETY: `sk` is a socket the kernel handed this program; no create flag.
    let p = unsafe { bpf_sk_storage_get(maps::pending_map(), sk.cast(), null_mut(), 0) };
    // SAFETY: non-null storage stays valid while the program runs.
    unsafe { p.cast::<PendingHeader>().as_mut() }
}

/// A map key on the stack, written in whole 64-bit words. Field by field, a key's
/// narrow fields (a 16-bit port, then an 8-bit family) are separate stores into one
/// 8-byte stack slot, and Linux 6.1's verifier, without CAP_PERFMON (the DaemonSet
/// does not grant it), refuses the second: "attempt to corrupt spilled pointer on
/// stack", for a slot that holds a narrow scalar spill (`check_stack_write_fixed_off`;
/// fixed in 6.13 by b0e66977dc07, "bpf: Fix narrow scalar spill onto 64-bit spilled
/// scalar slots"). Volatile stores keep each word one store.
#[repr(C, align(8))]
pub(super) struct StackKey<const WORDS: usize>([u64; WORDS]);

impl<const WORDS: usize> StackKey<WORDS> {
    /// The key made of `words`, each written with one 64-bit store.
    #[inline(always)]
    pub(super) fn new(words: [u64; WORDS]) -> Self {
        let mut key = core::mem::MaybeUninit::<Self>::uninit();
        let p = key.as_mut_ptr().cast::<u64>();
        let mut i = 0;
        while i < WORDS {
            // SAFETY: within the WORDS words of `key`, aligned to 8.
            unsafe { core::ptr::write_volatile(p.add(i), words[i]) };
            i += 1;
        }
        // SAFETY: every word was written above.
        unsafe { key.assume_init() }
    }
}

/// A [`FrontendKey`] (20 bytes) in 64-bit words.
#[inline(always)]
pub(super) fn frontend_key(addr: [u32; 4], port: u16, family: u8) -> StackKey<3> {
    const { assert!(core::mem::size_of::<FrontendKey>() <= 24) };
    StackKey::new([
        u64::from(addr[0]) | u64::from(addr[1]) << 32,
        u64::from(addr[2]) | u64::from(addr[3]) << 32,
        // port, family, pad: the key's last word, little-endian as the struct lays it.
        u64::from(port) | u64::from(family) << 16,
    ])
}

impl StackKey<3> {
    /// The [`FrontendKey`] these words hold.
    #[inline(always)]
    pub(super) fn frontend(&self) -> &FrontendKey {
        // SAFETY: `frontend_key` wrote a FrontendKey's bytes at the start of the
        // buffer, which is aligned to 8 (FrontendKey needs 4).
        unsafe { &*(self as *const Self).cast::<FrontendKey>() }
    }
}

/// A [`SlotKey`] (4 bytes) in one 64-bit word.
#[inline(always)]
pub(super) fn slot_key(port: u16, addr: u8, family: u8) -> StackKey<1> {
    const { assert!(core::mem::size_of::<SlotKey>() <= 8) };
    StackKey::new([u64::from(port) | u64::from(addr) << 16 | u64::from(family) << 24])
}

impl StackKey<1> {
    /// The [`SlotKey`] this word holds.
    #[inline(always)]
    pub(super) fn slot(&self) -> &SlotKey {
        // SAFETY: `slot_key` wrote a SlotKey's bytes at the start of the buffer,
        // aligned to 8 (SlotKey needs 2).
        unsafe { &*(self as *const Self).cast::<SlotKey>() }
    }
}

/// The value at `index` of the array map `map` (an aya `Array` or `PerCpuArray`
/// static: `#[repr(transparent)]` over its map definition, so its address is the
/// map's), looked up with the key written as one 64-bit word ([`StackKey`]): aya's
/// own `get` writes the u32 index with a 32-bit store, which Linux 6.1 refuses
/// without CAP_PERFMON where LLVM gave the index a slot that held a spilled scalar.
#[inline(always)]
pub(super) fn array_value<M, T>(map: &'static M, index: u32) -> Option<*mut T> {
    let key = StackKey::new([u64::from(index)]);
    // SAFETY: `map` is an array map definition the loader relocates; the key is the
    // u32 index at the start of an 8-byte stack word; the helper returns a pointer
    // to the value valid for this program run, or null.
    let p = unsafe {
        aya_ebpf::helpers::bpf_map_lookup_elem(
            (map as *const M).cast_mut().cast(),
            (&raw const key).cast(),
        )
    };
    (!p.is_null()).then_some(p.cast())
}
