//! Capacity is a stated limit. The peer maps hold so many entries (their
//! `max_entries`, read from the kernel), one per peer in each. A view with
//! more peers than that is cut to fit, the same way every pass, instead of
//! failing one write per extra peer every second (and, with a full map,
//! holding back the deletes that would have made room).
//!
//! - [`fit`] chooses which peers are programmed (pure);
//! - [`Fill`] is what a pass found, recorded for `edgevx status`;
//! - [`Nag`] says when the error is logged again: with backoff, not per pass.
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::peer::Peer;

/// The state file (in the state dir) with the last pass's [`Fill`].
pub const CAPACITY_FILE: &str = "capacity.json";

/// The limit, and how the last pass's peers fit in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fill {
    /// Peers the maps hold: the smallest `max_entries` of the peer maps.
    pub capacity: usize,
    /// Peers the view has that passed the checks (conflicts and the like).
    pub wanted: usize,
    /// Of those, the peers left out: `wanted - capacity` when positive.
    pub not_programmed: usize,
}

impl Fill {
    pub fn over(&self) -> bool {
        self.not_programmed > 0
    }
}

/// Splits `peers` into those programmed and those left out, at most
/// `capacity` of the first. Which ones are left out is decided the same
/// way every pass, so passes do not churn: the peers the dataplane already
/// holds (`established`) stay, then the first by node name. The peers
/// kept keep their order. Names are unique here (`select` rejects a second
/// node of the same name).
pub fn fit(peers: Vec<Peer>, capacity: usize, established: impl Fn(&Peer) -> bool) -> (Vec<Peer>, Vec<Peer>) {
    if peers.len() <= capacity {
        return (peers, Vec::new());
    }
    let held: Vec<bool> = peers.iter().map(established).collect();
    let mut order: Vec<usize> = (0..peers.len()).collect();
    order.sort_by(|&a, &b| (!held[a], &peers[a].node).cmp(&(!held[b], &peers[b].node)));
    let mut keep = vec![false; peers.len()];
    for &i in &order[..capacity] {
        keep[i] = true;
    }
    let (mut kept, mut left_out) = (Vec::with_capacity(capacity), Vec::with_capacity(peers.len() - capacity));
    for (p, k) in peers.into_iter().zip(keep) {
        if k { kept.push(p) } else { left_out.push(p) }
    }
    (kept, left_out)
}

/// The first repeat of the error, after the first line.
const FIRST_REPEAT: Duration = Duration::from_secs(30);
/// The longest wait between two lines while the view stays too large.
const LONGEST_REPEAT: Duration = Duration::from_secs(300);

/// What to log after a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Say {
    Nothing,
    /// The view is beyond the limit: one error line.
    Over,
    /// It no longer is: one info line.
    Cleared,
}

/// When the over-capacity error is logged: at the first pass that finds
/// it, then after 30 s, 1, 2 and 4 min, and every 5 min while it lasts,
/// whatever the number of passes in between; and once more, as info, when
/// it clears.
#[derive(Clone, Debug)]
pub struct Nag {
    /// When the error may be logged again; `None` while not over.
    next: Option<Instant>,
    every: Duration,
}

impl Default for Nag {
    fn default() -> Self {
        Nag { next: None, every: FIRST_REPEAT }
    }
}

