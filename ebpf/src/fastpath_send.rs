//! The fast path's send side, on the pod bridge's ingress after the pod
//! guard: a local pod's packet of an established, plain TCP or UDP flow to
//! a peer's pod goes straight to `flannel.<VNI>`'s egress, where the encap
//! program wraps it, past the host's routing and netfilter, once the
//! kernel's own conntrack entry says the flow may (the same rules as the
//! receive side, fastpath.rs; the proof that the stack carried the flow
//! under the current ruleset is written by the encap, after POSTROUTING,
//! for the stack's packets only: these carry [`MARK_FAST_SENT`]).
//!
//! Why not encapsulate here: the encap's variants are chosen per kernel
//! (5.10's verifier refuses the shared IP ID counter's atomic anywhere in
//! a program, dead or not), and the outer IP IDs to a peer must come from
//! one counter, whichever path a packet took.
//!
//! Packet order: from the bridge's ingress on, the stack's path (routing,
//! netfilter, `flannel.<VNI>`'s transmit, which has no queue, and the
//! encap) runs synchronously in the same call as this program, so a
//! flow's fast and stack packets reach the encap in the order they came.
//!
//! What the stack would have done and this does too: the TTL decrement,
//! the timeout refresh. What it leaves to the stack: a TTL about to expire
//! (ICMP time exceeded), and anything not from a learned pod's own MAC to
//! the bridge's. A frame too big for the underlay meets the encap's
//! frag-needed answer either way.
//!
//! Where the stack would send the packet is the kernel's FIB's to say, not
//! the peer map's: a DirectRouting peer's subnet, or any route an operator
//! put ahead of `flannel.<VNI>`'s, sends it elsewhere, and so does the
//! stack, so only a packet the FIB routes into `flannel.<VNI>` from the
//! bridge (forwarding on, its MTU fitting) is handed to the encap.
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    helpers::generated::{bpf_fib_lookup, bpf_redirect},
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    maps::MARK_FAST_SENT,
    vxlan::{ETH_HLEN, IPV4_HLEN},
};

use crate::{
    fastpath,
    maps::{EDGEVX_CONFIG, EDGEVX_LOCAL_PODS},
    skb, stats,
};

/// `bpf_fib_lookup`'s result: found, and the next hop's neighbour too.
const FIB_SUCCESS: i64 = 0;
/// Found, without a neighbour entry for the next hop yet (`flannel.<VNI>`
/// is NOARP: the stack's next packet makes one).
const FIB_NO_NEIGH: i64 = 7;

/// Whether the kernel would route this IPv4 packet, arriving on the
/// bridge, into `vtep_ifindex` (BPF_FIB_LOOKUP with the packet's
/// addresses, TOS and ports; no `tot_len`, so the kernel judges the skb
/// against the route's device MTU, GSO included). `struct bpf_fib_lookup`
/// written as 16 words: family, l4 proto, ports, tot_len; ifindex; tos;
/// the source (4 words); the destination (4 words); and 12 bytes out.
#[inline(always)]
fn routed_into(ctx: &TcContext, header: &[u8; 20], ports: [u8; 4], vtep_ifindex: u32) -> bool {
    let src = u32::from_ne_bytes([header[12], header[13], header[14], header[15]]);
    let dst = u32::from_ne_bytes([header[16], header[17], header[18], header[19]]);
    // SAFETY: reading a field of the context the program was given.
    let ifindex = unsafe { (*skb::raw(ctx)).ifindex };
    // written word by word with volatile stores: a zeroed array literal
    // becomes a call to a memset subprogram, which a program that tail
    // calls may not hold on every JIT (see fastpath::parse)
    let mut params = core::mem::MaybeUninit::<[u32; 16]>::uninit();
    let words = params.as_mut_ptr().cast::<u32>();
    for i in 0..16 {
        let v = match i {
            0 => u32::from_ne_bytes([AF_INET, header[9], ports[0], ports[1]]),
            1 => u32::from_ne_bytes([ports[2], ports[3], 0, 0]),
            2 => ifindex,
            3 => u32::from(header[1]),
            4 => src,
            8 => dst,
            _ => 0,
        };
        // SAFETY: i < 16, within the array.
        unsafe { core::ptr::write_volatile(words.add(i), v) };
    }
    // SAFETY: the helper reads and writes the 64 bytes it is given, all written above.
    let rc = unsafe { bpf_fib_lookup(skb::raw(ctx).cast(), words.cast(), 64, 0) };
    // SAFETY: written above, and by the helper: the egress ifindex
    (rc == FIB_SUCCESS || rc == FIB_NO_NEIGH) && unsafe { core::ptr::read_volatile(words.add(2)) } == vtep_ifindex
}

const AF_INET: u8 = 2;

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
    let cfg = EDGEVX_CONFIG.get(0)?;
    if cfg.vni == 0 {
        return None;
    }
    let header = ctx.load::<[u8; IPV4_HLEN]>(ETH_HLEN).ok()?;
    let ports = ctx.load::<[u8; 4]>(ETH_HLEN + IPV4_HLEN).ok()?;
    // the stack answers what would expire, and sends what it would route elsewhere
    if header[8] <= 1 || !routed_into(ctx, &header, ports, cfg.vtep_ifindex) {
        stats::add(Counter::FastPathStackOther, 1);
        return None;
    }
    if !fastpath::verified(ctx, fp, &key, tcp_flags) {
        return None;
    }
    if fastpath::ttl_down(ctx).is_err() {
        stats::add(Counter::DropAdjustRoom, 1);
        return Some(TC_ACT_SHOT);
    }
    // SAFETY: a read of the context's own field.
    let mark = unsafe { (*skb::raw(ctx)).mark };
    ctx.set_mark(mark | MARK_FAST_SENT);
    stats::count(Counter::FastPathSentPackets, Counter::FastPathSentBytes, ctx.len() - ETH_HLEN as u32);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    Some(unsafe { bpf_redirect(cfg.vtep_ifindex, 0) as i32 })
}
