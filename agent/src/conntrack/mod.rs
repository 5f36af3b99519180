//! Conntrack from the agent's side of the fast path (fast-path.md §B.4):
//! making a flow's TCP tracking liberal through ctnetlink ([`liberal`]),
//! the loop that does it for the flows the fast path asks about
//! ([`promote`]), and the conntrack sysctls it follows ([`sysctls`]).
//!
//! The netlink messages are written by hand ([`netlink`]): the agent needs
//! one update and one lookup, a few dozen lines. netlink-packet-netfilter
//! 0.4 (rust-netlink, on the same netlink-packet-core as rtnetlink) models
//! them, but its ctnetlink support is new (0.4), it adds derive_more 0.99
//! beside the tree's 2.x, and it has no socket: the agent would still
//! write the request/ack loop, which is most of this code.
pub mod liberal;
pub mod netlink;
pub mod promote;
pub mod sysctls;

pub use liberal::{Outcome, fields, make_liberal, tcp_flags};
pub use netlink::CtNetlink;

#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod ring_tests;
