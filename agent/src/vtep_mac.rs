//! Which VTEP MAC this node uses. The first that exists wins:
//! 1. the VtepMAC our own Node publishes in `backend-data` (with etcd, our
//!    lease's);
//! 2. the MAC saved in the state dir;
//! 3. a new random one, saved (fsync + rename) before any device exists.
//!
//! Whatever is chosen is saved, so a reboot brings back the same MAC and
//! peers that never saw an update keep working. In dual-stack the IPv6
//! VTEP's MAC is chosen the same way from `backend-v6-data` and its own file.
//!
//! The choice is made once, at bring-up ([`choose`], from `run/plan.rs`).
//! The etcd source must write a MAC into a new lease before that, as
//! flannel's `AcquireLease` carries the device's: it publishes a
//! [`candidate`], read without writing, which bring-up then finds as our
//! published MAC and saves.
use anyhow::{Context, Result};
use tracing::info;

use crate::{
    family::Family,
    mac::VtepMac,
    state::{MAC_FILE, MAC6_FILE, StateDir},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacSource {
    /// Our own node's `backend-data` (or `backend-v6-data`), or our etcd
    /// lease's: a new lease publishes a [`candidate`] before bring-up.
    Published,
    StateDir,
    Generated,
}

/// The MAC of a family's VTEP (`flannel.<VNI>` or `flannel-v6.<VNI>`):
/// `published` is the VtepMAC of our `backend-data` (or
/// `backend-v6-data`; with etcd, our lease's), and each family's state file is its own. flannel
/// draws a separate MAC per device, and kernel flannel peers only see a
/// new IPv6 one when the IPv4 half changes too, so both must be as stable.
pub fn choose<N: Family>(published: Option<VtepMac>, state: &StateDir) -> Result<(VtepMac, MacSource)> {
    let file = mac_file::<N>();
    let saved = state.load_mac(file)?;
    let (mac, source) = match (published, saved) {
        (Some(m), _) => (m, MacSource::Published),
        (None, Some(m)) => (m, MacSource::StateDir),
        (None, None) => {
            (VtepMac::random().context("cannot read /dev/urandom for a new VTEP MAC")?, MacSource::Generated)
        }
    };
    if saved != Some(mac) {
        state
            .save_mac(file, mac)
            .context("cannot save the VTEP MAC; refusing to use a MAC that would not survive a reboot")?;
    }
    info!(%mac, ?source, ipv6 = N::V6, "VTEP MAC chosen");
    Ok((mac, source))
}

/// The MAC a source publishes for a family before bring-up has chosen one:
/// the saved one, else a new random one. Nothing is written; the MAC
/// becomes ours when [`choose`] finds it published.
pub fn candidate<N: Family>(state: &StateDir) -> Result<VtepMac> {
    match state.load_mac(mac_file::<N>())? {
        Some(saved) => Ok(saved),
        None => VtepMac::random().context("cannot read /dev/urandom for a new VTEP MAC"),
    }
}

fn mac_file<N: Family>() -> &'static str {
    if N::V6 { MAC6_FILE } else { MAC_FILE }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use ipnet::{Ipv4Net, Ipv6Net};

    use super::*;

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

        let (m, src) = choose::<Ipv4Net>(None, &s).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(m), "a generated MAC is saved");
        assert_eq!(choose::<Ipv4Net>(None, &s).unwrap(), (m, MacSource::StateDir), "and reused");

        s.save_mac(MAC_FILE, b).unwrap();
        assert_eq!(choose::<Ipv4Net>(Some(a), &s).unwrap(), (a, MacSource::Published));
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(a), "the MAC in use is always saved");
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn the_ipv6_mac_follows_the_same_precedence_apart_from_the_ipv4_one() {
        let s = dir("prec6");
        let a: VtepMac = "02:aa:00:00:00:06".parse().unwrap();
        let (m4, _) = choose::<Ipv4Net>(None, &s).unwrap();
        let (m6, src) = choose::<Ipv6Net>(None, &s).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_ne!(m4, m6, "one random MAC per device, as flannel draws them");
        assert_eq!((s.load_mac(MAC_FILE).unwrap(), s.load_mac(MAC6_FILE).unwrap()), (Some(m4), Some(m6)));
        assert_eq!(choose::<Ipv6Net>(None, &s).unwrap(), (m6, MacSource::StateDir));
        assert_eq!(choose::<Ipv6Net>(Some(a), &s).unwrap(), (a, MacSource::Published));
        assert_eq!((s.load_mac(MAC_FILE).unwrap(), s.load_mac(MAC6_FILE).unwrap()), (Some(m4), Some(a)));
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn a_candidate_writes_nothing_and_becomes_ours_when_bring_up_finds_it_published() {
        let s = dir("cand");
        let c = candidate::<Ipv4Net>(&s).unwrap();
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), None, "a candidate is not saved");
        assert_eq!(choose::<Ipv4Net>(Some(c), &s).unwrap(), (c, MacSource::Published));
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), Some(c), "bring-up saves it");
        assert_eq!(candidate::<Ipv4Net>(&s).unwrap(), c, "and the next run offers the saved one");
        assert_eq!(s.load_mac(MAC6_FILE).unwrap(), None);
        let c6 = candidate::<Ipv6Net>(&s).unwrap();
        assert_ne!(c6, c, "the IPv6 VTEP's candidate is drawn apart");
        assert_eq!(s.load_mac(MAC6_FILE).unwrap(), None);
        fs::remove_dir_all(&s.0).unwrap();
    }
}
