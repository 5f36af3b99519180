//! Where our programs sit among others on the same hook, as the kernel
//! runs them. Decap must run first on the underlay's ingress: a program
//! ahead of it that ends the chain (a TCX program returning `TC_ACT_OK`, a
//! clsact filter in front of ours) hands VXLAN to the kernel's socket
//! unjudged. The VTEP guard (ebpf/src/vtep_guard.rs) then drops it, but a
//! peer's traffic stops with it: the agent checks the order every resync,
//! says what ran ahead, and puts decap back first.
//!
//! - TCX: `BPF_PROG_QUERY` on the interface lists the programs in the
//!   order they run (`bpftool net show dev IFACE`).
//! - clsact: the filter dump lists them in the order they run, by
//!   priority, and within one priority newest first (cls_bpf adds a filter
//!   at the head of its list): `tc filter show dev IFACE ingress`.
use std::{fmt, io, path::Path};

use crate::gone::Gone;
use aya::programs::TcAttachType;
use serde::Serialize;

/// A program that runs before ours on the same hook.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Foreign {
    /// The program's id (`bpftool prog show id N`), when the kernel says it.
    pub id: Option<u32>,
    /// Its name, when it can be read (a TCX program's needs CAP_SYS_ADMIN).
    pub name: Option<String>,
    /// A clsact filter: `pref P handle 0xH KIND`, as `tc filter show` says it.
    pub filter: Option<String>,
}

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(filter) = &self.filter {
            parts.push(filter.clone());
        }
        if let Some(id) = self.id {
            parts.push(format!("id {id}"));
        }
        if let Some(name) = &self.name {
            // the kernel holds 16 bytes of any name a loader gave: shown escaped
            parts.push(format!("name {}", name.escape_debug()));
        }
        match parts.is_empty() {
            true => f.write_str("an unnamed program"),
            false => f.write_str(&parts.join(" ")),
        }
    }
}

/// Where our program sits on its hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// It runs first.
    First,
    /// It runs after these, in the order they run.
    Behind(Vec<Foreign>),
    /// It is not attached there.
    Absent,
}

impl Place {
    /// What runs ahead of ours (empty when first, or absent).
    pub fn ahead(&self) -> &[Foreign] {
        match self {
            Place::Behind(ahead) => ahead,
            _ => &[],
        }
    }
}

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The TCX attach type of `kind` (`BPF_TCX_INGRESS`, `BPF_TCX_EGRESS`).
pub fn tcx_attach_type(kind: TcAttachType) -> u32 {
    match kind {
        TcAttachType::Ingress => BPF_TCX_INGRESS,
        _ => BPF_TCX_EGRESS,
    }
}

/// What the kernel says of a TCX link: where it is attached and which
/// program it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcxLink {
    /// 0 once its device is gone.
    pub ifindex: u32,
    pub attach_type: u32,
    pub prog_id: u32,
}

/// The TCX link pinned at `path`, as the kernel has it; `None` without a
/// pin. Read with two raw bpf(2) calls because aya exposes neither, and the
/// alternative (BPF_PROG_GET_FD_BY_ID) needs CAP_SYS_ADMIN.
pub fn pinned_tcx(path: &Path) -> io::Result<Option<TcxLink>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("pin path {}", path.display())))?;
    let mut get = [0u64; 3];
    get[0] = cpath.as_ptr() as u64; // pathname; bpf_fd, file_flags = 0
    // SAFETY: bpf(BPF_OBJ_GET) reads the attr we own, with a valid C string.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, get.as_mut_ptr(), std::mem::size_of_val(&get)) };
    if fd < 0 {
        // no pin is an answer (the link is gone); EMFILE, ENOMEM and the like are not
        return match io::Error::last_os_error() {
            e if e.is_gone() => Ok(None),
            e => Err(e),
        };
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = [0u8; 256];
    let mut attr = [0u32; 4];
    attr[0] = fd.as_raw_fd() as u32;
    attr[1] = info.len() as u32;
    let ptr = info.as_mut_ptr() as u64;
    attr[2] = ptr as u32;
    attr[3] = (ptr >> 32) as u32;
    // SAFETY: the kernel writes at most info_len bytes into `info`.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, attr.as_mut_ptr(), std::mem::size_of_val(&attr))
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // struct bpf_link_info: type, id, prog_id, then (8-aligned) tcx { ifindex, attach_type }
    let word = |off: usize| u32::from_ne_bytes([info[off], info[off + 1], info[off + 2], info[off + 3]]);
    Ok(Some(TcxLink { ifindex: word(16), attach_type: word(20), prog_id: word(8) }))
}

