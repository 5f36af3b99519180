//! Drop events for `edgevx monitor`: the programs' drop points call in
//! here beside their counter. Nothing is read or written unless a monitor
//! watches, and then at most `EVENTS_PER_SEC` a CPU (common/src/monitor.rs
//! says why and how).
//!
//! A drop point checks the watch (one array lookup, one clock read) and,
//! when watched, tail-calls the event program (`EVENT_PROGRAM`, in slot 0
//! of `EDGEVX_MON_PROGS`) with what it knows beyond the headers in the
//! skb's `cb`: the reason and program, where the UDP header is, the peer.
//! The event program reads the headers again from the skb, writes the
//! event and drops the packet. A tail call, not a BPF-to-BPF call: the
//! callee gets a stack of its own (decap alone uses nearly all of the 512
//! bytes a program and its calls share), and none of the drop points
//! carries a copy of the header parsing. Should the tail call fail (an
//! empty slot), the drop point drops the packet itself, as without a
//! monitor.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, bpf_sk_lookup},
    cty::c_void,
    helpers::{bpf_ktime_get_ns, generated::bpf_skb_load_bytes},
    maps::ring_buf::RingBufEntry,
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    monitor::{
        DROP_EVENT_LEN, DropEvent, EV_INNER, EV_INNER_PORTS, EV_INNER6, EV_OUTER, EV_OUTER_PORTS, EV_OUTER6, EV_PEER,
        EV_VNI, Program,
    },
    vxlan::{ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_UDP, IPV6_HLEN},
};

use crate::{
    maps::{EDGEVX_MON_BUDGET, EDGEVX_MON_EVENTS, EDGEVX_MON_PROGS, EDGEVX_MON_WATCH},
    skb,
    tunnel::TUNNEL_LEN,
};

const IPPROTO_TCP: u8 = 6;

/// In `code`: the IP header after Ethernet is the inner packet (encap, the
/// VTEP guard), not an outer one.
const CODE_INNER: u32 = 1 << 24;
/// In `code`: the outer source is the peer (decap, after the sender was
/// found among the accepted peers).
const CODE_PEER_IS_SRC: u32 = 1 << 25;

/// The skb's `cb` words a drop point hands the event program.
const CB_CODE: usize = 0;
const CB_UDP_AT: usize = 1;
const CB_PEER4: usize = 2;

/// A drop on the underlay's ingress. `udp_at`: where the UDP header is when
/// the caller walked IPv6 extension headers to it (0: right after the IP
/// header). `from_peer`: the sender is an accepted peer.
#[inline(always)]
pub fn decap(ctx: &TcContext, reason: Counter, udp_at: usize, from_peer: bool) {
    let peer = if from_peer { CODE_PEER_IS_SRC } else { 0 };
    hand_over(ctx, code(reason as u32, Program::Decap) | peer, udp_at as u32, 0);
}

/// A drop on `flannel.<VNI>`'s egress; `peer`: the next hop's public IP, when known.
#[inline(always)]
pub fn encap(ctx: &TcContext, reason: Counter, peer: Option<&[u8; 4]>) {
    let peer = peer.map_or(0, |p| u32::from_ne_bytes(*p));
    hand_over(ctx, code(reason as u32, Program::Encap) | CODE_INNER, 0, peer);
}

/// A packet the encap answers with ICMP "fragmentation needed" instead of
/// sending it: not dropped by the event program (the caller goes on to
/// build the reply from it), so the event is written here, inline.
#[inline(always)]
pub fn frag_needed(ctx: &TcContext, peer: &[u8; 4]) {
    if watched() {
        let code = code(Counter::DropFragNeeded as u32, Program::Encap) | CODE_INNER;
        write(ctx, code, 0, u32::from_ne_bytes(*peer));
    }
}

/// A drop on the VTEP's ingress (the guard, the fast path behind it).
#[inline(always)]
pub fn vtep_guard(ctx: &TcContext, reason: u32) {
    hand_over(ctx, code(reason, Program::VtepGuard) | CODE_INNER, 0, 0);
}

