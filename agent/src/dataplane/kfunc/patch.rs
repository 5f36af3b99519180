//! Turns calls to undefined `bpf_*` functions into kfunc calls, in place,
//! before aya parses the object.
//!
//! Why: rustc (1.99) emits no BTF for `extern "C"` declarations, so the
//! object has no BTF FUNC / `.ksyms` entry for them and aya 0.16's extern
//! support fails with "extern `<name>` not found" (bpf-linker's tagging of
//! such declarations, aya-rs/bpf-linker#317, is not in 0.13). The kernel
//! needs only the call instruction: src_reg = BPF_PSEUDO_KFUNC_CALL, imm =
//! the function's BTF id, off = 0 for vmlinux's BTF, or a module BTF's
//! index in `fd_array` (which aya 0.16 cannot pass, aya-rs/aya#1594: such a
//! program is loaded by hand, see by_hand.rs).
//!
//! Edits (sizes and layout unchanged):
//! * each `call` insn with an R_BPF_64_32 relocation against such a symbol:
//!   resolved -> kfunc call; unresolved -> poisoned helper call (like
//!   libbpf/aya do for weak kfuncs), which must sit in code the verifier
//!   proves dead (the program guards it with a .rodata flag).
//! * the symbol's type NOTYPE -> OBJECT, so aya no longer classifies it as an
//!   extern and leaves the relocation alone.
use anyhow::{Context as _, bail, ensure};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SectionKind, SymbolKind};

const BPF_JMP_CALL: u8 = 0x85;
const BPF_PSEUDO_CALL: u8 = 1;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
/// Same base as libbpf/aya: an out-of-range helper id the verifier rejects if reached.
const POISON_CALL_KFUNC_BASE: i32 = 2_002_000_000;
const ELF64_SYM_SIZE: u64 = 24;

#[derive(Debug)]
pub struct Site {
    pub name: String,
    pub section: String,
    pub insn: u64,
    pub btf_id: Option<(u32, i16)>,
}

pub fn patch(elf: &mut [u8], resolve: impl Fn(&str) -> Option<(u32, i16)>) -> anyhow::Result<Vec<Site>> {
    let mut insn_edits: Vec<(usize, u8, i16, i32)> = Vec::new(); // (file offset, regs byte, off, imm)
    let mut sym_edits: Vec<usize> = Vec::new(); // file offsets of st_info
    let mut sites = Vec::new();
    {
        let file = object::File::parse(&*elf).context("parsing eBPF ELF")?;
        let symtab = file.section_by_name(".symtab").context("no .symtab")?;
        let (symtab_off, _) = symtab.file_range().context(".symtab has no file range")?;
        ensure!(file.is_64() && file.is_little_endian(), "not a 64-bit little-endian eBPF object");
        // calls are in code; a debug section's relocations name symbols too
        for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
            let Some((sec_off, sec_len)) = section.file_range() else { continue };
            for (rel_off, rel) in section.relocations() {
                let RelocationTarget::Symbol(sym_idx) = rel.target() else { continue };
                let sym = file.symbol_by_index(sym_idx).context("relocation to a missing symbol")?;
                let name = sym.name().context("symbol name")?;
                if !sym.is_undefined() || sym.kind() != SymbolKind::Unknown || !name.starts_with("bpf_") {
                    continue;
                }
                ensure!(rel_off % 8 == 0 && rel_off + 8 <= sec_len, "{name}: misaligned relocation at {rel_off}");
                let at = usize::try_from(sec_off + rel_off)?;
                let insn = elf.get(at..at + 8).with_context(|| format!("{name}: relocation past the object's end"))?;
                let (code, regs) = (insn[0], insn[1]);
                if code != BPF_JMP_CALL || regs >> 4 != BPF_PSEUDO_CALL {
                    bail!(
                        "{name}: relocation at {} is not a call insn (code {code:#x} regs {regs:#x}); taking a kfunc's address is not supported",
                        rel_off / 8
                    );
                }
                let btf_id = resolve(name);
                // off: 0 = vmlinux BTF, n > 0 = fd_array[n] (module BTF)
                let (regs, off, imm) = match btf_id {
                    Some((id, off)) => (BPF_PSEUDO_KFUNC_CALL << 4, off, i32::try_from(id)?),
                    None => (0, 0, POISON_CALL_KFUNC_BASE.wrapping_add(i32::try_from(sym_idx.0)?)),
                };
                insn_edits.push((at, regs, off, imm));
                let st_info = usize::try_from(symtab_off + sym_idx.0 as u64 * ELF64_SYM_SIZE + 4)?;
                ensure!(st_info < elf.len(), "{name}: symbol past the object's end");
                sym_edits.push(st_info);
                sites.push(Site {
                    name: name.to_owned(),
                    section: section.name().unwrap_or("?").to_owned(),
                    insn: rel_off / 8,
                    btf_id,
                });
            }
        }
    }
    for (at, regs, off, imm) in insn_edits {
        elf[at + 1] = regs;
        elf[at + 2..at + 4].copy_from_slice(&off.to_le_bytes());
        elf[at + 4..at + 8].copy_from_slice(&imm.to_le_bytes());
    }
    for at in sym_edits {
        elf[at] = (elf[at] & 0xf0) | 1; // STT_OBJECT, binding kept
    }
    Ok(sites)
}
