//! Facts that arrive as events instead of being polled: netlink multicast
//! for links, addresses, neighbours and routes ([`kernel`]), inotify for
//! the nodes file ([`file`]).
pub mod file;
pub mod kernel;
