//! The conntrack kfuncs the fast path calls (ebpf/src/kfunc.rs): whether
//! this kernel has them where the agent can reach them, and the object
//! rewritten to call them (or to poison the calls, behind a load-time
//! constant that keeps them dead).
//!
//! Probed, never read off the release number: the kfuncs came in 5.18
//! (lookup, release) and 6.0 (`bpf_ct_change_timeout`), need the kernel's
//! BTF, and are reachable only when conntrack is built in
//! (`CONFIG_NF_CONNTRACK=y`). With conntrack as a module (Debian's 6.1 and
//! 6.12) they live in the module's BTF, whose kfuncs a program reaches only
//! through `fd_array` at load time, which aya 0.16 cannot pass
//! (aya-rs/aya#1594): the fast path is then off, and status says why.
mod btf;
mod patch;

use anyhow::{Context, Result};
use aya::{Ebpf, EbpfLoader};

use self::btf::KernelBtf;

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

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conntrack {
    /// Every kfunc's BTF id, and the field offsets.
    Reachable { ids: Vec<(&'static str, u32)>, offsets: Vec<(&'static str, u32)> },
    /// Why not, for the log and status.
    Unreachable(String),
}

impl Conntrack {
    pub fn probe() -> Self {
        match KernelBtf::from_sys_fs() {
            Ok(btf) => Self::from_btf(&btf, module_conntrack()),
            Err(e) => Conntrack::Unreachable(format!("no kernel BTF ({e:#})")),
        }
    }

    fn from_btf(btf: &KernelBtf, module: bool) -> Self {
        let mut ids = Vec::new();
        for name in KFUNCS {
            match btf.func_id(name) {
                Some(id) => ids.push((name, id)),
                None if module => {
                    return Conntrack::Unreachable(
                        "conntrack is a module here: its kfuncs are in the module's BTF, which a program reaches \
                         only through fd_array, and aya 0.16 cannot pass it (aya-rs/aya#1594)"
                            .to_string(),
                    );
                }
                None => {
                    return Conntrack::Unreachable(format!(
                        "the kernel has no {name} (conntrack kfuncs: Linux 6.0 with BTF and conntrack built in)"
                    ));
                }
            }
        }
        let mut offsets = Vec::new();
        for (constant, path) in FIELDS {
            match btf.member("nf_conn", path) {
                Ok((off, _)) => offsets.push((constant, off)),
                Err(e) => return Conntrack::Unreachable(format!("cannot place nf_conn.{path} ({e:#})")),
            }
        }
        Conntrack::Reachable { ids, offsets }
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
/// `nf_conn` field offsets). The agent's loader and the packet tests both
/// load this way.
pub fn load<'a>(loader: &mut EbpfLoader<'a>, object: &[u8], ct: &'a Conntrack) -> Result<Ebpf> {
    static ON: u32 = 1;
    static OFF: u32 = 0;
    let object = prepare(object, ct)?;
    loader.override_global("FP_CT_KFUNCS", if ct.reachable() { &ON } else { &OFF }, true);
    if let Conntrack::Reachable { offsets, .. } = ct {
        for (constant, off) in offsets {
            loader.override_global(constant, off, true);
        }
    }
    loader.load(object.bytes()).context("cannot load the eBPF object (maps or BTF rejected by the kernel)")
}

/// A copy of `object` with every kfunc call resolved (or poisoned when the
/// kernel's conntrack is unreachable), aligned as the ELF parser needs.
pub fn prepare(object: &[u8], ct: &Conntrack) -> Result<AlignedObject> {
    let mut buf = AlignedObject::copy_of(object);
    let sites = patch::patch(buf.bytes_mut(), |name| match ct {
        Conntrack::Reachable { ids, .. } => ids.iter().find(|(n, _)| *n == name).map(|&(_, id)| (id, 0)),
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
        let reachable = Conntrack::Reachable { ids: KFUNCS.iter().map(|&n| (n, 1000)).collect(), offsets: vec![] };
        let mut resolved = object.to_vec();
        let sites = patch::patch(&mut resolved, |n| KFUNCS.contains(&n).then_some((1000, 0))).unwrap();
        assert!(sites.len() >= KFUNCS.len(), "every kfunc is called somewhere: {sites:?}");
        assert!(sites.iter().all(|s| s.btf_id == Some((1000, 0))));
        // a second pass finds nothing left to patch: the symbols are no longer externs
        assert!(patch::patch(&mut resolved, |_| None).unwrap().is_empty());
        assert!(prepare(object, &reachable).is_ok());
        assert!(prepare(object, &Conntrack::Unreachable("test".into())).is_ok());
    }

    #[test]
    fn this_kernels_conntrack_is_found() {
        let Ok(btf) = KernelBtf::from_sys_fs() else { return };
        // a kfunc name no kernel has stands in for a missing one
        let ct = Conntrack::from_btf(&btf, false);
        assert!(ct.reachable(), "this machine's kernel has conntrack built in: {ct:?}");
        if let Conntrack::Reachable { offsets, ids } = &ct {
            assert_eq!(ids.len(), KFUNCS.len());
            assert_eq!(offsets.len(), FIELDS.len());
        }
    }
}
