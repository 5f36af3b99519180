//! Which VTEP MAC this node uses. The first that exists wins:
//! 1. the VtepMAC our own Node publishes in `backend-data` (with etcd, our
//!    lease's);
//! 2. the MAC saved in the state dir;
//! 3. a new random one, saved (fsync + rename) before any device exists.
//!
//! A MAC another node publishes is never ours, whichever of 1 and 2 says
//! it: a state dir copied from that node (a golden image, a cloned VM) or a
//! clone that published the copied MAC would make two VTEPs answer for one
//! MAC. Such a MAC is replaced by a new one, saying whose it is.
//!
//! Whatever is chosen is saved, so a reboot brings back the same MAC and
//! peers that never saw an update keep working. A new MAC the state dir
//! cannot take (full, read-only) is used anyway, with an error saying it
//! will change at the next boot: forwarding now beats a MAC kept later. In
//! dual-stack the IPv6 VTEP's MAC is chosen the same way from
//! `backend-v6-data` and its own file.
//!
//! The choice is made once, at bring-up ([`choose`], from `run/vtep_plan.rs`).
//! The etcd source must write a MAC into a new lease before that, as
//! flannel's `AcquireLease` carries the device's: it publishes a
//! [`candidate`], read without writing, which bring-up then finds as our
//! published MAC and saves.
use std::collections::HashMap;

use anyhow::{Context, Result};
use tracing::{error, info, warn};

use crate::{
    family::Family,
    mac::VtepMac,
    peer::Peer,
    state::{StateDir, mac_file},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacSource {
    /// Our own node's `backend-data` (or `backend-v6-data`), or our etcd
    /// lease's: a new lease publishes a [`candidate`] before bring-up.
    Published,
    StateDir,
    Generated,
}

/// The VTEP MACs other nodes publish (either family), and whose each is.
#[derive(Clone, Debug, Default)]
pub struct OthersMacs(HashMap<VtepMac, String>);

impl OthersMacs {
    /// The MACs of `peers` (other nodes, as a source read them).
    pub fn of<'a>(peers: impl IntoIterator<Item = &'a Peer>) -> Self {
        let mut m = HashMap::new();
        for p in peers {
            for mac in [p.v4.map(|h| h.vtep_mac), p.v6.map(|h| h.vtep_mac)].into_iter().flatten() {
                m.entry(mac).or_insert_with(|| p.node.clone());
            }
        }
        OthersMacs(m)
    }

    /// One MAC with the node that publishes it.
    pub fn insert(&mut self, mac: VtepMac, node: String) {
        self.0.entry(mac).or_insert(node);
    }

    /// The node that publishes `mac`, if another one does.
    pub fn owner(&self, mac: VtepMac) -> Option<&str> {
        self.0.get(&mac).map(String::as_str)
    }

    /// A random MAC no other node publishes.
    fn fresh(&self) -> Result<VtepMac> {
        loop {
            let m = VtepMac::random().context("cannot read /dev/urandom for a new VTEP MAC")?;
            if self.owner(m).is_none() {
                return Ok(m);
            }
        }
    }
}

/// The MAC of a family's VTEP (`flannel.<VNI>` or `flannel-v6.<VNI>`):
/// `published` is the VtepMAC of our `backend-data` (or
/// `backend-v6-data`; with etcd, our lease's), and each family's state file is its own. flannel
/// draws a separate MAC per device, and kernel flannel peers only see a
/// new IPv6 one when the IPv4 half changes too, so both must be as stable.
/// `others` are the MACs other nodes publish: never taken.
pub fn choose<N: Family>(
    published: Option<VtepMac>,
    state: &StateDir,
    others: &OthersMacs,
) -> Result<(VtepMac, MacSource)> {
    let file = mac_file::<N>();
    let saved = state.load_mac(file)?;
    // the first that exists and no other node publishes
    let mut found = None;
    for (m, source) in [(published, MacSource::Published), (saved, MacSource::StateDir)] {
        let Some(m) = m else { continue };
        match others.owner(m) {
            None => {
                found = Some((m, source));
                break;
            }
            Some(whose) => warn!(mac = %m, node = whose, from = ?source, ipv6 = N::IPV6,
                "the VTEP MAC this node would use is the one node {whose:?} publishes (a state dir or an image \
                 copied from it?): two VTEPs cannot share a MAC, so this node does not take it"),
        }
    }
    let (mac, source) = match found {
        Some(f) => f,
        None => (others.fresh()?, MacSource::Generated),
    };
    if saved != Some(mac)
        && let Err(e) = state.save_mac(file, mac)
    {
        // forwarding now beats a MAC kept later: come up, and say what it costs
        error!(%mac, file = %state.path(file).display(), ipv6 = N::IPV6,
                "cannot save the VTEP MAC ({e:#}); coming up with it anyway, but THE MAC WILL CHANGE AT THE \
                 NEXT BOOT unless the state dir can be written before then (free space, or repair and remount \
                 it read-write): peers cut off from the control plane then cannot reach this node");
    }
    info!(%mac, ?source, ipv6 = N::IPV6, "VTEP MAC chosen");
    Ok((mac, source))
}

