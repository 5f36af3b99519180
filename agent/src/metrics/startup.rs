//! How fast a start brings the node back (restore first): the time from
//! process start to each milestone of the first bring-up. Logged as each
//! is reached, saved for `edgevx status` (`startup.json` in the state dir)
//! and served as `edgevx_startup_seconds{milestone}`. The first start's
//! figures stay; a rebuild later does not move them.
use std::{
    sync::{Mutex, OnceLock, PoisonError},
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use tracing::info;

/// The state file `edgevx status` reads.
pub const STARTUP_FILE: &str = "startup.json";

static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// Marks the process start: called first thing in `main`.
pub fn process_started() {
    PROCESS_START.get_or_init(Instant::now);
}

fn since_start(at: Instant) -> Duration {
    at.saturating_duration_since(*PROCESS_START.get_or_init(Instant::now))
}

/// A step of the first bring-up, in the order a restore reaches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Milestone {
    /// subnet.env written: the CNI can add pods.
    SubnetEnv,
    /// The VTEP device up with its MAC and address.
    VtepUp,
    /// The programs attached: packets are encapsulated and judged.
    Attached,
    /// The first peer's entries written.
    FirstPeer,
    /// A pass that wrote every peer of the view, both families, attached.
    AllPeers,
}

impl Milestone {
    pub const ALL: [Milestone; 5] =
        [Milestone::SubnetEnv, Milestone::VtepUp, Milestone::Attached, Milestone::FirstPeer, Milestone::AllPeers];

    pub fn label(self) -> &'static str {
        match self {
            Milestone::SubnetEnv => "subnet_env",
            Milestone::VtepUp => "vtep_up",
            Milestone::Attached => "attached",
            Milestone::FirstPeer => "first_peer",
            Milestone::AllPeers => "all_peers",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Milestone::SubnetEnv => "subnet.env written",
            Milestone::VtepUp => "VTEP up",
            Milestone::Attached => "programs attached",
            Milestone::FirstPeer => "first peer programmed",
            Milestone::AllPeers => "all peers programmed",
        }
    }
}

/// The milestones reached, and whether they changed since last saved.
#[derive(Debug, Default)]
pub struct Startup {
    inner: Mutex<([Option<Duration>; 5], bool)>,
}

impl Startup {
    /// `m` was reached at `at`: recorded and logged the first time only.
    pub fn reached(&self, m: Milestone, at: Instant) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut g.0[m as usize];
        if slot.is_some() {
            return;
        }
        let since = since_start(at);
        *slot = Some(since);
        g.1 = true;
        let ms = since.as_secs_f64() * 1e3;
        info!(
            milestone = m.label(),
            ms = format!("{ms:.1}"),
            "startup: {} {ms:.1} ms after the process started",
            m.words()
        );
    }

    /// Each milestone reached and its time from process start.
    pub fn times(&self) -> Vec<(Milestone, Duration)> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Milestone::ALL.iter().filter_map(|&m| Some((m, g.0[m as usize]?))).collect()
    }

    /// The figures as `edgevx status` shows them (`{"subnet_env_ms": 12.3, ...}`),
    /// when they changed since the last call.
    pub fn take_changed(&self) -> Option<Value> {
        {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if !std::mem::take(&mut g.1) {
                return None;
            }
        }
        Some(as_json(&self.times()))
    }
}

fn as_json(times: &[(Milestone, Duration)]) -> Value {
    let mut m = Map::new();
    for (milestone, d) in times {
        let ms = (d.as_secs_f64() * 1e4).round() / 10.0;
        m.insert(format!("{}_ms", milestone.label()), json!(ms));
    }
    m.insert("pid".into(), json!(std::process::id()));
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_milestone_is_recorded_once_and_saved_when_it_changed() {
        process_started();
        let s = Startup::default();
        assert!(s.take_changed().is_none(), "nothing reached, nothing to save");
        let t = Instant::now();
        s.reached(Milestone::SubnetEnv, t);
        s.reached(Milestone::Attached, t + Duration::from_millis(5));
        let first = s.take_changed().expect("changed");
        assert!(first["subnet_env_ms"].is_number() && first["attached_ms"].is_number(), "{first}");
        assert!(first.get("vtep_up_ms").is_none(), "not reached: {first}");
        assert!(s.take_changed().is_none(), "saved once");
        // a rebuild reaches it again later: the first start's figure stays
        s.reached(Milestone::SubnetEnv, t + Duration::from_secs(60));
        assert!(s.take_changed().is_none());
        let times = s.times();
        assert_eq!(times.iter().map(|(m, _)| *m).collect::<Vec<_>>(), [Milestone::SubnetEnv, Milestone::Attached]);
        assert_eq!(times[1].1 - times[0].1, Duration::from_millis(5));
    }
}