/// `union bpf_attr`'s `query` (BPF_PROG_QUERY), as of Linux 6.6.
#[repr(C)]
#[derive(Default)]
struct Query {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the TCX programs on `ifindex` for `attach_type`, in the
/// order they run (at most the first 64).
pub fn tcx_programs(ifindex: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    let mut q = Query {
        target_ifindex: ifindex,
        attach_type,
        prog_ids: ids.as_mut_ptr() as u64,
        count: ids.len() as u32,
        ..Default::default()
    };
    // SAFETY: the kernel writes at most `count` ids into `ids`, and the count back into `q`.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_QUERY, &mut q as *mut Query, std::mem::size_of::<Query>()) };
    // ENOSPC: more than 64; the first ones are written, which is all that is asked
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSPC) {
            return Err(e);
        }
    }
    Ok(ids[..(q.count as usize).min(ids.len())].to_vec())
}

/// Where the TCX program of `link` sits on `ifindex` for `kind`.
pub fn tcx_place(link: Option<TcxLink>, ifindex: u32, kind: TcAttachType) -> io::Result<Place> {
    let attach_type = tcx_attach_type(kind);
    let Some(link) = link.filter(|l| (l.ifindex, l.attach_type) == (ifindex, attach_type)) else {
        return Ok(Place::Absent);
    };
    let ids = tcx_programs(ifindex, attach_type)?;
    Ok(match ids.iter().position(|id| *id == link.prog_id) {
        None => Place::Absent,
        Some(0) => Place::First,
        Some(at) => Place::Behind(named(&ids[..at])),
    })
}

/// The programs `ids`, with their names where this process may read them
/// (BPF_PROG_GET_FD_BY_ID needs CAP_SYS_ADMIN; without it, ids alone).
fn named(ids: &[u32]) -> Vec<Foreign> {
    let mut names = std::collections::HashMap::new();
    for info in aya::programs::loaded_programs().flatten() {
        if ids.contains(&info.id()) {
            names.insert(info.id(), info.name_as_str().map(str::to_string));
        }
    }
    ids.iter().map(|id| Foreign { id: Some(*id), name: names.get(id).cloned().flatten(), filter: None }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_program_is_named_by_what_the_kernel_says() {
        let tcx = Foreign { id: Some(42), name: Some("observe".into()), filter: None };
        assert_eq!(tcx.to_string(), "id 42 name observe");
        let filter = Foreign { id: Some(7), name: None, filter: Some("pref 1 handle 0x1 bpf".into()) };
        assert_eq!(filter.to_string(), "pref 1 handle 0x1 bpf id 7");
        assert_eq!(Foreign::default().to_string(), "an unnamed program");
        let odd = Foreign { id: None, name: Some("a\nb".into()), filter: None };
        assert_eq!(odd.to_string(), "name a\\nb", "a name cannot start a log line of its own");
    }

    #[test]
    fn only_behind_has_programs_ahead() {
        assert!(Place::First.ahead().is_empty());
        assert!(Place::Absent.ahead().is_empty());
        assert_eq!(Place::Behind(vec![Foreign::default()]).ahead().len(), 1);
    }

    #[test]
    fn a_link_elsewhere_is_absent_here() {
        let link = TcxLink { ifindex: 3, attach_type: BPF_TCX_EGRESS, prog_id: 9 };
        // another hook: absent, without asking the kernel
        assert_eq!(tcx_place(Some(link), 3, TcAttachType::Ingress).ok(), Some(Place::Absent));
        assert_eq!(tcx_place(None, 3, TcAttachType::Ingress).ok(), Some(Place::Absent));
    }
}
