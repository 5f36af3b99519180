//! The conntrack-verified fast path (ebpf/src/fastpath.rs): what the agent
//! and the program share, and the rules that decide, from a conntrack
//! entry's fields, whether a packet may skip the host stack. The rules are
//! pure functions here so they are tested on the host; the program only
//! reads the fields and asks.
//!
//! Conntrack stays the truth: the stack creates every entry; SYN, FIN and
//! RST always go through it; NAT, helpers, expectations and marked entries
//! never skip it; TCP skips it only while both directions are tracked
//! liberally (window tracking cannot then turn the flow INVALID); and a
//! flow skips it only once the current ruleset accepted a packet of it
//! (the epoch).

/// `Array<FastPathConfig>` with one slot, written by the agent.
pub const FP_CONFIG: &str = "EDGEVX_FP_CONFIG";
/// `LruHashMap<FlowKey, Seen>`: flows (one direction each) a packet of
/// which the host stack delivered to a local pod, with the ruleset epoch
/// it did so in; written by the pod bridge's program after netfilter.
pub const FP_SEEN: &str = "EDGEVX_FP_SEEN";
/// `RingBuf` of [`FlowEvent`]: flows that would take the fast path but for
/// conntrack's window tracking (the agent makes them liberal).
pub const FP_EVENTS: &str = "EDGEVX_FP_EVENTS";

pub const FP_SEEN_ENTRIES: u32 = 65536;
pub const FP_EVENTS_BYTES: u32 = 64 * 1024;

/// [`FastPathConfig::flags`]: the fast path is on (the kernel has the
/// conntrack kfuncs and the agent was not told otherwise).
pub const FP_ON: u32 = 1;
/// [`FastPathConfig::flags`]: the netns has `nf_conntrack_tcp_be_liberal=1`,
/// so every TCP entry is tracked liberally whatever its own flags say.
pub const FP_LIBERAL_SYSCTL: u32 = 2;
/// [`FastPathConfig::flags`], for the tests' negative control only: skip
/// the liberal check (the fast path then breaks window tracking, which the
/// kube-proxy INVALID-drop test must see).
pub const FP_TEST_IGNORE_LIBERAL: u32 = 0x8000_0000;

/// What the agent tells the fast path. Timeouts are the values the stack
/// itself would apply (the node's `nf_conntrack_*_timeout_*` sysctls), in
/// seconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FastPathConfig {
    pub flags: u32,
    /// Bumped whenever the ruleset (or a conntrack sysctl) may have changed.
    pub epoch: u32,
    pub tcp_established: u32,
    pub tcp_unacknowledged: u32,
    pub udp_stream: u32,
    pub _pad: u32,
    /// Until when the agent's keeper vouches for `epoch`, in
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) nanoseconds. The keeper renews
    /// it every [`LEASE_RENEW_MS`]; once it has passed (the agent stopped,
    /// or its ruleset watch ended) every packet takes the stack, so a
    /// ruleset change nobody watches cannot be skipped for long.
    pub lease_until_ns: u64,
}

/// How long a lease runs, from when the keeper writes it.
pub const LEASE_MS: u64 = 3000;
/// How often the keeper renews the lease.
pub const LEASE_RENEW_MS: u64 = 1000;

/// One direction of a flow, as in the packet: addresses and ports in
/// network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct FlowKey {
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub proto: u8,
    pub _pad: [u8; 3],
}

/// [`FP_SEEN`]'s value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Seen {
    /// The epoch the stack last delivered a packet of the flow in.
    pub epoch: u32,
    /// When a liberal request last went out for this flow, in the unit of
    /// [`Seen::refreshed`] (0: never): a flow asks at most once a unit, and
    /// asks again while it is still not liberal (a request lost on a full
    /// ring, or an entry made anew after `conntrack -F`).
    pub asked: u32,
    /// When the fast path last refreshed the entry's timeout, in units of
    /// 2^30 ns (about a second) of `bpf_ktime_get_ns`: at most once per
    /// unit, so the entry is not written on every packet.
    pub refreshed: u32,
    pub _pad: u32,
}

/// [`Seen::refreshed`]'s unit: `bpf_ktime_get_ns() >> REFRESH_SHIFT`.
pub const REFRESH_SHIFT: u32 = 30;

/// [`FP_EVENTS`]'s record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowEvent {
    pub key: FlowKey,
}