/// A drop of a frame read as an outer packet with no known peer: a pod's
/// datagram on the bridge, a tagged frame on the underlay or the bridge.
#[inline(always)]
pub fn unpeered(ctx: &TcContext, reason: Counter, program: Program) {
    hand_over(ctx, code(reason as u32, program), 0, 0);
}

/// A drop on the underlay's ingress after decap stripped the outer headers.
#[inline(always)]
pub fn decap_stripped(ctx: &TcContext, reason: Counter) {
    hand_over(ctx, code(reason as u32, Program::Decap) | CODE_INNER | CODE_PEER_IS_SRC, 0, 0);
}

/// Whether a monitor watches now.
#[inline(always)]
fn watched() -> bool {
    let Some(watch) = EDGEVX_MON_WATCH.get(0) else {
        return false;
    };
    // SAFETY: plain helper call.
    watch.watched(unsafe { bpf_ktime_get_ns() })
}

/// When a monitor watches, the event program takes over (and drops the
/// packet); else, or should the tail call fail, back to the caller, which
/// drops it.
#[inline(always)]
fn hand_over(ctx: &TcContext, code: u32, udp_at: u32, peer4: u32) {
    if !watched() {
        return;
    }
    let raw = skb::raw(ctx);
    // SAFETY: `cb` is the programs' scratch space in the skb, writable by
    // TC programs; only the event program reads it after us. The tail
    // call returns only when it fails.
    unsafe {
        (*raw).cb[CB_CODE] = code;
        (*raw).cb[CB_UDP_AT] = udp_at;
        (*raw).cb[CB_PEER4] = peer4;
        EDGEVX_MON_PROGS.tail_call(ctx, 0);
    }
}

/// The event program: the event for the drop the caller handed over (in
/// `cb`), then the drop.
#[inline(always)]
pub fn event_program(ctx: &TcContext) -> i32 {
    let raw = skb::raw(ctx);
    // SAFETY: reads of the context's own fields.
    let (code, udp_at, peer4) = unsafe { ((*raw).cb[CB_CODE], (*raw).cb[CB_UDP_AT], (*raw).cb[CB_PEER4]) };
    write(ctx, code, udp_at, peer4);
    TC_ACT_SHOT
}

#[inline(always)]
const fn code(reason: u32, program: Program) -> u32 {
    (reason & 0xffff) | ((program as u32) << 16)
}

/// The event slot for a drop now, if a monitor watches and this CPU's
/// budget allows; counts what the budget or a full ring refuses.
#[inline(always)]
fn reserve() -> Option<(RingBufEntry<DropEvent>, u64)> {
    let watch = EDGEVX_MON_WATCH.get(0)?;
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if !watch.watched(now) {
        return None;
    }
    // SAFETY: per-CPU value, only this CPU writes it while we run.
    let budget = unsafe { &mut *EDGEVX_MON_BUDGET.get_ptr_mut(0)? };
    if !budget.admit(now) {
        return None;
    }
    let Some(mut entry) = EDGEVX_MON_EVENTS.reserve::<DropEvent>(0) else {
        budget.lost_ring += 1;
        return None;
    };
    budget.sent += 1;
    // Zeroed word by word: `write_bytes` becomes a call to a byte loop.
    let words = entry.as_mut_ptr().cast::<u64>();
    for i in 0..DROP_EVENT_LEN / 8 {
        // SAFETY: within the reservation, DropEvent's size (a multiple of 8,
        // 8-aligned); zero is a valid DropEvent.
        unsafe { words.add(i).write_volatile(0) };
    }
    Some((entry, now))
}

