//! The XDP judge on the underlay: drops, before any skb exists, the VXLAN
//! that TC's decap (IPv4) and judge6 (IPv6) would drop anyway and that
//! costs nothing to recognise: UDP to our VXLAN port from a source that is
//! not an accepted peer (`xdp_drop_unknown_peer`), a peer's datagram too
//! short for the VXLAN and inner Ethernet headers (`xdp_drop_short`), and
//! bad VXLAN flags or reserved bits (`xdp_drop_bad_vxlan_flags`). Its value
//! is keeping a spoofed-VXLAN flood from eating the softirq CPU pods need;
//! it speeds up nothing legitimate.
//!
//! Everything else is `XDP_PASS`, unchanged: other traffic, fragments but
//! a stranger's first one, VLAN-tagged frames, IPv6 behind extension
//! headers, IPv6 while IPv6 is off, and every accepted peer's datagram,
//! whose inner frame TC judges. The rules, and why what they drop is a
//! subset of TC's drops, are in `edgevx_common::early`: the program only
//! reads the headers (through the same views TC uses) and counts.
//!
//! The frame is read in place (direct packet access, bounds checked against
//! `data_end`). Without `BPF_F_XDP_HAS_FRAGS` a driver hands the program
//! whole frames only, so the length it sees is the frame's, as TC sees it.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use edgevx_common::{
    counters::Counter,
    early::{self, Early, TUNNEL_HEAD_LEN},
    headers::{EthHeader, Ipv4Header, Ipv6Header},
    maps::DataplaneConfig,
    vxlan::{ETH_HLEN, IPV4_HLEN, IPV6_HLEN},
};

use crate::{
    maps::{EDGEVX_CONFIG, EDGEVX_PEER_ACCEPT, EDGEVX_PEER_ACCEPT6},
    stats,
};

pub fn run(ctx: &XdpContext) -> u32 {
    match judge(ctx) {
        Early::Pass => xdp_action::XDP_PASS,
        Early::DropUnknownPeer => drop(Counter::XdpDropUnknownPeer),
        Early::DropShort => drop(Counter::XdpDropShort),
        Early::DropBadFlags => drop(Counter::XdpDropBadVxlanFlags),
    }
}

#[inline(always)]
fn drop(counter: Counter) -> u32 {
    stats::add(counter, 1);
    xdp_action::XDP_DROP
}

#[inline(always)]
fn judge(ctx: &XdpContext) -> Early {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return Early::Pass;
    };
    // as TC: nothing is judged before the agent configured a VNI
    if cfg.vni == 0 {
        return Early::Pass;
    }
    let Some(eth) = read::<ETH_HLEN>(ctx, 0) else {
        return Early::Pass;
    };
    let eth = EthHeader(&eth);
    if eth.is_ipv4() {
        return judge4(ctx, cfg, &eth);
    }
    if eth.is_ipv6() && cfg.ipv6_on() {
        return judge6(ctx, cfg, &eth);
    }
    Early::Pass
}

#[inline(always)]
fn judge4(ctx: &XdpContext, cfg: &DataplaneConfig, eth: &EthHeader) -> Early {
    let Some(ip) = read::<IPV4_HLEN>(ctx, ETH_HLEN) else {
        return Early::Pass;
    };
    let ip = Ipv4Header(&ip);
    let Some(fragment) = early::judged_v4(eth, &ip) else {
        return Early::Pass;
    };
    // IHL is 20 to 60 here: a bounded offset for the verifier
    let udp_at = ETH_HLEN + (ip.header_len() & 0x3c);
    let Some(ports) = read::<4>(ctx, udp_at) else {
        return Early::Pass;
    };
    if early::dport(&ports) != cfg.port {
        return Early::Pass;
    }
    let peer = EDGEVX_PEER_ACCEPT.get_ptr(&ip.src()).is_some();
    early::verdict(peer, fragment, read::<TUNNEL_HEAD_LEN>(ctx, udp_at).as_ref())
}

#[inline(always)]
fn judge6(ctx: &XdpContext, cfg: &DataplaneConfig, eth: &EthHeader) -> Early {
    let Some(ip) = read::<IPV6_HLEN>(ctx, ETH_HLEN) else {
        return Early::Pass;
    };
    let ip = Ipv6Header(&ip);
    if !early::judged_v6(eth, &ip) {
        return Early::Pass;
    }
    const UDP_AT: usize = ETH_HLEN + IPV6_HLEN;
    let Some(ports) = read::<4>(ctx, UDP_AT) else {
        return Early::Pass;
    };
    if early::dport(&ports) != cfg.port {
        return Early::Pass;
    }
    let peer = EDGEVX_PEER_ACCEPT6.get_ptr(&ip.src()).is_some();
    early::verdict(peer, false, read::<TUNNEL_HEAD_LEN>(ctx, UDP_AT).as_ref())
}

/// The `N` bytes at `at`, or `None` when the frame ends first.
#[inline(always)]
fn read<const N: usize>(ctx: &XdpContext, at: usize) -> Option<[u8; N]> {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + at + N > end {
        return None;
    }
    // SAFETY: in bounds of the frame by the check above; u8 needs no alignment.
    Some(unsafe { core::ptr::read_unaligned((start + at) as *const [u8; N]) })
}
