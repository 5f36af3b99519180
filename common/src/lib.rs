//! Types shared by the edgevx agent and its eBPF programs.
//!
//! Everything here is `#![no_std]` so the same definitions compile for
//! `bpfel-unknown-none` and for the host. Map keys and values are
//! `#[repr(C)]` without implicit padding; with the `user` feature they
//! implement `aya::Pod`.
#![no_std]

pub mod counters;
pub mod early;
pub mod fastpath;
pub mod headers;
pub mod icmp;
pub mod maps;
pub mod monitor;
pub mod vxlan;

/// Bumped whenever a pinned map's layout changes; pins live under
/// `<bpffs>/v<SCHEMA_VERSION>/` so an upgrade never reuses an incompatible map.
pub const SCHEMA_VERSION: u32 = 7;