/// Writes the event for a drop now, if a monitor (still) watches and this
/// CPU's budget allows.
#[inline(always)]
fn write(ctx: &TcContext, code: u32, udp_at: u32, peer4: u32) {
    let Some((mut entry, now)) = reserve() else {
        return;
    };
    let skb = skb::raw(ctx);
    // SAFETY: reserve zeroed it.
    let ev = unsafe { entry.assume_init_mut() };
    ev.ts_ns = now;
    ev.reason = code & 0xffff;
    ev.program = (code >> 16) as u8;
    // SAFETY: reads of the context's own fields.
    (ev.ifindex, ev.len) = unsafe { ((*skb).ifindex, (*skb).len) };
    fill(ctx, ev, code, udp_at as usize);
    if peer4 != 0 {
        ev.peer[..4].copy_from_slice(&peer4.to_ne_bytes());
        ev.flags |= EV_PEER;
    } else if code & CODE_PEER_IS_SRC != 0 && ev.flags & EV_OUTER != 0 {
        ev.peer = ev.outer_src;
        ev.flags |= EV_PEER;
    }
    entry.submit(0);
}

/// Reads `size_of::<T>()` packet bytes at `at` straight into the event
/// (the reservation), not onto the stack first.
#[inline(always)]
fn load_into<T>(ctx: &TcContext, at: usize, dst: &mut T) -> bool {
    // SAFETY: the helper writes exactly size_of::<T>() bytes into dst, which
    // is plain data (addresses, ports) for which any bytes are valid.
    unsafe {
        bpf_skb_load_bytes(
            skb::raw(ctx) as *const c_void,
            at as u32,
            (dst as *mut T).cast(),
            core::mem::size_of::<T>() as u32,
        ) == 0
    }
}

#[inline(always)]
fn ethertype_at(ctx: &TcContext, at: usize) -> u16 {
    ctx.load::<[u8; 2]>(at).map_or(0, u16::from_be_bytes)
}

#[inline(always)]
fn fill(ctx: &TcContext, ev: &mut DropEvent, code: u32, udp_at: usize) {
    let ethertype = ethertype_at(ctx, 12);
    if code & CODE_INNER != 0 {
        inner(ctx, ev, ETH_HLEN, ethertype);
        return;
    }
    let Some(l4) = outer(ctx, ev, ethertype, udp_at) else {
        return;
    };
    // source and destination port, adjacent in the event as on the wire
    let ports = unsafe { &mut *(&mut ev.outer_sport as *mut u16 as *mut [u16; 2]) };
    if !load_into(ctx, l4, ports) {
        return;
    }
    ev.outer_sport = u16::from_be(ev.outer_sport);
    ev.outer_dport = u16::from_be(ev.outer_dport);
    ev.flags |= EV_OUTER_PORTS;
    if ev.outer_proto != IPPROTO_UDP {
        return;
    }
    // UDP (8), VXLAN (8: the VNI in bytes 4..7), inner Ethernet (14)
    if !load_into(ctx, l4 + 12, &mut ev.vni) {
        return;
    }
    ev.vni = u32::from_be(ev.vni) >> 8;
    ev.flags |= EV_VNI;
    inner(ctx, ev, l4 + TUNNEL_LEN, ethertype_at(ctx, l4 + TUNNEL_LEN - 2));
}

/// The outer IP header's addresses; the offset of its TCP or UDP header,
/// when it has one (not a later fragment).
#[inline(always)]
fn outer(ctx: &TcContext, ev: &mut DropEvent, ethertype: u16, udp_at: usize) -> Option<usize> {
    match ethertype {
        ETH_P_IP => {
            let (vihl, frag, proto) = ipv4_fields(ctx, ETH_HLEN)?;
            let src = unsafe { &mut *(ev.outer_src.as_mut_ptr() as *mut [u8; 8]) };
            if !load_into(ctx, ETH_HLEN + 12, src) {
                return None;
            }
            // the destination came with the source: move it to its field
            ev.outer_dst[..4].copy_from_slice(&src[4..]);
            src[4..].copy_from_slice(&[0; 4]);
            ev.outer_proto = proto;
            ev.flags |= EV_OUTER;
            (frag & 0x1fff == 0 && is_l4(proto)).then_some(ETH_HLEN + (vihl & 0x0f) as usize * 4)
        }
        ETH_P_IPV6 => {
            let proto = ctx.load::<u8>(ETH_HLEN + 6).ok()?;
            if !load_into(ctx, ETH_HLEN + 8, &mut ev.outer_src) || !load_into(ctx, ETH_HLEN + 24, &mut ev.outer_dst) {
                return None;
            }
            ev.outer_proto = proto;
            ev.flags |= EV_OUTER | EV_OUTER6;
            if udp_at != 0 {
                // behind extension headers the caller walked
                ev.outer_proto = IPPROTO_UDP;
                return Some(udp_at);
            }
            is_l4(proto).then_some(ETH_HLEN + IPV6_HLEN)
        }
        _ => None,
    }
}

