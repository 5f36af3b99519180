//! One pass over one family's peer table, the same for both families:
//! read what the kernel holds (or take what the last pass left), cut the
//! chosen peers to what the table holds, plan, write the difference, and
//! keep the plan as known when the kernel now holds it.
use tracing::debug;

use super::{Fill, Known, Outcome, PeerTable, fit};
use crate::{
    family::Family,
    peer::{Peer, Rejection},
};

/// What one [`sync`] did.
#[derive(Debug)]
pub struct Synced {
    /// The peers the table is now written for: those chosen, cut to its
    /// capacity.
    pub peers: Vec<Peer>,
    /// The capacity and how many peers it left out.
    pub fill: Fill,
    /// The peers whose half of this family the plan left out, with the
    /// reason (logged by the caller when the list changes).
    pub skipped: Vec<Rejection>,
    /// The writes, whether any failed, and whether deletes were held back.
    pub outcome: Outcome,
}

/// Brings `table` in line with `chosen`, at most `capacity` of them: the
/// peers the table already holds stay, then the first by node name (see
/// [`fit`]). An error: the table could not be read back, nothing was
/// written.
pub async fn sync<T: PeerTable>(
    table: &mut T,
    known: &mut Known<T::Contents, T::Family>,
    chosen: Vec<Peer>,
    capacity: usize,
    direct_routing: bool,
) -> anyhow::Result<Synced> {
    let t = std::time::Instant::now();
    let (have, on_link) = known.take_or_read(table, direct_routing).await?;
    let wanted = chosen.len();
    let (peers, left_out) = fit(chosen, capacity, |p| table.holds(&have, p));
    let fill = Fill { capacity, wanted, not_programmed: left_out.len() };
    let (want, skipped) = table.plan(&peers, &on_link);
    let planned = t.elapsed();
    let outcome = table.write(&have, &want).await;
    debug!(ipv6 = T::Family::IPV6, observe_and_plan_ms = planned.as_millis() as u64, "peer table pass");
    // every write went through and none was held back: the kernel now
    // holds `want`, until the next event or resync says otherwise
    known.keep(want, on_link, direct_routing, outcome.complete());
    Ok(Synced { peers, fill, skipped, outcome })
}

#[cfg(test)]
mod tests {
    use ipnet::Ipv4Net;

    use super::*;
    use crate::reconcile::{OnLink, test_peer};

    /// A table of node names: it holds what was written, and holds back
    /// its deletes when asked.
    #[derive(Default)]
    struct Names {
        kernel: Vec<String>,
        reads: usize,
        hold_deletes: bool,
    }

    impl PeerTable for Names {
        type Family = Ipv4Net;
        type Contents = Vec<String>;
        async fn read(&mut self, _: bool) -> anyhow::Result<(Vec<String>, OnLink)> {
            self.reads += 1;
            Ok((self.kernel.clone(), OnLink::default()))
        }
        fn holds(&self, have: &Vec<String>, p: &Peer) -> bool {
            have.contains(&p.node)
        }
        fn plan(&self, peers: &[Peer], _: &OnLink) -> (Vec<String>, Vec<Rejection>) {
            (peers.iter().map(|p| p.node.clone()).collect(), Vec::new())
        }
        async fn write(&mut self, have: &Vec<String>, want: &Vec<String>) -> Outcome {
            let held = self.hold_deletes && have.iter().any(|n| !want.contains(n));
            let mut kernel: Vec<String> = want.clone();
            if held {
                kernel.extend(have.iter().filter(|n| !want.contains(n)).cloned());
            }
            self.kernel = kernel;
            Outcome { written: want.len(), held, ..Outcome::default() }
        }
    }

    fn peers(names: &[&str]) -> Vec<Peer> {
        names.iter().enumerate().map(|(i, n)| test_peer(n, &format!("10.244.{i}.0/24"), "198.18.0.2")).collect()
    }

    #[tokio::test]
    async fn the_peers_held_stay_over_capacity_and_held_deletes_read_the_kernel_again() {
        let (mut t, mut known) = (Names::default(), Known::default());
        let s = sync(&mut t, &mut known, peers(&["b", "c"]), 2, false).await.unwrap();
        assert_eq!(s.fill, Fill { capacity: 2, wanted: 2, not_programmed: 0 });
        // over capacity: b and c are in, so a (first by name) waits
        let s = sync(&mut t, &mut known, peers(&["a", "b", "c"]), 2, false).await.unwrap();
        let names: Vec<&str> = s.peers.iter().map(|p| p.node.as_str()).collect();
        assert_eq!((names, s.fill.not_programmed), (vec!["b", "c"], 1));
        assert_eq!(t.reads, 1, "the last pass's plan was known");
        // deletes held back: the kernel does not hold the plan, the next pass reads it
        t.hold_deletes = true;
        let s = sync(&mut t, &mut known, peers(&["b"]), 2, false).await.unwrap();
        assert!(s.outcome.held && s.outcome.ok() && !s.outcome.complete());
        assert!(!known.is_known());
        t.hold_deletes = false;
        sync(&mut t, &mut known, peers(&["b"]), 2, false).await.unwrap();
        assert_eq!((t.reads, t.kernel.clone()), (2, vec!["b".to_string()]));
    }
}
