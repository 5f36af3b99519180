//! Ingress of the pod bridge (`cni0`): what local pods send up to the host.
//! A UDP datagram to the VXLAN port is dropped here, whatever its
//! destination (`drop_pod_vxlan`): a pod must not reach any node's VXLAN
//! socket, since masquerade would give it this node's address, which every
//! peer accepts. Dropping on the node where it starts is the only place the
//! pod's own source address is still there to tell it apart.
//!
//! IPv6 the same way (a dual-stack peer's `flannel-v6.<VNI>` socket),
//! behind extension headers too; see `vxlan_port.rs` for what counts.
//!
//! A pod with CAP_NET_RAW may hide the datagram behind VLAN tags: the
//! kernel strips them after this program and routes what they carry. That
//! is judged by `tagged.rs` and dropped as `drop_vxlan_tagged`.
//!
//! What is not VXLAN may take the fast path's send side
//! (`fastpath_send.rs`).

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use edgevx_common::{counters::Counter, headers::EthHeader, monitor::Program, vxlan::ETH_HLEN};

use crate::{fastpath_send, maps::EDGEVX_CONFIG, monitor, stats, tagged, vxlan_port};

/// Not VXLAN: the bridge and the host carry on as usual.
const NEXT: i32 = TC_ACT_UNSPEC;

pub fn run(ctx: &TcContext) -> i32 {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return NEXT;
    };
    let Ok(eth) = ctx.load::<[u8; ETH_HLEN]>(0) else {
        return NEXT;
    };
    if cfg.vni == 0 {
        return NEXT;
    }
    let eth = EthHeader(&eth);
    if eth.is_vlan() {
        return tagged::judge(ctx, cfg.port, Program::PodGuard);
    }
    if !vxlan_port::is_udp_to(ctx, eth.ethertype(), ETH_HLEN, cfg.port) {
        // not VXLAN: an established plain flow to a peer's pod may skip the stack
        return fastpath_send::run(ctx).unwrap_or(NEXT);
    }
    stats::add(Counter::DropPodVxlan, 1);
    monitor::unpeered(ctx, Counter::DropPodVxlan, Program::PodGuard);
    TC_ACT_SHOT
}
