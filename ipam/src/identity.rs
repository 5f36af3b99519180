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
use std::{
    collections::BTreeMap,
    fs, io,
    net::IpAddr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::store::{Holder, Store, StoreError};

/// Relative to the store's directory.
pub const PODS_DIR: &str = ".edgevx/pods";

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
    /// Released longer than `retain` ago.
    pub fn expired(&self, retain: Duration, now: u64) -> bool {
        let retain = u64::try_from(retain.as_nanos()).unwrap_or(u64::MAX);
        self.released_at_ns.is_some_and(|at| now.saturating_sub(at) >= retain)
    }
}

/// The records, by address.
pub fn load(store: &Store) -> Result<BTreeMap<IpAddr, PodRecord>, StoreError> {
    let dir = store.dir().join(PODS_DIR);
    let mut out = BTreeMap::new();
    let entries = match fs::read_dir(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        r => r.map_err(|source| StoreError::Io { path: dir.clone(), source })?,
    };
    for entry in entries {
        let path = entry.map_err(|source| StoreError::Io { path: dir.clone(), source })?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Ok(ip) = name.parse::<IpAddr>() else {
            return Err(StoreError::Corrupt { path, why: "not named by an IP address".into() });
        };
        if let Some(record) = read(&path)? {
            out.insert(ip, record);
        }
    }
    Ok(out)
}

/// Only the records of `ips` (DEL needs no others).
pub fn load_some(store: &Store, ips: &[IpAddr]) -> Result<BTreeMap<IpAddr, PodRecord>, StoreError> {
    let dir = store.dir().join(PODS_DIR);
    let mut out = BTreeMap::new();
    for ip in ips {
        if let Some(record) = read(&dir.join(ip.to_string()))? {
            out.insert(*ip, record);
        }
    }
    Ok(out)
}

fn read(path: &std::path::Path) -> Result<Option<PodRecord>, StoreError> {
    let bytes = match fs::read(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        r => r.map_err(|source| StoreError::Io { path: path.to_path_buf(), source })?,
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Corrupt { path: path.to_path_buf(), why: format!("not a pod record: {e}") })
}

/// Stages writing `ip`'s record; `step` names the moment after it for the crash hook.
pub fn save(store: &Store, ip: IpAddr, record: &PodRecord, step: &'static str) -> Result<(), StoreError> {
    let json = serde_json::to_vec(record).map_err(|e| StoreError::Corrupt {
        path: store.dir().join(PODS_DIR).join(ip.to_string()),
        why: format!("cannot encode: {e}"),
    })?;
    store.write_own(PODS_DIR, &ip.to_string(), &json, step)
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
/// comes); otherwise it is retained from now. Returns what it migrated.
pub fn migrate_openyurt(
    store: &Store,
    records: &mut BTreeMap<IpAddr, PodRecord>,
    reservations: &BTreeMap<IpAddr, Holder>,
) -> Result<Vec<(IpAddr, PodRef)>, StoreError> {
    let mut migrated = Vec::new();
    for name in store.other_names()? {
        let Some((ip, pod)) = parse_openyurt_marker(&name) else { continue };
        if let std::collections::btree_map::Entry::Vacant(slot) = records.entry(ip) {
            let record = match reservations.get(&ip) {
                Some(Holder::Attachment { container_id, ifname }) => PodRecord {
                    pod: pod.clone(),
                    container_id: container_id.clone(),
                    ifname: ifname.clone().unwrap_or_else(|| "eth0".into()),
                    previous_container_id: None,
                    released_at_ns: None,
                },
                _ => PodRecord {
                    pod: pod.clone(),
                    container_id: String::new(),
                    ifname: String::new(),
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
