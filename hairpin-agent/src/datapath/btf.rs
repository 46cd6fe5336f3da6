//! Where the running kernel keeps the fields of `struct tcp_sock` that say a socket
//! asked for TCP Fast Open, read from its BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The connect programs that may use `bpf_probe_read_kernel` (CAP_PERFMON) read
//! `tcp_sock.fastopen_req` (set by `sendto(MSG_FASTOPEN)` before it connects) and the
//! `fastopen_connect` bit (TCP_FASTOPEN_CONNECT). Rust BPF programs have no CO-RE
//! field relocations, so the loader finds the offsets here and writes them into the
//! programs' read-only globals before the load. aya-obj parses BTF but keeps struct
//! members to itself; btf-rs (2.0, checked: it finds the same offsets on this
//! kernel) is LGPL-2.1-or-later, which every agent image would then have to carry
//! beside the Apache-2.0 code; libbpf-rs brings libbpf's C library into a pure-Rust
//! build. So this is a small reader of its own: the header, the type
//! section (walked to find each type's start) and the string section; only STRUCT
//! and UNION members are looked into. Every read is bounds-checked: a blob it cannot
//! make sense of is an error, never a guess.

use std::fmt;

/// Where the running kernel has `sysfs` publish its own BTF.
pub(super) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offsets in `struct tcp_sock` of the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FastOpenFields {
    /// Of `fastopen_req` (a pointer, 8 bytes): non-null while a `sendto(MSG_FASTOPEN)`
    /// is connecting.
    pub req: u32,
    /// Of the byte holding the `fastopen_connect` bit.
    pub connect_byte: u32,
    /// The bit of `fastopen_connect` in that byte, as a mask.
    pub connect_mask: u32,
}

/// Why the running kernel's fields could not be found.
#[derive(Debug, thiserror::Error)]
pub(super) enum BtfError {
    /// The kernel's BTF file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// [`VMLINUX_BTF`].
        path: &'static str,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel's BTF was read but does not give the fields.
    #[error("{path}: {source}")]
    Blob {
        /// [`VMLINUX_BTF`].
        path: &'static str,
        /// What in the blob is not as expected.
        #[source]
        source: BtfFormat,
    },
}

/// What in a BTF blob is not as this reader expects: a description, as the blob's
/// bytes have no error of their own to carry.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BtfFormat(String);

impl fmt::Display for BtfFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BtfFormat {}

fn err<T>(what: impl Into<String>) -> Result<T, BtfFormat> {
    Err(BtfFormat(what.into()))
}

/// [`FastOpenFields`] of the running kernel, from [`VMLINUX_BTF`].
pub(super) fn running_kernel_fast_open_fields() -> Result<FastOpenFields, BtfError> {
    let data = std::fs::read(VMLINUX_BTF).map_err(|source| BtfError::Read {
        path: VMLINUX_BTF,
        source,
    })?;
    fast_open_fields(&data).map_err(|source| BtfError::Blob {
        path: VMLINUX_BTF,
        source,
    })
}

/// [`FastOpenFields`] from the BTF blob `data`.
pub(super) fn fast_open_fields(data: &[u8]) -> Result<FastOpenFields, BtfFormat> {
    if cfg!(target_endian = "big") {
        // Bitfields are laid out from the most significant bit there; the mask below
        // assumes little-endian bit numbering.
        return err("fast open fields are only read on little-endian machines");
    }
    let btf = Btf::parse(data)?;
    let tcp_sock = btf.struct_named("tcp_sock")?;
    let size = u64::from(btf.ty(tcp_sock)?.size_or_type);
    let req = btf
        .member(tcp_sock, "fastopen_req", 0)?
        .ok_or_else(|| BtfFormat("tcp_sock has no member fastopen_req".into()))?;
    if req.bits != 0 || req.bit_offset % 8 != 0 || !btf.is_pointer(req.type_id)? {
        return err("tcp_sock.fastopen_req is not a pointer at a byte offset");
    }
    let req_byte = req.bit_offset / 8;
    if req_byte + 8 > size {
        return err("tcp_sock.fastopen_req lies outside tcp_sock");
    }
    let connect = btf
        .member(tcp_sock, "fastopen_connect", 0)?
        .ok_or_else(|| BtfFormat("tcp_sock has no member fastopen_connect".into()))?;
    if connect.bits != 1 {
        return err("tcp_sock.fastopen_connect is not a one-bit field");
    }
    let connect_byte = connect.bit_offset / 8;
    if connect_byte >= size {
        return err("tcp_sock.fastopen_connect lies outside tcp_sock");
    }
    let as_u32 = |v: u64| u32::try_from(v).or_else(|_| err("offset out of range"));
    Ok(FastOpenFields {
        req: as_u32(req_byte)?,
        connect_byte: as_u32(connect_byte)?,
        connect_mask: 1 << (connect.bit_offset % 8),
    })
}

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One type's common part, and where its kind-specific data starts in the type
/// section.
#[derive(Clone, Copy, Debug)]
struct Type {
    name_off: u32,
    info: u32,
    size_or_type: u32,
    extra: usize,
}

