//! Pod identity: which pod (namespace/name) an address belongs to, so the
//! pod gets it back under a new sandbox.
//!
//! One JSON record per address in `.edgevx/pods/<address>`, so the file
//! name is at most 39 bytes whatever the pod's name (253-character names
//! and 63-character namespaces are content, far from NAME_MAX). host-local
//! walks into this directory when it releases but never matches a record
//! (its content is JSON, never a container ID) and never returns one (it
//! only parses names of files that matched).
//!
//! A record is *live* while its attachment holds the address's reservation
//! file, and *retained* once released (`releasedAtNs`): the address then
//! waits for the pod for `retain`, and goes to others only when nothing
//! else is free. OpenYurt's patched host-local kept the same fact as empty
//! files `<ip>_<namespace>_<pod>` beside the reservations; [`migrate_openyurt`]
//! turns them into records.
//!
//! A pod keeps one address per interface and range set: a record names the
//! attachment (container ID and interface) that holds its address, and a
//! new sandbox of the pod gets back, on each interface, the address the
//! pod had on that interface. A record with an empty interface (earlier
//! versions wrote one when they migrated an unreserved OpenYurt marker) or
//! none is the pod's [`LEGACY_IFNAME`].
//!
//! A damaged record (a regular file cut short, empty, NUL-filled or not
//! JSON, as a power cut leaves one) is repaired or released under the
//! lock, with a warning naming the file ([`repair`]): repaired when its
//! pod can still be read ([`crate::salvage`]), the missing fields taken
//! from the address's reservation; else released, its bytes moved to
//! `.edgevx/damaged/` (never deleted), so the address is free again or
//! held only by its reservation, as host-local's are.
//!
//! A record that is not a regular file ([`crate::entry`]: a FIFO, a
//! directory, a link, too long) is skipped with a warning and left as it
//! is. Its address, told by its name, stays out of use
//! ([`Records::unreadable`]): no crash makes one, and handing its address
//! to another pod could put two pods on one address, while keeping it
//! costs one address until an operator removes the entry. A name that is
//! not an address ties no address up and is only reported.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    net::IpAddr,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::{
    entry,
    holder::{Holder, LEGACY_IFNAME, ifname_or_legacy},
    store::{PODS_DIR, Store, StoreError},
};

/// A Kubernetes pod, as CNI_ARGS names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whose an address is, and since when it waits for its pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub pod: PodRef,
    /// The attachment that last held the address.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Read through [`PodRecord::ifname`]: may be empty in old records.
    #[serde(default)]
    pub ifname: String,
    /// While a new sandbox takes the address over from the pod's previous
    /// one: that one's ID, so a crash between the two writes of the
    /// takeover still finds the address the pod's.
    #[serde(default, rename = "previousContainerID", skip_serializing_if = "Option::is_none")]
    pub previous_container_id: Option<String>,
    /// When the attachment was released (DEL or GC); None while live.
    pub released_at_ns: Option<u64>,
}

pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl PodRecord {
    /// The interface the address is the pod's on.
    pub fn ifname(&self) -> &str {
        ifname_or_legacy(&self.ifname)
    }

    /// Released longer than `retain` ago.
    pub fn expired(&self, retain: Duration, now: u64) -> bool {
        let retain = u64::try_from(retain.as_nanos()).unwrap_or(u64::MAX);
        self.released_at_ns.is_some_and(|at| now.saturating_sub(at) >= retain)
    }
}

/// The pod records, as far as they can be read.
#[derive(Debug, Default)]
pub struct Records {
    pub by_ip: BTreeMap<IpAddr, PodRecord>,
    /// Addresses whose record could not be read: out of use, and never
    /// rewritten or removed here (see the module's doc). Damaged records
    /// are here too until [`repair`] handles them.
    pub unreadable: BTreeSet<IpAddr>,
    /// Regular files that are not records (cut short, empty, garbage):
    /// what [`repair`] repairs or releases.
    pub damaged: Vec<Damaged>,
}

/// A pod record file that is a regular file but not a record.
#[derive(Debug)]
pub struct Damaged {
    pub ip: IpAddr,
    pub path: std::path::PathBuf,
    pub bytes: Vec<u8>,
}

