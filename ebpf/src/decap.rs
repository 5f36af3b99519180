//! Decapsulation on the underlay's ingress. Every UDP datagram to our VXLAN
//! port that arrives here is judged, whatever its destination address
//! (ours, another local address, a broadcast): it is accepted only from a
//! peer in `EDGEVX_PEER_ACCEPT`, and only if the kernel's own VXLAN receive
//! would take it too. Anything that is not to our port is not touched.
//!
//! The judging, in order, before any other verdict (so a broadcast inner
//! MAC or another VNI cannot skip it):
//! 1. the outer source is a peer (`drop_unknown_peer`);
//! 2. the headers up to the inner IPv4 header are there; a first fragment
//!    too short to hold them is dropped (`drop_short_fragment`): the kernel
//!    would reassemble it and decapsulate what this program never saw;
//! 3. the outer IPv4 checksum (`drop_bad_checksum`) and the VXLAN flags and
//!    reserved bits (`drop_bad_vxlan_flags`), as `ip_rcv` and `vxlan_rcv`;
//! 4. the inner frame is IPv4 (`drop_inner_not_ipv4`), its source belongs
//!    to the sender unless the sender is exempt (`drop_spoofed_source`),
//!    and its TTL is above 1 (`drop_inner_ttl`). The source belongs to the
//!    owner of the longest programmed prefix holding it, as encap routes to
//!    it: a peer whose pod CIDR covers another's more specific one (a /23
//!    over a /24) cannot send as the /24's pods. A source no prefix holds
//!    must lie in the sender's accept entry's CIDR.
//!
//! Later fragments carry no UDP header and are left to the kernel, which
//! cannot reassemble them without the first one judged here.
//!
//! Where an accepted frame goes:
//! - for a learned local pod (default): stripped here and handed to the
//!   host stack on `flannel.<VNI>`'s ingress, exactly where the kernel's own
//!   VXLAN receive would put it. Routing, conntrack and every netfilter hook
//!   still see it; only the outer packet's trip through the stack is saved.
//! - for a learned local pod with `--bypass-netfilter`: stripped here and
//!   redirected straight into the pod's namespace, past the host stack.
//! - anything else (the host itself, a pod not learned yet, a fragment, a
//!   header with options, another local address): left to the kernel's
//!   `flannel.<VNI>` receive path.
//!
//! What is accepted for our VTEP (stripped here or left to the kernel)
//! carries `MARK_JUDGED` in `skb->mark`: the VTEP's ingress guard
//! (`vtep_guard.rs`) drops what does not, so a program ahead of this one
//! that ends the chain cannot let a forged inner source past unjudged.
//!
//! IPv6 frames are judged by `judge6.rs` and never decapsulated here: the
//! kernel's `flannel-v6.<VNI>` receives what it lets through.
//!
//! All of this reads the headers at fixed offsets behind an untagged
//! Ethernet header. A frame with VLAN tags left in its bytes (the kernel
//! moves at most one into metadata before TC, and strips the rest after)
//! is judged by `tagged.rs`: VXLAN behind them is dropped
//! (`drop_vxlan_tagged`), anything else passes untouched.

use aya_ebpf::{
    bindings::{BPF_F_ADJ_ROOM_FIXED_GSO, BPF_F_INGRESS, TC_ACT_SHOT, bpf_adj_room_mode},
    helpers::generated::{bpf_redirect, bpf_redirect_peer},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    headers::{EthHeader, Ipv4Header, VxlanHeader},
    maps::{DataplaneConfig, FLAG_BYPASS_NETFILTER, LocalPod, MARK_JUDGED, PeerAccept},
    monitor::Program,
    vxlan::{ENCAP_OVERHEAD, ETH_HLEN, ETH_P_IP, IPPROTO_UDP, IPV4_HLEN, UDP_HLEN, VXLAN_HLEN},
};

use crate::{
    judge6,
    maps::{EDGEVX_CONFIG, EDGEVX_LOCAL_PODS, EDGEVX_PEER_ACCEPT, EDGEVX_PEER_SUBNETS},
    monitor, skb, stats, tagged,
    tunnel::{INNER_ETH_AT, NEXT, TUNNEL_LEN, VXLAN_AT, load_tunnel, sub},
};

