//! The reconciler, kube-rs style: the kernel is the truth.
//!
//! - [`select`] decides which candidates become peers (pure), and [`fit`]
//!   which of them the maps hold when the view is beyond their capacity.
//! - [`plan`] turns the chosen peers into the dataplane contents they need:
//!   LPM entries, accepted peer addresses, routes (pure); with
//!   DirectRouting, [`OnLink`] (read from the kernel, passed in) says which
//!   peers get a plain route instead.
//! - [`read`](PeerTable::read) reads back what is really in a family's peer
//!   table (the IPv4 maps and routes, or the IPv6 VTEP's kernel entries);
//!   [`Known`] keeps what the last pass left while every write went through.
//! - [`apply`] writes the difference key by key: map entries no peer wants
//!   go first (always: they make room in a full map), then every add, then
//!   the routes no peer wants. A key whose value changed is overwritten in
//!   place, so no swap, rename or chain of moves ever removes something
//!   still wanted.
//!
//! Nothing here keeps a record of what it programmed: every pass starts
//! from what the kernel holds, so drift (a route deleted by hand, a map
//! entry changed under us, a second writer) is repaired by the next pass.
mod capacity;
mod on_link;
mod plan;
mod select;
mod table;

pub use capacity::{CAPACITY_FILE, Fill, Nag, Say, fit};
pub use on_link::{Hop, OnLink};
pub use plan::{
    Accept, Changes, Contents, Dataplane, Outcome, Tunnel, VTEP_GATEWAY, accept_by_public_ip, apply, diff, plan,
};
pub use select::{claiming_ours, first_to_appear, select};
pub use table::{Known, PeerTable};

/// A peer for the unit tests of this module.
#[cfg(test)]
pub(crate) fn test_peer(node: &str, subnet: &str, ip: &str) -> crate::peer::Peer {
    crate::peer::Peer::v4(node, subnet.parse().unwrap(), ip.parse().unwrap(), "02:00:00:00:00:01".parse().unwrap())
}
