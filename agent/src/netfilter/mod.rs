//! The host firewall rules edgevx owns, with flannel's meaning, and the
//! detection of kube-proxy's rules.
//!
//! - `EDGEVX-INPUT` (filter, jumped to first from INPUT), always: drops
//!   VXLAN sent to a broadcast or multicast address, on any interface (the
//!   kernel delivers those without the socket lookup the guard judges).
//! - `EDGEVX-POSTRTG` (nat, jumped to first from POSTROUTING), with `--ip-masq`:
//!   flannel's FLANNEL-POSTRTG (pkg/trafficmngr/iptables/iptables.go).
//! - `EDGEVX-FWD` (filter, appended to FORWARD): flannel's FLANNEL-FWD, which
//!   accepts the Network in both directions, so pods keep working on hosts
//!   whose FORWARD policy is DROP. It is appended, like flannel's, so that
//!   kube-proxy's KUBE-FORWARD (prepended, with its `ctstate INVALID` drop)
//!   still comes first.
//!
//! The rules are read with the host's `iptables -S` (through the `iptables`
//! crate, as flannel's go-iptables drives the binary) and written with the
//! host's `iptables-restore --noflush`, one atomic batch per table
//! ([`restore`]). That binary picks
//! the backend (nft or legacy) that kube-proxy uses on the node, so the rules
//! live in the same tables as kube-proxy's and a DROP policy in FORWARD is met
//! in its own chain (an accept in a separate nftables table would not
//! override it).
mod iptables;
#[cfg(test)]
mod kernel_tests;
mod restore;
mod rules;

pub use iptables::{Firewall, check_backend, check_binary, kube_proxy_present};
pub use rules::{Settings, plan};
