//! The conntrack-verified fast path's settings (ebpf/src/fastpath.rs): on
//! or off, and why; the timeouts the stack would apply, read from the
//! node's conntrack sysctls; and the ruleset epoch, which the agent moves
//! whenever the ruleset or a conntrack sysctl may have changed, so every
//! flow passes the stack once under the new rules before it skips it again.
use anyhow::{Context, Result};
use aya::maps::{Array, MapData};
use edgevx_common::fastpath::{FP_CONFIG, FP_LIBERAL_SYSCTL, FP_ON, FP_TEST_IGNORE_LIBERAL, FastPathConfig};

pub use crate::conntrack::sysctls::CtSysctls;
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

/// Whether the fast path runs, and if not, why (for the log and status).
pub fn state(mode: Mode, ct: &Conntrack) -> Result<(), String> {
    match (mode, ct) {
        (Mode::Off, _) => Err("off (--fast-path=off)".to_string()),
        (Mode::Auto, Conntrack::Reachable { .. }) => Ok(()),
        (Mode::Auto, Conntrack::Unreachable(why)) => Err(format!("unavailable: {why}")),
    }
}

/// What the program is told.
/// `test_ignore_liberal`: the hidden `--fast-path-test-ignore-liberal`.
pub fn config(on: bool, epoch: u32, s: &CtSysctls, test_ignore_liberal: bool) -> FastPathConfig {
    FastPathConfig {
        flags: if on { FP_ON } else { 0 }
            | if s.tcp_be_liberal { FP_LIBERAL_SYSCTL } else { 0 }
            | if test_ignore_liberal { FP_TEST_IGNORE_LIBERAL } else { 0 },
        epoch,
        tcp_established: s.tcp_timeout_established,
        tcp_unacknowledged: s.tcp_timeout_unacknowledged,
        udp_stream: s.udp_timeout_stream,
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

    #[test]
    fn the_config_carries_the_sysctls_and_the_epoch() {
        let s = CtSysctls {
            tcp_be_liberal: true,
            tcp_timeout_established: 86400,
            tcp_timeout_unacknowledged: 300,
            udp_timeout_stream: 120,
        };
        let c = config(true, 7, &s, false);
        assert_eq!((c.flags & FP_ON, c.flags & FP_LIBERAL_SYSCTL, c.epoch), (FP_ON, FP_LIBERAL_SYSCTL, 7));
        assert_eq!((c.tcp_established, c.tcp_unacknowledged, c.udp_stream), (86400, 300, 120));
        assert_eq!(config(false, 7, &s, false).flags & FP_ON, 0);
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
