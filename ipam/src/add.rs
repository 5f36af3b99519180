//! ADD: one address per range set for the attachment (container ID and
//! interface, as host-local), the pod's own on that interface when it has
//! one.
//!
//! For each range set, in order:
//! 1. the attachment already holds an address there (a retried ADD): that;
//!    another interface of the same container never counts;
//! 2. the pod (namespace/name) has a record there for this interface: that
//!    address, when it is free or still held by the same interface of the
//!    pod's previous sandbox, whose DEL never came (the node rebooted);
//! 3. otherwise host-local's round-robin from `last_reserved_ip.<n>`,
//!    passing over addresses retained for other pods or interfaces, and
//!    those whose record cannot be read ([`crate::identity`]);
//! 4. only when nothing else is free, the address retained longest ago,
//!    with a line on stderr.
//!
//! Writes per address, staged and committed in this order: the pod record,
//! the reservation file, `last_reserved_ip.<n>`. A crash after the record
//! alone leaves the address unreserved but retained for the pod (see
//! [`crate::ledger`]).
use std::net::IpAddr;

use crate::{
    env::Attachment,
    identity::{PodRecord, PodRef},
    ledger::{Ledger, held_by_record, log},
    range::RangeSet,
    store::StoreError,
    wire::{CniError, Code, IpConfig},
};

/// Addresses for every range set. Every write is staged: on failure
/// nothing is committed, so nothing given so far stays given (host-local
/// releases them again).
pub fn add(
    ledger: &mut Ledger<'_>,
    sets: &[RangeSet],
    pod: &PodRef,
    att: &Attachment,
) -> Result<Vec<IpConfig>, CniError> {
    let mut given: Vec<IpConfig> = Vec::new();
    for (index, set) in sets.iter().enumerate() {
        let ip = assign(ledger, index, set, pod, att)?;
        let range = set.range_of(ip).ok_or_else(|| {
            CniError::new(Code::CorruptStore, "address outside its range set", format!("{ip} not in {set}"))
        })?;
        given.push(IpConfig { address: ip, prefix: range.prefix, gateway: Some(range.gateway) });
    }
    Ok(given)
}

fn assign(
    ledger: &mut Ledger<'_>,
    index: usize,
    set: &RangeSet,
    pod: &PodRef,
    att: &Attachment,
) -> Result<IpAddr, CniError> {
    // 1. a retried ADD
    let held = ledger
        .reservations
        .iter()
        .find(|(ip, h)| set.contains(**ip) && h.is_attachment(&att.container_id, &att.ifname));
    if let Some((&ip, _)) = held {
        record(ledger, ip, pod, att)?;
        return Ok(ip);
    }

    // 2. the pod's own address on this interface
    let mine: Vec<IpAddr> = ledger
        .records
        .iter()
        .filter(|(ip, r)| r.pod == *pod && r.ifname() == att.ifname && set.contains(**ip))
        .map(|(ip, _)| *ip)
        .collect();
    for ip in mine {
        let Some(rec) = ledger.records.get(&ip).cloned() else { continue };
        match ledger.reservations.get(&ip) {
            None => {
                if !ledger.store.is_taken(ip) {
                    record(ledger, ip, pod, att)?;
                    ledger.store.reserve(ip, &att.container_id, &att.ifname, "add-reservation")?;
                    note_reserved(ledger, ip, att);
                    return Ok(ip);
                }
            }
            holder if held_by_record(holder, &rec) => {
                log(format_args!(
                    "{ip} goes back to pod {pod} ({}): its previous sandbox {} was never deleted",
                    att.ifname, rec.container_id
                ));
                let previous = ledger.reservations.get(&ip).and_then(|h| h.container_id()).map(str::to_string);
                let taking_over = PodRecord { previous_container_id: previous, ..live(pod, att) };
                ledger.save(ip, taking_over, "takeover-record")?;
                ledger.store.reassign(ip, &att.container_id, &att.ifname, "takeover-reservation")?;
                note_reserved(ledger, ip, att);
                return Ok(ip);
            }
            Some(_) => {
                log(format_args!(
                    "{ip}, kept for pod {pod} ({}), is held by another attachment: the pod gets a new address",
                    att.ifname
                ));
                ledger.forget(ip);
            }
        }
    }

    // 3. round-robin, passing over retained addresses
    let last = ledger.store.last_reserved(index);
    let mut oldest: Option<(u64, IpAddr)> = None;
    for ip in set.walk(last) {
        if ledger.reservations.contains_key(&ip) || ledger.blocked.contains(&ip) {
            continue;
        }
        if let Some(r) = ledger.records.get(&ip) {
            let at = r.released_at_ns.unwrap_or(ledger.now);
            if oldest.is_none_or(|(o, _)| at < o) {
                oldest = Some((at, ip));
            }
            continue;
        }
        if take(ledger, index, ip, pod, att)? {
            return Ok(ip);
        }
    }

    // 4. reclaim the address retained longest ago
    if let Some((at, ip)) = oldest {
        if let Some(r) = ledger.records.get(&ip) {
            log(format_args!(
                "range set {set} has no free address: reclaiming {ip}, retained for pod {} for {}s (the oldest)",
                r.pod,
                ledger.now.saturating_sub(at) / 1_000_000_000
            ));
        }
        ledger.forget(ip);
        if take(ledger, index, ip, pod, att)? {
            return Ok(ip);
        }
    }
    Err(CniError::new(
        Code::NoAddress,
        "no IP addresses available",
        format!("no IP addresses available in range set {set} (index {index}) of {}", ledger.store.dir().display()),
    ))
}

/// A fresh address: record, reservation, then last_reserved_ip.
fn take(ledger: &mut Ledger<'_>, index: usize, ip: IpAddr, pod: &PodRef, att: &Attachment) -> Result<bool, StoreError> {
    if ledger.store.is_taken(ip) {
        // a writer that ignores the lock got there first
        return Ok(false);
    }
    record(ledger, ip, pod, att)?;
    ledger.store.reserve(ip, &att.container_id, &att.ifname, "add-reservation")?;
    note_reserved(ledger, ip, att);
    ledger.store.set_last_reserved(index, ip, "add-last-reserved")?;
    Ok(true)
}

fn live(pod: &PodRef, att: &Attachment) -> PodRecord {
    PodRecord {
        pod: pod.clone(),
        container_id: att.container_id.clone(),
        ifname: att.ifname.clone(),
        previous_container_id: None,
        released_at_ns: None,
    }
}

/// Writes the attachment's live record for `ip` unless it is there.
fn record(ledger: &mut Ledger<'_>, ip: IpAddr, pod: &PodRef, att: &Attachment) -> Result<(), StoreError> {
    let want = live(pod, att);
    if ledger.records.get(&ip) != Some(&want) {
        ledger.save(ip, want, "add-record")?;
    }
    Ok(())
}

fn note_reserved(ledger: &mut Ledger<'_>, ip: IpAddr, att: &Attachment) {
    ledger.reservations.insert(
        ip,
        crate::holder::Holder::Attachment { container_id: att.container_id.clone(), ifname: Some(att.ifname.clone()) },
    );
}
