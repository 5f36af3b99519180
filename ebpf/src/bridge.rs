//! Egress of the pod bridge (`cni0`): a frame the host routed to a learned
//! local pod goes straight to that pod's port, as the bridge would send it.
//!
//! Why: a GSO packet decapsulated in TC still carries the tunnel GSO state
//! (the kernel offers BPF no flag to clear it on this kernel). The bridge
//! has no tunnel offload features, so it would cut such a packet into
//! MTU-sized segments in software; the pod's veth takes it whole. This
//! runs after routing and every netfilter hook (POSTROUTING included), so
//! nothing the host decided is skipped: only the bridge's own forwarding
//! step, whose result (the port behind the pod's MAC) the agent learned.

use aya_ebpf::{bindings::TC_ACT_UNSPEC, helpers::generated::bpf_redirect, programs::TcContext};
use edgevx_common::{
    counters::Counter,
    vxlan::{ETH_HLEN, ETH_P_IP},
};

use crate::{fastpath, maps::EDGEVX_LOCAL_PODS, stats};

/// Not for a learned pod: the bridge forwards it as usual.
const NEXT: i32 = TC_ACT_UNSPEC;

pub fn run(ctx: &TcContext) -> i32 {
    let Ok(head) = ctx.load::<[u8; ETH_HLEN + 20]>(0) else {
        return NEXT;
    };
    if u16::from_be_bytes([head[12], head[13]]) != ETH_P_IP {
        return NEXT;
    }
    let dst = [head[ETH_HLEN + 16], head[ETH_HLEN + 17], head[ETH_HLEN + 18], head[ETH_HLEN + 19]];
    let Some(pod) = EDGEVX_LOCAL_PODS.get_ptr(&dst).map(|p| unsafe { *p }) else {
        return NEXT;
    };
    // only where the bridge itself would send it: the frame is for the pod's MAC
    if head[..6] != pod.pod_mac {
        return NEXT;
    }
    stats::add(Counter::BridgeToPort, 1);
    fastpath::record(ctx);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect(pod.host_ifindex, 0) as i32 }
}
