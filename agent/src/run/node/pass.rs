//! One reconcile pass of the running dataplane: the peers of the view
//! chosen, cut to the maps' capacity, and written where the kernel differs
//! (the IPv4 maps and routes here, the IPv6 half through `Side6`).
use std::{borrow::Cow, collections::HashSet, time::Instant};

use ipnet::Ipv4Net;
use tracing::{error, info, warn};

use super::Node;
use crate::{
    dataplane::{own_addrs, peers},
    peer::{ClusterView, Peer},
    reconcile::{self, CAPACITY_FILE, Fill, PeerTable, Say},
    run::warned::Warned,
    state::StateDir,
};

impl Node {
    /// Chooses the peers of `view` and brings the IPv4 dataplane in line
    /// with them, starting from what the kernel really holds (the IPv6 half
    /// is [`reconcile6`](Self::reconcile6)'s). Returns whether every write
    /// succeeded (failures are logged and retried on the next pass).
    pub(in crate::run) async fn reconcile(
        &mut self,
        view: &ClusterView,
        direct_routing: bool,
        state: &StateDir,
        warned: &mut Warned,
    ) -> bool {
        let t = std::time::Instant::now();
        // the first pass, or a resync or a route event since the last one
        let fresh = match (self.vtep_index, &self.v6) {
            (None, Some(v6)) => !v6.known.is_known(), // IPv6-only: its table is the one
            _ => !self.known.is_known(),
        };
        if let Some(v6) = self.v6.as_mut().filter(|_| fresh) {
            v6.known.forget(); // a resync or a route event reads both back
        }
        // no peer may claim an address of this node (read again with the kernel's contents)
        if fresh || self.own_addrs.is_empty() {
            match own_addrs::read(&self.handle).await {
                Ok(addrs) => self.own_addrs = addrs,
                Err(e) => warn!("cannot read this node's addresses; judging peers by the last read: {e:#}"),
            }
        }
        let claims = reconcile::claiming_ours(&view.peers, &self.own_addrs);
        warned.conflicts(&claims);
        let candidates: Cow<'_, [Peer]> = match claims.is_empty() {
            true => Cow::Borrowed(&view.peers),
            false => {
                let out: HashSet<&str> = claims.iter().map(|r| r.node.as_str()).collect();
                Cow::Owned(view.peers.iter().filter(|p| !out.contains(p.node.as_str())).cloned().collect())
            }
        };
        let chosen = match (self.vtep_index, self.record.v4.as_ref().map(|v4| v4.network)) {
            (Some(vtep_index), Some(network)) => {
                self.reconcile4(&candidates, direct_routing, vtep_index, network, warned).await
            }
            _ => {
                // IPv6-only: the peers are their IPv6 halves
                let (selected, rejected) = reconcile::select(None, self.own.subnet6, &candidates);
                warned.conflicts(&rejected);
                Some((self.fit6(selected), true))
            }
        };
        let Some(((accepted, fill), ok)) = chosen else { return false };
        tracing::debug!(
            peers = accepted.len(),
            not_programmed = fill.not_programmed,
            total_ms = t.elapsed().as_millis() as u64,
            "reconcile pass"
        );
        if accepted != self.accepted || !self.peers_saved {
            // names for `edgevx status` and the hand-over to flanneld; not a
            // record of what is programmed (the maps are): best effort, tried
            // again each pass until the state dir or /run takes it
            self.peers_saved = state.save_peers(accepted.iter());
            self.accepted = accepted;
        }
        // after the peer list: a status that shows the new figures shows the new list
        self.report_fill(fill, state);
        ok
    }

    /// The IPv6 half of the pass, for the peers [`reconcile`](Self::reconcile)
    /// chose: `flannel-v6.<VNI>`'s kernel entries and the IPv6 accept map.
    /// Run after the programs are attached, so IPv4 forwarding never waits
    /// for tens of thousands of IPv6 kernel entries. `true` without IPv6.
    pub(in crate::run) async fn reconcile6(&mut self, direct_routing: bool) -> bool {
        match &mut self.v6 {
            Some(v6) => {
                let ok = v6
                    .reconcile(&self.handle, &mut self.maps, &self.accepted, direct_routing, self.underlay_index)
                    .await;
                if self.vtep_index.is_none() && !self.accepted.is_empty() {
                    // IPv6-only: the peers are programmed here
                    self.first_peer_at.get_or_insert_with(Instant::now);
                }
                ok
            }
            None => true,
        }
    }

    /// The IPv4 pass: chooses the peers and programs their IPv4 halves;
    /// returns the chosen peers, how they fit in the maps, and whether every
    /// write went through, or `None` when the dataplane could not be read.
    /// A twin of [`reconcile6`](Self::reconcile6) because the halves run
    /// apart: this one chooses the peers for both families (by the
    /// candidates alone, whatever the maps hold) before the programs are
    /// attached, and the IPv6 table is written after.
    async fn reconcile4(
        &mut self,
        candidates: &[Peer],
        direct_routing: bool,
        vtep_index: u32,
        network: Ipv4Net,
        warned: &mut Warned,
    ) -> Option<((Vec<Peer>, Fill), bool)> {
        let t = std::time::Instant::now();
        let capacity = self.maps.peer_capacity() as usize;
        let mut table = peers::Programmed {
            maps: &mut self.maps,
            handle: &self.handle,
            vtep_index,
            underlay_index: self.underlay_index,
            network,
            hold_deletes: self.pending.is_some(),
            held: false,
        };
        let (observed, on_link) = match self.known.take_or_read(&mut table, direct_routing).await {
            Ok(read) => read,
            Err(e) => {
                warn!("cannot read back the dataplane: {e:#}");
                return None;
            }
        };
        let (selected, rejected) = reconcile::select(self.own.subnet, self.own.subnet6, candidates);
        warned.conflicts(&rejected);
        // beyond the capacity: the peers already in the LPM map stay
        let established = |p: &Peer| {
            p.v4.is_some_and(|v4| observed.subnets.get(&v4.subnet).is_some_and(|t| t.public_ip == v4.public_ip))
        };
        let (accepted, fill) = super::fit(selected, capacity, established);
        let (want, _) = table.plan(&accepted, &on_link);
        let planned = t.elapsed();
        let outcome = table.write(&observed, &want).await;
        tracing::debug!(observe_and_plan_ms = planned.as_millis() as u64, "IPv4 reconcile pass");
        // every write went through (and none was held back): the kernel now
        // holds `want`, until the next event or resync says otherwise
        let held = table.held;
        self.known.keep(want, on_link, direct_routing, outcome.ok() && !held);
        if !accepted.is_empty() {
            // the first write of the first pass that had peers; none written: they were in already
            self.first_peer_at.get_or_insert(outcome.first_at.unwrap_or_else(Instant::now));
        }
        Some(((accepted, fill), outcome.ok()))
    }

    /// IPv6-only: the chosen peers cut to what the maps hold, those the
    /// IPv6 accept map already has first. A twin of the IPv4 pass's cut,
    /// where the LPM map, read with the table, says which peers are held.
    fn fit6(&self, selected: Vec<Peer>) -> (Vec<Peer>, Fill) {
        let capacity = self.maps.peer_capacity() as usize;
        let held = match selected.len() > capacity {
            // only read when it decides something; unreadable, the name alone decides
            true => self.maps.accept6_entries().unwrap_or_default(),
            false => Default::default(),
        };
        super::fit(selected, capacity, |p| p.v6.is_some_and(|v6| held.contains_key(&v6.public_ip)))
    }

    /// Logs a view beyond the capacity (one line, repeated with backoff,
    /// and one when it ends) and saves the figures for `edgevx status`
    /// when they change.
    fn report_fill(&mut self, fill: Fill, state: &StateDir) {
        let Fill { capacity, wanted, not_programmed } = fill;
        match self.nag.pass(std::time::Instant::now(), fill.over()) {
            Say::Over => error!(
                capacity,
                peers = wanted,
                not_programmed,
                "{not_programmed} of the {wanted} peers in the view are not programmed: the BPF maps hold \
                 {capacity} peers (edgevx's limit). The peers already programmed stay, then the first by node \
                 name; the others get no tunnel and their VXLAN is dropped. Fix: fewer nodes in this flannel \
                 network (the limit is fixed when edgevx is built). Repeated with backoff while it lasts"
            ),
            Say::Cleared => info!(capacity, peers = wanted, "every peer in the view fits in the maps again"),
            Say::Nothing => {}
        }
        if self.fill != Some(fill) {
            // best effort (records.rs), tried again at the next pass
            if state.save_record(CAPACITY_FILE, &fill) {
                self.fill = Some(fill);
            }
        }
    }
}
