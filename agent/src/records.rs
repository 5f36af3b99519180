//! The records that exist only for `edgevx status` and the next start
//! (agent.json, peers.json, the capacity and start-up figures) are best
//! effort: a full or read-only state filesystem must never stop forwarding.
//! A record the state dir cannot take is written under /run instead
//! ([`runtime_dir`], a tmpfs, like flanneld's subnet.env), said once, and
//! readers take the newer of the two copies. Only a new VTEP MAC must reach
//! the state dir (`vtep_mac.rs` says loudly when it cannot).
use std::{
    collections::HashSet,
    path::{Component, Path, PathBuf},
    sync::{Mutex, PoisonError},
};

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::state::{STATE_DIR_MODE, STATE_FILE_MODE, StateDir, ensure_dir, write_atomic};

/// Where a state dir's records go when it cannot take them: the state
/// dir's absolute path below this (`/var/lib/edgevx` →
/// `/run/edgevx/state/var/lib/edgevx`), so two state dirs never share one.
pub const RUNTIME_BASE: &str = "/run/edgevx/state";

/// The runtime twin of `state_dir` (see [`RUNTIME_BASE`]).
pub fn runtime_dir(state_dir: &Path) -> PathBuf {
    let abs = if state_dir.is_absolute() {
        state_dir.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(state_dir)
    };
    let below: PathBuf = abs.components().filter(|c| matches!(c, Component::Normal(_))).collect();
    Path::new(RUNTIME_BASE).join(below)
}

/// The records whose fall-back has been said (once each, until the state
/// dir takes them again).
static FELL_BACK: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Notes that `name` fell back (`true`: the first time, say it).
fn first_fall_back(name: &str, fell: bool) -> bool {
    let mut g = FELL_BACK.lock().unwrap_or_else(PoisonError::into_inner);
    let set = g.get_or_insert_with(HashSet::new);
    if fell { set.insert(name.to_string()) } else { set.remove(name) }
}

impl StateDir {
    /// This state dir's runtime twin under [`RUNTIME_BASE`].
    pub fn runtime(&self) -> StateDir {
        StateDir(runtime_dir(&self.0))
    }

    /// Saves a record for `status` and the next start: in the state dir,
    /// else (full, read-only) under /run, said once. `false` when neither
    /// takes it (said once too); the caller goes on either way.
    pub fn save_record<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> bool {
        let mut data = match serde_json::to_vec_pretty(value) {
            Ok(d) => d,
            Err(e) => {
                warn!("cannot encode {name}: {e}");
                return false;
            }
        };
        data.push(b'\n');
        let run = self.runtime();
        let e = match self.write(name, &data) {
            Ok(()) => {
                // the state dir's copy is the newer now; a stale one under /run must not win
                let _ = std::fs::remove_file(run.path(name));
                if first_fall_back(name, false) {
                    info!(file = %self.path(name).display(), "the state dir takes this record again");
                }
                return true;
            }
            Err(e) => e,
        };
        let saved =
            ensure_dir(&run.0, STATE_DIR_MODE).and_then(|()| write_atomic(&run.path(name), &data, STATE_FILE_MODE));
        let first = first_fall_back(name, true);
        match &saved {
            Ok(()) if first => warn!(
                file = %self.path(name).display(), instead = %run.path(name).display(),
                "cannot write a record for edgevx status ({e}); keeping it under /run while the state dir \
                 cannot take it (forwarding is not affected)"
            ),
            Err(e2) if first => warn!(
                file = %self.path(name).display(),
                "cannot write a record for edgevx status ({e}), nor under /run ({e2}); forwarding is not \
                 affected, edgevx status may show an older one"
            ),
            _ => {}
        }
        saved.is_ok()
    }

    /// A record as [`save_record`](Self::save_record) left it: the newer of
    /// the state dir's copy and the one under /run.
    pub fn load_record<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Result<Option<T>> {
        let run = self.runtime();
        let modified = |d: &StateDir| std::fs::symlink_metadata(d.path(name)).and_then(|m| m.modified()).ok();
        match (modified(self), modified(&run)) {
            (_, None) => self.load_json(name),
            (Some(s), Some(r)) if s > r => self.load_json(name),
            (_, Some(_)) => run.load_json(name).or_else(|e| {
                warn!("{e:#}; reading the state dir's copy");
                self.load_json(name)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_twin_mirrors_the_absolute_path() {
        assert_eq!(runtime_dir(Path::new("/var/lib/edgevx")), Path::new("/run/edgevx/state/var/lib/edgevx"));
        assert_eq!(runtime_dir(Path::new("/a/../b")), Path::new("/run/edgevx/state/a/b"));
        assert!(runtime_dir(Path::new("rel")).starts_with(RUNTIME_BASE));
    }

    #[test]
    fn a_fall_back_is_said_once_until_it_clears() {
        assert!(first_fall_back("unit-x", true));
        assert!(!first_fall_back("unit-x", true));
        assert!(first_fall_back("unit-x", false));
        assert!(!first_fall_back("unit-x", false));
    }
}
