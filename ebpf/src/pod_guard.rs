//! Ingress of the pod bridge (`cni0`): what local pods send up to the host.
//! A UDP datagram to the VXLAN port is dropped here, whatever its
//! destination (`drop_pod_vxlan`): a pod must not reach any node's VXLAN
//! socket, since masquerade would give it this node's address, which every
//! peer accepts. Dropping on the node where it starts is the only place the
//! pod's own source address is still there to tell it apart.
//!
//! A later fragment carries no UDP header; without its first fragment,
//! judged here, nobody can reassemble it.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    headers::{EthHeader, Ipv4Header},
    vxlan::{ETH_HLEN, IPPROTO_UDP, IPV4_HLEN},
};

use crate::{maps::EDGEVX_CONFIG, stats};

/// Not VXLAN: the bridge and the host carry on as usual.
const NEXT: i32 = TC_ACT_UNSPEC;

pub fn run(ctx: &TcContext) -> i32 {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return NEXT;
    };
    let (Ok(eth), Ok(ip)) = (ctx.load::<[u8; ETH_HLEN]>(0), ctx.load::<[u8; IPV4_HLEN]>(ETH_HLEN)) else {
        return NEXT;
    };
    let ip = Ipv4Header(&ip);
    if cfg.vni == 0
        || !EthHeader(&eth).is_ipv4()
        || !ip.is_valid_v4()
        || ip.protocol() != IPPROTO_UDP
        || ip.is_later_fragment()
    {
        return NEXT;
    }
    let Ok(ports) = ctx.load::<[u8; 4]>(ETH_HLEN + ip.header_len()) else {
        return NEXT;
    };
    if u16::from_be_bytes([ports[2], ports[3]]) != cfg.port {
        return NEXT;
    }
    stats::add(Counter::DropPodVxlan, 1);
    TC_ACT_SHOT
}
