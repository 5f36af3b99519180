//! The fast path's keeper: moves the ruleset epoch on every change the
//! watcher reports (events/ruleset.rs) and rewrites the program's config
//! with the conntrack sysctls read again, and runs the loop that makes the
//! flows the program reports liberal (conntrack/promote.rs). Source →
//! keeper → the one config map; nothing else writes it.
use std::sync::Arc;

use anyhow::{Context, Result};
use aya::maps::{Map, MapData, RingBuf};
use edgevx_common::fastpath::FP_EVENTS;
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{debug, warn};

use crate::{
    conntrack::{
        CtNetlink,
        promote::{self, PromoteCounters},
        sysctls::read_ct_sysctls,
    },
    dataplane::{
        bpffs::PinDir,
        fast_path::{self, FastPathMap},
    },
    events::ruleset,
};

/// The keeper's tasks; dropping it stops them.
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

/// Writes the fast path's config (on only when `on`) and, when on, starts
/// the keeper. `Ok(None)`: off, or the pins are an earlier edgevx's.
pub fn start(pins: &PinDir, on: bool, test_ignore_liberal: bool) -> Result<Option<FastPathTasks>> {
    let Some(mut map) = FastPathMap::open(pins)? else { return Ok(None) };
    let mut epoch = fast_path::first_epoch();
    // never fatal: without conntrack loaded the sysctls do not exist, and
    // the fast path is then simply off
    let sysctls = match read_ct_sysctls() {
        Ok(s) => Some(s),
        Err(e) if on => {
            warn!("fast path off: cannot read the conntrack sysctls it follows ({e:#})");
            None
        }
        Err(_) => None,
    };
    let on = on && sysctls.is_some();
    map.set(&fast_path::config(on, epoch, &sysctls.unwrap_or_default(), test_ignore_liberal))?;
    if !on {
        return Ok(None);
    }
    let (tx, mut rx) = mpsc::channel(8);
    let watcher = ruleset::spawn(tx).context("cannot watch the ruleset for the fast path")?;
    let keeper = tokio::spawn(async move {
        while let Some(change) = rx.recv().await {
            // odd, so never 0 (what a fresh seen entry holds)
            epoch = epoch.wrapping_add(2);
            let sysctls = match read_ct_sysctls() {
                Ok(s) => s,
                Err(e) => {
                    warn!("fast path: cannot read the conntrack sysctls ({e:#}); stopping it");
                    let off = fast_path::config(false, epoch, &Default::default(), false);
                    let _ = map.set(&off);
                    continue;
                }
            };
            match map.set(&fast_path::config(true, epoch, &sysctls, test_ignore_liberal)) {
                Ok(()) => debug!(?change, epoch, "fast path: the ruleset changed, every flow passes the stack once"),
                Err(e) => warn!("fast path: {e:#}"),
            }
        }
    });
    let path = pins.map(FP_EVENTS);
    let data = MapData::from_pin(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let ring = RingBuf::try_from(Map::RingBuf(data)).context("the fast path's event map is not a ring buffer")?;
    let sock = CtNetlink::open().context("cannot open ctnetlink for the fast path")?;
    let promoted = Arc::new(PromoteCounters::default());
    let promote = promote::spawn(ring, sock, promoted.clone())?;
    Ok(Some(FastPathTasks { tasks: vec![watcher, keeper, promote], _promoted: promoted }))
}
