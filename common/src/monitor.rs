//! `edgevx monitor`: drop events from the programs' drop points, through a
//! ring buffer, for "why can't pod A reach pod B" without tcpdump.
//!
//! Free when nobody watches: a program writes an event only while
//! `bpf_ktime_get_ns()` is before [`MonitorWatch::until_ns`], which
//! `edgevx monitor` pushes [`WATCH_MS`] ahead every [`RENEW_MS`]; without a
//! monitor a drop costs one array lookup and one clock read more than its
//! counter (with one, a tail call into [`EVENT_PROGRAM`] as well). While watched, each CPU writes at most [`EVENTS_PER_SEC`] events
//! a second ([`MonitorBudget::admit`]); the rest are counted as lost, as are
//! events a full ring refused, so a flood of drops costs forwarding at most
//! that many ring writes per CPU and second.
//!
//! The reason is the counter the drop is counted under (the id `edgevx
//! status` and `edgevx_drops_total{reason}` use), or one of the event-only
//! reasons below for a drop no counter has.

use crate::counters::Counter;

/// `Array<MonitorWatch>` with one slot, written by `edgevx monitor`.
pub const MON_WATCH: &str = "EDGEVX_MON_WATCH";
/// `PerCpuArray<MonitorBudget>` with one slot: each CPU's budget and losses.
pub const MON_BUDGET: &str = "EDGEVX_MON_BUDGET";
/// `RingBuf` of [`DropEvent`].
pub const MON_EVENTS: &str = "EDGEVX_MON_EVENTS";
/// The one-slot program array a drop point tail-calls: [`EVENT_PROGRAM`]
/// at index 0. Pinned, as a program array's slots are emptied when the
/// last user-space reference to it goes (the agent's exit).
pub const MON_PROGS: &str = "EDGEVX_MON_PROGS";
/// The program that writes a drop's event and drops the packet; a drop
/// point tail-calls it with what it knows in the skb's `cb` (see the eBPF
/// side's monitor.rs), so it runs on a stack of its own.
pub const EVENT_PROGRAM: &str = "edgevx_drop_event";

/// 256 KiB: about 2,100 events of 120 bytes (plus the ring's 8-byte
/// header each), two seconds of every CPU's budget on a 4-CPU node, so a
/// reader that stalls for a moment loses nothing it would have been sent.
pub const MON_EVENTS_BYTES: u32 = 256 * 1024;

/// Events a CPU writes per second at most while watched. 200 is more than
/// anyone reads on a terminal and enough for `--json | grep` to catch a
/// rare drop among a flood of others; at roughly 100 ns per ring write it
/// bounds the monitor's cost to about 20 µs per CPU and second (0.002%)
/// however many packets are dropped.
pub const EVENTS_PER_SEC: u32 = 200;
/// The budget's window: [`EVENTS_PER_SEC`] per this many nanoseconds.
pub const WINDOW_NS: u64 = 1_000_000_000;

/// How far ahead `edgevx monitor` sets the watch each time it renews it:
/// a monitor killed without cleaning up stops the events this soon.
pub const WATCH_MS: u64 = 3000;
/// How often `edgevx monitor` renews the watch.
pub const RENEW_MS: u64 = 1000;

/// [`MON_WATCH`]'s value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MonitorWatch {
    /// Programs write events while `bpf_ktime_get_ns()` (CLOCK_MONOTONIC)
    /// is before this; 0 (the map's initial value) means never.
    pub until_ns: u64,
}

impl MonitorWatch {
    #[inline(always)]
    pub fn watched(&self, now_ns: u64) -> bool {
        now_ns < self.until_ns
    }
}

/// One CPU's event budget ([`MON_BUDGET`]'s per-CPU value). Only that CPU
/// writes it; readers sum the counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MonitorBudget {
    /// When the current one-second window began.
    pub window_start_ns: u64,
    /// Events admitted in the current window.
    pub used: u32,
    pub _pad: u32,
    /// Events written to the ring.
    pub sent: u64,
    /// Events not written: the CPU's budget for the window was spent.
    pub lost_rate: u64,
    /// Events not written: the ring was full (the reader is behind).
    pub lost_ring: u64,
}

