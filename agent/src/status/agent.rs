//! What `edgevx status` says of the agent itself: who holds this network
//! namespace's lock (the kernel's answer, never a recorded pid), and what
//! that holder wrote in it.
use std::path::Path;

use anyhow::Result;

use super::{
    SCHEMA,
    document::{Agent, Source},
};
use crate::run::netns_lock;

/// The agent of this state dir, if one runs: the holder of this network
/// namespace's lock, when it runs `edgevx run` on this state dir (a holder
/// that wrote no record yet counts). `None` when none runs.
pub(super) fn running(state_dir: &Path) -> Result<Option<netns_lock::Holder>> {
    let Some(h) = netns_lock::holder()? else { return Ok(None) };
    let same_dir = |r: &netns_lock::Record| {
        r.state_dir == state_dir
            || std::fs::canonicalize(&r.state_dir)
                .ok()
                .zip(std::fs::canonicalize(state_dir).ok())
                .is_some_and(|(a, b)| a == b)
    };
    let ours = h.record.as_ref().is_none_or(|r| r.role == netns_lock::Role::Run && same_dir(r));
    Ok(ours.then_some(h))
}

/// Now, in Unix seconds: the clock the lock record's times are on.
pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What `status` says of the agent itself, the same in every document:
/// running or not, its pid (as this pid namespace sees it), what it is
/// doing, its release, and how its control plane stands (aged to `now`).
pub(super) fn section(agent: Option<&netns_lock::Holder>, now: u64) -> Agent {
    let record = agent.and_then(|h| h.record.as_ref());
    let source = record.and_then(|r| r.source.as_ref()).map(|s| Source {
        name: s.name.clone(),
        watching: s.watching,
        since_seconds: now.saturating_sub(s.since),
        connected: s.connected,
        view_age_seconds: s.view_at.map(|at| now.saturating_sub(at)),
    });
    Agent {
        status_schema: SCHEMA,
        version: env!("CARGO_PKG_VERSION"),
        // empty in the records of agents older than 0.2
        agent_version: record.map(|r| r.version.clone()).filter(|v| !v.is_empty()),
        agent_running: agent.is_some(),
        agent_pid: agent.and_then(|h| h.pid),
        agent_phase: record.map(|r| r.phase.clone()),
        source,
    }
}
