//! The judge of IPv6 VXLAN on the underlay's ingress, called by decap for
//! every IPv6 frame. On a dual-stack node the kernel's own
//! `flannel-v6.<VNI>` device decapsulates IPv6 pod traffic; this program
//! only decides what may reach its socket, the IPv6 twin of decap's
//! judging. Nothing here changes a packet's bytes: what passes goes on to
//! the kernel exactly as it came, marked judged (`MARK_JUDGED` in
//! `skb->mark`) when it is for our VNI, which the VTEP guard on
//! `flannel-v6.<VNI>`'s ingress requires and clears.
//!
//! A frame is judged when it is UDP to our VXLAN port, whatever its
//! destination address: as for IPv4, the kernel's socket is bound to every
//! local address (and multicast reaches it without a socket lookup), so a
//! peer's forged inner source sent to another address of ours must not
//! skip the inner check. Extension headers in front of the UDP header:
//! - from a stranger, the frame is not touched here: the socket-lookup
//!   guard (`guard.rs`) refuses it after the kernel walked them;
//! - from a peer, up to [`MAX_EXT_HEADERS`] are walked and the frame is
//!   judged like any other; a longer chain is dropped
//!   (`drop_long_ext_chain`), a later fragment left to the kernel (which
//!   cannot use it without the first, judged here).
//!
//! Other protocols or ports, and everything while IPv6 is off, are not
//! touched.
//!
//! The judging, in order, before any other verdict:
//! 1. the outer source is an IPv6 peer (`drop_unknown_peer`);
//! 2. the VXLAN header, the inner Ethernet header and a whole inner IPv6
//!    header are there (`drop_inner_not_ipv6`; `drop_short_fragment` for a
//!    first fragment that does not hold them);
//! 3. the VXLAN flags and reserved bits, as `vxlan_rcv` (`drop_bad_vxlan_flags`);
//! 4. the inner frame is IPv6 (`drop_inner_not_ipv6`: flannel never carries
//!    IPv4 over the IPv6 tunnel), and its source belongs to the sender
//!    unless the sender is exempt (`drop_spoofed_source`): to the owner of
//!    the longest IPv6 pod CIDR holding it (`EDGEVX_PEER_SUBNETS6`), as the
//!    kernel's routes send to it, or, when none holds it, to the sender's
//!    accept entry's CIDR.
//!
//! Then another VNI is counted as not ours (`pass_not_ours`), the rest as
//! left to the kernel (`rx_host_*`); both pass unchanged.

use aya_ebpf::{bindings::TC_ACT_SHOT, maps::lpm_trie::Key, programs::TcContext};
use edgevx_common::{
    counters::Counter,
    headers::{EthHeader, ExtHeader, Ipv6Header, VxlanHeader, ext_header, is_ext_header},
    maps::{DataplaneConfig, PeerAccept6},
    vxlan::{ETH_HLEN, IPPROTO_UDP, IPV6_HLEN, UDP_HLEN, VXLAN_HLEN},
};

use crate::{
    maps::{EDGEVX_PEER_ACCEPT6, EDGEVX_PEER_SUBNETS6},
    monitor, stats,
    tunnel::{INNER_ETH_AT, NEXT, TUNNEL_LEN, VXLAN_AT, load_tunnel, sub},
};

/// The longest extension header chain walked to find a peer's UDP header.
/// Flannel's peers send none (their VXLAN fits the path: the kernel sizes
/// flannel-v6 for it); a fragment header is the one they might.
const MAX_EXT_HEADERS: usize = 4;

