//! The conntrack-verified fast path, on `flannel.<VNI>`'s ingress after the
//! VTEP guard: a decapsulated packet of an established, plain TCP or UDP
//! flow for a learned local pod goes straight to the pod's port, past the
//! host's routing, netfilter and bridge, once the kernel's own conntrack
//! entry says the flow may (the rules: common/src/fastpath.rs).
//!
//! Why here: decap re-injects every packet on this device's ingress through
//! the same backlog, and everything from here on is synchronous, so a
//! flow's fast and stack packets keep their order whichever path each one
//! takes (a fast path on the underlay would overtake packets still queued
//! for the stack).
//!
//! What the stack would have done to the packet and the fast path does
//! too: the TTL decrement, the MACs of routing out of the pod bridge, and
//! the conntrack entry's timeout refresh (to the value the stack would
//! set, at most once a second per flow). What it skips: `ip_rcv`,
//! PREROUTING, the FIB lookup, FORWARD, POSTROUTING and the bridge, which
//! for an established plain flow whose packets the current ruleset already
//! accepted (the epoch) change nothing.
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    helpers::{bpf_ktime_get_ns, generated::bpf_redirect},
    programs::TcContext,
};
use edgevx_common::{
    counters::Counter,
    fastpath::{
        CtFields, FP_LIBERAL_SYSCTL, FP_ON, FP_TEST_IGNORE_LIBERAL, FastPathConfig, FlowEvent, FlowKey, IPPROTO_TCP,
        IPPROTO_UDP, REFRESH_SHIFT, Seen, Verdict, judge, stack_timeout, tcp_flags_allow,
    },
    maps::LocalPod,
    vxlan::{ETH_HLEN, ETH_P_IP, IPV4_HLEN},
};

use crate::{
    kfunc::{self, CT_OPTS_SIZE, CURRENT_NETNS, CtOpts, NfConn, SockTupleV4},
    maps::{EDGEVX_FP_CONFIG, EDGEVX_FP_EVENTS, EDGEVX_FP_SEEN, EDGEVX_LOCAL_PODS},
    skb, stats,
};

// Load-time constants (frozen .rodata, so the verifier knows their values):
// whether the conntrack kfuncs were resolved on this kernel, and the
// offsets of the `struct nf_conn` fields read, from the kernel's BTF.
#[unsafe(no_mangle)]
static FP_CT_KFUNCS: u32 = 0;
#[unsafe(no_mangle)]
static FP_OFF_STATUS: u32 = 0;
#[unsafe(no_mangle)]
static FP_OFF_MARK: u32 = 0;
#[unsafe(no_mangle)]
static FP_OFF_TCP_STATE: u32 = 0;
#[unsafe(no_mangle)]
static FP_OFF_SEEN0_FLAGS: u32 = 0;
#[unsafe(no_mangle)]
static FP_OFF_SEEN1_FLAGS: u32 = 0;

/// A load-time constant; volatile so the compiler keeps the read from
/// .rodata instead of folding the placeholder.
#[inline(always)]
fn constant(v: &'static u32) -> u32 {
    // SAFETY: a read of a static.
    unsafe { core::ptr::read_volatile(v) }
}

/// A field of the entry at a BTF offset; the verifier checks the access
/// against `struct nf_conn`'s BTF.
#[inline(always)]
fn field<T: Copy>(ct: *const NfConn, off: &'static u32) -> T {
    // SAFETY: `ct` is a referenced entry from bpf_skb_ct_lookup; the offset
    // is a member's, from BTF.
    unsafe { *((ct as *const u8).add(constant(off) as usize) as *const T) }
}

const IP_MF: u8 = 0x20;
const IP_OFFSET_HI: u8 = 0x1f;

/// Delivers the frame if the fast path may; `None` leaves it to the stack.
#[inline(always)]
pub fn run(ctx: &TcContext) -> Option<i32> {
    let cfg = config()?;
    let Some((key, tcp_flags)) = parse(ctx) else {
        stats::add(Counter::FastPathStackOther, 1);
        return None;
    };
    // SAFETY: a map value copied out.
    let Some(pod) = EDGEVX_LOCAL_PODS.get_ptr(&key.daddr).map(|p| unsafe { *p }) else {
        stats::add(Counter::FastPathStackOther, 1);
        return None;
    };
    verified(ctx, cfg, &key, tcp_flags).then(|| deliver(ctx, &pod))
}

/// The fast path's config, if it is on: the kfuncs resolved at load and
/// the agent's switch.
#[inline(always)]
pub fn config() -> Option<&'static FastPathConfig> {
    if constant(&FP_CT_KFUNCS) == 0 {
        return None;
    }
    let cfg = EDGEVX_FP_CONFIG.get(0)?;
    (cfg.flags & FP_ON != 0).then_some(cfg)
}

