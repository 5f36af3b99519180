//! DEL and GC: reservations go, pod records stay (retained) until `retain`
//! has passed since the release.
//!
//! DEL releases every address the attachment holds, as host-local's
//! `ReleaseByID` does (the exact `<containerID>\r\n<ifname>`, or a bare
//! container ID): another interface of the container keeps its own. A
//! repeated DEL finds nothing and succeeds. GC (CNI 1.1) releases every
//! address whose holder is not in `cni.dev/valid-attachments`; a bare ID is
//! kept while any interface of its container is listed (it does not say
//! which), a torn (empty) file only if a live record ties it to a listed
//! attachment. An unreadable file is never released: nobody can say whose
//! it is (see [`crate::entry`]). Neither touches `lock`,
//! `last_reserved_ip.*` or `.edgevx/`.
use std::{collections::HashSet, net::IpAddr};

use crate::{config::Attachment as Valid, env::Attachment, holder::Holder, ledger::Ledger, store::StoreError};

pub fn del(ledger: &mut Ledger<'_>, att: &Attachment) -> Result<Vec<IpAddr>, StoreError> {
    let held: Vec<IpAddr> =
        ledger.reservations.iter().filter(|(_, h)| h.is(&att.container_id, &att.ifname)).map(|(ip, _)| *ip).collect();
    for ip in &held {
        ledger.release(*ip)?;
    }
    Ok(held)
}

pub fn gc(ledger: &mut Ledger<'_>, valid: &[Valid]) -> Result<Vec<IpAddr>, StoreError> {
    let pairs: HashSet<(&str, &str)> = valid.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
    let ids: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    let stale: Vec<IpAddr> = ledger
        .reservations
        .iter()
        .filter(|(ip, h)| match h {
            Holder::Attachment { container_id, ifname: Some(ifname) } => {
                !pairs.contains(&(container_id.as_str(), ifname.as_str()))
            }
            Holder::Attachment { container_id, ifname: None } => !ids.contains(container_id.as_str()),
            Holder::Torn => !ledger
                .records
                .get(ip)
                .is_some_and(|r| r.released_at_ns.is_none() && pairs.contains(&(r.container_id.as_str(), r.ifname()))),
            Holder::Unreadable => false,
        })
        .map(|(ip, _)| *ip)
        .collect();
    // staged here; the commit applies every change it can, then reports (as the spec asks)
    for ip in &stale {
        ledger.release(*ip)?;
    }
    Ok(stale)
}