// include/uapi/linux/netfilter/nf_conntrack_common.h, `enum ip_conntrack_status`
pub const IPS_EXPECTED: u32 = 1 << 0;
pub const IPS_SEEN_REPLY: u32 = 1 << 1;
pub const IPS_ASSURED: u32 = 1 << 2;
pub const IPS_CONFIRMED: u32 = 1 << 3;
pub const IPS_SRC_NAT: u32 = 1 << 4;
pub const IPS_DST_NAT: u32 = 1 << 5;
pub const IPS_SEQ_ADJUST: u32 = 1 << 6;
pub const IPS_SRC_NAT_DONE: u32 = 1 << 7;
pub const IPS_DST_NAT_DONE: u32 = 1 << 8;
pub const IPS_DYING: u32 = 1 << 9;
pub const IPS_FIXED_TIMEOUT: u32 = 1 << 10;
pub const IPS_TEMPLATE: u32 = 1 << 11;
pub const IPS_NAT_CLASH: u32 = 1 << 12;
pub const IPS_HELPER: u32 = 1 << 13;
pub const IPS_OFFLOAD: u32 = 1 << 14;
pub const IPS_HW_OFFLOAD: u32 = 1 << 15;

/// All of these must be set: the entry is in the table and both
/// directions were seen long enough to be assured.
pub const IPS_MUST: u32 = IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED;
/// None of these may be set: a translation either way, sequence
/// adjustment, expectations and helpers, a dying or template entry, a fixed
/// timeout (a timeout policy the fast path cannot honour), an offloaded one.
/// Not `IPS_*_NAT_DONE`: those say only that the NAT hook ran, and it sets
/// them on every entry (a null binding) wherever a nat table exists.
pub const IPS_NEVER: u32 = IPS_EXPECTED
    | IPS_SRC_NAT
    | IPS_DST_NAT
    | IPS_SEQ_ADJUST
    | IPS_DYING
    | IPS_FIXED_TIMEOUT
    | IPS_TEMPLATE
    | IPS_NAT_CLASH
    | IPS_HELPER
    | IPS_OFFLOAD
    | IPS_HW_OFFLOAD;

// include/uapi/linux/netfilter/nf_conntrack_tcp.h
pub const TCP_CONNTRACK_ESTABLISHED: u8 = 3;
pub const IP_CT_TCP_FLAG_BE_LIBERAL: u8 = 0x08;
pub const IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED: u8 = 0x10;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

// TCP header flags (byte 13)
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// The fields of a conntrack entry the decision reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct CtFields {
    pub status: u32,
    pub mark: u32,
    /// `proto.tcp.state` (TCP only).
    pub tcp_state: u8,
    /// `proto.tcp.seen[0].flags` and `seen[1].flags` (TCP only).
    pub seen_flags: [u8; 2],
}

/// Why a packet did or did not take the fast path; each is a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fast,
    /// SYN, FIN or RST, or no ACK: conntrack's state machine must see it.
    TcpFlags,
    /// Not yet confirmed, assured and replied, or TCP not ESTABLISHED.
    NotEstablished,
    /// NAT, helper, expectation, sequence adjustment, a fixed timeout, an
    /// offloaded or dying entry, or a conntrack mark.
    NotPlain,
    /// TCP whose window tracking is not liberal in both directions.
    NotLiberal,
}

/// Whether a TCP segment with `flags` may skip the stack at all.
#[inline(always)]
pub fn tcp_flags_allow(flags: u8) -> bool {
    flags & TCP_ACK != 0 && flags & (TCP_SYN | TCP_FIN | TCP_RST) == 0
}

/// The decision from the entry's fields. `liberal_sysctl`: the netns
/// tracks every TCP entry liberally.
#[inline(always)]
pub fn judge(proto: u8, ct: &CtFields, liberal_sysctl: bool) -> Verdict {
    if ct.status & IPS_NEVER != 0 || ct.mark != 0 {
        return Verdict::NotPlain;
    }
    if ct.status & IPS_MUST != IPS_MUST {
        return Verdict::NotEstablished;
    }
    if proto == IPPROTO_TCP {
        if ct.tcp_state != TCP_CONNTRACK_ESTABLISHED {
            return Verdict::NotEstablished;
        }
        let both = ct.seen_flags[0] & ct.seen_flags[1] & IP_CT_TCP_FLAG_BE_LIBERAL != 0;
        if !both && !liberal_sysctl {
            return Verdict::NotLiberal;
        }
    }
    Verdict::Fast
}