/// Where released damaged records are kept, relative to the store.
pub const DAMAGED_DIR: &str = ".edgevx/damaged";

/// Every record. Only a failure to list the directory itself is an error.
pub fn load(store: &Store) -> Result<Records, StoreError> {
    let dir = store.dir().join(PODS_DIR);
    let mut out = Records::default();
    let entries = match fs::read_dir(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        r => r.map_err(|source| StoreError::Io { path: dir.clone(), source })?,
    };
    for entry in entries {
        let path = entry.map_err(|source| StoreError::Io { path: dir.clone(), source })?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match name.parse::<IpAddr>() {
            Ok(ip) if ip.to_string() == name => out.read_into(ip, &path),
            // a name this plugin would not write, but an address all the same
            Ok(ip) => {
                entry::warn(&path, format_args!("not named as {ip} is"), out_of_use(ip));
                out.unreadable.insert(ip);
            }
            Err(_) => entry::warn(&path, "not named by an IP address", "no address is tied to it"),
        }
    }
    Ok(out)
}

/// Only the records of `ips` (DEL needs no others).
pub fn load_some(store: &Store, ips: &[IpAddr]) -> Records {
    let dir = store.dir().join(PODS_DIR);
    let mut out = Records::default();
    for ip in ips {
        out.read_into(*ip, &dir.join(ip.to_string()));
    }
    out
}

