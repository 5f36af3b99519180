//! A small reader of the kernel's BTF, enough to answer "the byte offset of
//! `nf_conn.proto.tcp.seen[1].flags`" and "the BTF id of function X". aya
//! 0.16's `Btf` keeps its type lookup crate-private (only
//! `id_by_type_name_kind` is public), so it cannot give member offsets; the
//! btf-rs crate can, but is LGPL.
use anyhow::{Context as _, bail, ensure};

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
}

struct Type {
    name_off: u32,
    kind: u32,
    /// size for INT/STRUCT/UNION/ENUM, referenced type for PTR/TYPEDEF/modifiers
    size_or_type: u32,
    members: Vec<Member>,
    array: Option<(u32, u32)>, // (elem type, nelems)
}

pub struct KernelBtf {
    types: Vec<Type>, // index = type id; 0 is void
    strings: Vec<u8>,
    /// How many type ids vmlinux's BTF holds (void included): an id at or
    /// past this is a module's, which a program reaches through `fd_array`.
    base_types: u32,
}

fn u32_at(b: &[u8], off: usize) -> anyhow::Result<u32> {
    let s = b.get(off..off + 4).with_context(|| format!("BTF truncated at {off}"))?;
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

impl KernelBtf {
    pub fn from_sys_fs() -> anyhow::Result<Self> {
        let data = std::fs::read(VMLINUX).with_context(|| format!("cannot read {VMLINUX}"))?;
        Self::parse(&data)
    }

    /// vmlinux's BTF with a loaded module's on top (`/sys/kernel/btf/<module>`,
    /// split BTF: its type ids and string offsets continue vmlinux's).
    pub fn with_module(mut self, module: &str) -> anyhow::Result<Self> {
        let path = format!("/sys/kernel/btf/{module}");
        let data = std::fs::read(&path).with_context(|| format!("cannot read {path}"))?;
        self.append(&data).with_context(|| format!("cannot parse {path}"))?;
        Ok(self)
    }

    pub fn parse(d: &[u8]) -> anyhow::Result<Self> {
        let mut btf = Self {
            types: vec![Type { name_off: 0, kind: 0, size_or_type: 0, members: vec![], array: None }],
            strings: vec![],
            base_types: 0,
        };
        btf.append(d)?;
        btf.base_types = u32::try_from(btf.types.len())?;
        Ok(btf)
    }

    /// Whether type `id` is in a module's BTF rather than vmlinux's.
    pub fn in_module(&self, id: u32) -> bool {
        id >= self.base_types
    }

    fn append(&mut self, d: &[u8]) -> anyhow::Result<()> {
        ensure!(d.len() >= 24 && d[0] == 0x9f && d[1] == 0xeb, "not little-endian BTF");
        let hdr_len = u32_at(d, 4)? as usize;
        let (type_off, type_len) = (u32_at(d, 8)? as usize, u32_at(d, 12)? as usize);
        let (str_off, str_len) = (u32_at(d, 16)? as usize, u32_at(d, 20)? as usize);
        let tsec = d.get(hdr_len + type_off..hdr_len + type_off + type_len).context("type section out of range")?;
        self.strings.extend_from_slice(
            d.get(hdr_len + str_off..hdr_len + str_off + str_len).context("string section out of range")?,
        );
        let types = &mut self.types;
        let mut p = 0;
        while p < tsec.len() {
            let name_off = u32_at(tsec, p)?;
            let info = u32_at(tsec, p + 4)?;
            let size_or_type = u32_at(tsec, p + 8)?;
            p += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kflag = info >> 31 == 1;
            let mut t = Type { name_off, kind, size_or_type, members: vec![], array: None };
            match kind {
                KIND_INT | 14 /* VAR */ | 17 /* DECL_TAG */ => p += 4,
                KIND_ARRAY => {
                    t.array = Some((u32_at(tsec, p)?, u32_at(tsec, p + 8)?));
                    p += 12;
                }
                KIND_STRUCT | KIND_UNION => {
                    for _ in 0..vlen {
                        let off = u32_at(tsec, p + 8)?;
                        // with kflag the top 8 bits hold the bitfield size
                        let bit_offset = if kflag { off & 0x00ff_ffff } else { off };
                        t.members.push(Member { name_off: u32_at(tsec, p)?, type_id: u32_at(tsec, p + 4)?, bit_offset });
                        p += 12;
                    }
                }
                KIND_ENUM => p += 8 * vlen,
                13 /* FUNC_PROTO */ => p += 8 * vlen,
                15 /* DATASEC */ | KIND_ENUM64 => p += 12 * vlen,
                KIND_PTR | 7 /* FWD */ | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | 12 /* FUNC */
                | 16 /* FLOAT */ | KIND_TYPE_TAG => {}
                k => bail!("unknown BTF kind {k} at type id {}", types.len()),
            }
            types.push(t);
        }
        Ok(())
    }

    fn name(&self, off: u32) -> &[u8] {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        &s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]
    }

    fn ty(&self, id: u32) -> anyhow::Result<&Type> {
        self.types.get(id as usize).with_context(|| format!("BTF type id {id} out of range"))
    }

    /// Skips typedefs and cv-qualifiers.
    fn strip(&self, mut id: u32) -> anyhow::Result<u32> {
        for _ in 0..32 {
            let t = self.ty(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = t.size_or_type,
                _ => return Ok(id),
            }
        }
        bail!("BTF modifier chain too long at {id}")
    }

    fn size_of(&self, id: u32) -> anyhow::Result<u64> {
        self.size_at_depth(id, 0)
    }

    /// [`Self::size_of`], refusing arrays nested deeper than any C type
    /// (a BTF whose array holds itself would recurse forever).
    fn size_at_depth(&self, id: u32, depth: u32) -> anyhow::Result<u64> {
        ensure!(depth < 16, "BTF arrays nested too deep at {id}");
        let id = self.strip(id)?;
        let t = self.ty(id)?;
        Ok(match t.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => u64::from(t.size_or_type),
            KIND_PTR => 8,
            KIND_ARRAY => {
                let (elem, n) = t.array.context("array without data")?;
                self.size_at_depth(elem, depth + 1)?.checked_mul(u64::from(n)).context("BTF array size overflows")?
            }
            k => bail!("no size for BTF kind {k}"),
        })
    }

    /// Byte offset and size of `path` inside `struct <root>`; path segments
    /// are member names, optionally with `[i]` for arrays: "proto.tcp.seen[1].flags".
    pub fn member(&self, root: &str, path: &str) -> anyhow::Result<(u32, u64)> {
        let root_id = (1..self.types.len() as u32)
            .find(|&i| {
                self.types[i as usize].kind == KIND_STRUCT
                    && self.name(self.types[i as usize].name_off) == root.as_bytes()
            })
            .with_context(|| format!("struct {root} not in kernel BTF"))?;
        let mut id = root_id;
        let mut bits: u64 = 0;
        for seg in path.split('.') {
            let (name, index) = match seg.split_once('[') {
                Some((n, rest)) => {
                    (n, Some(rest.trim_end_matches(']').parse::<u64>().with_context(|| format!("bad index in {seg}"))?))
                }
                None => (seg, None),
            };
            let t = self.ty(self.strip(id)?)?;
            ensure!(
                t.kind == KIND_STRUCT || t.kind == KIND_UNION,
                "{root}.{path}: {name} is not inside a struct/union"
            );
            let m = t
                .members
                .iter()
                .find(|m| self.name(m.name_off) == name.as_bytes())
                .with_context(|| format!("{root}.{path}: no member {name}"))?;
            bits += u64::from(m.bit_offset);
            id = m.type_id;
            if let Some(i) = index {
                let arr = self.ty(self.strip(id)?)?;
                let (elem, n) = arr.array.with_context(|| format!("{name} is not an array"))?;
                ensure!(i < u64::from(n), "{name}[{i}] out of bounds ({n})");
                let skip = self.size_of(elem)?.checked_mul(8 * i).context("BTF offset overflows")?;
                bits = bits.checked_add(skip).context("BTF offset overflows")?;
                id = elem;
            }
        }
        ensure!(bits.is_multiple_of(8), "{root}.{path} is a bitfield");
        Ok((u32::try_from(bits / 8)?, self.size_of(id)?))
    }

    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.types.iter().position(|t| t.kind == 12 && self.name(t.name_off) == name.as_bytes()).map(|i| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kernel: conntrack built in, BTF present (CI's too).
    #[test]
    fn nf_conn_members_and_kfuncs_are_found_in_this_kernels_btf() {
        let Ok(btf) = KernelBtf::from_sys_fs() else {
            eprintln!("no {VMLINUX}: nothing to read");
            return;
        };
        let (status, size) = btf.member("nf_conn", "status").expect("nf_conn.status");
        assert_eq!(size, 8, "unsigned long status");
        let (seen0, _) = btf.member("nf_conn", "proto.tcp.seen[0].flags").expect("seen[0].flags");
        let (seen1, one) = btf.member("nf_conn", "proto.tcp.seen[1].flags").expect("seen[1].flags");
        assert_eq!(one, 1);
        assert!(seen1 > seen0 && status > 0);
        assert!(btf.member("nf_conn", "proto.tcp.nonexistent").is_err());
        assert!(btf.member("nf_conn", "proto.tcp.seen[9].flags").is_err());
        assert!(btf.func_id("bpf_skb_ct_lookup").is_some());
        assert!(btf.func_id("no_such_function_in_any_kernel").is_none());
    }
}
