//! Loads, without aya, the programs that call a kfunc in a module's BTF.
//!
//! Why: such a call names the module's BTF object by its index in
//! `BPF_PROG_LOAD`'s `fd_array` (the call's `off`), and aya 0.16 cannot pass
//! `fd_array` (aya-rs/aya#1594). Everything else stays aya's: aya creates
//! the maps (pins, `.rodata` set and frozen) and loads the other programs;
//! here a second parse of the same object is relocated against aya's map
//! fds with aya-obj's own relocation code, and only the load is ours. The
//! program then comes back to aya through a bpffs pin
//! (`SchedClassifier::from_pin`), so attaching and pinning work as for the
//! others.
//!
//! Loaded without the object's BTF (no `func_info`/`line_info`): the
//! verifier then checks every subprogram in its caller's context, which
//! is stricter, never looser.
use std::{
    collections::HashSet,
    ffi::CStr,
    os::fd::{AsFd as _, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{Map, MapData},
    programs::SchedClassifier,
};
use aya_obj::generated::bpf_insn;

use crate::dataplane::refused;
use crate::gone::Gone;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_JMP_CALL: u8 = 0x85;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
/// `BPF_OBJ_NAME_LEN`: names are cut to 15 bytes and a NUL, as aya does.
const NAME_LEN: usize = 16;
/// The verifier's log for a refusal (asked for only after one): enough
/// for the decap's 370 lines on 5.10 many times over.
const LOG_SIZE: usize = 4 << 20;

/// The start of `union bpf_attr` for `BPF_PROG_LOAD`, up to `fd_array`
/// (include/uapi/linux/bpf.h; `fd_array` since 5.14). The kernel takes a
/// shorter attr than it knows, the rest read as zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    core_relo_cnt: u32,
    fd_array: u64,
}

/// A TC classifier ready for the kernel: its linked instructions, license
/// and name, and the `fd_array` its kfunc calls index.
struct Classifier<'a> {
    insns: &'a [bpf_insn],
    license: &'a CStr,
    name: &'a str,
    fd_array: &'a [RawFd],
}

impl Classifier<'_> {
    /// The attr for `BPF_PROG_LOAD`; `log` is the buffer for the verifier's
    /// log (empty: none asked for). The pointers are into `self` and `log`.
    fn attr(&self, log: &mut [u8]) -> ProgLoadAttr {
        let mut prog_name = [0u8; NAME_LEN];
        let name = self.name.as_bytes();
        let len = name.len().min(NAME_LEN - 1);
        prog_name[..len].copy_from_slice(&name[..len]);
        ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_SCHED_CLS,
            insn_cnt: self.insns.len() as u32,
            insns: self.insns.as_ptr() as u64,
            license: self.license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() { 0 } else { log.as_mut_ptr() as u64 },
            prog_name,
            fd_array: if self.fd_array.is_empty() { 0 } else { self.fd_array.as_ptr() as u64 },
            ..Default::default()
        }
    }

    /// `BPF_PROG_LOAD`; a refusal is asked again with the verifier's log.
    fn load(&self, program: &str) -> Result<OwnedFd> {
        let e = match self.try_load(&mut []).0 {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        if e.raw_os_error() != Some(libc::EACCES) && e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e).with_context(|| format!("cannot load {program} (BPF_PROG_LOAD)"));
        }
        let mut log = vec![0u8; LOG_SIZE];
        let (again, log_len) = self.try_load(&mut log);
        match again {
            Ok(fd) => Ok(fd),
            Err(e) => {
                let log = String::from_utf8_lossy(&log[..log_len]).into_owned();
                Err(refused::refused_with_log(program, e, log))
            }
        }
    }

    /// One `BPF_PROG_LOAD`, with how much of `log` the kernel wrote.
    fn try_load(&self, log: &mut [u8]) -> (std::io::Result<OwnedFd>, usize) {
        let mut attr = self.attr(log);
        // SAFETY: the attr and the buffers it points to (self's, log) outlive the call.
        let rc =
            unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, &raw mut attr, std::mem::size_of::<ProgLoadAttr>()) };
        let written = log.iter().position(|&c| c == 0).unwrap_or(log.len());
        if rc < 0 {
            return (Err(std::io::Error::last_os_error()), written);
        }
        // SAFETY: a new fd the kernel just gave us.
        (i32::try_from(rc).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).map_err(std::io::Error::other), written)
    }
}

