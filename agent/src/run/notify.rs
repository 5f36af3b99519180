//! systemd's readiness protocol (`Type=notify`): `READY=1` once the node
//! forwards, `STATUS=` saying what the agent waits for meanwhile, and
//! `STOPPING=1` on the way out. Outside systemd (`NOTIFY_SOCKET` unset) each
//! call does nothing. The sd-notify crate speaks the protocol; systemd
//! ignores a message it cannot take, and so does the agent.
use sd_notify::NotifyState;

use crate::metrics::{LoopReport, Readiness};

/// Whether `READY=1` was sent: systemd takes it once.
#[derive(Default)]
pub(super) struct Notifier {
    ready: bool,
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("cannot tell systemd: {e}");
    }
}

impl Notifier {
    /// What the agent waits for before it can forward.
    pub(super) fn waiting(&self, why: &str) {
        send(&[NotifyState::Status(&format!("waiting for the host: {why}"))]);
    }

    /// `READY=1` the first time the report says the node forwards.
    pub(super) fn ready_if(&mut self, report: &LoopReport) {
        if !self.ready && report.readiness() == Readiness::Ready {
            self.ready = true;
            send(&[NotifyState::Ready, NotifyState::Status("forwarding")]);
        }
    }

    pub(super) fn stopping(&self) {
        send(&[NotifyState::Stopping, NotifyState::Status("stopping; the dataplane stays in place")]);
    }
}
