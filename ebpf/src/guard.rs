//! The socket-lookup guard: runs on every UDP socket lookup in the node's
//! network namespace, so on every datagram delivered locally, whatever
//! interface it came in on and whatever local address it was sent to, and
//! after IP reassembly (the lookup follows `ip_defrag` / `ipv6_frag_rcv`).
//! A datagram to our VXLAN port from an address that is not an accepted
//! peer finds no socket: the kernel's VXLAN socket never sees it
//! (`drop_unknown_peer_socket`). Neither does a peer's that came in on
//! another interface than the underlay (`drop_vxlan_off_underlay`).
//!
//! Both families: IPv4 lookups (`flannel.<VNI>`'s socket) against
//! `EDGEVX_PEER_ACCEPT`, IPv6 lookups (`flannel-v6.<VNI>`'s) against
//! `EDGEVX_PEER_ACCEPT6`. With IPv6 off (no public IPv6 configured) IPv6
//! lookups pass, as on a v4-only node.
//!
//! Decap on the underlay judges first and more (the inner checks); this
//! closes the paths decap does not see: a second interface, pods of this
//! node, fragments reassembled by the kernel, IPv6 extension headers.
//! Broadcast and multicast datagrams are delivered without a lookup; on the
//! underlay decap judges those.

use aya_ebpf::{bindings::bpf_sk_lookup, programs::SkLookupContext};
use edgevx_common::{counters::Counter, vxlan::IPPROTO_UDP};

use crate::{
    maps::{EDGEVX_CONFIG, EDGEVX_PEER_ACCEPT, EDGEVX_PEER_ACCEPT6},
    monitor, stats,
};

const SK_DROP: u32 = 0;
const SK_PASS: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

/// `check_iface`: whether to refuse a peer's VXLAN off the underlay; a
/// constant per program, so the compat program never reads the field.
#[inline(always)]
pub fn run(ctx: &SkLookupContext, check_iface: bool) -> u32 {
    // SAFETY: the context the program was given.
    let l = unsafe { &*ctx.lookup };
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return SK_PASS;
    };
    // local_port is in host order, the remote address as on the wire
    if cfg.vni == 0 || l.protocol != IPPROTO_UDP as u32 || l.local_port != cfg.port as u32 {
        return SK_PASS;
    }
    let (peer, v6) = match l.family {
        AF_INET => (EDGEVX_PEER_ACCEPT.get_ptr(&l.remote_ip4.to_ne_bytes()).is_some(), false),
        AF_INET6 if cfg.ipv6_on() => (EDGEVX_PEER_ACCEPT6.get_ptr(&remote_ip6(l)).is_some(), true),
        _ => return SK_PASS,
    };
    if !peer {
        return drop(l, Counter::DropUnknownPeerSocket, v6, check_iface);
    }
    // a peer's VXLAN is judged whole (inner source, TTL, flags) only by
    // decap on the underlay, which saw it before the kernel reassembled or
    // delivered it; from anywhere else the kernel would decapsulate it
    // unjudged
    if check_iface && l.ingress_ifindex != cfg.underlay_ifindex {
        return drop(l, Counter::DropVxlanOffUnderlay, v6, check_iface);
    }
    SK_PASS
}

/// Refuses the lookup: counted, and shown to a monitor (with the ingress
/// interface where the kernel has it, see `check_iface`).
#[inline(always)]
fn drop(l: &bpf_sk_lookup, reason: Counter, v6: bool, check_iface: bool) -> u32 {
    stats::add(reason, 1);
    let remote = if v6 {
        remote_ip6(l)
    } else {
        let a = l.remote_ip4.to_ne_bytes();
        [a[0], a[1], a[2], a[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    };
    let ifindex = if check_iface { l.ingress_ifindex } else { 0 };
    monitor::socket_guard(l, reason, v6, remote, ifindex);
    SK_DROP
}

/// The remote IPv6 address, as on the wire. Read word by word with
/// volatile loads: the verifier allows `remote_ip6` only in reads of at
/// most 4 bytes, and LLVM would merge two plain ones into an 8-byte load.
#[inline(always)]
fn remote_ip6(l: &bpf_sk_lookup) -> [u8; 16] {
    // SAFETY: reads of the context's own fields.
    let w = |i: usize| unsafe { core::ptr::read_volatile(&l.remote_ip6[i]) }.to_ne_bytes();
    let (a, b, c, d) = (w(0), w(1), w(2), w(3));
    #[rustfmt::skip]
    let ip = [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3],
        c[0], c[1], c[2], c[3], d[0], d[1], d[2], d[3],
    ];
    ip
}