/// Whether `insns` call a kfunc in a module's BTF (`off` > 0: an `fd_array` index).
fn calls_module_kfunc(insns: &[bpf_insn]) -> bool {
    insns.iter().any(|i| i.code == BPF_JMP_CALL && i.src_reg() == BPF_PSEUDO_KFUNC_CALL && i.off > 0)
}

/// The map data of any aya map (every kind holds one).
fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    }
}

/// `object` (the bytes aya loaded `ebpf` from) parsed again, its map
/// references pointing at `ebpf`'s maps and its calls linked, as aya does
/// in `EbpfLoader::load`.
fn relocated(object: &[u8], ebpf: &Ebpf) -> Result<aya_obj::Object> {
    let mut obj = aya_obj::Object::parse(object).context("cannot parse the eBPF object")?;
    let mut maps = Vec::new();
    for (name, map) in &obj.maps {
        let loaded = ebpf.map(name).with_context(|| format!("map {name} of the object was not created by aya"))?;
        maps.push((name.clone(), map_data(loaded).fd().as_fd().as_raw_fd(), map.clone()));
    }
    let text_sections: HashSet<usize> = obj.functions.keys().map(|&(section, _)| section).collect();
    obj.relocate_maps(maps.iter().map(|(n, fd, m)| (n.as_str(), *fd, m)), &text_sections)
        .context("cannot point the object's map references at the maps")?;
    obj.relocate_calls(&text_sections).context("cannot link the object's calls")?;
    Ok(obj)
}

/// Loads every program of `object` that calls a kfunc in a module's BTF,
/// with `fd_array` (whose index 1 holds `module_btf`; 0 would mean vmlinux
/// and is never used), and hands each to aya through a pin at
/// `scratch_pin` (on bpffs; removed once taken back).
pub fn load(
    object: &[u8],
    ebpf: &Ebpf,
    module_btf: BorrowedFd<'_>,
    scratch_pin: &Path,
) -> Result<Vec<(String, SchedClassifier)>> {
    let obj = relocated(object, ebpf)?;
    let fd_array = [-1, module_btf.as_raw_fd()];
    let mut loaded = Vec::new();
    for (name, prog) in &obj.programs {
        let func = obj.functions.get(&prog.function_key()).with_context(|| format!("program {name} has no code"))?;
        if !calls_module_kfunc(&func.instructions) {
            continue;
        }
        if !matches!(prog.section, aya_obj::ProgramSection::SchedClassifier) {
            bail!("program {name} calls a module's kfunc but is not a TC classifier; only those are loaded by hand");
        }
        let classifier = Classifier { insns: &func.instructions, license: &prog.license, name, fd_array: &fd_array };
        let fd = classifier.load(name)?;
        loaded.push((name.clone(), through_pin(fd, scratch_pin, name)?));
    }
    Ok(loaded)
}

