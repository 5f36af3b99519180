//! What the agent is doing, told to those who ask: systemd's readiness
//! protocol (`Type=notify`: `READY=1` once the node forwards, `STATUS=`
//! saying what the agent waits for meanwhile, and `STOPPING=1` on the way
//! out), and the phase `edgevx status` reads from the agent's lock. Outside
//! systemd (`NOTIFY_SOCKET` unset) the systemd half does nothing. The
//! sd-notify crate speaks the protocol; systemd ignores a message it cannot
//! take, and so does the agent.
use std::{
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use sd_notify::NotifyState;

use super::netns_lock::{NetnsLock, SourceState};
use crate::metrics::{LoopReport, Readiness};

/// Whether `READY=1` was sent: systemd takes it once.
pub(super) struct Notifier {
    ready: bool,
    lock: Arc<NetnsLock>,
    /// Whether the source was in touch at the last turn, and since when.
    watching: Option<(bool, u64)>,
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("cannot tell systemd: {e}");
    }
}

impl Notifier {
    pub(super) fn new(lock: Arc<NetnsLock>) -> Self {
        Self { ready: false, lock, watching: None }
    }

    /// What the agent waits for before it can forward.
    pub(super) fn waiting(&self, why: &str) {
        let phase = format!("waiting for the host: {why}");
        self.lock.phase(&phase);
        send(&[NotifyState::Status(&phase)]);
    }

    /// The host has what it needs; the first bring-up (and its retries) runs.
    pub(super) fn bringing_up(&self) {
        self.lock.phase("bringing up the dataplane");
    }

    /// `READY=1` the first time the report says the node forwards; the
    /// phase and the source's state follow the report at every turn of the
    /// loop (unchanged, they cost a comparison).
    pub(super) fn ready_if(&mut self, report: &LoopReport) {
        let watching = report.watching.get();
        let since = match self.watching {
            Some((was, since)) if was == watching => since,
            _ => unix_seconds(SystemTime::now()),
        };
        self.watching = Some((watching, since));
        self.lock.source(SourceState {
            name: report.source.to_string(),
            connected: report.connected(),
            watching,
            since,
            view_at: report.view_at().map(unix_seconds),
        });
        let readiness = report.readiness();
        self.lock.phase(if readiness == Readiness::Ready { "forwarding" } else { readiness.reason() });
        if !self.ready && readiness == Readiness::Ready {
            self.ready = true;
            send(&[NotifyState::Ready, NotifyState::Status("forwarding")]);
        }
    }

    pub(super) fn stopping(&self) {
        self.lock.phase("stopping");
        send(&[NotifyState::Stopping, NotifyState::Status("stopping; the dataplane stays in place")]);
    }
}
