//! Which VTEP MAC this node uses. The first that exists wins:
//! 1. the VtepMAC our own Node publishes in `backend-data`;
//! 2. the MAC saved in the state dir;
//! 3. a new random one, saved (fsync + rename) before any device exists.
//!
//! Whatever is chosen is saved, so a reboot brings back the same MAC and
//! peers that never saw an update keep working.
use anyhow::{Context, Result};
use tracing::info;

use crate::{mac::VtepMac, state::StateDir};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacSource {
    Annotation,
    StateDir,
    Generated,
}

pub fn choose(published: Option<VtepMac>, state: &StateDir) -> Result<(VtepMac, MacSource)> {
    let saved = state.load_mac()?;
    let (mac, source) = match (published, saved) {
        (Some(m), _) => (m, MacSource::Annotation),
        (None, Some(m)) => (m, MacSource::StateDir),
        (None, None) => {
            (VtepMac::random().context("cannot read /dev/urandom for a new VTEP MAC")?, MacSource::Generated)
        }
    };
    if saved != Some(mac) {
        state
            .save_mac(mac)
            .context("cannot save the VTEP MAC; refusing to use a MAC that would not survive a reboot")?;
    }
    info!(%mac, ?source, "VTEP MAC chosen");
    Ok((mac, source))
}

// SHIM-DROP-BEFORE-MERGE
pub fn choose_v6(published: Option<VtepMac>, state: &StateDir) -> Result<(VtepMac, MacSource)> {
    choose(published, state)
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
}