/// Whether the packet of the flow `key` (its direction) may skip the
/// stack: the keeper's lease holds, the TCP flags are plain, the stack
/// carried the flow under the current ruleset, and the kernel's own
/// conntrack entry is established, plain and (TCP) tracked liberally. The
/// entry's timeout is refreshed as the stack would; a reason to take the
/// stack is counted, and a flow that only lacks the liberal flag asks the
/// agent for it.
#[inline(always)]
pub fn verified(ctx: &TcContext, cfg: &FastPathConfig, key: &FlowKey, tcp_flags: u8) -> bool {
    // SAFETY: a monotonic clock read.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    if now_ns > cfg.lease_until_ns {
        stats::add(Counter::FastPathStackNoKeeper, 1);
        return false;
    }
    if key.proto == IPPROTO_TCP && !tcp_flags_allow(tcp_flags) {
        stats::add(Counter::FastPathStackTcpFlags, 1);
        return false;
    }
    let Some(seen) = EDGEVX_FP_SEEN.get_ptr_mut(key) else {
        stats::add(Counter::FastPathStackNewRuleset, 1);
        return false;
    };
    // SAFETY: an LRU value; a racing update from another CPU only makes a
    // flow ask or refresh once more.
    let seen = unsafe { &mut *seen };
    if seen.epoch != cfg.epoch {
        stats::add(Counter::FastPathStackNewRuleset, 1);
        return false;
    }
    let mut tuple = SockTupleV4 { saddr: key.saddr, daddr: key.daddr, sport: key.sport, dport: key.dport };
    let mut opts = CtOpts { netns_id: CURRENT_NETNS, error: 0, l4proto: key.proto, dir: 0, reserved: [0; 2] };
    // SAFETY: the kfunc's arguments as its BTF declares them.
    let ct = unsafe {
        kfunc::bpf_skb_ct_lookup(
            skb::raw(ctx),
            &mut tuple,
            core::mem::size_of::<SockTupleV4>() as u32,
            &mut opts,
            CT_OPTS_SIZE,
        )
    };
    if ct.is_null() {
        stats::add(Counter::FastPathStackNoEntry, 1);
        return false;
    }
    let fields = CtFields {
        // `unsigned long status`: the bits that matter are in the low word
        status: field::<u64>(ct, &FP_OFF_STATUS) as u32,
        mark: field::<u32>(ct, &FP_OFF_MARK),
        tcp_state: if key.proto == IPPROTO_TCP { field::<u8>(ct, &FP_OFF_TCP_STATE) } else { 0 },
        seen_flags: if key.proto == IPPROTO_TCP {
            [field::<u8>(ct, &FP_OFF_SEEN0_FLAGS), field::<u8>(ct, &FP_OFF_SEEN1_FLAGS)]
        } else {
            [0; 2]
        },
    };
    let now = (now_ns >> REFRESH_SHIFT) as u32;
    let liberal = cfg.flags & (FP_LIBERAL_SYSCTL | FP_TEST_IGNORE_LIBERAL) != 0;
    let verdict = judge(key.proto, &fields, liberal);
    if verdict == Verdict::Fast && seen.refreshed != now {
        seen.refreshed = now;
        let secs = stack_timeout(key.proto, &fields, cfg);
        // SAFETY: the referenced entry; the kernel refuses fixed timeouts (excluded above).
        unsafe { kfunc::bpf_ct_change_timeout(ct, secs.saturating_mul(1000)) };
    }
    // SAFETY: releases the reference the lookup took, exactly once.
    unsafe { kfunc::bpf_ct_release(ct) };
    match verdict {
        Verdict::Fast => return true,
        Verdict::TcpFlags => stats::add(Counter::FastPathStackTcpFlags, 1),
        Verdict::NotEstablished => stats::add(Counter::FastPathStackNotEstablished, 1),
        Verdict::NotPlain => stats::add(Counter::FastPathStackNotPlain, 1),
        Verdict::NotLiberal => {
            stats::add(Counter::FastPathStackNotLiberal, 1);
            // at most once a unit; a request the full ring refused is asked again
            if seen.asked != now && EDGEVX_FP_EVENTS.output(&FlowEvent { key: *key }, 0).is_ok() {
                seen.asked = now;
            }
        }
    }
    false
}

/// On the pod bridge's egress, after every netfilter hook: the stack
/// delivered a packet of this flow to a learned local pod under the current
/// ruleset, so later packets of the flow may skip it (until the epoch moves).
#[inline(always)]
pub fn record(ctx: &TcContext) {
    record_if(ctx, |key| EDGEVX_LOCAL_PODS.get_ptr(&key.daddr).is_some());
}

