//! The fallback for kernels without TCX (before 6.6): the programs as
//! direct-action `bpf` filters on a `clsact` qdisc, as `tc` would put them:
//! `tc qdisc add dev IFACE clsact`, then
//! `tc filter replace dev IFACE {ingress|egress} prio 1 handle 0xed bpf da obj ...`.
//!
//! A filter belongs to the qdisc, not to a process, so it outlives the agent
//! without a pin. A restarted or upgraded agent replaces the filter at the
//! same priority and handle in one netlink request, which cls_bpf swaps
//! atomically: traffic never runs without a program, as with TCX.

use anyhow::{Context, Result};
use aya::programs::{
    SchedClassifier, TcAttachType,
    tc::{self, NlOptions, SchedClassifierLink, TcAttach, TcHandle},
};
use futures::TryStreamExt;
use rtnetlink::{
    Handle,
    packet_route::tc::{TcAttribute, TcFilterBpfOption, TcHandle as NlHandle, TcMessage, TcOption},
};
use tracing::info;

use crate::dataplane::{
    device,
    order::{Foreign, Place},
};
use crate::gone::Gone;

/// First in line, like the TCX links (`LinkOrder::first`).
pub const PRIORITY: u16 = 1;
/// One filter of ours per interface and direction, so one handle serves all.
pub const HANDLE: TcHandle = TcHandle::new(0, 0xed);

/// Attaches `prog` (program `name`, in whichever variant was loaded) to
/// `iface`, replacing in place the filter an earlier agent left at our
/// priority and handle.
pub fn attach(prog: &mut SchedClassifier, name: &str, iface: &str, kind: TcAttachType) -> Result<()> {
    let c_iface = device::c_name(iface)?;
    // EEXIST is the normal case after the first start; a real failure shows in the attach below
    let _ = tc::qdisc_add_clsact(&c_iface);
    let existing = SchedClassifierLink::attached(&c_iface, kind.into(), PRIORITY, HANDLE, None)
        .with_context(|| format!("no interface {iface}"))?;
    let id = match prog.attach_to_link(existing) {
        Ok(id) => {
            info!(program = name, iface, "replaced the clsact filter in place");
            id
        }
        // nothing at our priority and handle yet: create it
        Err(_) => {
            let opts = NlOptions { priority: PRIORITY, handle: HANDLE, classid: None };
            let id = prog
                .attach(&c_iface, TcAttach::Netlink { parent: kind.into(), options: opts })
                .with_context(|| format!("cannot attach {name} to {iface} ({kind:?}) as a clsact filter"))?;
            info!(program = name, iface, "attached as a clsact filter");
            id
        }
    };
    // the filter stays when this process goes: dropping the link would remove it
    let link = prog.take_link(id).context("cannot take the clsact link")?;
    std::mem::forget(link);
    Ok(())
}

/// Removes our filters for program `name` from `iface`; `false` if there
/// were none. A filter is named after its program as its loader knew it:
/// the whole name where aya loaded the program, the kernel's name, cut to
/// 15 bytes (`BPF_OBJ_NAME_LEN`), where it was loaded by hand and taken
/// back from a pin (the guards that call a module's kfuncs,
/// kfunc/by_hand.rs), so both are asked for, for every variant of it.
pub fn detach(name: &str, iface: &str, kind: TcAttachType) -> Result<bool> {
    let mut found = false;
    // and under each variant's name (the compat encap's filter is named after it)
    let variants = std::iter::once(name).chain(crate::dataplane::loader::other_variants(name).iter().copied());
    for name in variants.flat_map(filter_names) {
        match tc::qdisc_detach_program(&device::c_name(iface)?, kind.into(), name) {
            Ok(()) => found = true,
            Err(e) if e.is_gone() => {}
            // the interface itself is gone: so is every filter on it
            Err(_) if matches!(device::ifindex(iface), Ok(None)) => return Ok(found),
            Err(e) => return Err(e).with_context(|| format!("cannot remove {name} from {iface} ({kind:?})")),
        }
    }
    Ok(found)
}

/// The names a filter of program `name` may carry: its own, and the
/// kernel's cut to `BPF_OBJ_NAME_LEN - 1` bytes when that differs.
fn filter_names(name: &str) -> impl Iterator<Item = &str> {
    let cut = name.get(..OBJ_NAME_MAX).filter(|c| c.len() < name.len());
    std::iter::once(name).chain(cut)
}

/// `BPF_OBJ_NAME_LEN` less its NUL.
const OBJ_NAME_MAX: usize = 15;

/// The clsact qdisc's handle, `ffff:` (`tc qdisc del dev IFACE clsact`).
const CLSACT_HANDLE: u32 = 0xffff_0000;

/// Removes `iface`'s clsact qdisc once no filter is left on it, ours gone:
/// the agent added it (`tc qdisc add dev IFACE clsact`) and a qdisc with
/// no filters does nothing. One that still holds someone else's filters
/// stays, with them. `false` when nothing was removed.
pub async fn remove_if_empty(handle: &Handle, iface: &str) -> Result<bool> {
    let Some(index) = device::ifindex(iface).with_context(|| format!("cannot look up {iface}"))? else {
        return Ok(false);
    };
    if !has_clsact(handle, iface, index).await? {
        return Ok(false);
    }
    for ingress in [true, false] {
        let req = handle.traffic_filter(index as i32).get();
        let req = if ingress { req.ingress() } else { req.egress() };
        let filters: Vec<_> =
            req.execute().try_collect().await.with_context(|| format!("cannot list the filters of {iface}"))?;
        if !filters.is_empty() {
            info!(iface, filters = filters.len(), "kept the clsact qdisc: it holds filters that are not ours");
            return Ok(false);
        }
    }
    let mut del = handle.qdisc().del(index as i32);
    del.message_mut().header.parent = NlHandle::CLSACT;
    del.message_mut().header.handle = NlHandle::from(CLSACT_HANDLE);
    del.execute().await.with_context(|| format!("cannot remove the clsact qdisc of {iface}"))?;
    Ok(true)
}

