//! Per-CPU counters: no atomics needed, readers sum across CPUs.

use edgevx_common::{
    counters::{Counter, Slot},
    maps::PeerStats,
};

use crate::maps::{EDGEVX_GLOBAL_STATS, EDGEVX_MORE_STATS, EDGEVX_PEER_STATS};

#[inline(always)]
pub fn add(counter: Counter, n: u64) {
    // `counter` is a constant at every call site: the match folds away.
    let slot = match counter.slot() {
        Slot::First(i) => EDGEVX_GLOBAL_STATS.get_ptr_mut(i),
        Slot::More(i) => EDGEVX_MORE_STATS.get_ptr_mut(i),
    };
    if let Some(slot) = slot {
        // SAFETY: per-CPU slot, only this CPU writes it while we run.
        unsafe { *slot += n };
    }
}

#[inline(always)]
pub fn count(packets: Counter, bytes: Counter, len: u32) {
    add(packets, 1);
    add(bytes, len as u64);
}

/// The per-peer counters of `public_ip`; `None` means it is not a known peer.
#[inline(always)]
pub fn peer(public_ip: &[u8; 4]) -> Option<&'static mut PeerStats> {
    let ptr = EDGEVX_PEER_STATS.get_ptr_mut(public_ip)?;
    // SAFETY: per-CPU value, only this CPU writes it while we run.
    Some(unsafe { &mut *ptr })
}
