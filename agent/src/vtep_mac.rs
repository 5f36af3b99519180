//! Which VTEP MAC this node uses. The first that exists wins:
//! 1. the VtepMAC our own Node publishes in `backend-data`;
//! 2. the MAC saved in the state dir;
//! 3. a new random one, saved (fsync + rename) before any device exists.
//!
//! Whatever is chosen is saved, so a reboot brings back the same MAC and
//! peers that never saw an update keep working. In dual-stack the IPv6
//! VTEP's MAC is chosen the same way from `backend-v6-data` and its own file.
use anyhow::{Context, Result};
use tracing::info;

use crate::{mac::VtepMac, state::StateDir};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacSource {
    Annotation,
    StateDir,
    Generated,
}

/// The MAC of `flannel.<VNI>`; `published` is the VtepMAC of our `backend-data`.
pub fn choose(published: Option<VtepMac>, state: &StateDir) -> Result<(VtepMac, MacSource)> {
    choose_for(Family::V4, published, state)
}

/// The MAC of `flannel-v6.<VNI>` (dual-stack), with the same precedence:
/// `published` is the VtepMAC of our `backend-v6-data`, the state file is
/// its own. flannel draws a separate MAC per device, and kernel flannel
/// peers only see a new one when the IPv4 half changes too, so this one
/// must be as stable as the IPv4 one.
pub fn choose_v6(published: Option<VtepMac>, state: &StateDir) -> Result<(VtepMac, MacSource)> {
    choose_for(Family::V6, published, state)
}

#[derive(Clone, Copy, Debug)]
enum Family {
    V4,
    V6,
}

fn choose_for(family: Family, published: Option<VtepMac>, state: &StateDir) -> Result<(VtepMac, MacSource)> {
    let saved = match family {
        Family::V4 => state.load_mac()?,
        Family::V6 => state.load_mac6()?,
    };
    let (mac, source) = match (published, saved) {
        (Some(m), _) => (m, MacSource::Annotation),
        (None, Some(m)) => (m, MacSource::StateDir),
        (None, None) => {
            (VtepMac::random().context("cannot read /dev/urandom for a new VTEP MAC")?, MacSource::Generated)
        }
    };
    if saved != Some(mac) {
        match family {
            Family::V4 => state.save_mac(mac),
            Family::V6 => state.save_mac6(mac),
        }
        .context("cannot save the VTEP MAC; refusing to use a MAC that would not survive a reboot")?;
    }
    info!(%mac, ?source, ?family, "VTEP MAC chosen");
    Ok((mac, source))
}

#[cfg(test)]
mod tests {
    use std::fs;

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

        let (m, src) = choose(None, &s).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_eq!(s.load_mac().unwrap(), Some(m), "a generated MAC is saved");
        assert_eq!(choose(None, &s).unwrap(), (m, MacSource::StateDir), "and reused");

        s.save_mac(b).unwrap();
        assert_eq!(choose(Some(a), &s).unwrap(), (a, MacSource::Annotation));
        assert_eq!(s.load_mac().unwrap(), Some(a), "the MAC in use is always saved");
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn the_ipv6_mac_follows_the_same_precedence_apart_from_the_ipv4_one() {
        let s = dir("prec6");
        let a: VtepMac = "02:aa:00:00:00:06".parse().unwrap();
        let (m4, _) = choose(None, &s).unwrap();
        let (m6, src) = choose_v6(None, &s).unwrap();
        assert_eq!(src, MacSource::Generated);
        assert_ne!(m4, m6, "one random MAC per device, as flannel draws them");
        assert_eq!((s.load_mac().unwrap(), s.load_mac6().unwrap()), (Some(m4), Some(m6)));
        assert_eq!(choose_v6(None, &s).unwrap(), (m6, MacSource::StateDir));
        assert_eq!(choose_v6(Some(a), &s).unwrap(), (a, MacSource::Annotation));
        assert_eq!((s.load_mac().unwrap(), s.load_mac6().unwrap()), (Some(m4), Some(a)));
        fs::remove_dir_all(&s.0).unwrap();
    }
}
