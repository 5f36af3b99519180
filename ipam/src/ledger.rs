//! The store read under the lock: reservations (host-local's files) and pod
//! records (ours), brought into agreement before ADD and GC act (DEL only
//! reads the records of what it releases, [`Ledger::for_release`]).
//!
//! Settling, in order:
//! 1. OpenYurt markers become records ([`identity::migrate_openyurt`]);
//! 2. a live record whose attachment no longer holds the address (host-local
//!    released it, or a crash came between our two writes) is retained
//!    from now;
//! 3. a retained record older than `retain` is dropped.
//!
//! An address whose record cannot be read ([`identity::Records::unreadable`])
//! is in `blocked`: no record is ever written or removed there.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use crate::{
    holder::Holder,
    identity::{self, PodRecord, now_ns},
    store::{Store, StoreError},
};

pub struct Ledger<'a> {
    pub store: &'a Store,
    pub reservations: BTreeMap<IpAddr, Holder>,
    pub records: BTreeMap<IpAddr, PodRecord>,
    /// Addresses with an unreadable record: given to no pod, left as they are.
    pub blocked: BTreeSet<IpAddr>,
    pub now: u64,
}

/// Whether `holder` is the attachment `record` names, or the one it is
/// taking over from: the same interface (a bare-ID file from host-local
/// before v0.8.0 or OpenYurt is eth0's) of the same container.
pub fn held_by_record(holder: Option<&Holder>, record: &PodRecord) -> bool {
    let Some(holder) = holder else { return false };
    let (Some(id), Some(ifname)) = (holder.container_id(), holder.ifname()) else { return false };
    ifname == record.ifname()
        && ((!record.container_id.is_empty() && id == record.container_id)
            || record.previous_container_id.as_deref() == Some(id))
}

pub fn log(line: std::fmt::Arguments<'_>) {
    eprintln!("edgevx-ipam: {line}");
}

impl<'a> Ledger<'a> {
    pub fn load(store: &'a Store, retain: Duration) -> Result<Self, StoreError> {
        let reservations = store.reservations()?;
        let mut records = identity::load(store)?;
        identity::repair(store, &mut records, &reservations)?;
        for (ip, pod) in identity::migrate_openyurt(store, &mut records, &reservations)? {
            log(format_args!("migrated OpenYurt record {ip} of pod {pod}"));
        }
        let now = now_ns();
        let mut ledger = Ledger { store, reservations, records: records.by_ip, blocked: records.unreadable, now };
        let ips: Vec<IpAddr> = ledger.records.keys().copied().collect();
        for ip in ips {
            let Some(record) = ledger.records.get(&ip) else { continue };
            let held = held_by_record(ledger.reservations.get(&ip), record);
            if record.released_at_ns.is_none() && !held {
                let mut r = record.clone();
                r.released_at_ns = Some(now);
                ledger.save(ip, r, "settle-record")?;
            } else if !held && record.expired(retain, now) {
                log(format_args!("retention of {ip} for pod {} expired", record.pod));
                ledger.forget(ip);
            }
        }
        Ok(ledger)
    }

    /// The ledger DEL needs: the reservations, and the records of only the
    /// addresses the attachment holds (settling is left to ADD and GC).
    pub fn for_release(store: &'a Store, container_id: &str, ifname: &str) -> Result<Self, StoreError> {
        let reservations = store.reservations()?;
        let held: Vec<IpAddr> =
            reservations.iter().filter(|(_, h)| h.is(container_id, ifname)).map(|(ip, _)| *ip).collect();
        let records = identity::load_some(store, &held);
        Ok(Ledger { store, reservations, records: records.by_ip, blocked: records.unreadable, now: now_ns() })
    }

    /// Stages `ip`'s record (placed at [`Store::commit`]), unless the one
    /// there is unreadable: that is left as it is.
    pub fn save(&mut self, ip: IpAddr, record: PodRecord, step: &'static str) -> Result<(), StoreError> {
        if self.blocked.contains(&ip) {
            return Ok(());
        }
        identity::save(self.store, ip, &record, step)?;
        self.records.insert(ip, record);
        Ok(())
    }

    pub fn forget(&mut self, ip: IpAddr) {
        if self.blocked.contains(&ip) {
            return;
        }
        identity::remove(self.store, ip);
        self.records.remove(&ip);
    }

    /// Stages the release of `ip`'s reservation; its record, if the
    /// holder's, is retained from now. The record is placed first: a
    /// crash between the two leaves the address reserved and the pod's.
    /// The record is written only if it can be: on a full disk the
    /// release goes ahead without it (removing needs no space), and the
    /// next ADD or GC finds the record live without its reservation and
    /// retains it from then (see [`Ledger::load`]).
    pub fn release(&mut self, ip: IpAddr) -> Result<(), StoreError> {
        let live = self.records.get(&ip).filter(|r| r.released_at_ns.is_none());
        if let Some(record) = live.filter(|r| held_by_record(self.reservations.get(&ip), r)) {
            let mut r = record.clone();
            r.released_at_ns = Some(self.now);
            if !self.blocked.contains(&ip) {
                identity::save_if_possible(self.store, ip, &r, "release-record");
                self.records.insert(ip, r);
            }
        }
        self.store.release(ip, "release-reservation");
        self.reservations.remove(&ip);
        Ok(())
    }
}