/// Whether `iface` has a clsact qdisc (`tc qdisc show dev IFACE`); `false`
/// when the interface is gone.
pub async fn present(handle: &Handle, iface: &str) -> Result<bool> {
    match device::ifindex(iface).with_context(|| format!("cannot look up {iface}"))? {
        Some(index) => has_clsact(handle, iface, index).await,
        None => Ok(false),
    }
}

async fn has_clsact(handle: &Handle, iface: &str, index: u32) -> Result<bool> {
    let qdiscs: Vec<_> = handle
        .qdisc()
        .get()
        .execute()
        .try_collect()
        .await
        .with_context(|| format!("cannot list the qdiscs of {iface}"))?;
    Ok(qdiscs.iter().any(|q| q.header.index == index as i32 && q.header.parent == NlHandle::CLSACT))
}

/// Whether our filter sits on `iface` for `kind` (the kernel's word, read
/// with a filter dump: `tc filter show dev IFACE ingress`). `false` when
/// the interface is gone; an error when the kernel could not be asked.
pub async fn attached(handle: &Handle, iface: &str, kind: TcAttachType) -> Result<bool> {
    Ok(place(handle, iface, kind).await? != Place::Absent)
}

/// Where our filter sits among the filters on `iface` for `kind`, in the
/// order the kernel runs them: the dump lists them by priority, and within
/// one priority newest first (cls_bpf adds a filter at the head of its
/// list), so one added after ours at our priority runs before it. Only
/// chain 0 is run by the hook itself. `Absent` when the interface is gone.
pub async fn place(handle: &Handle, iface: &str, kind: TcAttachType) -> Result<Place> {
    let Some(index) = device::ifindex(iface).with_context(|| format!("cannot look up {iface}"))? else {
        return Ok(Place::Absent);
    };
    let req = handle.traffic_filter(index as i32).get();
    let req = if matches!(kind, TcAttachType::Ingress) { req.ingress() } else { req.egress() };
    let filters = match req.execute().try_collect::<Vec<_>>().await {
        Ok(filters) => filters,
        // gone between the lookup and the dump
        Err(e) if e.is_gone() => return Ok(Place::Absent),
        Err(e) => return Err(e).with_context(|| format!("cannot list the filters of {iface}")),
    };
    let mut ahead = Vec::new();
    for f in &filters {
        let h = f.header.handle;
        let handle = u32::from(h.major) << 16 | u32::from(h.minor);
        let prio = (f.header.info >> 16) as u16;
        let chain = f.attributes.iter().find_map(|a| match a {
            TcAttribute::Chain(c) => Some(*c),
            _ => None,
        });
        // handle 0: the priority's own entry, not a filter
        if handle == 0 || chain.unwrap_or(0) != 0 {
            continue;
        }
        if handle == u32::from(HANDLE) && prio == PRIORITY {
            return Ok(if ahead.is_empty() { Place::First } else { Place::Behind(ahead) });
        }
        ahead.push(foreign(f, prio, handle));
    }
    Ok(Place::Absent)
}

/// A filter that is not ours, as `tc filter show` names it.
fn foreign(f: &TcMessage, prio: u16, handle: u32) -> Foreign {
    let mut out = Foreign::default();
    let mut kind = String::from("?");
    for a in &f.attributes {
        match a {
            TcAttribute::Kind(k) => kind = k.escape_debug().to_string(),
            TcAttribute::Options(opts) => {
                for o in opts {
                    match o {
                        TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => out.id = Some(*id),
                        TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => out.name = Some(n.clone()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out.filter = Some(format!("pref {prio} handle {handle:#x} {kind}"));
    out
}

/// [`place`] for callers outside the agent's runtime (`edgevx status`):
/// asked on a thread of its own, with a runtime and a netlink socket of
/// its own. `None` when the kernel could not be asked.
pub fn place_blocking(iface: &str, kind: TcAttachType) -> Option<Place> {
    let iface = iface.to_string();
    let ask = move || -> Option<Place> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection().ok()?;
            tokio::spawn(conn);
            place(&handle, &iface, kind).await.ok()
        })
    };
    std::thread::spawn(ask).join().ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_is_looked_for_under_the_whole_name_and_the_kernels_cut_one() {
        assert_eq!(filter_names("edgevx_vtep_guard").collect::<Vec<_>>(), ["edgevx_vtep_guard", "edgevx_vtep_gua"]);
        assert_eq!(filter_names("edgevx_pod_guard").collect::<Vec<_>>(), ["edgevx_pod_guard", "edgevx_pod_guar"]);
        assert_eq!(filter_names("edgevx_decap").collect::<Vec<_>>(), ["edgevx_decap"]);
        assert_eq!(filter_names("edgevx_encap_co").collect::<Vec<_>>(), ["edgevx_encap_co"]);
    }
}