impl Records {
    fn read_into(&mut self, ip: IpAddr, path: &Path) {
        let bytes = match entry::read(path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return,
            Err(why) => {
                entry::warn(path, why, out_of_use(ip));
                self.unreadable.insert(ip);
                return;
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(record) => {
                self.by_ip.insert(ip, record);
            }
            // out of use until repair() (under the lock) repairs or releases it
            Err(_) => {
                self.unreadable.insert(ip);
                self.damaged.push(Damaged { ip, path: path.to_path_buf(), bytes });
            }
        }
    }
}

/// Repairs or releases each damaged record (see the module's doc), staged
/// for [`Store::commit`], each with a warning naming its file. Only under
/// the store's lock (ADD, GC).
pub fn repair(store: &Store, records: &mut Records, reservations: &BTreeMap<IpAddr, Holder>) -> Result<(), StoreError> {
    for d in std::mem::take(&mut records.damaged) {
        let holder = reservations.get(&d.ip);
        let what = match d.bytes.iter().all(|&b| b == 0) {
            true if d.bytes.is_empty() => "empty",
            true => "NUL-filled",
            false => "not a whole pod record",
        };
        match crate::salvage::salvage(&d.bytes) {
            Some(mut r) => {
                // what was cut off: the reservation says who holds the address now
                if let Some(h @ Holder::Attachment { container_id, .. }) = holder {
                    if r.container_id.is_empty() {
                        r.container_id = container_id.clone();
                    }
                    if r.ifname.is_empty() {
                        r.ifname = h.ifname().unwrap_or(LEGACY_IFNAME).to_string();
                    }
                }
                save(store, d.ip, &r, "repair-record")?;
                entry::warn(
                    &d.path,
                    what,
                    format_args!("repaired: {} stays pod {}'s ({} bytes were readable)", d.ip, r.pod, d.bytes.len()),
                );
                records.by_ip.insert(d.ip, r);
            }
            None => {
                let dir = store.dir().join(DAMAGED_DIR);
                fs::create_dir_all(&dir).map_err(|source| StoreError::Io { path: dir.clone(), source })?;
                let kept = format!("{}.{}", d.ip, now_ns());
                store.write_own(DAMAGED_DIR, &kept, &d.bytes, "keep-damaged-record")?;
                // staged after the copy, so the copy is placed first
                remove(store, d.ip);
                let outcome = match holder {
                    Some(_) => format!("released: nothing says whose pod {} was; its reservation stays", d.ip),
                    None => format!("released: nothing says whose pod {} was; it is free again", d.ip),
                };
                entry::warn(&d.path, what, format_args!("{outcome} (its bytes kept as {DAMAGED_DIR}/{kept})"));
            }
        }
        records.unreadable.remove(&d.ip);
    }
    Ok(())
}

fn out_of_use(ip: IpAddr) -> String {
    format!("{ip} is given to no pod until the file is removed")
}

/// Stages writing `ip`'s record; `step` names the moment after it for the crash hook.
pub fn save(store: &Store, ip: IpAddr, record: &PodRecord, step: &'static str) -> Result<(), StoreError> {
    let json = serde_json::to_vec(record).map_err(|e| StoreError::Corrupt {
        path: store.dir().join(PODS_DIR).join(ip.to_string()),
        why: format!("cannot encode: {e}"),
    })?;
    store.write_own(PODS_DIR, &ip.to_string(), &json, step)
}

/// Stages writing `ip`'s record if it can be (see [`Store::write_own_if_possible`]).
pub fn save_if_possible(store: &Store, ip: IpAddr, record: &PodRecord, step: &'static str) {
    match serde_json::to_vec(record) {
        Ok(json) => store.write_own_if_possible(PODS_DIR, &ip.to_string(), &json, step),
        Err(e) => eprintln!("edgevx-ipam: warning: cannot encode the record of {ip}: {e}"),
    }
}

pub fn remove(store: &Store, ip: IpAddr) {
    store.remove_own(PODS_DIR, &ip.to_string(), "forget-record");
}

/// An OpenYurt marker `<ip>_<namespace>_<pod>`: Kubernetes names have no
/// '_', so the split is unambiguous (the patch accepts exactly two).
pub fn parse_openyurt_marker(name: &str) -> Option<(IpAddr, PodRef)> {
    let mut parts = name.split('_');
    let (ip, ns, pod) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || ns.is_empty() || pod.is_empty() {
        return None;
    }
    Some((ip.parse().ok()?, PodRef { namespace: ns.to_string(), name: pod.to_string() }))
}

/// Turns OpenYurt markers into records, then removes them. A marker whose
/// address is still reserved becomes a live record of that holder (so the
/// pod's next sandbox takes the address over when the old DEL never
/// comes); otherwise it is retained from now. The patched host-local wrote
/// markers only for the pod's network interface, [`LEGACY_IFNAME`]. A
/// marker that is not a file, or whose address has an unreadable record,
/// is left as it is (removing it, or writing over the record, would lose
/// what it says). Returns what it migrated.
pub fn migrate_openyurt(
    store: &Store,
    records: &mut Records,
    reservations: &BTreeMap<IpAddr, Holder>,
) -> Result<Vec<(IpAddr, PodRef)>, StoreError> {
    let mut migrated = Vec::new();
    for name in store.other_names()? {
        let Some((ip, pod)) = parse_openyurt_marker(&name) else { continue };
        let path = store.dir().join(&name);
        if !fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
            entry::warn(&path, "an OpenYurt marker that is not a regular file", "not migrated");
            continue;
        }
        if records.unreadable.contains(&ip) {
            entry::warn(
                &path,
                format_args!("the record of {ip} cannot be read"),
                "the OpenYurt marker is not migrated",
            );
            continue;
        }
        if let std::collections::btree_map::Entry::Vacant(slot) = records.by_ip.entry(ip) {
            let record = match reservations.get(&ip) {
                Some(holder @ Holder::Attachment { container_id, .. }) => PodRecord {
                    pod: pod.clone(),
                    container_id: container_id.clone(),
                    ifname: holder.ifname().unwrap_or(LEGACY_IFNAME).to_string(),
                    previous_container_id: None,
                    released_at_ns: None,
                },
                _ => PodRecord {
                    pod: pod.clone(),
                    container_id: String::new(),
                    ifname: LEGACY_IFNAME.to_string(),
                    previous_container_id: None,
                    released_at_ns: Some(now_ns()),
                },
            };
            save(store, ip, &record, "migrate-record")?;
            slot.insert(record);
        }
        // staged after the record, so the record is placed first
        store.remove_name(&name, "migrate-marker");
        migrated.push((ip, pod));
    }
    Ok(migrated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openyurt_markers_parse() {
        let (ip, pod) = parse_openyurt_marker("172.30.132.194_kube-system_coredns-vstxh").unwrap();
        assert_eq!(ip.to_string(), "172.30.132.194");
        assert_eq!(pod, PodRef { namespace: "kube-system".into(), name: "coredns-vstxh".into() });
        assert!(parse_openyurt_marker("fd00::5_default_web-0").is_some());
        assert!(parse_openyurt_marker("10.0.0.1_a_b_c").is_none());
        assert!(parse_openyurt_marker("last_reserved_ip.0").is_none());
        assert!(parse_openyurt_marker("10.0.0.1__b").is_none());
    }

    #[test]
    fn expiry_counts_from_release() {
        let r = PodRecord {
            pod: PodRef { namespace: "ns".into(), name: "p".into() },
            container_id: "c".into(),
            ifname: "eth0".into(),
            previous_container_id: None,
            released_at_ns: Some(1_000),
        };
        assert!(!r.expired(Duration::from_nanos(500), 1_400));
        assert!(r.expired(Duration::from_nanos(500), 1_500));
        assert!(r.expired(Duration::ZERO, 1_000));
        let live = PodRecord { released_at_ns: None, ..r };
        assert!(!live.expired(Duration::ZERO, u64::MAX));
    }

    #[test]
    fn a_record_without_an_interface_is_eth0s() {
        let old = r#"{"pod":{"namespace":"ns","name":"p"},"containerID":"c","releasedAtNs":null}"#;
        let r: PodRecord = serde_json::from_str(old).unwrap();
        assert_eq!(r.ifname(), "eth0");
        let migrated = r#"{"pod":{"namespace":"ns","name":"p"},"containerID":"","ifname":"","releasedAtNs":5}"#;
        assert_eq!(serde_json::from_str::<PodRecord>(migrated).unwrap().ifname(), "eth0");
        let net1 = r#"{"pod":{"namespace":"ns","name":"p"},"containerID":"c","ifname":"net1","releasedAtNs":null}"#;
        assert_eq!(serde_json::from_str::<PodRecord>(net1).unwrap().ifname(), "net1");
    }

    #[test]
    fn unreadable_records_are_skipped_and_their_addresses_kept() {
        let dir = std::env::temp_dir().join(format!("edgevx-ipam-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = Store::open_locked(&dir).unwrap();
        let pods = dir.join(PODS_DIR);
        let good = PodRecord {
            pod: PodRef { namespace: "ns".into(), name: "p".into() },
            container_id: "c".into(),
            ifname: "eth0".into(),
            previous_container_id: None,
            released_at_ns: None,
        };
        fs::write(pods.join("10.0.0.2"), serde_json::to_vec(&good).unwrap()).unwrap();
        fs::write(pods.join("10.0.0.3"), r#"{"pod":{"namespace":"ns","na"#).unwrap();
        fs::create_dir(pods.join("10.0.0.4")).unwrap();
        fs::write(pods.join("notes.txt"), "hello").unwrap();
        fs::write(pods.join("fd00:0::5"), "{}").unwrap();
        let r = load(&store).unwrap();
        assert_eq!(r.by_ip.len(), 1);
        assert_eq!(r.by_ip[&"10.0.0.2".parse().unwrap()], good);
        let unreadable: Vec<String> = r.unreadable.iter().map(ToString::to_string).collect();
        assert_eq!(unreadable, ["10.0.0.3", "10.0.0.4", "fd00::5"]);
        let some = load_some(&store, &["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()]);
        assert_eq!(some.by_ip.len(), 1);
        assert!(some.unreadable.contains(&"10.0.0.3".parse().unwrap()));
        for name in ["10.0.0.3", "10.0.0.4", "notes.txt", "fd00:0::5"] {
            assert!(pods.join(name).exists(), "{name} was removed");
        }
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn record_json_is_never_a_host_local_match() {
        let r = PodRecord {
            pod: PodRef { namespace: "ns".into(), name: "p".into() },
            container_id: "c".into(),
            ifname: "eth0".into(),
            previous_container_id: None,
            released_at_ns: None,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.starts_with('{'), "{text}");
        assert!(!Holder::parse(&text).is("c", "eth0"));
    }
}
