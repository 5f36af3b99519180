//! CHECK and STATUS: they read the store and write nothing.
//!
//! CHECK passes when the attachment holds an address in every range set
//! (host-local only asks for one anywhere). STATUS fails with code 50 when a
//! range set has no address left that ADD could give: every address is
//! reserved or has an unreadable record (retained ones still count as
//! available, since ADD reclaims them).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use crate::{
    env::Attachment,
    holder::Holder,
    range::RangeSet,
    wire::{CniError, Code},
};

pub fn check(reservations: &BTreeMap<IpAddr, Holder>, sets: &[RangeSet], att: &Attachment) -> Result<(), CniError> {
    for (index, set) in sets.iter().enumerate() {
        let held = reservations.iter().any(|(ip, h)| set.contains(*ip) && h.is(&att.container_id, &att.ifname));
        if !held {
            return Err(CniError::new(
                Code::UnknownContainer,
                "no address reserved for the attachment",
                format!("{} ({}) holds no address in range set {index} ({set})", att.container_id, att.ifname),
            ));
        }
    }
    Ok(())
}

pub fn status(
    reservations: &BTreeMap<IpAddr, Holder>,
    unreadable: &BTreeSet<IpAddr>,
    sets: &[RangeSet],
) -> Result<(), CniError> {
    for (index, set) in sets.iter().enumerate() {
        if set.walk(None).all(|ip| reservations.contains_key(&ip) || unreadable.contains(&ip)) {
            return Err(CniError::new(
                Code::NotAvailable,
                "no IP addresses available",
                format!("every address of range set {index} ({set}) is reserved or has an unreadable record"),
            ));
        }
    }
    Ok(())
}