/// Records the frame's flow as carried by the stack under the current
/// ruleset, if `ours` says the flow is one a fast path may take. Writes
/// only when the epoch changed.
#[inline(always)]
pub fn record_if(ctx: &TcContext, ours: impl Fn(&FlowKey) -> bool) {
    let Some(cfg) = config() else {
        return;
    };
    let Some((key, _)) = parse(ctx) else {
        return;
    };
    if !ours(&key) {
        return;
    }
    match EDGEVX_FP_SEEN.get_ptr_mut(&key) {
        // SAFETY: an LRU value; racing writers write the same epoch.
        Some(seen) => unsafe {
            if (*seen).epoch != cfg.epoch {
                (*seen).epoch = cfg.epoch;
            }
        },
        None => {
            let _ = EDGEVX_FP_SEEN.insert(&key, &Seen { epoch: cfg.epoch, ..Default::default() }, 0);
        }
    }
}

/// The flow key of an unfragmented IPv4 TCP or UDP packet without options,
/// and its TCP flags.
#[inline(always)]
pub fn parse(ctx: &TcContext) -> Option<(FlowKey, u8)> {
    let head = ctx.load::<[u8; ETH_HLEN + IPV4_HLEN]>(0).ok()?;
    if u16::from_be_bytes([head[12], head[13]]) != ETH_P_IP || head[ETH_HLEN] != 0x45 {
        return None;
    }
    let frag = [head[ETH_HLEN + 6], head[ETH_HLEN + 7]];
    if frag[0] & (IP_MF | IP_OFFSET_HI) != 0 || frag[1] != 0 {
        return None;
    }
    let proto = head[ETH_HLEN + 9];
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return None;
    }
    let ip = &head[ETH_HLEN..];
    let l4 = ETH_HLEN + IPV4_HLEN;
    let ports = ctx.load::<[u8; 4]>(l4).ok()?;
    let tcp_flags = if proto == IPPROTO_TCP { ctx.load::<u8>(l4 + 13).ok()? } else { 0 };
    // built as four words: a 3-byte `_pad: [0; 3]` becomes a call to a
    // memset subprogram, and a program with BPF-to-BPF calls may not tail
    // call (the monitor's event program) on JITs without support for the
    // mix (arm64 before 6.x)
    let words = [
        u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]),
        u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]),
        u32::from_ne_bytes(ports),
        u32::from_ne_bytes([proto, 0, 0, 0]),
    ];
    // SAFETY: FlowKey is 16 bytes of plain data in this order (saddr,
    // daddr, sport, dport, proto, padding), any bytes valid.
    let key: FlowKey = unsafe { core::mem::transmute(words) };
    Some((key, tcp_flags))
}

const TTL_OFF: usize = ETH_HLEN + 8;
const CSUM_OFF: usize = ETH_HLEN + 10;

/// The TTL down by one and the header checksum with it, as `ip_forward`
/// does; `Err` if the kernel refused a store. The caller made sure the TTL
/// is above 1.
#[inline(always)]
pub fn ttl_down(ctx: &TcContext) -> Result<(), ()> {
    let word = ctx.load::<[u8; 2]>(TTL_OFF).map_err(|_| ())?;
    if word[0] <= 1 {
        return Err(());
    }
    let old = u16::from_be_bytes(word);
    let new = old - 0x100;
    ctx.store(TTL_OFF, &new.to_be_bytes(), 0).map_err(|_| ())?;
    ctx.l3_csum_replace(CSUM_OFF, old.to_be() as u64, new.to_be() as u64, 2).map_err(|_| ())
}

/// What `ip_forward` and the pod bridge would have done: TTL down by one
/// (the VTEP guard's caller, decap, dropped TTL <= 1 already), the frame
/// from the bridge's MAC to the pod's, out of the pod's port.
#[inline(always)]
fn deliver(ctx: &TcContext, pod: &LocalPod) -> i32 {
    let (d, s) = (&pod.pod_mac, &pod.host_mac);
    let eth = [d[0], d[1], d[2], d[3], d[4], d[5], s[0], s[1], s[2], s[3], s[4], s[5], 0x08, 0x00];
    if ttl_down(ctx).is_err() || ctx.store(0, &eth, 0).is_err() {
        stats::add(Counter::DropAdjustRoom, 1);
        crate::monitor::vtep_guard(ctx, Counter::DropAdjustRoom as u32);
        return TC_ACT_SHOT;
    }
    stats::count(Counter::FastPathPackets, Counter::FastPathBytes, ctx.len() - ETH_HLEN as u32);
    // SAFETY: plain helper call; the kernel checks the ifindex.
    unsafe { bpf_redirect(pod.host_ifindex, 0) as i32 }
}