#[inline(always)]
pub fn run(ctx: &TcContext, cfg: &DataplaneConfig) -> i32 {
    if !cfg.ipv6_on() || cfg.vni == 0 {
        return NEXT;
    }
    let Ok(outer) = ctx.load::<[u8; IPV6_HLEN]>(ETH_HLEN) else {
        return NEXT;
    };
    let ip = Ipv6Header(&outer);
    if !ip.is_valid_v6() {
        return NEXT;
    }
    let mut peer = None;
    let mut udp_at = ETH_HLEN + IPV6_HLEN;
    let mut first_fragment = false;
    if ip.next_header() != IPPROTO_UDP {
        // A stranger's datagram behind extension headers is refused by the
        // socket-lookup guard, after the kernel walked them; a peer's must
        // be walked here, or its inner source would go unjudged.
        if !is_ext_header(ip.next_header()) {
            return NEXT;
        }
        peer = accepted(&ip);
        if peer.is_none() {
            return NEXT;
        }
        let mut next = ip.next_header();
        for _ in 0..MAX_EXT_HEADERS {
            let Ok(h) = ctx.load::<[u8; 8]>(udp_at) else {
                return NEXT;
            };
            match ext_header(next, &h) {
                // no UDP header in it; the kernel needs the first fragment, judged here
                ExtHeader::LaterFragment => return NEXT,
                ExtHeader::Skip { next_header, len, first_fragment: first } => {
                    next = next_header;
                    udp_at += len;
                    first_fragment |= first;
                }
            }
            if !is_ext_header(next) {
                break;
            }
        }
        if is_ext_header(next) {
            return drop(ctx, Counter::DropLongExtChain, 0, true);
        }
        if next != IPPROTO_UDP {
            return NEXT;
        }
    }
    let Ok(ports) = ctx.load::<[u8; 4]>(udp_at) else {
        return NEXT;
    };
    if u16::from_be_bytes([ports[2], ports[3]]) != cfg.port {
        return NEXT;
    }

    // From here on the datagram is for the kernel's VXLAN socket: judge it.
    let Some(accept) = peer.or_else(|| accepted(&ip)) else {
        return drop(ctx, Counter::DropUnknownPeer, udp_at, false);
    };
    // one read after the other, never both at once: see `load_tunnel`
    let Some((tunnel, inner_ip)) = load_tunnel::<IPV6_HLEN>(ctx, udp_at) else {
        // a first fragment must hold all that is judged: the kernel would
        // reassemble it and decapsulate what this program never saw
        let reason = if first_fragment { Counter::DropShortFragment } else { Counter::DropInnerNotIpv6 };
        return drop(ctx, reason, udp_at, true);
    };
    let vxlan = VxlanHeader(sub::<TUNNEL_LEN, VXLAN_AT, VXLAN_HLEN>(&tunnel));
    if !vxlan.is_valid() {
        return drop(ctx, Counter::DropBadVxlanFlags, udp_at, true);
    }
    let inner_eth = EthHeader(sub::<TUNNEL_LEN, INNER_ETH_AT, ETH_HLEN>(&tunnel));
    let inner_ip = Ipv6Header(&inner_ip);
    if !inner_eth.is_ipv6() || !inner_ip.is_valid_v6() {
        return drop(ctx, Counter::DropInnerNotIpv6, udp_at, true);
    }
    if !accept.exempt() && !owns_source6(&ip.src(), &accept, &inner_ip.src()) {
        return drop(ctx, Counter::DropSpoofedSource, udp_at, true);
    }

    // Judged: the kernel's flannel-v6 socket decapsulates it.
    if vxlan.vni() != cfg.vni {
        stats::add(Counter::PassNotOurs, 1);
        return NEXT;
    }
    let inner_len = ctx.len().wrapping_sub((udp_at + UDP_HLEN + VXLAN_HLEN) as u32);
    stats::count(Counter::RxHostPackets, Counter::RxHostBytes, inner_len);
    // flannel-v6.<VNI>'s ingress guard lets through only what was judged
    crate::decap::judged(ctx);
    NEXT
}

/// Drops a frame: counted, and shown to a monitor. `udp_at`: where the
/// walk found the UDP header (0: not found); `from_peer`: an accepted sender.
#[inline(always)]
fn drop(ctx: &TcContext, reason: Counter, udp_at: usize, from_peer: bool) -> i32 {
    stats::add(reason, 1);
    monitor::decap(ctx, reason, udp_at, from_peer);
    TC_ACT_SHOT
}

/// Whether `inner_src` is the peer at `outer_src`'s to send: the longest
/// programmed IPv6 pod CIDR holding it is that peer's, or, when none holds
/// it, its accept entry's CIDR does.
#[inline(always)]
fn owns_source6(outer_src: &[u8; 16], accept: &PeerAccept6, inner_src: &[u8; 16]) -> bool {
    match EDGEVX_PEER_SUBNETS6.get(&Key::new(128, *inner_src)) {
        Some(owner) => owner == outer_src,
        None => accept.allows_inner_source(inner_src),
    }
}

/// The accept entry of the peer that sent `ip`, if it is one.
#[inline(always)]
fn accepted(ip: &Ipv6Header) -> Option<PeerAccept6> {
    EDGEVX_PEER_ACCEPT6.get_ptr(&ip.src()).map(|p| unsafe { *p })
}
