//! Decapsulation on the underlay's ingress. VXLAN for our address, port and
//! VNI from a known peer, for our VTEP MAC, is accepted; from anyone else
//! it is dropped. Anything that is not VXLAN for us is not touched.
//!
//! Where an accepted frame goes:
//! - for a learned local pod (default): stripped here and handed to the
//!   host stack on `flannel.<VNI>`'s ingress, exactly where the kernel's own
//!   VXLAN receive would put it. Routing, conntrack and every netfilter hook
//!   still see it; only the outer packet's trip through the stack is saved.
//! - for a learned local pod with `--bypass-netfilter`: stripped here and
//!   redirected straight into the pod's namespace, past the host stack.
//! - anything else (the host itself, a pod not learned yet): left to the
//!   kernel's `flannel.<VNI>` receive path.

use aya_ebpf::{
    bindings::{BPF_F_ADJ_ROOM_FIXED_GSO, BPF_F_INGRESS, TC_ACT_SHOT, TC_ACT_UNSPEC, bpf_adj_room_mode},
    helpers::generated::{bpf_redirect, bpf_redirect_peer},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    maps::{DataplaneConfig, FLAG_BYPASS_NETFILTER, FLAG_STRICT_INNER_SOURCE, LocalPod},
    vxlan::{ENCAP_OVERHEAD, ETH_HLEN, ETH_P_IP, INNER_IP_OFF, IPPROTO_UDP, UDP_HLEN, VXLAN_HLEN, parse_vni},
};

use crate::{
    maps::{EDGEVX_CONFIG, EDGEVX_LOCAL_PODS, EDGEVX_PEER_SUBNETS},
    stats,
};

/// Not ours: let the next program or the stack have it, unchanged.
const NEXT: i32 = TC_ACT_UNSPEC;

/// UDP + VXLAN + inner Ethernet, read in one go after the outer IP header.
const TUNNEL_LEN: usize = UDP_HLEN + VXLAN_HLEN + ETH_HLEN;

pub fn run(ctx: &TcContext) -> i32 {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return NEXT;
    };
    let Ok(outer) = ctx.load::<[u8; ETH_HLEN + 20]>(0) else {
        return NEXT;
    };
    let ip = &outer[ETH_HLEN..];
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    // a later fragment carries no UDP header to judge; the kernel cannot
    // reassemble it without the first one, which is judged below
    let later_fragment = frag & 0x1fff != 0;
    let first_fragment = frag & 0x2000 != 0;
    if u16::from_be_bytes([outer[12], outer[13]]) != ETH_P_IP
        || ip[0] >> 4 != 4
        || ihl < 20
        || ip[9] != IPPROTO_UDP
        || later_fragment
        || ip[16..20] != cfg.local_ip
        || cfg.vni == 0
    {
        return NEXT;
    }
    let udp_off = ETH_HLEN + ihl;
    if udp_off > ETH_HLEN + 60 {
        return NEXT;
    }
    let Ok(tunnel) = ctx.load::<[u8; TUNNEL_LEN]>(udp_off) else {
        return NEXT;
    };
    if u16::from_be_bytes([tunnel[2], tunnel[3]]) != cfg.port {
        return NEXT;
    }
    let v = UDP_HLEN;
    let vxlan = [
        tunnel[v],
        tunnel[v + 1],
        tunnel[v + 2],
        tunnel[v + 3],
        tunnel[v + 4],
        tunnel[v + 5],
        tunnel[v + 6],
        tunnel[v + 7],
    ];
    if parse_vni(&vxlan) != Some(cfg.vni) {
        stats::add(Counter::PassNotOurs, 1);
        return NEXT;
    }
    let src = [ip[12], ip[13], ip[14], ip[15]];
    let Some(peer) = stats::peer(&src) else {
        stats::add(Counter::DropUnknownPeer, 1);
        return TC_ACT_SHOT;
    };
    let inner_eth = &tunnel[UDP_HLEN + VXLAN_HLEN..];
    if inner_eth[..6] != cfg.vtep_mac {
        stats::add(Counter::PassNotOurs, 1);
        return NEXT;
    }
    let inner_len = ctx.len().wrapping_sub((udp_off + UDP_HLEN + VXLAN_HLEN) as u32);
    peer.rx_packets += 1;
    peer.rx_bytes += inner_len as u64;

    let ipv4_inside = u16::from_be_bytes([inner_eth[12], inner_eth[13]]) == ETH_P_IP;
    let peer_mac = [inner_eth[6], inner_eth[7], inner_eth[8], inner_eth[9], inner_eth[10], inner_eth[11]];
    if cfg.flags & FLAG_STRICT_INNER_SOURCE != 0 && !(ipv4_inside && inner_source_is_peers(ctx, udp_off, &src)) {
        stats::add(Counter::DropSpoofedSource, 1);
        return TC_ACT_SHOT;
    }
    if ihl == 20 && ipv4_inside && !first_fragment {
        if let Some(pod) = local_pod(ctx) {
            if strip(ctx).is_err() {
                stats::add(Counter::DropAdjustRoom, 1);
                return TC_ACT_SHOT;
            }
            return if cfg.flags & FLAG_BYPASS_NETFILTER != 0 {
                deliver_to_pod(ctx, &pod, inner_len)
            } else {
                deliver_to_stack(ctx, cfg, &peer_mac, inner_len)
            };
        }
    }
    stats::count(Counter::RxHostPackets, Counter::RxHostBytes, inner_len);
    NEXT
}

/// The learned local pod the inner IPv4 destination belongs to, if any.
#[inline(always)]
fn local_pod(ctx: &TcContext) -> Option<LocalPod> {
    let dst = ctx.load::<[u8; 4]>(INNER_IP_OFF + 16).ok()?;
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
        return TC_ACT_SHOT;
    }
    stats::count(Counter::RxStackPackets, Counter::RxStackBytes, inner_len);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect(cfg.vtep_ifindex, BPF_F_INGRESS as u64) as i32 }
}

/// Whether the inner IPv4 source lies in a subnet of the peer at `outer_src`.
#[inline(always)]
fn inner_source_is_peers(ctx: &TcContext, udp_off: usize, outer_src: &[u8; 4]) -> bool {
    let inner_src_off = udp_off + UDP_HLEN + VXLAN_HLEN + ETH_HLEN + 12;
    let Ok(inner_src) = ctx.load::<[u8; 4]>(inner_src_off) else { return false };
    EDGEVX_PEER_SUBNETS.get(Key::new(32, inner_src)).is_some_and(|p| p.public_ip == *outer_src)
}

/// Redirects the stripped frame straight into the pod's namespace
/// (`--bypass-netfilter`): the host's routing and netfilter never see it.
#[inline(always)]
fn deliver_to_pod(ctx: &TcContext, pod: &LocalPod, inner_len: u32) -> i32 {
    if ctx.store(0, &eth_header(&pod.pod_mac, &pod.host_mac), 0).is_err() {
        stats::add(Counter::DropAdjustRoom, 1);
        return TC_ACT_SHOT;
    }
    stats::count(Counter::RxFastPackets, Counter::RxFastBytes, inner_len);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect_peer(pod.host_ifindex, 0) as i32 }
}
