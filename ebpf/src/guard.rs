//! The socket-lookup guard: runs on every UDP socket lookup in the node's
//! network namespace, so on every datagram delivered locally, whatever
//! interface it came in on and whatever local address it was sent to, and
//! after IP reassembly (the lookup follows `ip_defrag`). A datagram to our
//! VXLAN port from an address that is not an accepted peer finds no socket:
//! the kernel's VXLAN socket never sees it (`drop_unknown_peer_socket`).
//! Neither does a peer's that came in on another interface than the
//! underlay (`drop_vxlan_off_underlay`).
//!
//! Decap on the underlay judges first and more (the inner checks); this
//! closes the paths decap does not see: a second interface, pods of this
//! node, fragments reassembled by the kernel. Broadcast and multicast
//! datagrams are delivered without a lookup; on the underlay decap judges
//! those.

use aya_ebpf::programs::SkLookupContext;
use edgevx_common::{counters::Counter, vxlan::IPPROTO_UDP};

use crate::{
    maps::{EDGEVX_CONFIG, EDGEVX_PEER_ACCEPT},
    stats,
};

const SK_DROP: u32 = 0;
const SK_PASS: u32 = 1;
const AF_INET: u32 = 2;

/// `check_iface`: whether to refuse a peer's VXLAN off the underlay; a
/// constant per program, so the compat program never reads the field.
#[inline(always)]
pub fn run(ctx: &SkLookupContext, check_iface: bool) -> u32 {
    // SAFETY: the context the program was given.
    let l = unsafe { &*ctx.lookup };
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return SK_PASS;
    };
    // local_port is in host order, remote_ip4 as on the wire
    if cfg.vni == 0 || l.family != AF_INET || l.protocol != IPPROTO_UDP as u32 || l.local_port != cfg.port as u32 {
        return SK_PASS;
    }
    let src = l.remote_ip4.to_ne_bytes();
    if EDGEVX_PEER_ACCEPT.get_ptr(src).is_none() {
        stats::add(Counter::DropUnknownPeerSocket, 1);
        return SK_DROP;
    }
    // a peer's VXLAN is judged whole (inner source, TTL, flags) only by
    // decap on the underlay, which saw it before the kernel reassembled or
    // delivered it; from anywhere else the kernel would decapsulate it
    // unjudged
    if check_iface && l.ingress_ifindex != cfg.underlay_ifindex {
        stats::add(Counter::DropVxlanOffUnderlay, 1);
        return SK_DROP;
    }
    SK_PASS
}
