//! Ingress of `flannel.<VNI>` and `flannel-v6.<VNI>`: what the VTEP
//! receives, decapsulated. Decap judges every peer's VXLAN on the
//! underlay (inner source, TTL, flags) and marks what it accepted for our
//! VTEP with `MARK_JUDGED`; a frame without the mark took a path decap
//! never saw and is dropped here.
//!
//! The path decap never sees: another program attached ahead of it on the
//! underlay that ends the chain (a TCX program returning `TC_ACT_OK`, a
//! clsact filter added in front of ours at the same priority). The kernel's
//! VXLAN socket then decapsulates the datagram with only the socket guard
//! judging it, and that checks the outer source alone. With this program
//! the inner-source check holds whatever runs ahead of decap: a forged
//! inner source is dropped, and so is a peer's legitimate traffic until the
//! agent puts decap first again (every resync, see
//! agent/src/dataplane/order.rs).
//!
//! The mark is cleared here, so routing and netfilter never see it. Only
//! while the config says decap marks (`FLAG_REQUIRE_JUDGED`): after a
//! downgrade to an agent that does not, this program lets everything by.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use edgevx_common::{
    maps::{FLAG_REQUIRE_JUDGED, MARK_JUDGED},
    monitor::REASON_VTEP_UNJUDGED,
};

use crate::{fastpath, maps::EDGEVX_CONFIG, monitor, skb};

/// Judged, or nothing to enforce: the VTEP's receive carries on.
const NEXT: i32 = TC_ACT_UNSPEC;

pub fn run(ctx: &TcContext) -> i32 {
    // SAFETY: a read of the context's own field.
    let mark = unsafe { (*skb::raw(ctx)).mark };
    if mark & MARK_JUDGED != 0 {
        ctx.set_mark(mark & !MARK_JUDGED);
    } else {
        let Some(cfg) = EDGEVX_CONFIG.get(0) else {
            return NEXT;
        };
        if cfg.flags & FLAG_REQUIRE_JUDGED != 0 {
            monitor::vtep_guard(ctx, REASON_VTEP_UNJUDGED);
            return TC_ACT_SHOT;
        }
    }
    // judged (or nothing to enforce): an established plain flow may skip the stack
    fastpath::run(ctx).unwrap_or(NEXT)
}