impl MonitorBudget {
    /// Whether one more event may be written at `now_ns`; counts it as
    /// lost when not. A fixed window per CPU: no division, no shared state.
    #[inline(always)]
    pub fn admit(&mut self, now_ns: u64) -> bool {
        if now_ns.wrapping_sub(self.window_start_ns) >= WINDOW_NS {
            self.window_start_ns = now_ns;
            self.used = 0;
        }
        if self.used < EVENTS_PER_SEC {
            self.used += 1;
            true
        } else {
            self.lost_rate += 1;
            false
        }
    }
}

/// The program that dropped a frame ([`DropEvent::program`]).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// Ingress of the underlay: IPv4 decap, the IPv6 judge, tagged frames.
    Decap = 1,
    /// Egress of `flannel.<VNI>`.
    Encap = 2,
    /// Ingress of `flannel.<VNI>` / `flannel-v6.<VNI>` (and the fast path behind it).
    VtepGuard = 3,
    /// Ingress of the pod bridge.
    PodGuard = 4,
    /// Socket lookups in the node's namespace (no interface: ifindex is where it came in).
    SocketGuard = 5,
    /// The XDP judge on the underlay.
    XdpJudge = 6,
}

impl Program {
    pub const ALL: [Program; 6] = [
        Program::Decap,
        Program::Encap,
        Program::VtepGuard,
        Program::PodGuard,
        Program::SocketGuard,
        Program::XdpJudge,
    ];

    pub fn from_u8(v: u8) -> Option<Program> {
        Program::ALL.into_iter().find(|p| *p as u8 == v)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Program::Decap => "decap",
            Program::Encap => "encap",
            Program::VtepGuard => "vtep_guard",
            Program::PodGuard => "pod_guard",
            Program::SocketGuard => "socket_guard",
            Program::XdpJudge => "xdp_judge",
        }
    }

    /// Which way the frame was going on the interface.
    pub const fn direction(self) -> &'static str {
        match self {
            Program::Encap => "egress",
            _ => "ingress",
        }
    }
}

/// Event-only reason: the VTEP guard dropped a frame decap did not judge
/// (a program ahead of decap ended the chain). No counter has it.
pub const REASON_VTEP_UNJUDGED: u32 = 0x100;

/// The name of a [`DropEvent::reason`]: the counter's, as in `edgevx status`.
pub fn reason_name(reason: u32) -> Option<&'static str> {
    if reason == REASON_VTEP_UNJUDGED {
        return Some("drop_vtep_unjudged");
    }
    Counter::ALL.get(reason as usize).map(|c| c.name())
}

/// [`DropEvent::flags`]: the outer addresses are there (and the outer
/// protocol); IPv6 when [`EV_OUTER6`] is set too.
pub const EV_OUTER: u8 = 1;
pub const EV_OUTER6: u8 = 2;
/// The outer UDP (or TCP) ports are there.
pub const EV_OUTER_PORTS: u8 = 4;
/// The VXLAN header was there: [`DropEvent::vni`] is its VNI.
pub const EV_VNI: u8 = 8;
/// The inner addresses are there (and the inner protocol); IPv6 with [`EV_INNER6`].
pub const EV_INNER: u8 = 16;
pub const EV_INNER6: u8 = 32;
/// The inner ports are there.
pub const EV_INNER_PORTS: u8 = 64;
/// [`DropEvent::peer`] holds the public IP of the peer concerned: the
/// sender on decap (an accepted peer), the next hop on encap.
pub const EV_PEER: u8 = 128;

/// One dropped frame, as the program saw it. Addresses are in network
/// order (IPv4 in the first 4 bytes, the rest zero), ports and the VNI in
/// host order. What was not parsed is zero and its flag clear.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the drop.
    pub ts_ns: u64,
    /// The counter id of the drop (`Counter as u32`) or an event-only reason.
    pub reason: u32,
    /// The interface the program ran on (`skb->ifindex`; the ingress
    /// interface for the socket guard and XDP).
    pub ifindex: u32,
    /// The frame's length.
    pub len: u32,
    pub vni: u32,
    /// [`Program`] as u8.
    pub program: u8,
    /// `EV_*` bits.
    pub flags: u8,
    pub outer_proto: u8,
    pub inner_proto: u8,
    pub outer_sport: u16,
    pub outer_dport: u16,
    pub inner_sport: u16,
    pub inner_dport: u16,
    pub _pad: u32,
    pub outer_src: [u8; 16],
    pub outer_dst: [u8; 16],
    pub inner_src: [u8; 16],
    pub inner_dst: [u8; 16],
    pub peer: [u8; 16],
}

