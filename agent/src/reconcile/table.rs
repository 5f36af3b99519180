//! One family's peers in the kernel, behind one trait ([`sync`](super::sync()) runs a pass over it). A pass reads the
//! table back (or takes what the last pass left, see [`Known`]), plans
//! what the chosen peers need, and writes the difference; the kernel is the
//! truth.
//!
//! The two tables differ in what holds the peers, as edgevx's two halves do:
//! - IPv4 (`dataplane::ipv4_table`): the BPF maps the programs encapsulate and
//!   judge by, and one route for the Network through the VTEP.
//! - IPv6 (`dataplane::ipv6_table`): flannel's own kernel entries on
//!   `flannel-v6.<VNI>` (neighbour, fdb entry and route per peer; the
//!   kernel encapsulates) and the IPv6 maps decap judges by.
//!
//! Both take DirectRouting's plain routes through the underlay for the
//! peers on its link.
use super::{Outcome, on_link::OnLink};
use crate::{
    family::Family,
    peer::{Peer, Rejection},
};

/// A family's peer table as a reconcile pass sees it.
#[allow(async_fn_in_trait)]
pub trait PeerTable {
    type Family: Family;
    /// What the table holds for the peers, or should.
    type Contents;
    /// What the kernel holds, and with `direct_routing` which public IPs
    /// are on the underlay's link (else none), read back.
    async fn read(&mut self, direct_routing: bool) -> anyhow::Result<(Self::Contents, OnLink<Self::Family>)>;
    /// Whether `have` already holds `peer`: over the capacity, such a peer
    /// stays ahead of one not in yet.
    fn holds(&self, have: &Self::Contents, peer: &Peer) -> bool;
    /// What `peers` need (pure), and the peers left out, with the reason.
    fn plan(&self, peers: &[Peer], on_link: &OnLink<Self::Family>) -> (Self::Contents, Vec<Rejection>);
    /// Writes where `have` differs from `want`: every write is tried, and
    /// the failures are logged and counted.
    async fn write(&mut self, have: &Self::Contents, want: &Self::Contents) -> Outcome;
}

/// What the last pass left in a family's table (`C`, the table's
/// contents, and which public IPs of the family `N` are on-link), kept
/// while every write went through: the kernel then holds the plan until an
/// event or a resync says otherwise ([`forget`](Self::forget)), and the
/// next pass need not read it back.
pub struct Known<C, N> {
    contents: Option<C>,
    on_link: Option<OnLink<N>>,
}

impl<C, N> Default for Known<C, N> {
    fn default() -> Self {
        Known { contents: None, on_link: None }
    }
}

impl<C, N: Family> Known<C, N> {
    /// The next pass reads the kernel again.
    pub fn forget(&mut self) {
        self.contents = None;
        self.on_link = None;
    }

    pub fn is_known(&self) -> bool {
        self.contents.is_some()
    }

    /// What the last pass left, or else what `table` reads back. Taken:
    /// a pass that ends before [`keep`](Self::keep) leaves nothing known.
    pub async fn take_or_read<T: PeerTable<Contents = C, Family = N>>(
        &mut self,
        table: &mut T,
        direct_routing: bool,
    ) -> anyhow::Result<(C, OnLink<N>)> {
        match (self.contents.take(), self.on_link.take()) {
            (Some(have), on_link) if !direct_routing || on_link.is_some() => Ok((have, on_link.unwrap_or_default())),
            _ => table.read(direct_routing).await,
        }
    }

    /// Keeps `want` as what the kernel holds when `written` (every write
    /// went through), else nothing: the next pass reads it back.
    pub fn keep(&mut self, want: C, on_link: OnLink<N>, direct_routing: bool, written: bool) {
        if written {
            self.contents = Some(want);
            self.on_link = direct_routing.then_some(on_link);
        }
    }
}

#[cfg(test)]
mod tests {
    use ipnet::Ipv4Net;

    use super::*;

    /// A table whose contents are a number, counting its reads.
    #[derive(Default)]
    struct Counted {
        reads: usize,
    }

    impl PeerTable for Counted {
        type Family = Ipv4Net;
        type Contents = usize;
        async fn read(&mut self, _: bool) -> anyhow::Result<(usize, OnLink)> {
            self.reads += 1;
            Ok((100 + self.reads, OnLink::default()))
        }
        fn holds(&self, _: &usize, _: &Peer) -> bool {
            false
        }
        fn plan(&self, peers: &[Peer], _: &OnLink) -> (usize, Vec<Rejection>) {
            (peers.len(), Vec::new())
        }
        async fn write(&mut self, _: &usize, _: &usize) -> Outcome {
            Outcome::default()
        }
    }

    #[tokio::test]
    async fn the_kernel_is_read_again_unless_every_write_of_the_last_pass_went_through() {
        let (mut t, mut known) = (Counted::default(), Known::<usize, Ipv4Net>::default());
        assert_eq!(known.take_or_read(&mut t, false).await.unwrap().0, 101, "nothing known: read");
        known.keep(7, OnLink::default(), false, true);
        assert!(known.is_known());
        let (have, _) = known.take_or_read(&mut t, false).await.unwrap();
        assert_eq!((have, t.reads), (7, 1), "the last plan, no read");
        assert!(!known.is_known(), "taken: a pass that fails before keeping reads again");
        known.keep(8, OnLink::default(), false, false);
        assert_eq!(known.take_or_read(&mut t, false).await.unwrap().0, 102, "a failed write: read");
        known.keep(9, OnLink::default(), false, true);
        assert_eq!(known.take_or_read(&mut t, true).await.unwrap().0, 103, "DirectRouting turned on: read");
        known.keep(9, OnLink::default(), true, true);
        known.forget();
        assert_eq!(known.take_or_read(&mut t, true).await.unwrap().0, 104, "forgotten: read");
    }
}
