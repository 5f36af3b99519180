//! The network config on stdin, read as host-local reads it
//! (plugins/ipam/host-local/backend/allocator/config.go): the top-level
//! `name` (the store's directory), `cniVersion`, `ipam` with `ranges` (a
//! list of range sets), the older single `subnet`/`rangeStart`/`rangeEnd`/
//! `gateway` form (put first), `runtimeConfig.ipRanges` (put first too),
//! `routes`, `dataDir`, `resolvConf`; and this plugin's own `retain`.
//!
//! Under the flannel CNI plugin this is the bridge delegate's config:
//! flannel fills `ipam.ranges` from subnet.env and keeps every other key
//! of the conflist's `ipam` block (flannel-io/cni-plugin
//! flannel_linux.go `getDelegateIPAM`).
use std::{path::PathBuf, time::Duration};

use serde::Deserialize;
use thiserror::Error;

use crate::{
    range::{Range, RangeError, RangeSet},
    wire::{CniError, Code, Route, SUPPORTED_VERSIONS},
};

/// host-local's default (backend/disk/backend.go `defaultDataDir`).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// How long a released pod's address is kept for it by default.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("the network config is not valid JSON: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("cniVersion {0:?} is not supported (supported: {supported})", supported = SUPPORTED_VERSIONS.join(", "))]
    Version(String),
    #[error("network name {0:?} is not a CNI network name (alphanumeric, then alphanumerics, '_', '.', '-')")]
    Name(String),
    #[error("the config has no \"ipam\" object")]
    NoIpam,
    #[error("ipam has no ranges: give \"ranges\" or \"subnet\"")]
    NoRanges,
    #[error("ipam range set {index}: {source}")]
    Range { index: usize, source: RangeError },
    #[error("ipam range sets {0} and {1} overlap")]
    SetsOverlap(usize, usize),
    #[error("ipam.retain {0:?} is not a duration such as \"24h\", \"90m\" or \"0s\"")]
    Retain(String),
}

impl From<ConfigError> for CniError {
    fn from(e: ConfigError) -> Self {
        let code = match e {
            ConfigError::Decode(_) => Code::Decode,
            ConfigError::Version(_) => Code::IncompatibleVersion,
            _ => Code::InvalidConfig,
        };
        let msg = match code {
            Code::Decode => "cannot decode the network config",
            Code::IncompatibleVersion => "incompatible CNI version",
            _ => "invalid network config",
        };
        CniError::new(code, msg, e.to_string())
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RangeJson {
    #[serde(default)]
    subnet: String,
    range_start: Option<String>,
    range_end: Option<String>,
    gateway: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IpamJson {
    #[serde(default)]
    ranges: Vec<Vec<RangeJson>>,
    subnet: Option<String>,
    range_start: Option<String>,
    range_end: Option<String>,
    gateway: Option<String>,
    #[serde(default)]
    routes: Vec<Route>,
    data_dir: Option<PathBuf>,
    resolv_conf: Option<PathBuf>,
    retain: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RuntimeConfigJson {
    #[serde(default)]
    ip_ranges: Vec<Vec<RangeJson>>,
}

/// One attachment the runtime still holds (GC's valid list).
#[derive(Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetConfJson {
    cni_version: Option<String>,
    name: Option<String>,
    ipam: Option<IpamJson>,
    #[serde(default)]
    runtime_config: RuntimeConfigJson,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
    /// The key's name at the spec-v1.1.0 tag; libcni sends both.
    #[serde(rename = "cni.dev/attachments")]
    attachments: Option<Vec<Attachment>>,
}

/// What this plugin needs from the config, checked.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub data_dir: PathBuf,
    pub resolv_conf: Option<PathBuf>,
    pub retain: Duration,
    /// GC only: the attachments to keep.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// Only `cniVersion`, for VERSION and for the version of an error object.
pub fn version_of(stdin: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct V {
        cni_version: Option<String>,
    }
    serde_json::from_slice::<V>(stdin).ok().and_then(|v| v.cni_version)
}

/// A CNI network name (SPEC.md section 1): it becomes a directory name, so
/// anything else (`..`, `/`) is refused.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Go's `time.ParseDuration` for what a config needs: `1h30m`, `90s`, `0`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1000,
            "ms" => 1,
            _ => return None,
        };
        // a sum past Duration's range is refused, as Go refuses past int64 nanoseconds
        total = total.checked_add(Duration::from_millis(n.checked_mul(scale)?))?;
        rest = &rest[unit..];
    }
    Some(total)
}