pub fn run(ctx: &TcContext) -> i32 {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return NEXT;
    };
    let Ok(outer) = ctx.load::<[u8; ETH_HLEN + IPV4_HLEN]>(0) else {
        return NEXT;
    };
    let eth = EthHeader(sub::<{ ETH_HLEN + IPV4_HLEN }, 0, ETH_HLEN>(&outer));
    if eth.is_vlan() && cfg.vni != 0 {
        return tagged::judge(ctx, cfg.port, Program::Decap);
    }
    if eth.is_ipv6() {
        return judge6::run(ctx, cfg);
    }
    let ip = Ipv4Header(sub::<{ ETH_HLEN + IPV4_HLEN }, ETH_HLEN, IPV4_HLEN>(&outer));
    if !eth.is_ipv4() || !ip.is_valid_v4() || ip.protocol() != IPPROTO_UDP || ip.is_later_fragment() || cfg.vni == 0 {
        return NEXT;
    }
    let ihl = ip.header_len();
    let udp_off = ETH_HLEN + ihl;
    let Ok(ports) = ctx.load::<[u8; 4]>(udp_off) else {
        return NEXT;
    };
    if u16::from_be_bytes([ports[2], ports[3]]) != cfg.port {
        return NEXT;
    }

    // From here on the datagram is for the kernel's VXLAN socket: judge it.
    let src = ip.src();
    let Some(accept) = EDGEVX_PEER_ACCEPT.get_ptr(&src).map(|p| unsafe { *p }) else {
        return drop(ctx, Counter::DropUnknownPeer, false);
    };
    // one read after the other, never both at once: see `load_tunnel`
    let Some((tunnel, inner_ip)) = load_tunnel::<IPV4_HLEN>(ctx, udp_off) else {
        let reason = if ip.is_first_fragment() { Counter::DropShortFragment } else { Counter::DropInnerNotIpv4 };
        return drop(ctx, reason, true);
    };
    if ihl == IPV4_HLEN && !ip.checksum_ok() {
        return drop(ctx, Counter::DropBadChecksum, true);
    }
    let vxlan = VxlanHeader(sub::<TUNNEL_LEN, VXLAN_AT, VXLAN_HLEN>(&tunnel));
    if !vxlan.is_valid() {
        return drop(ctx, Counter::DropBadVxlanFlags, true);
    }
    let inner_eth = EthHeader(sub::<TUNNEL_LEN, INNER_ETH_AT, ETH_HLEN>(&tunnel));
    let inner_ip = Ipv4Header(&inner_ip);
    if !inner_eth.is_ipv4() || !inner_ip.is_valid_v4() {
        return drop(ctx, Counter::DropInnerNotIpv4, true);
    }
    if !accept.exempt() && !owns_source(&src, &accept, inner_ip.src()) {
        return drop(ctx, Counter::DropSpoofedSource, true);
    }
    if inner_ip.ttl() <= 1 {
        return drop(ctx, Counter::DropInnerTtl, true);
    }

    // Judged: from here on, only where it goes.
    if vxlan.vni() != cfg.vni || inner_eth.dst() != cfg.vtep_mac {
        stats::add(Counter::PassNotOurs, 1);
        return NEXT;
    }
    let inner_len = ctx.len().wrapping_sub((udp_off + UDP_HLEN + VXLAN_HLEN) as u32);
    if let Some(peer) = stats::peer(&src) {
        peer.rx_packets += 1;
        peer.rx_bytes += inner_len as u64;
    }
    // the fast path takes only what it fully understands; the kernel checks
    // the rest (options, padding, fragments, other addresses). The outer UDP
    // checksum is not verified here: a kernel VXLAN peer sends one by
    // default, and over veth or an offloading NIC it arrives as a partial
    // sum (CHECKSUM_PARTIAL) that cannot be checked in the program; it only
    // guards against corruption, which the inner checksums also catch.
    let whole = ip.total_len() as u32 == ctx.len().wrapping_sub(ETH_HLEN as u32);
    if ihl == IPV4_HLEN
        && !ip.is_first_fragment()
        && whole
        && ip.dst() == cfg.local_ip
        && let Some(pod) = local_pod(&inner_ip.dst())
    {
        if strip(ctx).is_err() {
            return drop(ctx, Counter::DropAdjustRoom, true);
        }
        return if cfg.flags & FLAG_BYPASS_NETFILTER != 0 {
            deliver_to_pod(ctx, &pod, inner_len)
        } else {
            deliver_to_stack(ctx, cfg, &inner_eth.src(), inner_len)
        };
    }
    stats::count(Counter::RxHostPackets, Counter::RxHostBytes, inner_len);
    judged(ctx);
    NEXT
}

