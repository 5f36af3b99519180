//! Waiting for the host before the first bring-up: what [`settle`] finds
//! missing (no default route yet, an interface or address not there yet, no
//! bpffs yet) fixes itself, so it is waited for, never an exit. `/readyz`
//! says what for, and the log says it at once, on every change and every
//! few seconds. A stop signal ends the wait.
use std::time::{Duration, Instant};

use anyhow::Result;
use rtnetlink::Handle;
use tokio::signal::unix::Signal;
use tracing::{info, warn};

use super::{
    check::{Checked, NotYet, Pending, settle},
    notify::Notifier,
};
use crate::metrics::LoopReport;

/// The host is looked at again this often.
const RETRY: Duration = Duration::from_secs(1);
/// The same wait is logged again this often.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// The checked run once the host has what it needs; `None` if stopped first.
pub(super) async fn wait_for_host(
    p: &Pending,
    handle: &Handle,
    report: &LoopReport,
    notifier: &Notifier,
    stop: (&mut Signal, &mut Signal),
) -> Result<Option<Checked>> {
    let (term, int) = stop;
    let mut said: Option<(String, Instant)> = None;
    loop {
        report.tick();
        match settle(p, handle).await? {
            Ok(c) => {
                if let Some((_, since)) = said {
                    info!(waited_secs = since.elapsed().as_secs(), "the host has what the agent waited for");
                }
                report.waiting_for(None);
                return Ok(Some(c));
            }
            Err(NotYet(why)) => {
                if said.as_ref().is_none_or(|(was, at)| *was != why || at.elapsed() >= LOG_EVERY) {
                    warn!(node = %p.node(), "not ready to bring up the dataplane: {why}");
                    notifier.waiting(&why);
                    said = Some((why.clone(), Instant::now()));
                }
                report.waiting_for(Some(why));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = term.recv() => return Ok(None),
            _ = int.recv() => return Ok(None),
        }
    }
}
