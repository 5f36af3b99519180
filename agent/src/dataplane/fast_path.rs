//! The conntrack-verified fast path's settings (ebpf/src/fastpath.rs): on
//! or off, and why; the timeouts the stack would apply, read from the
//! node's conntrack sysctls; and the ruleset epoch, which the agent moves
//! whenever the ruleset or a conntrack sysctl may have changed, so every
//! flow passes the stack once under the new rules before it skips it again.
use std::{fs, path::Path};

use anyhow::{Context, Result};
use aya::maps::{Array, MapData};
use edgevx_common::fastpath::{FP_CONFIG, FP_LIBERAL_SYSCTL, FP_ON, FP_TEST_IGNORE_LIBERAL, FastPathConfig};

use crate::dataplane::{bpffs::PinDir, kfunc::Conntrack};

/// `--fast-path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// On where the kernel has the conntrack kfuncs within reach.
    Auto,
    /// Every decapsulated packet goes through the host stack.
    Off,
}

/// Test-only: skip the liberal check (the negative control of the
/// kube-proxy INVALID-drop test, which must then see drops).
pub const TEST_IGNORE_LIBERAL_ENV: &str = "EDGEVX_TEST_FAST_PATH_IGNORE_LIBERAL";

/// Whether the fast path runs, and if not, why (for the log and status).
pub fn state(mode: Mode, ct: &Conntrack) -> Result<(), String> {
    match (mode, ct) {
        (Mode::Off, _) => Err("off (--fast-path=off)".to_string()),
        (Mode::Auto, Conntrack::Reachable { .. }) => Ok(()),
        (Mode::Auto, Conntrack::Unreachable(why)) => Err(format!("unavailable: {why}")),
    }
}

const SYSCTLS: &str = "/proc/sys/net/netfilter";

/// The conntrack settings of this network namespace the fast path follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CtSysctls {
    pub tcp_be_liberal: bool,
    pub tcp_established: u32,
    pub tcp_unacknowledged: u32,
    pub udp_stream: u32,
}

impl CtSysctls {
    pub fn read() -> Result<Self> {
        Self::read_from(Path::new(SYSCTLS))
    }

    fn read_from(dir: &Path) -> Result<Self> {
        let value = |name: &str| -> Result<u32> {
            let path = dir.join(name);
            let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            text.trim().parse().with_context(|| format!("{} is not a number: {text:?}", path.display()))
        };
        Ok(CtSysctls {
            tcp_be_liberal: value("nf_conntrack_tcp_be_liberal")? != 0,
            tcp_established: value("nf_conntrack_tcp_timeout_established")?,
            tcp_unacknowledged: value("nf_conntrack_tcp_timeout_unacknowledged")?,
            udp_stream: value("nf_conntrack_udp_timeout_stream")?,
        })
    }
}

/// What the program is told.
pub fn config(on: bool, epoch: u32, s: &CtSysctls) -> FastPathConfig {
    let test_ignore_liberal = std::env::var_os(TEST_IGNORE_LIBERAL_ENV).is_some_and(|v| v == "1");
    FastPathConfig {
        flags: if on { FP_ON } else { 0 }
            | if s.tcp_be_liberal { FP_LIBERAL_SYSCTL } else { 0 }
            | if test_ignore_liberal { FP_TEST_IGNORE_LIBERAL } else { 0 },
        epoch,
        tcp_established: s.tcp_established,
        tcp_unacknowledged: s.tcp_unacknowledged,
        udp_stream: s.udp_stream,
        _pad: 0,
    }
}

/// The first epoch of a run: one no earlier run used recently (the seen
/// map is pinned and outlives the agent), never 0.
pub fn first_epoch() -> u32 {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs());
    (secs as u32).wrapping_mul(2) | 1
}

/// The pinned config map.
pub struct FastPathMap(Array<MapData, FastPathConfig>);

impl FastPathMap {
    /// `None` when the pins are an earlier edgevx's (no such map).
    pub fn open(pins: &PinDir) -> Result<Option<Self>> {
        let path = pins.map(FP_CONFIG);
        if !path.exists() {
            return Ok(None);
        }
        let data = aya::maps::MapData::from_pin(&path).with_context(|| format!("cannot open {}", path.display()))?;
        let map = Array::try_from(aya::maps::Map::Array(data))
            .with_context(|| format!("pinned map {FP_CONFIG} does not have the layout this edgevx expects"))?;
        Ok(Some(FastPathMap(map)))
    }

    pub fn set(&mut self, cfg: &FastPathConfig) -> Result<()> {
        self.0.set(0, cfg, 0).context("cannot write the fast path's config map")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(std::path::PathBuf);
    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    fn scopeguard(p: std::path::PathBuf) -> Dir {
        Dir(p)
    }

    #[test]
    fn sysctls_are_read_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("edgevx-unit-ct-sysctls-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let dir = scopeguard(dir);
        for (n, v) in [
            ("nf_conntrack_tcp_be_liberal", "0\n"),
            ("nf_conntrack_tcp_timeout_established", "86400\n"),
            ("nf_conntrack_tcp_timeout_unacknowledged", "300\n"),
            ("nf_conntrack_udp_timeout_stream", "120\n"),
        ] {
            fs::write(dir.path().join(n), v).unwrap();
        }
        let s = CtSysctls::read_from(dir.path()).unwrap();
        assert_eq!(
            s,
            CtSysctls { tcp_be_liberal: false, tcp_established: 86400, tcp_unacknowledged: 300, udp_stream: 120 }
        );
        let c = config(true, 7, &s);
        assert_eq!((c.flags & FP_ON, c.flags & FP_LIBERAL_SYSCTL, c.epoch), (FP_ON, 0, 7));
        fs::write(dir.path().join("nf_conntrack_udp_timeout_stream"), "lots").unwrap();
        let e = format!("{:#}", CtSysctls::read_from(dir.path()).unwrap_err());
        assert!(e.contains("nf_conntrack_udp_timeout_stream"), "{e}");
    }

    #[test]
    fn off_or_unreachable_says_why() {
        let reachable = Conntrack::Reachable { ids: vec![], offsets: vec![] };
        assert!(state(Mode::Auto, &reachable).is_ok());
        assert!(state(Mode::Off, &reachable).unwrap_err().contains("--fast-path=off"));
        let e = state(Mode::Auto, &Conntrack::Unreachable("conntrack is a module".into())).unwrap_err();
        assert!(e.contains("conntrack is a module"), "{e}");
        assert_ne!(first_epoch(), 0);
    }
}
