//! Frames that would not fit the underlay once encapsulated. A DF frame is
//! answered with ICMP "fragmentation needed" carrying the MTU that fits
//! (underlay MTU - 50), so the sender's path MTU discovery works end to
//! end, as when the kernel's own forwarding meets a smaller MTU. The reply
//! is built in place of the frame and handed to `flannel.<VNI>`'s ingress:
//! from the unreachable destination, it is routed back to the sending pod
//! like any frame from that peer, and conntrack sees it as related to the
//! flow it quotes. It is marked judged (`MARK_JUDGED`), as decap marks what
//! it hands there, or the VTEP guard would drop it.
//!
//! The underlay MTU is the device's (`bpf_check_mtu`); a smaller path MTU
//! further on is learned by the kernel from ICMP the underlay returns.

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, TC_ACT_SHOT, bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS},
    helpers::generated::{bpf_check_mtu, bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    headers::Ipv4Header,
    icmp::{FRAG_NEEDED_LEN, IPPROTO_ICMP, QUOTE_LEN, frag_needed, is_error, reply_ip},
    maps::{DataplaneConfig, Peer},
    vxlan::{ENCAP_OVERHEAD, ETH_HLEN, ETH_P_IP, IPV4_HLEN, UDP_HLEN},
};

use crate::{encap, skb, stats};

const IPPROTO_TCP: u8 = 6;

/// The underlay MTU if the frame, once encapsulated, would not fit it
/// (each segment, for a GSO frame); `None` if it fits or cannot be judged.
#[inline(always)]
pub fn exceeds(ctx: &TcContext, cfg: &DataplaneConfig, inner: &Ipv4Header) -> Option<u32> {
    let mut mtu: u32 = 0;
    // SAFETY: helper on our own skb; mtu is a valid out pointer.
    let rc = unsafe { bpf_check_mtu(skb::raw(ctx).cast(), cfg.underlay_ifindex, &mut mtu, ENCAP_OVERHEAD as i32, 0) };
    if rc < 0 || mtu == 0 {
        return None;
    }
    // SAFETY: reading a field of the context the program was given.
    let gso_size = unsafe { (*skb::raw(ctx)).gso_size };
    if gso_size == 0 {
        return (rc != BPF_MTU_CHK_RET_SUCCESS as i64).then_some(mtu);
    }
    // a GSO frame passes the length check as a whole; each of its segments
    // gets the inner headers and the 50 bytes
    let l4 = match inner.protocol() {
        IPPROTO_TCP => {
            let off = ETH_HLEN + inner.header_len() + 12;
            ctx.load::<u8>(off).map(|d| ((d >> 4) as u32) * 4).unwrap_or(20)
        }
        _ => UDP_HLEN as u32,
    };
    let segment = inner.header_len() as u32 + l4 + gso_size + ENCAP_OVERHEAD as u32;
    (segment > mtu).then_some(mtu)
}

/// Answers or drops a frame that `exceeds` the underlay MTU `mtu`.
#[inline(always)]
pub fn handle(ctx: &TcContext, cfg: &DataplaneConfig, inner: &Ipv4Header, peer: &Peer, mtu: u32) -> i32 {
    // only the first fragment of a DF packet is answered, never an ICMP error
    // (the kernel's icmp_send rules)
    let icmp_error =
        inner.protocol() == IPPROTO_ICMP && ctx.load::<u8>(ETH_HLEN + inner.header_len()).map(is_error).unwrap_or(true);
    if !inner.dont_fragment() || inner.is_later_fragment() || icmp_error || inner.header_len() != IPV4_HLEN {
        return encap::drop(ctx, Counter::DropTooBig, Some(&peer.public_ip));
    }
    let Ok(quote) = ctx.load::<[u8; QUOTE_LEN]>(ETH_HLEN) else {
        return encap::drop(ctx, Counter::DropTooBig, Some(&peer.public_ip));
    };
    // shown to a monitor before the frame becomes the ICMP reply (should
    // building it fail below, the counter says drop_too_big instead)
    crate::monitor::frag_needed(ctx, &peer.public_ip);
    let fits = mtu.saturating_sub(ENCAP_OVERHEAD as u32).min(u16::MAX as u32) as u16;
    let icmp = frag_needed(&quote, fits);
    let ip = reply_ip(inner.dst(), inner.src());
    let t = ETH_P_IP.to_be_bytes();
    let (d, s) = (cfg.vtep_mac, &peer.vtep_mac);
    let eth = [d[0], d[1], d[2], d[3], d[4], d[5], s[0], s[1], s[2], s[3], s[4], s[5], t[0], t[1]];
    // SAFETY: helper on our own skb.
    let shrunk = unsafe { bpf_skb_change_tail(skb::raw(ctx), (ETH_HLEN + FRAG_NEEDED_LEN) as u32, 0) } == 0;
    let built = shrunk
        && ctx.store(0, &eth, 0).is_ok()
        && ctx.store(ETH_HLEN, &ip, 0).is_ok()
        && ctx.store(ETH_HLEN + IPV4_HLEN, &icmp, 0).is_ok()
        && ctx.store(ETH_HLEN + IPV4_HLEN + icmp.len(), &quote, 0).is_ok();
    if !built {
        stats::add(Counter::DropTooBig, 1);
        return TC_ACT_SHOT;
    }
    stats::add(Counter::DropFragNeeded, 1);
    // our own reply: the VTEP's ingress guard lets only judged frames by
    crate::decap::judged(ctx);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect(cfg.vtep_ifindex, BPF_F_INGRESS as u64) as i32 }
}