/// Drops a frame on the underlay: counted, and shown to a monitor.
/// `from_peer`: its sender is an accepted peer.
#[inline(always)]
fn drop(ctx: &TcContext, reason: Counter, from_peer: bool) -> i32 {
    stats::add(reason, 1);
    monitor::decap(ctx, reason, 0, from_peer);
    TC_ACT_SHOT
}

/// Marks a frame judged and accepted for our VTEP, whose ingress guard
/// (`vtep_guard.rs`) drops what carries no such mark; never a frame that
/// goes straight into a pod (`--bypass-netfilter`), which the VTEP does not
/// see and whose namespace must not get the bit.
#[inline(always)]
pub(crate) fn judged(ctx: &TcContext) {
    // SAFETY: a read of the context's own field.
    let mark = unsafe { (*skb::raw(ctx)).mark };
    ctx.set_mark(mark | MARK_JUDGED);
}

/// Whether `inner_src` is the peer at `outer_src`'s to send: the longest
/// programmed prefix holding it is that peer's (every subnet behind its
/// public IP counts), or, when none holds it, its accept entry's CIDR does.
#[inline(always)]
fn owns_source(outer_src: &[u8; 4], accept: &PeerAccept, inner_src: [u8; 4]) -> bool {
    match EDGEVX_PEER_SUBNETS.get(&Key::new(32, inner_src)) {
        Some(p) => p.public_ip == *outer_src,
        None => accept.allows_inner_source(inner_src),
    }
}

/// The learned local pod at `dst`, if any.
#[inline(always)]
fn local_pod(dst: &[u8; 4]) -> Option<LocalPod> {
    EDGEVX_LOCAL_PODS.get_ptr(dst).map(|p| unsafe { *p })
}

/// Removes the outer IPv4, UDP and VXLAN headers and the inner Ethernet
/// header; the outer Ethernet header stays, to be rewritten. FIXED_GSO: the
/// segment size stays what the sender chose, which already fits the pod MTU.
#[inline(always)]
fn strip(ctx: &TcContext) -> Result<(), i64> {
    ctx.adjust_room(-(ENCAP_OVERHEAD as i32), bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO as u64)
}

#[inline(always)]
fn eth_header(dst: &[u8; 6], src: &[u8; 6]) -> [u8; ETH_HLEN] {
    let t = ETH_P_IP.to_be_bytes();
    let (d, s) = (dst, src);
    [d[0], d[1], d[2], d[3], d[4], d[5], s[0], s[1], s[2], s[3], s[4], s[5], t[0], t[1]]
}

/// Hands the stripped frame to the host stack as the kernel's VXLAN receive
/// would: on `flannel.<VNI>`'s ingress, from the peer's VTEP MAC to ours.
#[inline(always)]
fn deliver_to_stack(ctx: &TcContext, cfg: &DataplaneConfig, peer_mac: &[u8; 6], inner_len: u32) -> i32 {
    if ctx.store(0, &eth_header(&cfg.vtep_mac, peer_mac), 0).is_err() {
        stats::add(Counter::DropAdjustRoom, 1);
        monitor::decap_stripped(ctx, Counter::DropAdjustRoom);
        return TC_ACT_SHOT;
    }
    stats::count(Counter::RxStackPackets, Counter::RxStackBytes, inner_len);
    judged(ctx);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect(cfg.vtep_ifindex, BPF_F_INGRESS as u64) as i32 }
}

/// Redirects the stripped frame straight into the pod's namespace
/// (`--bypass-netfilter`): the host's routing and netfilter never see it.
#[inline(always)]
fn deliver_to_pod(ctx: &TcContext, pod: &LocalPod, inner_len: u32) -> i32 {
    if ctx.store(0, &eth_header(&pod.pod_mac, &pod.host_mac), 0).is_err() {
        stats::add(Counter::DropAdjustRoom, 1);
        monitor::decap_stripped(ctx, Counter::DropAdjustRoom);
        return TC_ACT_SHOT;
    }
    stats::count(Counter::RxFastPackets, Counter::RxFastBytes, inner_len);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect_peer(pod.host_ifindex, 0) as i32 }
}
