//! The conntrack-verified fast path's settings (ebpf/src/fastpath.rs): on
//! or off, and why; the timeouts the stack would apply, read from the
//! node's conntrack sysctls; and the ruleset epoch, which the agent moves
//! whenever the ruleset or a conntrack sysctl may have changed, so every
//! flow passes the stack once under the new rules before it skips it again.
use anyhow::{Context, Result};
use aya::maps::{Array, MapData};
use edgevx_common::fastpath::{FP_CONFIG, FP_LIBERAL_SYSCTL, FP_ON, FP_TEST_IGNORE_LIBERAL, FastPathConfig, LEASE_MS};

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

/// What the program is told, vouched for until `lease_until_ns`
/// ([`lease_until`]). `test_ignore_liberal`: the hidden
/// `--fast-path-test-ignore-liberal`.
pub fn config(on: bool, epoch: u32, s: &CtSysctls, test_ignore_liberal: bool, lease_until_ns: u64) -> FastPathConfig {
    FastPathConfig {
        flags: if on { FP_ON } else { 0 }
            | if s.tcp_be_liberal { FP_LIBERAL_SYSCTL } else { 0 }
            | if test_ignore_liberal { FP_TEST_IGNORE_LIBERAL } else { 0 },
        epoch,
        tcp_established: s.tcp_timeout_established,
        tcp_unacknowledged: s.tcp_timeout_unacknowledged,
        udp_stream: s.udp_timeout_stream,
        _pad: 0,
        lease_until_ns,
    }
}

/// The fast path off, at `epoch`.
pub fn off(epoch: u32) -> FastPathConfig {
    config(false, epoch, &CtSysctls::default(), false, 0)
}

/// A lease from now: CLOCK_MONOTONIC, which `bpf_ktime_get_ns` reads.
pub fn lease_until() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .saturating_add(LEASE_MS * 1_000_000)
}

/// The first epoch of a run: after the one the pinned map holds (the seen
/// map is pinned too, and outlives the agent: an epoch an earlier run used
/// must not come back), else one from the clock; odd, so never 0 (what a
/// fresh seen entry holds).
pub fn next_epoch(pinned: Option<u32>) -> u32 {
    match pinned {
        Some(e) if e != 0 => e.wrapping_add(2) | 1,
        _ => {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs());
            (secs as u32).wrapping_mul(2) | 1
        }
    }
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

    /// What the map holds now.
    pub fn get(&self) -> Result<FastPathConfig> {
        self.0.get(&0, 0).context("cannot read the fast path's config map")
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
        let c = config(true, 7, &s, false, 42);
        assert_eq!((c.flags & FP_ON, c.flags & FP_LIBERAL_SYSCTL, c.epoch), (FP_ON, FP_LIBERAL_SYSCTL, 7));
        assert_eq!((c.tcp_established, c.tcp_unacknowledged, c.udp_stream, c.lease_until_ns), (86400, 300, 120, 42));
        assert_eq!(config(false, 7, &s, false, 42).flags & FP_ON, 0);
        assert_eq!((off(9).flags, off(9).epoch, off(9).lease_until_ns), (0, 9, 0));
    }

    #[test]
    fn off_or_unreachable_says_why() {
        let reachable =
            Conntrack::Reachable { ids: vec![], offsets: vec![], home: crate::dataplane::kfunc::Home::Vmlinux };
        assert!(state(Mode::Auto, &reachable).is_ok());
        assert!(state(Mode::Off, &reachable).unwrap_err().contains("--fast-path=off"));
        let e = state(Mode::Auto, &Conntrack::Unreachable("conntrack is a module".into())).unwrap_err();
        assert!(e.contains("conntrack is a module"), "{e}");
    }

    /// An epoch an earlier run used never comes back: the next run goes on
    /// from the pinned one.
    #[test]
    fn a_run_goes_on_from_the_pinned_epoch() {
        assert_eq!(next_epoch(Some(7)), 9);
        assert_eq!(next_epoch(Some(u32::MAX)), 1);
        assert_eq!(next_epoch(None) % 2, 1);
        assert_eq!(next_epoch(Some(0)) % 2, 1);
    }

    #[test]
    fn a_lease_runs_from_now() {
        let (a, b) = (lease_until(), lease_until());
        assert!(b >= a && a > LEASE_MS * 1_000_000);
    }
}
