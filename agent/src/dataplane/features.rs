//! What the running kernel offers beyond edgevx's minimum, probed at start
//! (never read off the release number: distribution kernels backport), and
//! the program variant or attach mode each answer chooses.
//!
//! | feature | since | without it |
//! |---|---|---|
//! | `bpf_check_mtu` | 5.12 | `edgevx_encap_compat`: no MTU judgement in the program |
//! | BPF atomics with fetch (`BPF_ATOMIC`, `BPF_FETCH`) | 5.12 | `edgevx_encap_compat`: per-CPU outer IP ID counters |
//! | TCX links | 6.6 | `bpf` filters on a `clsact` qdisc |
//! | `bpf_sk_lookup.ingress_ifindex` | 5.17 | `edgevx_guard_compat` (`guard.rs` tries the full guard) |
//! | `BPF_F_ADJ_ROOM_ENCAP_L2_ETH` | 5.13 | the encap asks again without it (`ebpf/src/encap.rs`) |
//! | conntrack kfuncs in vmlinux's BTF, or in the loaded `nf_conntrack` module's (then loaded with `fd_array`, which needs CAP_SYS_ADMIN to open) | 6.0 | no fast path (`kfunc/mod.rs`) |
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{fast_path::Mode, kfunc::Conntrack};
use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};

/// The answers, probed once per bring-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// `bpf_check_mtu` (Linux 5.12).
    pub check_mtu: bool,
    /// Atomic fetch-and-add (`BPF_ATOMIC | BPF_FETCH`, Linux 5.12).
    pub atomic_fetch: bool,
    /// TCX attachment (Linux 6.6).
    pub tcx: bool,
    /// The conntrack kfuncs, for the fast path (kfunc/mod.rs).
    pub conntrack: Conntrack,
}

impl Features {
    /// Probes this kernel. A probe that fails (not a "no": an error) is
    /// taken as a "no", whose fallback works everywhere. The conntrack
    /// kfuncs are looked for only when the fast path is asked for: with it
    /// off their calls are loaded poisoned and dead, so the default path's
    /// programs never depend on the verifier taking them.
    pub fn probe(fast_path: Mode) -> Self {
        Features {
            check_mtu: is_helper_supported(ProgramType::SchedClassifier, BpfHelper::BPF_FUNC_check_mtu)
                .unwrap_or(false),
            atomic_fetch: atomic_fetch_supported(),
            tcx: tcx_supported(),
            conntrack: match fast_path {
                Mode::Auto => Conntrack::probe(),
                Mode::Off => Conntrack::Unreachable("off (--fast-path=off)".into()),
            },
        }
    }
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;

/// Whether the kernel can make a TCX link. Asks for one on interface index
/// 0, which never exists: a kernel with TCX looks the device up and fails
/// with ENODEV; one without it refuses the attach type (EINVAL) before any
/// lookup. Nothing is attached either way.
fn tcx_supported() -> bool {
    let Some(prog) = trivial_classifier() else { return false };
    // union bpf_attr.link_create: prog_fd, target_ifindex, attach_type, flags
    let mut attr = [0u32; 16];
    attr[0] = prog.as_raw_fd() as u32;
    attr[1] = 0;
    attr[2] = BPF_TCX_INGRESS;
    // SAFETY: bpf(2) reads the attr we own; on success it returns a link fd we close.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_CREATE, attr.as_mut_ptr(), std::mem::size_of_val(&attr)) };
    if rc >= 0 {
        // SAFETY: a new fd the kernel just gave us.
        drop(unsafe { OwnedFd::from_raw_fd(rc as i32) });
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV)
}

/// Whether the verifier takes an atomic fetch-and-add (on the stack): a
/// kernel before 5.12 knows only BPF_XADD and refuses the fetch flag.
fn atomic_fetch_supported() -> bool {
    // struct bpf_insn as a little-endian u64: code | regs << 8 | off << 16 | imm << 32
    let insns: [u64; 6] = [
        0x0000_0000_0000_01b7, // r1 = 0
        0x0000_0000_fff8_1a7b, // *(u64 *)(r10 - 8) = r1
        0x0000_0001_0000_02b7, // r2 = 1
        0x0000_0001_fff8_2adb, // r2 = atomic_fetch_add((u64 *)(r10 - 8), r2)
        0x0000_0000_0000_00b7, // r0 = 0
        0x0000_0000_0000_0095, // exit
    ];
    load_classifier(&insns).is_some()
}

/// `r0 = 0; exit`, loaded as a TC classifier.
fn trivial_classifier() -> Option<OwnedFd> {
    // mov64 r0, 0 ; exit
    load_classifier(&[0x0000_0000_0000_00b7, 0x0000_0000_0000_0095])
}

/// `insns` loaded as a TC classifier; `None` when the verifier refuses them.
fn load_classifier(insns: &[u64]) -> Option<OwnedFd> {
    let license = c"GPL";
    // union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, ...
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // SAFETY: bpf(2) reads the attr and the buffers it points to, all alive here.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, attr.as_mut_ptr(), attr.len()) };
    // SAFETY: a new fd the kernel just gave us.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
