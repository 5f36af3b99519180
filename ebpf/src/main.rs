//! edgevx TC programs: VXLAN encapsulation on the VTEP device's egress and
//! decapsulation on the underlay's ingress. All state comes from maps the
//! agent fills; nothing here knows where a peer came from.
#![no_std]
#![no_main]
// the outer IP ID's atomic fetch-and-add, written out (encap.rs `fetch_add`)
#![feature(asm_experimental_arch)]
// aya-ebpf-macros 0.4's #[classifier] wraps each program in a public
// extern fn taking the raw context pointer; the lint is about that wrapper
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod bridge;
mod decap;
mod encap;
mod fastpath;
mod fastpath_send;
mod guard;
mod judge6;
mod kfunc;
mod maps;
mod monitor;
mod pod_guard;
mod skb;
mod stats;
mod tagged;
mod too_big;
mod tunnel;
mod vtep_guard;
mod vxlan_port;
mod xdp_judge;

use aya_ebpf::{
    macros::{classifier, sk_lookup, xdp},
    programs::{SkLookupContext, TcContext, XdpContext},
};

/// Egress of `flannel.<VNI>`: routed pod traffic in, VXLAN out of the underlay.
#[classifier]
pub fn edgevx_encap(ctx: TcContext) -> i32 {
    encap::run(&ctx, true)
}

/// The same without judging the underlay MTU, for kernels without
/// `bpf_check_mtu` (Linux 5.12): their verifier refuses the call.
#[classifier]
pub fn edgevx_encap_compat(ctx: TcContext) -> i32 {
    encap::run(&ctx, false)
}

/// Egress of the pod bridge: routed frames for a learned pod go to its port.
#[classifier]
pub fn edgevx_bridge(ctx: TcContext) -> i32 {
    bridge::run(&ctx)
}

/// Ingress of the pod bridge: VXLAN sent by local pods is dropped.
#[classifier]
pub fn edgevx_pod_guard(ctx: TcContext) -> i32 {
    pod_guard::run(&ctx)
}

/// Ingress of the underlay interface: VXLAN from known peers in (IPv6
/// VXLAN judged, then left to the kernel's `flannel-v6.<VNI>`).
#[classifier]
pub fn edgevx_decap(ctx: TcContext) -> i32 {
    decap::run(&ctx)
}

/// Ingress of `flannel.<VNI>` and `flannel-v6.<VNI>`: a frame decap did
/// not judge (a program ahead of it ended the chain) is dropped.
#[classifier]
pub fn edgevx_vtep_guard(ctx: TcContext) -> i32 {
    vtep_guard::run(&ctx)
}

/// Not attached anywhere: a drop point tail-calls it (through
/// `EDGEVX_MON_PROGS`) while `edgevx monitor` watches; it writes the drop's
/// event and drops the packet (monitor.rs).
#[classifier]
pub fn edgevx_drop_event(ctx: TcContext) -> i32 {
    monitor::event_program(&ctx)
}

/// Socket lookups in the node's namespace: VXLAN from non-peers, by any
/// path, and a peer's off the underlay.
#[sk_lookup]
pub fn edgevx_guard(ctx: SkLookupContext) -> u32 {
    guard::run(&ctx, true)
}

/// The same without the ingress-interface check, for kernels before 5.17
/// (no `bpf_sk_lookup.ingress_ifindex`: their verifier refuses the read).
#[sk_lookup]
pub fn edgevx_guard_compat(ctx: SkLookupContext) -> u32 {
    guard::run(&ctx, false)
}

/// The underlay's driver (native XDP only): a stranger's VXLAN, bad flags
/// and truncated headers dropped before any skb; the rest left to decap.
#[xdp]
pub fn edgevx_xdp_judge(ctx: XdpContext) -> u32 {
    xdp_judge::run(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
