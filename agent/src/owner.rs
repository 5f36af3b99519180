//! Whose state dir this is. A state dir records the node it belongs to
//! (`owner.json`: the node name, and `/etc/machine-id` where the host has
//! one), so one copied from another node (a golden image, a cloned VM, a
//! moved disk) is not used: its subnet would go into subnet.env while the
//! control plane is away, and its VTEP MAC would be published as ours.
//! Such a state dir is moved aside, whole, into a dated subdirectory
//! (never deleted), and the node starts clean, saying both identities.
//!
//! - [`examine`] only reads (from `run`'s checks, before anything changes);
//! - [`settle`] acts on the verdict once the agent holds the lock.
//!
//! A state dir with content but no record was written by an older edgevx:
//! it is adopted and stamped, and the log says so.
use std::{
    fs, io,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use crate::{
    cache::VIEW_FILE,
    run::lock::LOCK_FILE,
    state::{AGENT_FILE, MAC_FILE, MAC6_FILE, PEERS_FILE, STATE_DIR_MODE, StateDir, ensure_dir},
};

pub const OWNER_FILE: &str = "owner.json";
/// The host's identity (systemd, dbus): survives renames, differs between
/// clones that were prepared properly.
pub const MACHINE_ID_FILE: &str = "/etc/machine-id";
/// What the subdirectories a foreign state dir is moved into start with.
pub const ASIDE_PREFIX: &str = "other-node.";

/// A node's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub node: String,
    /// `/etc/machine-id`, when the host has a well-formed one.
    #[serde(default)]
    pub machine_id: Option<String>,
}

impl Owner {
    /// This host as node `node`.
    pub fn this_host(node: &str) -> Owner {
        Owner { node: node.to_string(), machine_id: machine_id(Path::new(MACHINE_ID_FILE)) }
    }