/// The MAC a source publishes for a family before bring-up has chosen one:
/// the saved one, else a new random one; never one `others` publish.
/// Nothing is written; the MAC becomes ours when [`choose`] finds it
/// published.
pub fn candidate<N: Family>(state: &StateDir, others: &OthersMacs) -> Result<VtepMac> {
    match state.load_mac(mac_file::<N>())? {
        Some(saved) if others.owner(saved).is_none() => Ok(saved),
        _ => others.fresh(),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use ipnet::{Ipv4Net, Ipv6Net};

    use super::*;
    use crate::state::{MAC_FILE, MAC6_FILE};

    fn none() -> OthersMacs {
        OthersMacs::default()
    }

    fn dir(tag: &str) -> StateDir {
        let d = std::env::temp_dir().join(format!("edgevx-unit-vtep-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        StateDir(d)
    }

    #[test]
    fn precedence_annotation_then_state_then_random() {
        let s = dir("prec");
        let a: VtepMac = "02:aa:00:00:00:01".parse().unwrap();
        let b: VtepMac = "02:bb:00:00:00:02".parse().unwrap();

        let (m, src) = choose::<Ipv4Net>(None, &s, &none()).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(m), "a generated MAC is saved");
        assert_eq!(choose::<Ipv4Net>(None, &s, &none()).unwrap(), (m, MacSource::StateDir), "and reused");

        s.save_mac(MAC_FILE, b).unwrap();
        assert_eq!(choose::<Ipv4Net>(Some(a), &s, &none()).unwrap(), (a, MacSource::Published));
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(a), "the MAC in use is always saved");
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn the_ipv6_mac_follows_the_same_precedence_apart_from_the_ipv4_one() {
        let s = dir("prec6");
        let a: VtepMac = "02:aa:00:00:00:06".parse().unwrap();
        let (m4, _) = choose::<Ipv4Net>(None, &s, &none()).unwrap();
        let (m6, src) = choose::<Ipv6Net>(None, &s, &none()).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_ne!(m4, m6, "one random MAC per device, as flannel draws them");
        assert_eq!((s.load_mac(MAC_FILE).unwrap(), s.load_mac(MAC6_FILE).unwrap()), (Some(m4), Some(m6)));
        assert_eq!(choose::<Ipv6Net>(None, &s, &none()).unwrap(), (m6, MacSource::StateDir));
        assert_eq!(choose::<Ipv6Net>(Some(a), &s, &none()).unwrap(), (a, MacSource::Published));
        assert_eq!((s.load_mac(MAC_FILE).unwrap(), s.load_mac(MAC6_FILE).unwrap()), (Some(m4), Some(a)));
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn a_candidate_writes_nothing_and_becomes_ours_when_bring_up_finds_it_published() {
        let s = dir("cand");
        let c = candidate::<Ipv4Net>(&s, &none()).unwrap();
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), None, "a candidate is not saved");
        assert_eq!(choose::<Ipv4Net>(Some(c), &s, &none()).unwrap(), (c, MacSource::Published));
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(c), "bring-up saves it");
        assert_eq!(candidate::<Ipv4Net>(&s, &none()).unwrap(), c, "and the next run offers the saved one");
        assert_eq!(s.load_mac(MAC6_FILE).unwrap(), None);
        let c6 = candidate::<Ipv6Net>(&s, &none()).unwrap();
        assert_ne!(c6, c, "the IPv6 VTEP's candidate is drawn apart");
        assert_eq!(s.load_mac(MAC6_FILE).unwrap(), None);
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn a_mac_another_node_publishes_is_never_taken_from_the_state_dir_or_our_node() {
        let s = dir("others");
        let theirs: VtepMac = "02:cc:00:00:00:01".parse().unwrap();
        let mut others = none();
        others.insert(theirs, "node-a".into());
        s.save_mac(MAC_FILE, theirs).unwrap();
        let (m, src) = choose::<Ipv4Net>(None, &s, &others).unwrap();
        assert_ne!(m, theirs, "the copied MAC was kept");
        assert_eq!(src, MacSource::Generated);
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(m), "the new one is saved");
        // a clone that already published the copied MAC as its own
        let (m2, src) = choose::<Ipv4Net>(Some(theirs), &s, &others).unwrap();
        assert_eq!((m2, src), (m, MacSource::StateDir), "the saved, unshared one is used");
        s.save_mac(MAC_FILE, theirs).unwrap();
        assert_ne!(candidate::<Ipv4Net>(&s, &others).unwrap(), theirs);
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn a_new_mac_the_state_dir_cannot_take_is_used_anyway() {
        let s = dir("unsaved");
        fs::create_dir_all(&s.0).unwrap();
        // a state dir of another user is refused for writing (the unit tests run as root)
        std::os::unix::fs::chown(&s.0, Some(65534), None).unwrap();
        let (m, src) = choose::<Ipv6Net>(None, &s, &none()).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_eq!(s.load_mac(MAC6_FILE).unwrap(), None, "{m} could not be saved");
        fs::remove_dir_all(&s.0).unwrap();
    }
}
