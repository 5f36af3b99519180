//! The conntrack kfuncs the fast path calls (ebpf/src/kfunc.rs): whether
//! this kernel has them where the agent can reach them, and the object
//! rewritten to call them (or to poison the calls, behind a load-time
//! constant that keeps them dead).
//!
//! Probed, never read off the release number: the kfuncs came in 5.18
//! (lookup, release) and 6.0 (`bpf_ct_change_timeout`) and need the
//! kernel's BTF. With conntrack built in (`CONFIG_NF_CONNTRACK=y`) they are
//! in vmlinux's BTF and aya loads the program as any other. With conntrack
//! a module (Debian's 6.1 and 6.12) they are in the module's BTF, which a
//! call names by its index in `BPF_PROG_LOAD`'s `fd_array`; aya 0.16 cannot
//! pass one (aya-rs/aya#1594), so the one program that calls them is
//! loaded by hand ([`by_hand`]). The module must be loaded already: the
//! agent loads no modules (kube-proxy's conntrack rules load it on a
//! node); until it is, the fast path is off, and status says why.
mod btf;
mod by_hand;
mod module_btf;
mod patch;

use std::{os::fd::AsFd, path::Path};

use anyhow::{Context, Result};
use aya::EbpfLoader;

use self::btf::KernelBtf;
use crate::dataplane::loaded::Loaded;

/// The module conntrack's kfuncs are in when it is not built in.
pub const MODULE: &str = "nf_conntrack";
/// A kfunc call's `off` for [`MODULE`]: its BTF fd's index in `fd_array`
/// (0 means vmlinux's BTF; kfunc/by_hand.rs puts the module's at 1).
const MODULE_FD_INDEX: i16 = 1;

/// The kfuncs ebpf/src/kfunc.rs declares.
pub const KFUNCS: [&str; 3] = ["bpf_skb_ct_lookup", "bpf_ct_release", "bpf_ct_change_timeout"];

/// Where the fast path reads `struct nf_conn`: (load-time constant in the
/// object, member path).
const FIELDS: [(&str, &str); 5] = [
    ("FP_OFF_STATUS", "status"),
    ("FP_OFF_MARK", "mark"),
    ("FP_OFF_TCP_STATE", "proto.tcp.state"),
    ("FP_OFF_SEEN0_FLAGS", "proto.tcp.seen[0].flags"),
    ("FP_OFF_SEEN1_FLAGS", "proto.tcp.seen[1].flags"),
];

/// Whose BTF the kfuncs are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// vmlinux's: conntrack built in.
    Vmlinux,
    /// [`MODULE`]'s, loaded.
    Module,
}

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conntrack {
    /// Every kfunc's BTF id, the field offsets, and whose BTF the ids are in.
    Reachable { ids: Vec<(&'static str, u32)>, offsets: Vec<(&'static str, u32)>, home: Home },
    /// Why not, for the log and status.
    Unreachable(String),
}

impl Conntrack {
    pub fn probe() -> Self {
        let btf = match KernelBtf::from_sys_fs() {
            Ok(btf) => btf,
            Err(e) => return Conntrack::Unreachable(format!("no kernel BTF ({e:#})")),
        };
        if btf.func_id(KFUNCS[0]).is_some() || !module_conntrack() {
            return Self::from_btf(&btf);
        }
        let ct = match btf.with_module(MODULE) {
            Ok(btf) => Self::from_btf(&btf),
            Err(e) => return Conntrack::Unreachable(format!("cannot read the BTF of conntrack's module ({e:#})")),
        };
        // the load names the module's BTF object by an fd, which only
        // CAP_SYS_ADMIN may open (BPF_BTF_GET_NEXT_ID, BPF_BTF_GET_FD_BY_ID):
        // asked here, so that a node without it runs with the fast path off
        // rather than failing every bring-up
        match module_btf::fd_of(MODULE) {
            Ok(_) => ct,
            Err(e) => Conntrack::Unreachable(format!(
                "cannot open the BTF object of conntrack's module ({e:#}); a program reaches a module's kfuncs \
                 through it, and opening it needs CAP_SYS_ADMIN and, under a seccomp profile, the bpf commands \
                 BPF_BTF_GET_NEXT_ID and BPF_BTF_GET_FD_BY_ID (neither the DaemonSet nor the systemd unit grants \
                 them)"
            )),
        }
    }

    fn from_btf(btf: &KernelBtf) -> Self {
        let mut ids = Vec::new();
        for name in KFUNCS {
            match btf.func_id(name) {
                Some(id) => ids.push((name, id)),
                None => {
                    return Conntrack::Unreachable(format!(
                        "the kernel has no {name}: the conntrack kfuncs need Linux 6.0 with BTF, and conntrack \
                         built in or its module ({MODULE}) loaded before the agent starts (kube-proxy loads it; \
                         the agent loads no modules)"
                    ));
                }
            }
        }
        let home = if ids.iter().all(|&(_, id)| btf.in_module(id)) {
            Home::Module
        } else if ids.iter().all(|&(_, id)| !btf.in_module(id)) {
            Home::Vmlinux
        } else {
            return Conntrack::Unreachable("the conntrack kfuncs are split between vmlinux and a module".into());
        };
        let mut offsets = Vec::new();
        for (constant, path) in FIELDS {
            match btf.member("nf_conn", path) {
                Ok((off, _)) => offsets.push((constant, off)),
                Err(e) => return Conntrack::Unreachable(format!("cannot place nf_conn.{path} ({e:#})")),
            }
        }
        Conntrack::Reachable { ids, offsets, home }
    }