    /// Whether a state dir stamped `self` belongs to `me`: the node name
    /// must match, and the machine ids where both are known.
    fn is(&self, me: &Owner) -> bool {
        self.node == me.node
            && match (&self.machine_id, &me.machine_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // {:?}: names read from a file are quoted and escaped, never raw log text
        write!(f, "node {:?}", self.node)?;
        match &self.machine_id {
            Some(id) => write!(f, " (machine-id {id})"),
            None => write!(f, " (no machine-id)"),
        }
    }
}

/// `path`'s machine id: 32 hex digits, else `None` (missing, empty or
/// "uninitialized" as in an image before its first boot).
pub fn machine_id(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let id = text.trim();
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// What the state dir is to this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Missing or empty: stamped when first written.
    Fresh,
    /// Ours.
    Ours(Owner),
    /// Content but no record (an older edgevx), or a damaged record: adopted and stamped.
    Unstamped { damaged: Option<String> },
    /// Another node's: not used.
    Foreign(Owner),
}

impl Verdict {
    /// Whether what the state dir holds may be used by this node.
    pub fn usable(&self) -> bool {
        !matches!(self, Verdict::Foreign(_))
    }
}

/// Reads the state dir's owner record; changes nothing.
pub fn examine(state: &StateDir, me: &Owner) -> Verdict {
    let recorded: Option<Owner> = match state.load_json(OWNER_FILE) {
        Ok(o) => o,
        Err(e) => return Verdict::Unstamped { damaged: Some(format!("{e:#}")) },
    };
    match recorded {
        Some(o) if o.is(me) => Verdict::Ours(o),
        Some(o) => Verdict::Foreign(o),
        None if has_content(state) => Verdict::Unstamped { damaged: None },
        None => Verdict::Fresh,
    }
}

fn has_content(state: &StateDir) -> bool {
    [MAC_FILE, MAC6_FILE, AGENT_FILE, PEERS_FILE, VIEW_FILE].iter().any(|f| state.path(f).exists())
}

/// Acts on `verdict` (the lock held): stamps a fresh, unstamped or our own
/// state dir (adding a machine id it lacked), or moves another node's
/// aside. Returns the state dir to use: `state`, or, when another node's
/// cannot be moved aside (a read-only filesystem), a clean one under /run,
/// said loudly (its MAC does not survive a reboot). Stamping is best
/// effort: a state dir that cannot take it is still ours.
pub fn settle(state: StateDir, me: &Owner, verdict: Verdict) -> StateDir {
    match verdict {
        Verdict::Fresh => stamp(&state, me),
        Verdict::Ours(o) => {
            if o.machine_id.is_none() && me.machine_id.is_some() {
                info!(dir = %state.0.display(), "recording this host's machine-id in the state dir");
                stamp(&state, me);
            }
        }
        Verdict::Unstamped { damaged: None } => {
            info!(dir = %state.0.display(), owner = %me,
                "the state dir has no owner record (written by an older edgevx): adopting it as this node's");
            stamp(&state, me);
        }
        Verdict::Unstamped { damaged: Some(e) } => {
            warn!(dir = %state.0.display(), owner = %me,
                "the state dir's owner record is unreadable ({e}); adopting the state dir as this node's");
            stamp(&state, me);
        }
        Verdict::Foreign(other) => return move_aside(state, me, &other),
    }
    state
}

fn stamp(state: &StateDir, me: &Owner) {
    if let Err(e) = state.save_json(OWNER_FILE, me) {
        warn!("cannot record this node in the state dir ({e:#}); tried again at the next start");
    }
}

fn move_aside(state: StateDir, me: &Owner, other: &Owner) -> StateDir {
    let aside = state.path(&format!("{ASIDE_PREFIX}{}.{}", file_part(&other.node), utc_stamp(SystemTime::now())));
    match move_entries(&state.0, &aside) {
        Ok(()) => {
            error!(dir = %state.0.display(), belongs_to = %other, this_node = %me, moved_to = %aside.display(),
                "the state dir belongs to another node (copied from it: a golden image, a cloned VM, a moved \
                 disk?); not using it: moved its files aside, untouched, and starting clean (a new VTEP MAC, \
                 the subnet from the control plane)");
            stamp(&state, me);
            state
        }
        Err(e) => {
            let run = state.runtime();
            let clean = ensure_dir(&run.0, STATE_DIR_MODE).is_ok()
                && fs::read_dir(&run.0).is_ok_and(|mut d| d.next().is_none());
            error!(dir = %state.0.display(), belongs_to = %other, this_node = %me, instead = %run.0.display(),
                clean,
                "the state dir belongs to another node (copied from it: a golden image, a cloned VM, a moved \
                 disk?) and cannot be moved aside ({e}); not using it: this run keeps its state under /run, so \
                 THE VTEP MAC WILL CHANGE AT THE NEXT BOOT unless the state dir is fixed (move its files away)");
            run
        }
    }
}

/// Moves every entry of `dir` but the lock and earlier set-asides into `aside`.
fn move_entries(dir: &Path, aside: &Path) -> io::Result<()> {
    fs::create_dir(aside)?;
    fs::set_permissions(aside, std::os::unix::fs::PermissionsExt::from_mode(STATE_DIR_MODE))?;
    for e in fs::read_dir(dir)? {
        let name = e?.file_name();
        let s = name.to_string_lossy();
        if s == LOCK_FILE || s.starts_with(ASIDE_PREFIX) {
            continue;
        }
        fs::rename(dir.join(&name), aside.join(&name))?;
    }
    // the moves reach the disk before anything new is written beside them
    fs::File::open(dir).and_then(|d| d.sync_all())
}

/// A node name as part of a file name: DNS-label characters, at most 63.
fn file_part(node: &str) -> String {
    let s: String = node
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .take(63)
        .collect();
    if s.is_empty() || s.starts_with('.') { format!("_{s}") } else { s }
}

/// `2026-11-28T15-30-00Z`: sorts by time, no `:` (a file name).
fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn dir(tag: &str) -> StateDir {
        let d = std::env::temp_dir().join(format!("edgevx-unit-owner-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        StateDir(d)
    }

    fn me(node: &str, id: Option<&str>) -> Owner {
        Owner { node: node.into(), machine_id: id.map(Into::into) }
    }

    #[test]
    fn dates_are_utc_and_sortable() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "1970-01-01T00-00-00Z");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(1_795_793_400)), "2026-11-27T15-30-00Z");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00-00-00Z");
    }

    #[test]
    fn machine_ids_are_read_only_when_well_formed() {
        let d = dir("mid");
        fs::create_dir_all(&d.0).unwrap();
        let f = d.path("machine-id");
        fs::write(&f, "0123456789ABCDEF0123456789abcdef\n").unwrap();
        assert_eq!(machine_id(&f).as_deref(), Some("0123456789abcdef0123456789abcdef"));
        for bad in ["", "uninitialized\n", "0123"] {
            fs::write(&f, bad).unwrap();
            assert_eq!(machine_id(&f), None, "{bad:?}");
        }
        assert_eq!(machine_id(&d.path("none")), None);
        fs::remove_dir_all(&d.0).unwrap();
    }

    #[test]
    fn a_state_dir_is_ours_by_name_and_by_machine_id_where_both_are_known() {
        let a = me("node-1", Some("aa"));
        assert!(a.is(&me("node-1", Some("aa"))));
        assert!(a.is(&me("node-1", None)), "a host without a machine-id cannot tell");
        assert!(me("node-1", None).is(&a));
        assert!(!a.is(&me("node-2", Some("aa"))), "a clone with the same machine-id and another name");
        assert!(!a.is(&me("node-1", Some("bb"))), "a disk moved to another host of the same name");
    }

    #[test]
    fn another_nodes_state_dir_is_moved_aside_whole_and_ours_is_stamped() {
        let s = dir("aside");
        let (a, b) = (me("node-a", Some("aa")), me("node-b", Some("bb")));
        assert_eq!(examine(&s, &b), Verdict::Fresh);
        s.save_mac(MAC_FILE, "02:00:00:00:00:0a".parse().unwrap()).unwrap();
        assert_eq!(examine(&s, &b), Verdict::Unstamped { damaged: None });
        s.save_json(OWNER_FILE, &a).unwrap();
        fs::write(s.path(LOCK_FILE), "1\n").unwrap();
        assert_eq!(examine(&s, &a), Verdict::Ours(a.clone()));
        let v = examine(&s, &b);
        assert_eq!(v, Verdict::Foreign(a.clone()));
        assert!(!v.usable());
        let used = settle(s.clone(), &b, v);
        assert_eq!(used.0, s.0, "moved aside in place");
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), None, "the other node's MAC is not used");
        assert_eq!(examine(&s, &b), Verdict::Ours(b.clone()), "stamped for this node");
        assert!(s.path(LOCK_FILE).exists(), "the lock stays");
        let aside: Vec<_> = fs::read_dir(&s.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("other-node.node-a."))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        let kept = StateDir(aside[0].clone());
        assert_eq!(kept.load_mac(MAC_FILE).unwrap(), Some("02:00:00:00:00:0a".parse().unwrap()), "nothing lost");
        assert_eq!(kept.load_json::<Owner>(OWNER_FILE).unwrap(), Some(a));
        fs::remove_dir_all(&s.0).unwrap();
    }

    #[test]
    fn a_damaged_record_is_adopted_with_a_warning_and_file_parts_are_tame() {
        let s = dir("damaged");
        fs::create_dir_all(&s.0).unwrap();
        fs::write(s.path(OWNER_FILE), "{not json").unwrap();
        assert!(matches!(examine(&s, &me("n", None)), Verdict::Unstamped { damaged: Some(_) }));
        assert_eq!(file_part("../x\ny"), "_.._x_y");
        assert_eq!(file_part(""), "_");
        fs::remove_dir_all(&s.0).unwrap();
    }
}