impl Type {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }

    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }

    fn kind_flag(&self) -> bool {
        self.info >> 31 == 1
    }
}

/// A member found: its offset from the start of the outer struct in bits, its
/// bitfield size (0: not a bitfield) and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    bit_offset: u64,
    bits: u32,
    type_id: u32,
}

struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Index i holds type id i + 1 (id 0 is void).
    index: Vec<Type>,
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BtfFormat> {
    match b.get(at..at.saturating_add(4)) {
        Some(&[a, b, c, d]) => Ok(u32::from_ne_bytes([a, b, c, d])),
        _ => err("truncated"),
    }
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfFormat> {
        if data.len() < HEADER_LEN {
            return err("truncated header");
        }
        let magic = u16::from_ne_bytes([data[0], data[1]]);
        if magic != MAGIC {
            return err(format!(
                "bad magic {magic:#06x} (not BTF, or another byte order)"
            ));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        if hdr_len < HEADER_LEN || hdr_len > data.len() {
            return err("bad header length");
        }
        let section = |off_at: usize, len_at: usize| -> Result<&'a [u8], BtfFormat> {
            let off = u32_at(data, off_at)? as usize;
            let len = u32_at(data, len_at)? as usize;
            let start = hdr_len.checked_add(off);
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(s), Some(e)) if e <= data.len() => Ok(&data[s..e]),
                _ => err("a section runs past the end of the data"),
            }
        };
        let types = section(8, 12)?;
        let strings = section(16, 20)?;
        let mut index = Vec::new();
        let mut at = 0;
        while at < types.len() {
            let t = Type {
                name_off: u32_at(types, at)?,
                info: u32_at(types, at + 4)?,
                size_or_type: u32_at(types, at + 8)?,
                extra: at + 12,
            };
            let vlen = t.vlen();
            let extra = match t.kind() {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                kind => {
                    return err(format!(
                        "unknown type kind {kind} at type {}",
                        index.len() + 1
                    ));
                }
            };
            at = t.extra + extra;
            if at > types.len() {
                return err("the type section ends inside a type");
            }
            index.push(t);
        }
        Ok(Btf {
            types,
            strings,
            index,
        })
    }

    fn ty(&self, id: u32) -> Result<Type, BtfFormat> {
        id.checked_sub(1)
            .and_then(|i| self.index.get(i as usize))
            .copied()
            .ok_or_else(|| BtfFormat(format!("no type id {id}")))
    }

    fn name(&self, off: u32) -> Result<&'a [u8], BtfFormat> {
        let rest = self
            .strings
            .get(off as usize..)
            .ok_or_else(|| BtfFormat("a name lies outside the string section".into()))?;
        let end = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| BtfFormat("an unterminated name".into()))?;
        Ok(&rest[..end])
    }

    /// The id of the (complete) struct called `name`.
    fn struct_named(&self, name: &str) -> Result<u32, BtfFormat> {
        for (i, t) in self.index.iter().enumerate() {
            if t.kind() == KIND_STRUCT && self.name(t.name_off)? == name.as_bytes() {
                return Ok(i as u32 + 1);
            }
        }
        err(format!("no struct {name}"))
    }

    /// `id` past typedefs and qualifiers (a bounded walk: a loop is an error).
    fn resolve(&self, mut id: u32) -> Result<Type, BtfFormat> {
        for _ in 0..32 {
            let t = self.ty(id)?;
            match t.kind() {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type;
                }
                _ => return Ok(t),
            }
        }
        err("a chain of typedefs too long")
    }

    fn is_pointer(&self, id: u32) -> Result<bool, BtfFormat> {
        Ok(self.resolve(id)?.kind() == KIND_PTR)
    }

    /// Member `name` of the struct or union `id`, whose start is `base` bits into
    /// the outer struct; looked for in anonymous struct and union members too.
    fn member(&self, id: u32, name: &str, base: u64) -> Result<Option<Member>, BtfFormat> {
        self.member_at_depth(id, name, base, 0)
    }

    fn member_at_depth(
        &self,
        id: u32,
        name: &str,
        base: u64,
        depth: u32,
    ) -> Result<Option<Member>, BtfFormat> {
        if depth > 8 {
            return err("anonymous members nested too deep");
        }
        let t = self.ty(id)?;
        if t.kind() != KIND_STRUCT && t.kind() != KIND_UNION {
            return err(format!("type {id} is not a struct or union"));
        }
        for i in 0..t.vlen() {
            let at = t.extra + 12 * i;
            let name_off = u32_at(self.types, at)?;
            let type_id = u32_at(self.types, at + 4)?;
            let offset = u32_at(self.types, at + 8)?;
            let (mut bit_offset, mut bits) = if t.kind_flag() {
                (u64::from(offset & 0xff_ffff), offset >> 24)
            } else {
                (u64::from(offset), 0)
            };
            let member_name = self.name(name_off)?;
            if member_name.is_empty() {
                let inner = self.resolve(type_id)?;
                if inner.kind() == KIND_STRUCT || inner.kind() == KIND_UNION {
                    let inner_id = self.id_of(&inner)?;
                    if let Some(m) =
                        self.member_at_depth(inner_id, name, base + bit_offset, depth + 1)?
                    {
                        return Ok(Some(m));
                    }
                }
                continue;
            }
            if member_name != name.as_bytes() {
                continue;
            }
            if !t.kind_flag() {
                // Old encoding: a bitfield is an INT whose own data gives its bit
                // offset and width.
                let int = self.resolve(type_id)?;
                if int.kind() == KIND_INT {
                    let enc = u32_at(self.types, int.extra)?;
                    let (int_offset, int_bits) = ((enc >> 16) & 0xff, enc & 0xff);
                    if int_offset != 0 || int_bits != int.size_or_type.saturating_mul(8) {
                        bit_offset += u64::from(int_offset);
                        bits = int_bits;
                    }
                }
            }
            return Ok(Some(Member {
                bit_offset: base + bit_offset,
                bits,
                type_id,
            }));
        }
        Ok(None)
    }

    /// The id of a type found in the index.
    fn id_of(&self, t: &Type) -> Result<u32, BtfFormat> {
        self.index
            .iter()
            .position(|x| x.extra == t.extra)
            .map(|i| i as u32 + 1)
            .ok_or_else(|| BtfFormat("a type not in the index".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob built by hand: `types` (each a list of words) and `strings`.
    fn blob(types: &[Vec<u32>], strings: &[u8]) -> Vec<u8> {
        let types: Vec<u8> = types
            .iter()
            .flatten()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_ne_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            HEADER_LEN as u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_ne_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(strings);
        out
    }

    fn info(kind: u32, vlen: u32, kind_flag: bool) -> u32 {
        (u32::from(kind_flag) << 31) | (kind << 24) | vlen
    }

    // Names: 1 "tcp_sock", 10 "fastopen_req", 23 "fastopen_connect", 40 "u8",
    // 43 "x", 45 "req".
    const STRINGS: &[u8] = b"\0tcp_sock\0fastopen_req\0fastopen_connect\0u8\0x\0req\0";

    /// struct tcp_sock (size 64) { u8 x; <anon union { req *fastopen_req; }> at
    /// byte 16; u8 fastopen_connect:1 at bit 8*9+3 }.
    fn synthetic(req_kind: u32, connect_bits: u32) -> Vec<u8> {
        blob(
            &[
                // 1: u8
                vec![40, info(KIND_INT, 0, false), 1, 8],
                // 2: struct req (forward)
                vec![45, info(KIND_FWD, 0, false), 0],
                // 3: pointer to it (or not)
                vec![
                    0,
                    info(req_kind, 0, false),
                    if req_kind == KIND_PTR { 2 } else { 1 },
                ]
                .into_iter()
                .chain(if req_kind == KIND_INT {
                    vec![8]
                } else {
                    vec![]
                })
                .collect(),
                // 4: union { fastopen_req }
                vec![0, info(KIND_UNION, 1, false), 8, 10, 3, 0],
                // 5: struct tcp_sock
                vec![
                    1,
                    info(KIND_STRUCT, 3, true),
                    64,
                    43,
                    1,
                    0,
                    0,
                    4,
                    128,
                    23,
                    1,
                    (connect_bits << 24) | 75,
                ],
            ],
            STRINGS,
        )
    }

    #[test]
    fn finds_the_fields_in_a_synthetic_blob_through_an_anonymous_union() {
        assert_eq!(
            fast_open_fields(&synthetic(KIND_PTR, 1)),
            Ok(FastOpenFields {
                req: 16,
                connect_byte: 9,
                connect_mask: 1 << 3,
            })
        );
        assert!(
            fast_open_fields(&synthetic(KIND_INT, 1)).is_err(),
            "not a pointer"
        );
        assert!(
            fast_open_fields(&synthetic(KIND_PTR, 2)).is_err(),
            "two bits"
        );
        assert!(
            fast_open_fields(&synthetic(KIND_PTR, 0)).is_err(),
            "not a bitfield"
        );
    }

    #[test]
    fn finds_tcp_socks_fast_open_fields_in_the_running_kernel() {
        let Ok(data) = std::fs::read(VMLINUX_BTF) else {
            eprintln!("SKIPPED: no {VMLINUX_BTF}");
            return;
        };
        let f = fast_open_fields(&data).expect("the running kernel's tcp_sock");
        let btf = Btf::parse(&data).expect("parse");
        let tcp_sock = btf.struct_named("tcp_sock").expect("tcp_sock");
        let size = btf.ty(tcp_sock).expect("type").size_or_type;
        // tcp_sock begins with inet_connection_sock: the fields lie well past it.
        assert!(
            f.req > 1000 && f.req + 8 <= size && f.req.is_multiple_of(8),
            "{f:?}"
        );
        assert!(f.connect_byte > 1000 && f.connect_byte < size, "{f:?}");
        assert_eq!(f.connect_mask.count_ones(), 1, "{f:?}");
        assert!(f.connect_mask < 256, "{f:?}");
        // Neighbours of both, found the same way, are where the kernel's own header
        // puts them: fastopen_rsk right after fastopen_req, the bits after
        // fastopen_connect in the same bytes.
        let rsk = btf
            .member(tcp_sock, "fastopen_rsk", 0)
            .expect("walk")
            .expect("fastopen_rsk");
        assert_eq!(rsk.bit_offset, u64::from(f.req) * 8 + 64);
        let no_cookie = btf
            .member(tcp_sock, "fastopen_no_cookie", 0)
            .expect("walk")
            .expect("fastopen_no_cookie");
        assert_eq!(
            no_cookie.bit_offset,
            u64::from(f.connect_byte) * 8 + u64::from(f.connect_mask.trailing_zeros()) + 1
        );
        assert_eq!(btf.member(tcp_sock, "no_such_field", 0), Ok(None));
    }

    #[test]
    fn a_truncated_or_garbled_blob_fails_cleanly() {
        let good = synthetic(KIND_PTR, 1);
        assert!(fast_open_fields(&good).is_ok());
        // Every truncation, of the synthetic blob and of the kernel's.
        for n in 0..good.len() {
            assert!(fast_open_fields(&good[..n]).is_err(), "cut at {n}");
        }
        if let Ok(kernel) = std::fs::read(VMLINUX_BTF) {
            for n in [0, 3, 23, 24, 100, 4096, kernel.len() / 2, kernel.len() - 1] {
                assert!(fast_open_fields(&kernel[..n]).is_err(), "kernel cut at {n}");
            }
            // The type section cut short inside a type, with the header agreeing.
            let mut cut = kernel.clone();
            let type_len = u32_at(&cut, 12).expect("type_len");
            // Types are whole words: a length of 2 mod 4 always ends inside one.
            cut[12..16].copy_from_slice(&((type_len / 2) & !3 | 2).to_ne_bytes());
            assert!(fast_open_fields(&cut).is_err());
        }
        let garble = |at: usize, word: u32| {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&word.to_ne_bytes());
            fast_open_fields(&b)
        };
        // Magic of the other byte order.
        let mut swapped = good.clone();
        swapped[..2].copy_from_slice(&MAGIC.swap_bytes().to_ne_bytes());
        assert!(fast_open_fields(&swapped).is_err());
        // Header length, section offsets and lengths past the end.
        assert!(garble(4, 1 << 30).is_err());
        assert!(garble(4, 4).is_err());
        assert!(garble(8, 1 << 20).is_err());
        assert!(garble(12, u32::MAX).is_err());
        assert!(garble(16, u32::MAX - 8).is_err());
        assert!(garble(20, 1 << 20).is_err());
        // An unknown kind in the first type's info.
        assert!(garble(HEADER_LEN + 4, 31 << 24).is_err());
        // A member count running past the type section (tcp_sock is the last type,
        // 12 words long).
        let tcp_sock = good.len() - STRINGS.len() - 4 * 12;
        assert_eq!(
            u32_at(&good, tcp_sock + 4).expect("info"),
            info(KIND_STRUCT, 3, true)
        );
        assert!(garble(tcp_sock + 4, info(KIND_STRUCT, 200, true)).is_err());
        // The anonymous member naming a type that does not exist, and
        // fastopen_connect's name past the strings.
        assert!(garble(tcp_sock + 12 + 12 + 4, 999).is_err());
        assert!(garble(tcp_sock + 12 + 24, 1 << 20).is_err());
        // A string section ending inside "tcp_sock", without its terminator.
        assert!(garble(20, 9).is_err());
        // A typedef loop where the pointer's type is looked at.
        let looped = blob(
            &[
                vec![40, info(KIND_TYPEDEF, 0, false), 1],
                vec![
                    1,
                    info(KIND_STRUCT, 2, true),
                    64,
                    10,
                    1,
                    0,
                    23,
                    1,
                    (1 << 24) | 9,
                ],
            ],
            STRINGS,
        );
        assert!(fast_open_fields(&looped).is_err());
    }
}
