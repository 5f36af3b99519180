//! Ingress of the pod bridge (`cni0`): what local pods send up to the host.
//! A UDP datagram to the VXLAN port is dropped here, whatever its
//! destination (`drop_pod_vxlan`): a pod must not reach any node's VXLAN
//! socket, since masquerade would give it this node's address, which every
//! peer accepts. Dropping on the node where it starts is the only place the
//! pod's own source address is still there to tell it apart.
//!
//! A later fragment carries no UDP header; without its first fragment,
//! judged here, nobody can reassemble it.
//!
//! IPv6 the same way (a dual-stack peer's `flannel-v6.<VNI>` socket): the
//! UDP header is found behind up to [`MAX_EXT_HEADERS`] extension headers;
//! a longer chain hiding it is dropped too.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    headers::{EthHeader, ExtHeader, Ipv4Header, Ipv6Header, ext_header, is_ext_header},
    vxlan::{ETH_HLEN, IPPROTO_UDP, IPV4_HLEN, IPV6_HLEN},
};

use crate::{maps::EDGEVX_CONFIG, stats};

/// Not VXLAN: the bridge and the host carry on as usual.
const NEXT: i32 = TC_ACT_UNSPEC;

/// The longest IPv6 extension header chain walked to find the UDP header.
const MAX_EXT_HEADERS: usize = 4;

pub fn run(ctx: &TcContext) -> i32 {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return NEXT;
    };
    let (Ok(eth), Ok(ip)) = (ctx.load::<[u8; ETH_HLEN]>(0), ctx.load::<[u8; IPV4_HLEN]>(ETH_HLEN)) else {
        return NEXT;
    };
    if cfg.vni == 0 {
        return NEXT;
    }
    if EthHeader(&eth).is_ipv6() {
        return ipv6(ctx, cfg.port);
    }
    let ip = Ipv4Header(&ip);
    if !EthHeader(&eth).is_ipv4() || !ip.is_valid_v4() || ip.protocol() != IPPROTO_UDP || ip.is_later_fragment() {
        return NEXT;
    }
    let Ok(ports) = ctx.load::<[u8; 4]>(ETH_HLEN + ip.header_len()) else {
        return NEXT;
    };
    if u16::from_be_bytes([ports[2], ports[3]]) != cfg.port {
        return NEXT;
    }
    drop()
}

fn drop() -> i32 {
    stats::add(Counter::DropPodVxlan, 1);
    TC_ACT_SHOT
}

/// An IPv6 frame from a pod: UDP to the VXLAN port, behind whatever
/// extension headers, is dropped.
#[inline(always)]
fn ipv6(ctx: &TcContext, port: u16) -> i32 {
    let Ok(ip) = ctx.load::<[u8; IPV6_HLEN]>(ETH_HLEN) else {
        return NEXT;
    };
    let ip = Ipv6Header(&ip);
    if !ip.is_valid_v6() {
        return NEXT;
    }
    let (mut next, mut at) = (ip.next_header(), ETH_HLEN + IPV6_HLEN);
    for _ in 0..MAX_EXT_HEADERS {
        if !is_ext_header(next) {
            break;
        }
        let Ok(h) = ctx.load::<[u8; 8]>(at) else {
            return NEXT;
        };
        match ext_header(next, &h) {
            ExtHeader::LaterFragment => return NEXT,
            ExtHeader::Skip { next_header, len, .. } => {
                next = next_header;
                at += len;
            }
        }
    }
    if is_ext_header(next) {
        return drop(); // a chain this long from a pod hides what it carries
    }
    if next != IPPROTO_UDP {
        return NEXT;
    }
    match ctx.load::<[u8; 4]>(at) {
        Ok(ports) if u16::from_be_bytes([ports[2], ports[3]]) == port => drop(),
        _ => NEXT,
    }
}
