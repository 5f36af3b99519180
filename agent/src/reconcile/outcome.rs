//! What a pass's writes did, for either family's table: counted as they
//! run ([`Tally`]), reported as one [`Outcome`].
use std::time::Instant;

/// What one pass's writes did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub written: usize,
    pub failed: usize,
    /// Route deletes held back because a route add failed (they run on the
    /// next pass).
    pub deferred: usize,
    /// Deletes held back on purpose: the programs are not attached yet, so
    /// what would go (flanneld's routes, on a takeover) still carries the
    /// traffic. They run on the first pass after the attach.
    pub held: bool,
    /// When the first write went through (`None`: nothing written).
    pub first_at: Option<Instant>,
}

impl Outcome {
    /// Every write went through and none waits: the kernel holds the plan.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.deferred == 0
    }

    /// The kernel holds the plan exactly: every write went through and
    /// nothing was held back, so the next pass need not read it again.
    pub fn complete(&self) -> bool {
        self.ok() && !self.held
    }
}

/// The writes of one pass and the first that failed: a pass logs one line
/// about its failures, however many there are (a full map would otherwise
/// log one per peer, every retry).
#[derive(Default)]
pub(super) struct Tally {
    pub(super) out: Outcome,
    pub(super) first_error: Option<String>,
}

impl Tally {
    /// Counts one write: `what` and `key` name it in the log line of the
    /// first failure.
    pub(super) fn note(&mut self, what: &str, key: &dyn std::fmt::Display, r: anyhow::Result<()>) {
        match r {
            Ok(()) => {
                self.out.written += 1;
                self.out.first_at.get_or_insert_with(Instant::now);
            }
            Err(e) => {
                self.out.failed += 1;
                self.first_error.get_or_insert_with(|| format!("{what} {key}: {e:#}"));
            }
        }
    }
}