/// `fd` as aya's `SchedClassifier`: pinned at `path`, taken back, unpinned
/// (the fd keeps the program; aya builds a program from a pin only).
/// `path`'s name must have no dot: bpffs refuses those (EPERM).
fn through_pin(fd: OwnedFd, path: &Path, name: &str) -> Result<SchedClassifier> {
    match std::fs::remove_file(path) {
        Err(e) if !e.is_gone() => {
            return Err(e).with_context(|| format!("cannot remove {}", path.display()));
        }
        _ => {}
    }
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} holds a NUL", path.display()))?;
    // union bpf_attr.obj: pathname (u64), bpf_fd, file_flags
    let mut attr = [0u32; 4];
    let ptr = c_path.as_ptr() as u64;
    (attr[0], attr[1], attr[2]) = (ptr as u32, (ptr >> 32) as u32, u32::try_from(fd.as_raw_fd())?);
    // SAFETY: the attr and the path it points to outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_PIN, attr.as_mut_ptr(), std::mem::size_of_val(&attr)) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot pin {name} at {}", path.display()));
    }
    let taken = SchedClassifier::from_pin(path).with_context(|| format!("cannot take {name} back from its pin"));
    std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))?;
    taken
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    /// The offsets of include/uapi/linux/bpf.h, which the kernel reads.
    #[test]
    fn the_attr_has_the_kernels_layout() {
        assert_eq!(offset_of!(ProgLoadAttr, insns), 8);
        assert_eq!(offset_of!(ProgLoadAttr, license), 16);
        assert_eq!(offset_of!(ProgLoadAttr, log_level), 24);
        assert_eq!(offset_of!(ProgLoadAttr, log_buf), 32);
        assert_eq!(offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(offset_of!(ProgLoadAttr, prog_btf_fd), 72);
        assert_eq!(offset_of!(ProgLoadAttr, attach_btf_id), 108);
        assert_eq!(offset_of!(ProgLoadAttr, fd_array), 120);
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 128);
    }

    #[test]
    fn the_attr_points_at_the_code_the_fd_array_and_a_cut_name() {
        let insns = [call(0, 0); 3];
        let fd_array = [-1, 7];
        let c = Classifier { insns: &insns, license: c"GPL", name: "edgevx_vtep_guard", fd_array: &fd_array };
        let attr = c.attr(&mut []);
        assert_eq!((attr.prog_type, attr.insn_cnt), (BPF_PROG_TYPE_SCHED_CLS, 3));
        assert_eq!(attr.insns, insns.as_ptr() as u64);
        assert_eq!(attr.fd_array, fd_array.as_ptr() as u64);
        assert_eq!(&attr.prog_name, b"edgevx_vtep_gua\0");
        assert_eq!((attr.log_level, attr.log_size, attr.log_buf), (0, 0, 0));
        let mut log = [0u8; 64];
        let attr = c.attr(&mut log);
        assert_eq!((attr.log_level, attr.log_size, attr.log_buf), (1, 64, log.as_ptr() as u64));
        let none = Classifier { fd_array: &[], ..c };
        assert_eq!(none.attr(&mut []).fd_array, 0);
    }

    fn call(src_reg: u8, off: i16) -> bpf_insn {
        bpf_insn { code: BPF_JMP_CALL, _bitfield_1: bpf_insn::new_bitfield_1(0, src_reg), off, imm: 1000 }
    }

    #[test]
    fn only_a_kfunc_call_with_an_fd_array_index_needs_the_hand_load() {
        assert!(calls_module_kfunc(&[call(0, 0), call(BPF_PSEUDO_KFUNC_CALL, 1)]));
        assert!(!calls_module_kfunc(&[call(BPF_PSEUDO_KFUNC_CALL, 0)]), "vmlinux's kfuncs: aya loads these");
        assert!(!calls_module_kfunc(&[call(1, 3)]), "a bpf-to-bpf call");
        assert!(!calls_module_kfunc(&[call(0, 1)]), "a helper call");
    }

    /// The embedded object, resolved as for a module's kfuncs: the pod
    /// guard and the VTEP guard (where the fast path's two sides run) and
    /// nothing else need the hand load.
    #[test]
    fn the_two_guards_alone_call_the_module() {
        let ct = super::super::Conntrack::Reachable {
            ids: super::super::KFUNCS.iter().map(|&n| (n, 100_000)).collect(),
            offsets: vec![],
            home: super::super::Home::Module,
        };
        let object = super::super::prepare(crate::dataplane::loader::object(), &ct).unwrap();
        let mut obj = aya_obj::Object::parse(object.bytes()).unwrap();
        let text_sections = obj.functions.keys().map(|&(section, _)| section).collect();
        obj.relocate_calls(&text_sections).unwrap();
        let mut callers: Vec<&str> = obj
            .programs
            .iter()
            .filter(|(_, p)| calls_module_kfunc(&obj.functions[&p.function_key()].instructions))
            .map(|(n, _)| n.as_str())
            .collect();
        callers.sort_unstable();
        assert_eq!(callers, ["edgevx_pod_guard", "edgevx_vtep_guard"]);
    }
}
