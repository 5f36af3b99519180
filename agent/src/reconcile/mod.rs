//! The reconciler, kube-rs style: the kernel is the truth. One pass over
//! either family's peer table is [`sync()`]: read back, cut, plan, write,
//! keep.
//!
//! - [`select`] decides which candidates become peers (pure), and [`fit`]
//!   which of them the maps hold when the view is beyond their capacity.
//! - A [`PeerTable`] per family: [`read`](PeerTable::read) reads back what
//!   is really in it, [`plan`](PeerTable::plan) what the chosen peers need
//!   (pure), [`write`](PeerTable::write) the difference; [`Known`] keeps
//!   what the last pass left while every write went through. With
//!   DirectRouting, [`OnLink`] (read from the kernel, passed in) says which
//!   peers get a plain route instead.
//! - Each family's plan, diff and ordered apply, pure but for the writer
//!   trait they write through (a fake in the tests): [`ipv4_maps`] (the BPF
//!   maps the programs encapsulate and judge by, and the Network's route)
//!   and [`ipv6_entries`] (flannel's kernel entries on `flannel-v6.<VNI>`
//!   and the IPv6 maps decap judges by). Map entries no peer wants go
//!   first (always: they make room in a full map), then every add, then
//!   the routes no peer wants. A key whose value changed is overwritten in
//!   place, so no swap, rename or chain of moves ever removes something
//!   still wanted.
//!
//! Nothing here keeps a record of what it programmed: every pass starts
//! from what the kernel holds, so drift (a route deleted by hand, a map
//! entry changed under us, a second writer) is repaired by the next pass.
mod capacity;
pub mod ipv4_maps;
pub mod ipv6_entries;
mod on_link;
mod outcome;
mod select;
mod sync;
mod table;

pub use capacity::{CAPACITY_FILE, Fill, Nag, Say, fit};
pub use ipv4_maps::{Accept, Ipv4Maps, Tunnel, VTEP_GATEWAY, accept_by_public_ip};
pub use ipv6_entries::Ipv6Entries;
pub use on_link::{Hop, OnLink};
pub use outcome::Outcome;
pub use select::{claiming_ours, first_to_appear, select};
pub use sync::{Synced, sync};
pub use table::{Known, PeerTable};

/// A peer for the unit tests of this module.
#[cfg(test)]
pub(crate) fn test_peer(node: &str, subnet: &str, ip: &str) -> crate::peer::Peer {
    crate::peer::Peer::v4(node, subnet.parse().unwrap(), ip.parse().unwrap(), "02:00:00:00:00:01".parse().unwrap())
}