/// An IPv4 header's version/IHL byte, flags/fragment offset and protocol.
#[inline(always)]
fn ipv4_fields(ctx: &TcContext, at: usize) -> Option<(u8, u16, u8)> {
    let vihl = ctx.load::<u8>(at).ok()?;
    let frag = u16::from_be_bytes(ctx.load::<[u8; 2]>(at + 6).ok()?);
    let proto = ctx.load::<u8>(at + 9).ok()?;
    Some((vihl, frag, proto))
}

/// The inner IP header at `at` and its ports.
#[inline(always)]
fn inner(ctx: &TcContext, ev: &mut DropEvent, at: usize, ethertype: u16) {
    let l4 = match ethertype {
        ETH_P_IP => {
            let Some((vihl, frag, proto)) = ipv4_fields(ctx, at) else {
                return;
            };
            let src = unsafe { &mut *(ev.inner_src.as_mut_ptr() as *mut [u8; 8]) };
            if !load_into(ctx, at + 12, src) {
                return;
            }
            ev.inner_dst[..4].copy_from_slice(&src[4..]);
            src[4..].copy_from_slice(&[0; 4]);
            ev.inner_proto = proto;
            ev.flags |= EV_INNER;
            if frag & 0x1fff != 0 || !is_l4(proto) {
                return;
            }
            at + (vihl & 0x0f) as usize * 4
        }
        ETH_P_IPV6 => {
            let Ok(proto) = ctx.load::<u8>(at + 6) else {
                return;
            };
            if !load_into(ctx, at + 8, &mut ev.inner_src) || !load_into(ctx, at + 24, &mut ev.inner_dst) {
                return;
            }
            ev.inner_proto = proto;
            ev.flags |= EV_INNER | EV_INNER6;
            if !is_l4(proto) {
                return;
            }
            at + IPV6_HLEN
        }
        _ => return,
    };
    let ports = unsafe { &mut *(&mut ev.inner_sport as *mut u16 as *mut [u16; 2]) };
    if load_into(ctx, l4, ports) {
        ev.inner_sport = u16::from_be(ev.inner_sport);
        ev.inner_dport = u16::from_be(ev.inner_dport);
        ev.flags |= EV_INNER_PORTS;
    }
}

#[inline(always)]
fn is_l4(proto: u8) -> bool {
    proto == IPPROTO_UDP || proto == IPPROTO_TCP
}

/// A datagram the socket-lookup guard refused: the lookup's addresses and
/// ports are the outer ones (no packet to read). `remote`/`local` as on the
/// wire; IPv4 in the first 4 bytes.
#[inline(always)]
pub fn socket_guard(l: &bpf_sk_lookup, reason: Counter, v6: bool, remote: [u8; 16], ifindex: u32) {
    let Some((mut entry, now)) = reserve() else {
        return;
    };
    // SAFETY: reserve zeroed it.
    let ev = unsafe { entry.assume_init_mut() };
    ev.ts_ns = now;
    ev.reason = reason as u32;
    ev.program = Program::SocketGuard as u8;
    ev.ifindex = ifindex;
    ev.outer_proto = l.protocol as u8;
    ev.outer_src = remote;
    if !v6 {
        ev.outer_dst[..4].copy_from_slice(&l.local_ip4.to_ne_bytes());
    }
    // remote_port: network order in the low 16 bits of the word; local_port: host order
    ev.outer_sport = u16::from_be(l.remote_port);
    ev.outer_dport = l.local_port as u16;
    ev.flags = EV_OUTER | EV_OUTER_PORTS | if v6 { EV_OUTER6 } else { 0 };
    entry.submit(0);
}
