//! Encapsulation: an IPv4 frame routed into `flannel.<VNI>` becomes a VXLAN
//! frame to the peer owning the inner destination's subnet, sent out of
//! the underlay with the kernel resolving the next hop (no fdb, no arp).

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L2_ETH, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP,
        BPF_F_ADJ_ROOM_FIXED_GSO, TC_ACT_SHOT, bpf_adj_room_mode,
    },
    helpers::generated::{bpf_get_hash_recalc, bpf_get_prandom_u32, bpf_redirect_neigh},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    headers::Ipv4Header,
    maps::{FLAG_ENCAP_NO_L2_ETH, IP_ID_BUCKETS, MARK_FAST_SENT},
    vxlan::{
        ENCAP_OVERHEAD, ETH_HLEN, ETH_P_IP, EncapParams, INNER_ETH_OFF, IPV4_HLEN, OUTER_IP_OFF, UDP_OFF, inner_eth,
        outer_ip, source_port, udp_vxlan,
    },
};

use crate::{
    fastpath,
    maps::{EDGEVX_CONFIG, EDGEVX_IP_ID, EDGEVX_IP_IDENTS, EDGEVX_LOCAL_PODS, EDGEVX_PEER_SUBNETS},
    monitor, skb, stats, too_big,
};

/// The device MTU already leaves room for the 50 bytes (flannel's MTU - 50),
/// so GSO segment sizes stay as the sender chose them (FIXED_GSO). The ENCAP
/// flags tell the kernel the skb is now a UDP tunnel, so segmentation and
/// checksum offload act on the inner headers.
const ENCAP_FLAGS: u64 = ENCAP_FLAGS_NO_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2_ETH as u64;

/// The same without marking the inner frame as Ethernet, for kernels before
/// 5.13, which refuse that flag (see [`grow`]).
const ENCAP_FLAGS_NO_L2_ETH: u64 =
    (BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP) as u64
        | ((ETH_HLEN as u64) << BPF_F_ADJ_ROOM_ENCAP_L2_SHIFT);

/// `BPF_F_ADJ_ROOM_ENCAP_L2(len)` puts the inner L2 length in the top byte.
const BPF_F_ADJ_ROOM_ENCAP_L2_SHIFT: u64 = 56;

