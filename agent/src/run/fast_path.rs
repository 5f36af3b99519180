//! The fast path's keeper: moves the ruleset epoch on every change the
//! watcher reports (events/ruleset.rs) and rewrites the program's config
//! with the conntrack sysctls read again, and runs the loop that makes the
//! flows the program reports liberal (conntrack/promote.rs). Source →
//! keeper → the one config map; nothing else writes it.
//!
//! It fails closed. The keeper renews a lease in the config every second;
//! the program takes nothing past it once it has run out (3 s), so an agent
//! that stopped or crashed, or whose ruleset watch ended, cannot leave
//! flows skipping rules nobody watches. The fast path is optional: nothing
//! that fails here stops the node's bring-up; it stays off and says why.
use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use aya::maps::{Map, MapData, RingBuf};
use edgevx_common::fastpath::{FP_EVENTS, LEASE_RENEW_MS};
use tokio::{
    sync::mpsc,
    task::JoinHandle,
    time::{MissedTickBehavior, interval},
};
use tracing::{debug, warn};

use crate::{
    conntrack::{
        CtNetlink,
        promote::{self, PromoteCounters},
        sysctls::read_ct_sysctls,
    },
    dataplane::{
        bpffs::PinDir,
        fast_path::{self, CtSysctls, FastPathMap},
    },
    events::ruleset::{self, RulesetChanged},
};

/// The keeper's tasks; dropping it stops them (and the lease runs out).
pub struct FastPathTasks {
    tasks: Vec<JoinHandle<()>>,
    _promoted: Arc<PromoteCounters>,
}

impl Drop for FastPathTasks {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the fast path where `state` lets it run, else writes it off.
/// Returns the state the node is in (on, or off and why) and, when on, the
/// keeper's tasks. Never an error: the fast path is optional.
pub fn start(
    pins: &PinDir,
    state: Result<(), String>,
    test_ignore_liberal: bool,
) -> (Result<(), String>, Option<FastPathTasks>) {
    let mut map = match FastPathMap::open(pins) {
        Ok(Some(map)) => map,
        Ok(None) => return (state.and(Err("off: the pinned programs are an earlier edgevx's".into())), None),
        Err(e) => return (state.and(Err(format!("off: {e:#}"))), None),
    };
    let epoch = fast_path::next_epoch(map.get().ok().map(|c| c.epoch));
    // off until every part runs
    if let Err(e) = map.set(&fast_path::off(epoch)) {
        warn!("fast path: {e:#}; its lease runs out and every packet takes the stack");
        return (state.and(Err(format!("off: {e:#}"))), None);
    }
    if let Err(why) = state {
        return (Err(why), None);
    }
    match run(pins, map, epoch, test_ignore_liberal) {
        Ok(tasks) => (Ok(()), Some(tasks)),
        Err(e) => {
            warn!("fast path off: {e:#}");
            (Err(format!("off: {e:#}")), None)
        }
    }
}

/// The watcher first (a change from then on moves the epoch), the
/// promotion loop, then the fast path on and its keeper. An error drops
/// the tasks started so far, which stops them.
fn run(pins: &PinDir, mut map: FastPathMap, epoch: u32, test_ignore_liberal: bool) -> Result<FastPathTasks> {
    // without conntrack loaded the sysctls do not exist
    let sysctls = read_ct_sysctls().context("cannot read the conntrack sysctls it follows")?;
    let promoted = Arc::new(PromoteCounters::default());
    let mut tasks = FastPathTasks { tasks: Vec::new(), _promoted: promoted.clone() };
    let (tx, rx) = mpsc::channel(8);
    tasks.tasks.push(ruleset::spawn(tx).context("cannot watch the ruleset")?);
    let path = pins.map(FP_EVENTS);
    let data = MapData::from_pin(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let ring = RingBuf::try_from(Map::RingBuf(data)).context("the fast path's event map is not a ring buffer")?;
    let sock = CtNetlink::open().context("cannot open ctnetlink")?;
    tasks.tasks.push(promote::spawn(ring, sock, promoted)?);
    map.set(&fast_path::config(true, epoch, &sysctls, test_ignore_liberal, fast_path::lease_until()))?;
    tasks.tasks.push(tokio::spawn(keep(map, rx, epoch, sysctls, test_ignore_liberal)));
    Ok(tasks)
}

/// Moves the epoch on every change the watcher reports (the conntrack
/// sysctls read again then: a change of one is reported too) and renews the
/// lease every second; writes the fast path off when the watch ends, or
/// while the sysctls cannot be read.
async fn keep(
    mut map: FastPathMap,
    mut changes: mpsc::Receiver<RulesetChanged>,
    mut epoch: u32,
    sysctls: CtSysctls,
    test_ignore_liberal: bool,
) {
    let mut renew = interval(Duration::from_millis(LEASE_RENEW_MS));
    renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut sysctls = Some(sysctls);
    loop {
        tokio::select! {
            change = changes.recv() => match change {
                Some(change) => {
                    // odd, so never 0 (what a fresh seen entry holds)
                    epoch = epoch.wrapping_add(2);
                    debug!(?change, epoch, "fast path: the ruleset changed, every flow passes the stack once");
                    let was_read = sysctls.is_some();
                    sysctls = match read_ct_sysctls() {
                        Ok(s) => Some(s),
                        Err(e) => {
                            if was_read {
                                warn!("fast path off until they can be read: cannot read the conntrack sysctls ({e:#})");
                            }
                            None
                        }
                    };
                }
                None => {
                    warn!("fast path off: the ruleset watch ended; every packet takes the stack");
                    let _ = map.set(&fast_path::off(epoch));
                    return;
                }
            },
            _ = renew.tick() => {}
        }
        let cfg = match &sysctls {
            Some(s) => fast_path::config(true, epoch, s, test_ignore_liberal, fast_path::lease_until()),
            None => fast_path::off(epoch),
        };
        if let Err(e) = map.set(&cfg) {
            warn!("fast path: {e:#}; its lease runs out and every packet takes the stack");
        }
    }
}