/// The timeout the stack would set for this packet's entry, in seconds
/// (nf_conntrack_proto_tcp.c: UNACK while data is unacknowledged either
/// way and that is shorter; the retransmission limit is not modelled).
#[inline(always)]
pub fn stack_timeout(proto: u8, ct: &CtFields, cfg: &FastPathConfig) -> u32 {
    if proto != IPPROTO_TCP {
        return cfg.udp_stream;
    }
    let unacked = (ct.seen_flags[0] | ct.seen_flags[1]) & IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED != 0;
    if unacked && cfg.tcp_unacknowledged < cfg.tcp_established { cfg.tcp_unacknowledged } else { cfg.tcp_established }
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::FastPathConfig {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::Seen {}
    unsafe impl aya::Pod for super::FlowEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIBERAL: u8 = IP_CT_TCP_FLAG_BE_LIBERAL;

    fn tcp(status: u32, seen: [u8; 2]) -> CtFields {
        CtFields { status, mark: 0, tcp_state: TCP_CONNTRACK_ESTABLISHED, seen_flags: seen }
    }

    #[test]
    fn an_assured_liberal_plain_flow_is_fast() {
        assert_eq!(judge(IPPROTO_TCP, &tcp(IPS_MUST, [LIBERAL, LIBERAL | 0x23]), false), Verdict::Fast);
        assert_eq!(judge(IPPROTO_UDP, &CtFields { status: IPS_MUST, ..Default::default() }, false), Verdict::Fast);
    }

    #[test]
    fn every_nat_helper_and_odd_bit_keeps_the_stack() {
        for bit in 0..16 {
            let b = 1u32 << bit;
            if (IPS_MUST | IPS_SRC_NAT_DONE | IPS_DST_NAT_DONE) & b != 0 {
                continue;
            }
            let v = judge(IPPROTO_TCP, &tcp(IPS_MUST | b, [LIBERAL, LIBERAL]), false);
            assert_eq!(v, Verdict::NotPlain, "status bit {bit}");
        }
        let marked = CtFields { mark: 1, ..tcp(IPS_MUST, [LIBERAL, LIBERAL]) };
        assert_eq!(judge(IPPROTO_TCP, &marked, false), Verdict::NotPlain);
    }

    #[test]
    fn the_null_binding_every_entry_gets_under_a_nat_table_is_plain() {
        let status = IPS_MUST | IPS_SRC_NAT_DONE | IPS_DST_NAT_DONE;
        assert_eq!(judge(IPPROTO_TCP, &tcp(status, [LIBERAL, LIBERAL]), false), Verdict::Fast);
        assert_eq!(judge(IPPROTO_TCP, &tcp(status | IPS_SRC_NAT, [LIBERAL, LIBERAL]), false), Verdict::NotPlain);
    }

    #[test]
    fn unassured_unreplied_or_unconfirmed_is_not_established() {
        for missing in [IPS_CONFIRMED, IPS_SEEN_REPLY, IPS_ASSURED] {
            assert_eq!(
                judge(IPPROTO_UDP, &CtFields { status: IPS_MUST & !missing, ..Default::default() }, false),
                Verdict::NotEstablished
            );
        }
        let closing = CtFields { tcp_state: 4, ..tcp(IPS_MUST, [LIBERAL, LIBERAL]) }; // FIN_WAIT
        assert_eq!(judge(IPPROTO_TCP, &closing, false), Verdict::NotEstablished);
    }

    #[test]
    fn tcp_needs_liberal_both_ways_or_the_sysctl() {
        assert_eq!(judge(IPPROTO_TCP, &tcp(IPS_MUST, [LIBERAL, 0]), false), Verdict::NotLiberal);
        assert_eq!(judge(IPPROTO_TCP, &tcp(IPS_MUST, [0, LIBERAL]), false), Verdict::NotLiberal);
        assert_eq!(judge(IPPROTO_TCP, &tcp(IPS_MUST, [0, 0]), true), Verdict::Fast);
    }

    #[test]
    fn syn_fin_rst_and_bare_segments_go_to_the_stack() {
        assert!(tcp_flags_allow(TCP_ACK));
        assert!(tcp_flags_allow(TCP_ACK | 0x08)); // PSH
        for f in [TCP_SYN | TCP_ACK, TCP_FIN | TCP_ACK, TCP_RST | TCP_ACK, TCP_RST, 0] {
            assert!(!tcp_flags_allow(f), "flags {f:#x}");
        }
    }

    #[test]
    fn the_timeout_is_the_one_the_stack_would_set() {
        let cfg =
            FastPathConfig { tcp_established: 1000, tcp_unacknowledged: 300, udp_stream: 120, ..Default::default() };
        assert_eq!(stack_timeout(IPPROTO_TCP, &tcp(IPS_MUST, [0, 0]), &cfg), 1000);
        assert_eq!(stack_timeout(IPPROTO_TCP, &tcp(IPS_MUST, [IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED, 0]), &cfg), 300);
        assert_eq!(stack_timeout(IPPROTO_UDP, &CtFields::default(), &cfg), 120);
        let short = FastPathConfig { tcp_established: 30, ..cfg };
        assert_eq!(stack_timeout(IPPROTO_TCP, &tcp(IPS_MUST, [IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED, 0]), &short), 30);
    }
}
