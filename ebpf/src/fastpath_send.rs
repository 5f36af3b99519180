//! The fast path's send side, on the pod bridge's ingress after the pod
//! guard: a local pod's packet of an established, plain TCP or UDP flow to
//! a peer's pod is encapsulated here and sent out of the underlay, past
//! the host's routing, netfilter and `flannel.<VNI>`, once the kernel's own
//! conntrack entry says the flow may (the same rules as the receive side,
//! fastpath.rs; the proof that the stack carried the flow under the
//! current ruleset is written by the encap, after POSTROUTING).
//!
//! Packet order: from the bridge's ingress on, the stack's path (routing,
//! netfilter, `flannel.<VNI>`'s transmit, which has no queue, and the
//! encap) runs synchronously in the same call as this program, so a
//! flow's fast and stack packets reach the underlay's queue in the order
//! they came.
//!
//! What the stack would have done and this does too: the TTL decrement,
//! the timeout refresh, the encapsulation the encap program does. What it
//! leaves to the stack: a TTL about to expire (ICMP time exceeded), a
//! frame too big for the underlay (the encap's frag-needed answer), and
//! anything not from a learned pod's own MAC to the bridge's.
use aya_ebpf::{maps::lpm_trie::Key, programs::TcContext};
use edgevx_common::{
    counters::Counter,
    headers::Ipv4Header,
    vxlan::{ETH_HLEN, IPV4_HLEN},
};

use crate::{
    encap, fastpath,
    maps::{EDGEVX_CONFIG, EDGEVX_LOCAL_PODS, EDGEVX_PEER_SUBNETS},
    stats, too_big,
};

/// Sends the frame if the fast path may; `None` leaves it to the stack.
#[inline(always)]
pub fn run(ctx: &TcContext) -> Option<i32> {
    let fp = fastpath::config()?;
    let (key, tcp_flags) = fastpath::parse(ctx)?;
    // a learned pod's own frame, to the bridge (the pod's gateway)
    // SAFETY: a map value copied out.
    let pod = EDGEVX_LOCAL_PODS.get_ptr(&key.saddr).map(|p| unsafe { *p })?;
    let eth = ctx.load::<[u8; 12]>(0).ok()?;
    if eth[..6] != pod.host_mac || eth[6..] != pod.pod_mac {
        return None;
    }
    let peer = *EDGEVX_PEER_SUBNETS.get(&Key::new(32, key.daddr))?;
    let cfg = EDGEVX_CONFIG.get(0)?;
    if cfg.vni == 0 {
        return None;
    }
    let header = ctx.load::<[u8; IPV4_HLEN]>(ETH_HLEN).ok()?;
    // the stack answers what would expire or not fit
    if header[8] <= 1 || too_big::exceeds(ctx, cfg, &Ipv4Header(&header)).is_some() {
        stats::add(Counter::FastPathStackOther, 1);
        return None;
    }
    if !fastpath::verified(ctx, fp, &key, tcp_flags) {
        return None;
    }
    if fastpath::ttl_down(ctx).is_err() {
        return Some(encap::drop(ctx, Counter::DropAdjustRoom, None));
    }
    stats::count(Counter::FastPathSentPackets, Counter::FastPathSentBytes, ctx.len() - ETH_HLEN as u32);
    Some(encap::encapsulate(ctx, cfg, &peer, header[1], true))
}
