//! The state dir: what must survive a reboot (the VTEP MAC) and what
//! `edgevx status` reads when the agent is gone. Every write is atomic:
//! a temp file, fsync, rename, fsync of the directory.
use std::{
    fs::{self, File},
    io::Write,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::{mac::VtepMac, peer::Peer};

pub const MAC_FILE: &str = "vtep-mac";
pub const PEERS_FILE: &str = "peers.json";
pub const AGENT_FILE: &str = "agent.json";

/// Writes `data` to `path` so readers see the old or the new file, never a part.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| -> Result<()> {
        let mut f = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        f.write_all(data).with_context(|| format!("cannot write {}", tmp.display()))?;
        f.sync_all().with_context(|| format!("cannot fsync {}", tmp.display()))?;
        fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
        File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot fsync {}", dir.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// What the running agent configured, for `edgevx status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentRecord {
    pub node: String,
    pub iface: String,
    pub vtep_device: String,
    pub vtep_mac: VtepMac,
    pub vni: u32,
    pub port: u16,
    pub public_ip: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub network: Ipv4Net,
    pub mtu: u32,
    /// `--bypass-netfilter` (older records called it fast delivery).
    #[serde(alias = "fast_delivery")]
    pub bypass_netfilter: bool,
    /// `--ip-masq`: FLANNEL_IPMASQ=true and our masquerade chain.
    #[serde(default)]
    pub ip_masq: bool,
    /// How the programs are attached (records older than the fallback: TCX).
    #[serde(default)]
    pub attach: crate::dataplane::loader::AttachMode,
    /// The pod bridge the bridge program goes on.
    #[serde(default = "default_pod_bridge")]
    pub pod_bridge: String,
    pub subnet_file: PathBuf,
    pub pid: u32,
}

fn default_pod_bridge() -> String {
    "cni0".into()
}

#[derive(Clone, Debug)]
pub struct StateDir(pub PathBuf);

impl StateDir {
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The saved VTEP MAC. A damaged file is an error, not "no MAC": a
    /// silent new MAC is the outage edgevx exists to prevent.
    pub fn load_mac(&self) -> Result<Option<VtepMac>> {
        let path = self.path(MAC_FILE);
        match fs::read_to_string(&path) {
            Ok(s) => {
                s.trim().parse().map(Some).with_context(|| format!("saved VTEP MAC in {} is damaged", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    pub fn save_mac(&self, mac: VtepMac) -> Result<()> {
        write_atomic(&self.path(MAC_FILE), format!("{mac}\n").as_bytes())
    }

    pub fn load_peers(&self) -> Result<Vec<Peer>> {
        self.load_json(PEERS_FILE).map(Option::unwrap_or_default)
    }

    pub fn save_peers<'a>(&self, peers: impl Iterator<Item = &'a Peer>) -> Result<()> {
        let list: Vec<&Peer> = peers.collect();
        self.save_json(PEERS_FILE, &list)
    }

    pub fn load_agent(&self) -> Result<Option<AgentRecord>> {
        self.load_json(AGENT_FILE)
    }

    pub fn save_agent(&self, rec: &AgentRecord) -> Result<()> {
        self.save_json(AGENT_FILE, rec)
    }

    pub(crate) fn load_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Result<Option<T>> {
        let path = self.path(name);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).with_context(|| format!("{} is damaged", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    pub(crate) fn save_json<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<()> {
        let mut data = serde_json::to_vec_pretty(value).context("cannot encode state")?;
        data.push(b'\n');
        write_atomic(&self.path(name), &data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("edgevx-unit-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = temp_dir("atomic");
        let f = d.join("x");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn damaged_mac_file_is_an_error() {
        let d = temp_dir("mac");
        let s = StateDir(d.clone());
        assert_eq!(s.load_mac().unwrap(), None);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(MAC_FILE), "not a mac").unwrap();
        assert!(s.load_mac().is_err());
        fs::remove_dir_all(d).unwrap();
    }
}