    pub fn reachable(&self) -> bool {
        matches!(self, Conntrack::Reachable { .. })
    }
}

/// Whether conntrack is a loaded module (its BTF under /sys/kernel/btf).
fn module_conntrack() -> bool {
    std::path::Path::new("/sys/kernel/btf/nf_conntrack").exists()
}

/// Loads `object` with `loader`: its kfunc calls resolved for `ct` and the
/// fast path's load-time constants set (whether the kfuncs are there, the
/// `nf_conn` field offsets). Where the kfuncs are a module's, the programs
/// that call them are loaded here, by hand, through a pin at `scratch_pin`
/// (on bpffs); aya loads the others when asked. The agent's loader and the
/// packet tests both load this way.
pub fn load<'a>(loader: &mut EbpfLoader<'a>, object: &[u8], ct: &'a Conntrack, scratch_pin: &Path) -> Result<Loaded> {
    static ON: u32 = 1;
    static OFF: u32 = 0;
    let object = prepare(object, ct)?;
    loader.override_global("FP_CT_KFUNCS", if ct.reachable() { &ON } else { &OFF }, true);
    if let Conntrack::Reachable { offsets, .. } = ct {
        for (constant, off) in offsets {
            loader.override_global(constant, off, true);
        }
    }
    let ebpf =
        loader.load(object.bytes()).context("cannot load the eBPF object (maps or BTF rejected by the kernel)")?;
    let by_hand = match ct {
        Conntrack::Reachable { home: Home::Module, .. } => {
            let btf = module_btf::fd_of(MODULE).context("cannot find conntrack's module BTF for its kfuncs")?;
            by_hand::load(object.bytes(), &ebpf, btf.as_fd(), scratch_pin)?
        }
        _ => Vec::new(),
    };
    Ok(Loaded::new(ebpf, by_hand))
}

/// A copy of `object` with every kfunc call resolved (or poisoned when the
/// kernel's conntrack is unreachable), aligned as the ELF parser needs.
pub fn prepare(object: &[u8], ct: &Conntrack) -> Result<AlignedObject> {
    let mut buf = AlignedObject::copy_of(object);
    let sites = patch::patch(buf.bytes_mut(), |name| match ct {
        Conntrack::Reachable { ids, home, .. } => {
            let off = match home {
                Home::Vmlinux => 0,
                Home::Module => MODULE_FD_INDEX,
            };
            ids.iter().find(|(n, _)| *n == name).map(|&(_, id)| (id, off))
        }
        Conntrack::Unreachable(_) => None,
    })
    .context("cannot resolve the conntrack kfunc calls in the eBPF object")?;
    for site in &sites {
        if !KFUNCS.contains(&site.name.as_str()) {
            anyhow::bail!(
                "the eBPF object calls {} (section {}, instruction {}), which is not a kfunc the agent knows",
                site.name,
                site.section,
                site.insn
            );
        }
    }
    let resolved = sites.iter().filter(|s| s.btf_id.is_some()).count();
    tracing::debug!(sites = sites.len(), resolved, "conntrack kfunc calls in the eBPF object");
    Ok(buf)
}

/// The object's bytes in 8-byte aligned storage (the ELF parser reads
/// headers in place).
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    fn copy_of(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        let mut this = AlignedObject { words: Vec::new(), len: bytes.len() };
        // SAFETY: u64 storage viewed as bytes, within its length.
        let view = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) };
        view[..bytes.len()].copy_from_slice(bytes);
        this.words = words;
        this
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in copy_of.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: as in copy_of.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_calls_only_known_kfuncs_resolved_or_poisoned() {
        let object = crate::dataplane::loader::object();
        let reachable = Conntrack::Reachable {
            ids: KFUNCS.iter().map(|&n| (n, 1000)).collect(),
            offsets: vec![],
            home: Home::Vmlinux,
        };
        let mut resolved = object.to_vec();
        let sites = patch::patch(&mut resolved, |n| KFUNCS.contains(&n).then_some((1000, 0))).unwrap();
        assert!(sites.len() >= KFUNCS.len(), "every kfunc is called somewhere: {sites:?}");
        assert!(sites.iter().all(|s| s.btf_id == Some((1000, 0))));
        // a second pass finds nothing left to patch: the symbols are no longer externs
        assert!(patch::patch(&mut resolved, |_| None).unwrap().is_empty());
        assert!(prepare(object, &reachable).is_ok());
        let Conntrack::Reachable { ids, .. } = &reachable else { unreachable!() };
        let module = Conntrack::Reachable { ids: ids.clone(), offsets: vec![], home: Home::Module };
        assert!(prepare(object, &module).is_ok());
        assert!(prepare(object, &Conntrack::Unreachable("test".into())).is_ok());
    }

    #[test]
    fn this_kernels_conntrack_is_found() {
        let Ok(btf) = KernelBtf::from_sys_fs() else { return };
        let ct = Conntrack::from_btf(&btf);
        if btf.func_id(KFUNCS[0]).is_none() {
            // conntrack a module here: found with the module's BTF, if loaded
            assert!(!ct.reachable());
            let Ok(btf) = btf.with_module(MODULE) else { return };
            assert!(matches!(Conntrack::from_btf(&btf), Conntrack::Reachable { home: Home::Module, .. }));
            return;
        }
        let Conntrack::Reachable { offsets, ids, home } = &ct else { panic!("conntrack built in: {ct:?}") };
        assert_eq!(ids.len(), KFUNCS.len());
        assert_eq!(offsets.len(), FIELDS.len());
        assert_eq!(*home, Home::Vmlinux);
    }
}