/// Encapsulates one frame. `check_mtu`: judge it against the underlay MTU
/// with `bpf_check_mtu` (a constant per entry point, so the compat variant
/// holds no call to the helper at all).
#[inline(always)]
pub fn run(ctx: &TcContext, check_mtu: bool) -> i32 {
    let Some(cfg) = EDGEVX_CONFIG.get(0) else {
        return TC_ACT_SHOT;
    };
    if cfg.vni == 0 {
        return drop(ctx, Counter::DropNoConfig, None);
    }
    match ctx.load::<[u8; 2]>(12) {
        Ok(p) if u16::from_be_bytes(p) == ETH_P_IP => {}
        _ => {
            return drop(ctx, Counter::DropNotIpv4, None);
        }
    }
    let Ok(header) = ctx.load::<[u8; IPV4_HLEN]>(ETH_HLEN) else {
        return drop(ctx, Counter::DropNotIpv4, None);
    };
    let inner = Ipv4Header(&header);
    // a destination in no peer's subnet is dropped here, counted: handing it
    // to the kernel's device (no fdb) would drop it unseen, and routing it
    // anywhere else could loop
    let Some(peer) = EDGEVX_PEER_SUBNETS.get(&Key::new(32, inner.dst())) else {
        return drop(ctx, Counter::DropNoRoute, None);
    };
    let peer = *peer;
    if check_mtu && let Some(mtu) = too_big::exceeds(ctx, cfg, &inner) {
        return too_big::handle(ctx, cfg, &inner, &peer, mtu);
    }
    // SAFETY: a read of the context's own field.
    let mark = unsafe { (*skb::raw(ctx)).mark };
    if mark & MARK_FAST_SENT != 0 {
        // the fast path's send side handed it here: cleared before the
        // underlay, and no proof of the stack's (fastpath_send.rs)
        ctx.set_mark(mark & !MARK_FAST_SENT);
    } else {
        // the stack carried this flow here under the current ruleset: a
        // local pod's later packets of it may take the send side
        fastpath::record_if(ctx, |key| EDGEVX_LOCAL_PODS.get_ptr(&key.saddr).is_some());
    }
    let peer_stats = stats::peer(&peer.public_ip);

    let len = ctx.len();
    let inner_ip_len = len.wrapping_sub(ETH_HLEN as u32);
    // SAFETY: the helper only reads the skb it is given.
    let hash = unsafe { bpf_get_hash_recalc(skb::raw(ctx)) };
    let params = EncapParams {
        local_ip: cfg.local_ip,
        remote_ip: peer.public_ip,
        local_mac: cfg.vtep_mac,
        remote_mac: peer.vtep_mac,
        vni: cfg.vni,
        src_port: source_port(hash),
        dst_port: cfg.port,
        ecn: header[1],
        ip_id: next_ip_id(ctx, check_mtu, peer.public_ip),
    };
    let grown = inner_ip_len + ENCAP_OVERHEAD as u32 <= u16::MAX as u32 && grow(ctx, cfg.flags);
    // the outer Ethernet header stays as routing left it; redirect_neigh rewrites it
    let ip_len = inner_ip_len as u16;
    let stored = grown
        && ctx.store(OUTER_IP_OFF, &outer_ip(&params, ip_len), 0).is_ok()
        && ctx.store(UDP_OFF, &udp_vxlan(&params, ip_len), 0).is_ok()
        && ctx.store(INNER_ETH_OFF, &inner_eth(&params), 0).is_ok();
    if !stored {
        // counted before the monitor's tail call, which does not return
        if let Some(s) = peer_stats {
            s.tx_errors += 1;
        }
        return drop(ctx, Counter::DropAdjustRoom, Some(&peer.public_ip));
    }
    stats::count(Counter::TxPackets, Counter::TxBytes, len);
    if let Some(s) = peer_stats {
        s.tx_packets += 1;
        s.tx_bytes += len as u64;
    }
    // SAFETY: no neighbour parameters: the kernel routes the outer
    // destination through the underlay and resolves its next hop.
    unsafe { bpf_redirect_neigh(cfg.underlay_ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

/// Drops a frame before encapsulation: counted, and shown to a monitor.
#[inline(always)]
pub(crate) fn drop(ctx: &TcContext, reason: Counter, peer: Option<&[u8; 4]>) -> i32 {
    stats::add(reason, 1);
    monitor::encap(ctx, reason, peer);
    TC_ACT_SHOT
}

/// Adds the 50 bytes. The kernel is asked with `BPF_F_ADJ_ROOM_ENCAP_L2_ETH`
/// first; a kernel that does not know the flag (before 5.13) refuses the
/// call with -EINVAL before it touches the skb, and is asked again without
/// it. Flags are run-time arguments the verifier never sees, so this is the
/// probe: whatever a distribution backported is used, and the headers on
/// the wire are the same either way (only `inner_protocol` differs).
/// `FLAG_ENCAP_NO_L2_ETH` (`--legacy-encap`) skips the first try.
#[inline(always)]
fn grow(ctx: &TcContext, cfg_flags: u32) -> bool {
    let mode = bpf_adj_room_mode::BPF_ADJ_ROOM_MAC;
    (cfg_flags & FLAG_ENCAP_NO_L2_ETH == 0 && ctx.adjust_room(ENCAP_OVERHEAD as i32, mode, ENCAP_FLAGS).is_ok())
        || ctx.adjust_room(ENCAP_OVERHEAD as i32, mode, ENCAP_FLAGS_NO_L2_ETH).is_ok()
}

/// A fresh outer IP ID, and the ones after it reserved for the segments of
/// a GSO frame (segmentation numbers them up from the first), as the
/// kernel's `iptunnel_xmit` does with `__ip_select_ident(.., gso_segs)`.
///
/// `shared` (the full encap, kernels with BPF atomics' fetch, 5.12): one
/// counter per destination bucket shared by every CPU and taken with an
/// atomic fetch-and-add, as the kernel's `ip_idents`, so no two packets to
/// one destination share an ID within 65,536, whichever CPU sends them.
/// Otherwise (the compat encap): a counter per CPU, started at a random
/// value, which two CPUs sending to one destination may repeat sooner.
#[inline(always)]
fn next_ip_id(ctx: &TcContext, shared: bool, dst: [u8; 4]) -> u16 {
    // SAFETY: reading a field of the context the program was given.
    let segs = unsafe { (*skb::raw(ctx)).gso_segs }.max(1);
    if shared {
        return shared_ip_id(dst, segs);
    }
    let Some(slot) = EDGEVX_IP_ID.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    unsafe {
        if *slot == 0 {
            // a restart must not begin where the last run did
            *slot = bpf_get_prandom_u32() | 1 << 16;
        }
        let id = *slot as u16;
        *slot = (*slot).wrapping_add(segs) | 1 << 16;
        id
    }
}

/// The shared counter of `dst`'s bucket, advanced by `segs`; its value
/// before. The bucket is chosen with a random salt (the map's last slot,
/// set once), so which destinations share a counter cannot be predicted
/// from outside; a fresh counter starts at a random value.
#[inline(always)]
fn shared_ip_id(dst: [u8; 4], segs: u32) -> u16 {
    let Some(salt) = EDGEVX_IP_IDENTS.get_ptr_mut(IP_ID_BUCKETS) else {
        return 0;
    };
    // SAFETY: a map value of ours; a racing first writer only picks another random salt.
    let salt = unsafe {
        if *salt == 0 {
            *salt = u64::from(bpf_get_prandom_u32()) | 1 << 32;
        }
        *salt as u32
    };
    let bucket = (u32::from_be_bytes(dst) ^ salt).wrapping_mul(0x9e37_79b1) >> 21;
    let Some(counter) = EDGEVX_IP_IDENTS.get_ptr_mut(bucket) else {
        return 0;
    };
    // SAFETY: a map value of ours, 8-byte aligned; changed only with atomic adds.
    unsafe {
        if *counter == 0 {
            // a fresh counter starts anywhere (two CPUs racing here only add two random starts)
            fetch_add(counter, u64::from(bpf_get_prandom_u32()) | 1 << 32);
        }
        fetch_add(counter, u64::from(segs)) as u16
    }
}

/// `*p += v` atomically, returning the value before: BPF_ATOMIC with
/// BPF_FETCH (Linux 5.12). Written out because LLVM emits it only for
/// `-mcpu=v3`, and the object is built for every kernel; only the full
/// encap, which the agent loads where the kernel takes it, contains it.
///
/// # Safety
/// `p` must point to a live, 8-byte aligned map value.
#[inline(always)]
unsafe fn fetch_add(p: *mut u64, v: u64) -> u64 {
    let mut v = v;
    // SAFETY: the caller's; the instruction touches only *p.
    unsafe {
        core::arch::asm!(
            "{v} = atomic_fetch_add((u64 *)({p} + 0), {v})",
            p = in(reg) p,
            v = inout(reg) v,
            options(nostack),
        );
    }
    v
}
