//! Warnings about nodes, once per change: a source that re-sends the same
//! view (heartbeats of unrelated Nodes) must not re-log every bad node.
use std::collections::BTreeMap;

use tracing::warn;

use crate::peer::Rejection;

#[derive(Default)]
pub(super) struct Warned {
    malformed: BTreeMap<String, String>,
    conflicts: BTreeMap<String, String>,
    partial: BTreeMap<String, String>,
    self_exempt: BTreeMap<String, String>,
}

/// Logs the rejections whose node is new to `seen` or has a new reason;
/// returns how many were logged.
fn once(seen: &mut BTreeMap<String, String>, now: &[Rejection], what: &str) -> usize {
    let now: BTreeMap<String, String> = now.iter().map(|r| (r.node.clone(), r.reason.clone())).collect();
    let mut logged = 0;
    for (node, reason) in &now {
        if seen.get(node) != Some(reason) {
            warn!(node = %node, "{what}: {reason}");
            logged += 1;
        }
    }
    *seen = now;
    logged
}

impl Warned {
    /// Nodes a source could not read (bad annotations, no pod CIDR, ...).
    pub(super) fn malformed(&mut self, rejected: &[Rejection]) -> usize {
        once(&mut self.malformed, rejected, "skipping malformed node")
    }

    /// Peers taken without their IPv6 half.
    pub(super) fn partial(&mut self, partial: &[Rejection]) -> usize {
        once(&mut self.partial, partial, "peer without its IPv6 half")
    }

    /// Nodes whose own entry asks to be exempt from the inner-source check.
    pub(super) fn self_exempt(&mut self, asked: &[Rejection]) -> usize {
        once(&mut self.self_exempt, asked, "not exempting a node from the inner-source check")
    }

    /// Nodes that conflict with another (overlapping CIDR, taken public IP).
    pub(super) fn conflicts(&mut self, rejected: &[Rejection]) -> usize {
        once(&mut self.conflicts, rejected, "skipping conflicting node")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_warned_about_once_per_reason() {
        let mut w = Warned::default();
        let bad = |reason: &str| vec![Rejection { node: "n1".into(), reason: reason.into() }];
        assert_eq!(w.malformed(&bad("no podCIDR")), 1);
        assert_eq!(w.malformed(&bad("no podCIDR")), 0, "same view, no new line");
        assert_eq!(w.malformed(&bad("bad VtepMAC")), 1, "a new reason is news");
        assert_eq!(w.malformed(&[]), 0);
        assert_eq!(w.malformed(&bad("bad VtepMAC")), 1, "broken again after a fix");
    }
}