fn range_set(index: usize, ranges: &[RangeJson]) -> Result<RangeSet, ConfigError> {
    let err = |source| ConfigError::Range { index, source };
    let ranges = ranges
        .iter()
        .map(|r| Range::new(&r.subnet, r.range_start.as_deref(), r.range_end.as_deref(), r.gateway.as_deref()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    if ranges.is_empty() {
        return Err(ConfigError::NoRanges);
    }
    RangeSet::new(ranges).map_err(err)
}

impl NetConf {
    pub fn parse(stdin: &[u8]) -> Result<Self, ConfigError> {
        let raw: NetConfJson = serde_json::from_slice(stdin)?;
        let cni_version = raw.cni_version.unwrap_or_default();
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(ConfigError::Version(cni_version));
        }
        let name = raw.name.unwrap_or_default();
        if !valid_name(&name) {
            return Err(ConfigError::Name(name));
        }
        let ipam = raw.ipam.ok_or(ConfigError::NoIpam)?;
        let mut sets: Vec<&[RangeJson]> = raw.runtime_config.ip_ranges.iter().map(Vec::as_slice).collect();
        let legacy = ipam.subnet.clone().map(|subnet| RangeJson {
            subnet,
            range_start: ipam.range_start.clone(),
            range_end: ipam.range_end.clone(),
            gateway: ipam.gateway.clone(),
        });
        let legacy = legacy.map(|l| vec![l]);
        sets.extend(legacy.as_deref());
        sets.extend(ipam.ranges.iter().map(Vec::as_slice));
        if sets.is_empty() {
            return Err(ConfigError::NoRanges);
        }
        let range_sets = sets.iter().enumerate().map(|(i, s)| range_set(i, s)).collect::<Result<Vec<_>, _>>()?;
        for (i, a) in range_sets.iter().enumerate() {
            if let Some(j) = range_sets[i + 1..].iter().position(|b| a.overlaps(b)) {
                return Err(ConfigError::SetsOverlap(i, i + 1 + j));
            }
        }
        let retain = match ipam.retain {
            None => DEFAULT_RETAIN,
            Some(s) => parse_duration(&s).ok_or(ConfigError::Retain(s))?,
        };
        Ok(NetConf {
            cni_version,
            name,
            range_sets,
            routes: ipam.routes,
            data_dir: ipam.data_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            resolv_conf: ipam.resolv_conf,
            retain,
            valid_attachments: raw.valid_attachments.or(raw.attachments),
        })
    }

    /// The store's directory: `dataDir/name`, as host-local's.
    pub fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(ipam: serde_json::Value) -> Result<NetConf, ConfigError> {
        NetConf::parse(
            &serde_json::to_vec(&serde_json::json!({"cniVersion": "1.1.0", "name": "cbr0", "ipam": ipam})).unwrap(),
        )
    }

    #[test]
    fn flannel_delegate_ipam_is_read() {
        // what flannel_linux.go getDelegateIPAM builds from subnet.env
        let c = conf(serde_json::json!({
            "type": "edgevx-ipam",
            "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:1::/64"}]],
            "routes": [{"dst": "10.244.0.0/16"}, {"dst": "fd00::/48"}],
        }))
        .unwrap();
        assert_eq!(c.range_sets.len(), 2);
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.store_dir(), PathBuf::from("/var/lib/cni/networks/cbr0"));
        assert_eq!(c.retain, DEFAULT_RETAIN);
    }

    #[test]
    fn legacy_subnet_comes_first() {
        let c = conf(serde_json::json!({
            "subnet": "10.1.0.0/24", "gateway": "10.1.0.254",
            "ranges": [[{"subnet": "10.2.0.0/24"}]],
            "dataDir": "/tmp/x", "retain": "90s",
        }))
        .unwrap();
        assert_eq!(c.range_sets[0].0[0].gateway.to_string(), "10.1.0.254");
        assert_eq!(c.range_sets[1].0[0].network.to_string(), "10.2.0.0");
        assert_eq!(c.retain, Duration::from_secs(90));
    }

    #[test]
    fn bad_configs_name_the_culprit() {
        let e = conf(serde_json::json!({"ranges": [[{"subnet": "10.1.0.1/24"}]]})).unwrap_err();
        assert!(e.to_string().contains("10.1.0.1/24"), "{e}");
        assert!(matches!(conf(serde_json::json!({})), Err(ConfigError::NoRanges)));
        let overlap = conf(serde_json::json!({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.1.0.0/16"}]]}));
        assert!(matches!(overlap, Err(ConfigError::SetsOverlap(0, 1))));
        let retain = conf(serde_json::json!({"subnet": "10.1.0.0/24", "retain": "a day"}));
        assert!(matches!(retain, Err(ConfigError::Retain(_))));
        let name = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"../etc","ipam":{"subnet":"10.1.0.0/24"}}"#);
        assert!(matches!(name, Err(ConfigError::Name(_))));
        let version = NetConf::parse(br#"{"cniVersion":"9.0.0","name":"n","ipam":{"subnet":"10.1.0.0/24"}}"#);
        assert_eq!(CniError::from(version.unwrap_err()).code, Code::IncompatibleVersion);
        assert_eq!(CniError::from(NetConf::parse(b"{not json").unwrap_err()).code, Code::Decode);
    }

    #[test]
    fn gc_attachments_under_either_key() {
        let c = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","ipam":{"subnet":"10.1.0.0/24"},
                "cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.valid_attachments.unwrap()[0].container_id, "a");
    }

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("24h"), Some(Duration::from_secs(86400)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("h"), None);
        assert_eq!(parse_duration("5d"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn a_duration_past_the_range_is_refused_not_a_panic() {
        // each term fits in u64 milliseconds; their sum does not fit in a Duration
        let huge = "5124095576030431h".repeat(1001);
        assert_eq!(parse_duration(&huge), None);
        let c = conf(serde_json::json!({"subnet": "10.1.0.0/24", "retain": huge}));
        assert!(matches!(c, Err(ConfigError::Retain(_))));
    }
}
