//! The judge of IPv6 VXLAN on the underlay's ingress, called by decap for
//! every IPv6 frame. On a dual-stack node the kernel's own
//! `flannel-v6.<VNI>` device decapsulates IPv6 pod traffic; this program
//! only decides what may reach its socket, the IPv6 twin of decap's
//! judging. Nothing here changes a packet: what passes goes on to the
//! kernel exactly as it came.
//!
//! A frame is judged when it is UDP right after the fixed IPv6 header, to
//! our VXLAN port, whatever its destination address: as for IPv4, the
//! kernel's socket is bound to every local address (and multicast reaches
//! it without a socket lookup), so a peer's forged inner source sent to
//! another address of ours must not skip the inner check. Anything else
//! (extension headers, other protocols or ports, and everything while IPv6
//! is off) is not touched here; the socket-lookup guard (`guard.rs`) still
//! refuses a stranger's unicast VXLAN that comes with extension headers.
//!
//! The judging, in order, before any other verdict:
//! 1. the outer source is an IPv6 peer (`drop_unknown_peer`);
//! 2. the VXLAN header, the inner Ethernet header and a whole inner IPv6
//!    header are there (`drop_inner_not_ipv6`);
//! 3. the VXLAN flags and reserved bits, as `vxlan_rcv` (`drop_bad_vxlan_flags`);
//! 4. the inner frame is IPv6 (`drop_inner_not_ipv6`: flannel never carries
//!    IPv4 over the IPv6 tunnel), and its source lies in the peer's IPv6
//!    pod CIDR unless the peer is exempt (`drop_spoofed_source`).
//!
//! Then another VNI is counted as not ours (`pass_not_ours`), the rest as
//! left to the kernel (`rx_host_*`); both pass unchanged.

use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use edgevx_common::{
    counters::Counter,
    headers::{EthHeader, Ipv6Header, VxlanHeader},
    maps::DataplaneConfig,
    vxlan::{ETH_HLEN, IPPROTO_UDP, IPV6_HLEN, UDP_HLEN, VXLAN_HLEN},
};

use crate::{
    decap::{INNER_ETH_AT, NEXT, TUNNEL_LEN, VXLAN_AT, sub},
    maps::EDGEVX_PEER_ACCEPT6,
    stats,
};

const UDP_AT: usize = ETH_HLEN + IPV6_HLEN;

#[inline(always)]
pub fn run(ctx: &TcContext, cfg: &DataplaneConfig) -> i32 {
    if !cfg.ipv6_on() || cfg.vni == 0 {
        return NEXT;
    }
    let Ok(outer) = ctx.load::<[u8; IPV6_HLEN]>(ETH_HLEN) else {
        return NEXT;
    };
    let ip = Ipv6Header(&outer);
    if !ip.is_valid_v6() || ip.next_header() != IPPROTO_UDP {
        return NEXT;
    }
    let Ok(ports) = ctx.load::<[u8; 4]>(UDP_AT) else {
        return NEXT;
    };
    if u16::from_be_bytes([ports[2], ports[3]]) != cfg.port {
        return NEXT;
    }

    // From here on the datagram is for the kernel's VXLAN socket: judge it.
    let Some(accept) = EDGEVX_PEER_ACCEPT6.get_ptr(ip.src()).map(|p| unsafe { *p }) else {
        stats::add(Counter::DropUnknownPeer, 1);
        return TC_ACT_SHOT;
    };
    let (Ok(tunnel), Ok(inner_ip)) =
        (ctx.load::<[u8; TUNNEL_LEN]>(UDP_AT), ctx.load::<[u8; IPV6_HLEN]>(UDP_AT + TUNNEL_LEN))
    else {
        stats::add(Counter::DropInnerNotIpv6, 1);
        return TC_ACT_SHOT;
    };
    let vxlan = VxlanHeader(sub::<TUNNEL_LEN, VXLAN_AT, VXLAN_HLEN>(&tunnel));
    if !vxlan.is_valid() {
        stats::add(Counter::DropBadVxlanFlags, 1);
        return TC_ACT_SHOT;
    }
    let inner_eth = EthHeader(sub::<TUNNEL_LEN, INNER_ETH_AT, ETH_HLEN>(&tunnel));
    let inner_ip = Ipv6Header(&inner_ip);
    if !inner_eth.is_ipv6() || !inner_ip.is_valid_v6() {
        stats::add(Counter::DropInnerNotIpv6, 1);
        return TC_ACT_SHOT;
    }
    if !accept.allows_inner_source(&inner_ip.src()) {
        stats::add(Counter::DropSpoofedSource, 1);
        return TC_ACT_SHOT;
    }

    // Judged: the kernel's flannel-v6 socket decapsulates it.
    if vxlan.vni() != cfg.vni {
        stats::add(Counter::PassNotOurs, 1);
        return NEXT;
    }
    let inner_len = ctx.len().wrapping_sub((UDP_AT + UDP_HLEN + VXLAN_HLEN) as u32);
    stats::count(Counter::RxHostPackets, Counter::RxHostBytes, inner_len);
    NEXT
}