/// The size of a [`DropEvent`] record in the ring.
pub const DROP_EVENT_LEN: usize = core::mem::size_of::<DropEvent>();

impl DropEvent {
    /// The event in a ring record, if it is whole.
    pub fn from_bytes(b: &[u8]) -> Option<DropEvent> {
        let b = b.get(..DROP_EVENT_LEN)?;
        // SAFETY: DropEvent is plain data of exactly DROP_EVENT_LEN bytes,
        // every bit pattern valid; read_unaligned needs no alignment.
        Some(unsafe { core::ptr::read_unaligned(b.as_ptr() as *const DropEvent) })
    }
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::MonitorWatch {}
    unsafe impl aya::Pod for super::MonitorBudget {}
    unsafe impl aya::Pod for super::DropEvent {}
}

#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::*;

    /// Sizes equal the sum of the fields: no implicit padding reaches the
    /// ring, and the offsets the reader and the tests rely on hold.
    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<MonitorWatch>(), 8);
        assert_eq!(size_of::<MonitorBudget>(), 8 + 4 + 4 + 8 + 8 + 8);
        assert_eq!(DROP_EVENT_LEN, 8 + 4 * 4 + 4 + 4 * 2 + 4 + 5 * 16);
        assert_eq!(DROP_EVENT_LEN, 120);
        assert_eq!(offset_of!(DropEvent, reason), 8);
        assert_eq!(offset_of!(DropEvent, vni), 20);
        assert_eq!(offset_of!(DropEvent, program), 24);
        assert_eq!(offset_of!(DropEvent, outer_sport), 28);
        assert_eq!(offset_of!(DropEvent, inner_dport), 34);
        assert_eq!(offset_of!(DropEvent, outer_src), 40);
        assert_eq!(offset_of!(DropEvent, peer), 104);
        assert_eq!(DROP_EVENT_LEN % 8, 0);
    }

    #[test]
    fn a_record_decodes_field_by_field() {
        let mut b = [0u8; DROP_EVENT_LEN + 4];
        b[8] = Counter::DropUnknownPeer as u8;
        b[20..24].copy_from_slice(&7u32.to_ne_bytes());
        b[24] = Program::Decap as u8;
        b[40..44].copy_from_slice(&[198, 18, 0, 66]);
        let e = DropEvent::from_bytes(&b).unwrap_or_default();
        assert_eq!(e.reason, Counter::DropUnknownPeer as u32);
        assert_eq!(e.vni, 7);
        assert_eq!(Program::from_u8(e.program), Some(Program::Decap));
        assert_eq!(e.outer_src[..4], [198, 18, 0, 66]);
        assert_eq!(DropEvent::from_bytes(&b[..DROP_EVENT_LEN - 1]), None);
    }

    #[test]
    fn the_budget_caps_each_window_and_counts_the_rest() {
        let mut b = MonitorBudget::default();
        let t0 = 5 * WINDOW_NS;
        let admitted = (0..EVENTS_PER_SEC + 50).filter(|_| b.admit(t0)).count();
        assert_eq!(admitted, EVENTS_PER_SEC as usize);
        assert_eq!(b.lost_rate, 50);
        // still the same window just before its end
        assert!(!b.admit(t0 + WINDOW_NS - 1));
        // a new window: a full budget again
        assert!(b.admit(t0 + WINDOW_NS));
        assert_eq!(b.used, 1);
        assert_eq!(b.lost_rate, 51);
    }

    #[test]
    fn the_first_event_opens_a_window_at_boot() {
        // a fresh slot (window_start 0) soon after boot still admits
        let mut b = MonitorBudget::default();
        assert!(b.admit(10));
        assert!(!MonitorWatch::default().watched(10));
        assert!(MonitorWatch { until_ns: 11 }.watched(10));
        assert!(!MonitorWatch { until_ns: 10 }.watched(10));
    }

    #[test]
    fn every_counter_and_the_event_only_reasons_have_names() {
        for c in Counter::ALL {
            assert_eq!(reason_name(c as u32), Some(c.name()));
        }
        assert_eq!(reason_name(REASON_VTEP_UNJUDGED), Some("drop_vtep_unjudged"));
        assert_eq!(reason_name(999), None);
        for p in Program::ALL {
            assert_eq!(Program::from_u8(p as u8), Some(p));
        }
    }
}