impl Nag {
    /// What a pass at `now` that found the view `over` the limit (or not) logs.
    pub fn pass(&mut self, now: Instant, over: bool) -> Say {
        match (over, self.next) {
            (false, None) => Say::Nothing,
            (false, Some(_)) => {
                *self = Nag::default();
                Say::Cleared
            }
            (true, Some(next)) if now < next => Say::Nothing,
            (true, _) => {
                self.next = Some(now + self.every);
                self.every = (self.every * 2).min(LONGEST_REPEAT);
                Say::Over
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::test_peer;

    fn peer(name: &str, n: u32) -> Peer {
        test_peer(name, &format!("10.{}.{}.0/24", 1 + n / 256, n % 256), &format!("198.19.{}.{}", n / 256, n % 256))
    }
    fn names(peers: &[Peer]) -> Vec<&str> {
        peers.iter().map(|p| p.node.as_str()).collect()
    }

    #[test]
    fn a_view_that_fits_is_untouched() {
        let peers = vec![peer("b", 1), peer("a", 2)];
        let (kept, left_out) = fit(peers.clone(), 2, |_| false);
        assert_eq!((kept, left_out), (peers, vec![]));
    }

    #[test]
    fn the_peers_already_programmed_stay_then_the_first_by_name() {
        let peers = vec![peer("d", 1), peer("c", 2), peer("b", 3), peer("a", 4), peer("e", 5)];
        // nothing programmed yet: the first three by name, in their order in the view
        let (kept, left_out) = fit(peers.clone(), 3, |_| false);
        assert_eq!(names(&kept), ["c", "b", "a"]);
        assert_eq!(names(&left_out), ["d", "e"]);
        // "e" and "d" already programmed (a restart after a smaller limit): they stay
        let (kept, left_out) = fit(peers.clone(), 3, |p| p.node == "e" || p.node == "d");
        assert_eq!(names(&kept), ["d", "a", "e"]);
        assert_eq!(names(&left_out), ["c", "b"]);
        // more programmed than fit: those first by name among them
        let (kept, _) = fit(peers, 2, |p| p.node != "a");
        assert_eq!(names(&kept), ["c", "b"]);
    }

    #[test]
    fn passes_do_not_churn_and_a_freed_place_goes_to_the_first_left_out() {
        let view: Vec<Peer> = (0..10).map(|i| peer(&format!("n{i}"), i)).collect();
        let (kept, _) = fit(view.clone(), 8, |_| false);
        let programmed: Vec<String> = kept.iter().map(|p| p.node.clone()).collect();
        let held = |p: &Peer| programmed.contains(&p.node);
        // a newcomer that sorts first does not push out a programmed peer
        let mut grown = view.clone();
        grown.insert(0, peer("a-new", 20));
        let (again, left_out) = fit(grown, 8, held);
        assert_eq!(again, kept);
        assert_eq!(names(&left_out), ["a-new", "n8", "n9"]);
        // a programmed peer leaves the view: the first left out by name takes its place
        let shrunk: Vec<Peer> = view.into_iter().filter(|p| p.node != "n3").collect();
        let (kept, left_out) = fit(shrunk, 8, held);
        assert_eq!(names(&kept), ["n0", "n1", "n2", "n4", "n5", "n6", "n7", "n8"]);
        assert_eq!(names(&left_out), ["n9"]);
    }

    #[test]
    fn the_error_is_repeated_with_backoff_and_its_end_said_once() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut nag = Nag::default();
        assert_eq!(nag.pass(at(0), false), Say::Nothing);
        assert_eq!(nag.pass(at(0), true), Say::Over, "at once");
        // a pass a second (retries) or every 10 s (resyncs): nothing until the backoff is up
        for s in 1..30 {
            assert_eq!(nag.pass(at(s), true), Say::Nothing, "{s} s");
        }
        assert_eq!(nag.pass(at(30), true), Say::Over);
        assert_eq!(nag.pass(at(89), true), Say::Nothing);
        assert_eq!(nag.pass(at(90), true), Say::Over, "60 s later");
        let mut lines = 3;
        let mut last = 90;
        for s in 91..3600 {
            if nag.pass(at(s), true) == Say::Over {
                assert!(s - last <= 300, "at most 5 min apart: {last} -> {s}");
                lines += 1;
                last = s;
            }
        }
        assert!(lines < 20, "{lines} lines in an hour");
        assert_eq!(nag.pass(at(3600), false), Say::Cleared);
        assert_eq!(nag.pass(at(3601), false), Say::Nothing);
        assert_eq!(nag.pass(at(3602), true), Say::Over, "over again: said at once, backoff from the start");
        assert_eq!(nag.pass(at(3603), true), Say::Nothing);
        assert_eq!(nag.pass(at(3632), true), Say::Over);
    }
}
