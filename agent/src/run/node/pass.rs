//! One reconcile pass of the running dataplane: the peers of the view
//! chosen, then each family's side synced to them ([`reconcile::sync`]).
//! The side that leads (IPv4's, or IPv6's in an IPv6-only network) cuts
//! them to the maps' capacity before the programs are attached; the IPv6
//! side of a dual-stack node follows with those peers after the attach.
use std::{borrow::Cow, collections::HashSet, time::Instant};

use ipnet::{Ipv4Net, Ipv6Net};
use tracing::{error, info, warn};

use super::{
    Node,
    side::{SideFamily, TableAt},
};
use crate::{
    dataplane::own_addrs,
    peer::{ClusterView, Peer},
    reconcile::{self, CAPACITY_FILE, Fill, Say, Synced},
    run::warned::Warned,
    state::StateDir,
};

impl Node {
    /// Chooses the peers of `view` and brings the leading family's table
    /// in line with them, starting from what the kernel really holds.
    /// Returns whether every write succeeded (failures are logged and
    /// retried on the next pass).
    pub(in crate::run) async fn reconcile(
        &mut self,
        view: &ClusterView,
        direct_routing: bool,
        state: &StateDir,
        warned: &mut Warned,
    ) -> bool {
        let t = Instant::now();
        // the first pass, or a resync or a route event since the last one
        let fresh = !self.sides.lead_known();
        if fresh {
            self.sides.forget(); // a resync or a route event reads both back
        }
        let chosen = self.choose(view, fresh, warned).await;
        let synced = match self.sides.v4.is_some() {
            true => self.sync_side::<Ipv4Net>(chosen, direct_routing).await,
            false => self.sync_side::<Ipv6Net>(chosen, direct_routing).await,
        };
        let Some(Synced { peers: accepted, fill, outcome, .. }) = synced else { return false };
        if !accepted.is_empty() {
            // the first write of the first pass that had peers; none written: they were in already
            self.first_peer_at.get_or_insert(outcome.first_at.unwrap_or_else(Instant::now));
        }
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
        outcome.ok()
    }

    /// The IPv6 side of a dual-stack node, for the peers
    /// [`reconcile`](Self::reconcile) chose: run after the programs are
    /// attached, so IPv4 forwarding never waits for tens of thousands of
    /// IPv6 kernel entries. `true` when there is no such side.
    pub(in crate::run) async fn reconcile_follower(&mut self, direct_routing: bool) -> bool {
        if self.sides.v4.is_none() || self.sides.v6.is_none() {
            return true;
        }
        let chosen = self.accepted.clone();
        self.sync_side::<Ipv6Net>(chosen, direct_routing).await.is_some_and(|s| s.outcome.ok())
    }

    /// The candidates of `view` that may be peers: none claiming an address
    /// of this node (read again with the kernel's contents), each checked
    /// against our own pod CIDRs and the others (see [`reconcile::select`]).
    async fn choose(&mut self, view: &ClusterView, fresh: bool, warned: &mut Warned) -> Vec<Peer> {
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
        // IPv6-only: the peers are their IPv6 halves
        let own4 = self.own.subnet.filter(|_| self.sides.v4.is_some());
        let (selected, rejected) = reconcile::select(own4, self.own.subnet6, &candidates);
        warned.conflicts(&rejected);
        selected
    }

    /// Syncs the family's side (if on) to `chosen`.
    async fn sync_side<N: SideFamily>(&mut self, chosen: Vec<Peer>, direct_routing: bool) -> Option<Synced> {
        let capacity = self.maps.peer_capacity() as usize;
        let Node { sides, record, handle, maps, pending, underlay_index, .. } = self;
        let (side, vtep) = (N::side_mut(sides)?, N::vtep(record)?);
        let at = TableAt { handle, maps, vtep: side.index, underlay: *underlay_index, hold_deletes: pending.is_some() };
        side.sync(at, &vtep, chosen, capacity, direct_routing).await
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
