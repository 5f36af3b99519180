//! Facts that arrive as events instead of being polled: netlink multicast
//! for links, addresses, neighbours and routes ([`kernel`]), inotify for
//! the nodes file ([`file`]), and changes of the firewall ruleset that the
//! fast path's epoch follows ([`ruleset`]; legacy iptables is polled).
pub mod file;
pub mod kernel;
pub mod ruleset;
pub mod xtables;

#[cfg(test)]
mod ruleset_tests;
