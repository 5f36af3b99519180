//! `edgevx monitor`'s events (common/src/monitor.rs) with BPF_PROG_TEST_RUN:
//! a drop writes exactly one event, byte for byte what the program saw,
//! while a monitor watches, and none when nobody does or the watch ran out;
//! a burst gets no more than the per-CPU budget, the rest counted as lost.
use anyhow::{Context, Result, ensure};
use aya::{
    TestRun, TestRunOptions,
    maps::{Array, PerCpuArray, ProgramArray, RingBuf},
    programs::SchedClassifier,
};
use edgevx_common::{
    counters::Counter,
    maps::FLAG_REQUIRE_JUDGED,
    monitor::{
        DROP_EVENT_LEN, DropEvent, EV_INNER, EV_INNER_PORTS, EV_INNER6, EV_OUTER, EV_OUTER_PORTS, EV_OUTER6, EV_PEER,
        EV_VNI, EVENTS_PER_SEC, MON_BUDGET, MON_EVENTS, MON_PROGS, MON_WATCH, MonitorBudget, MonitorWatch, Program,
        REASON_VTEP_UNJUDGED,
    },
};

use crate::prog_test_run::{
    Loaded, OUR_IP, OUR_MAC, PEER_IP, STRANGER_IP, TC_ACT_SHOT, eth, inner_icmp, ipv4, load, run_on, vxlan_frame,
};
use crate::prog_test_run_v6::{OUR_IP6, PEER_IP6, POD6, inner_echo6, load6, v6, vxlan6};

/// The loopback device, where BPF_PROG_TEST_RUN's skb is.
const LO_IFINDEX: u32 = 1;

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets the watch to `until_ns`, as `edgevx monitor` renews it.
fn watch_until(l: &mut Loaded, until_ns: u64) -> Result<()> {
    let mut w: Array<_, MonitorWatch> = Array::try_from(l.ebpf.map_mut(MON_WATCH).context(MON_WATCH)?)?;
    w.set(0, &MonitorWatch { until_ns }, 0)?;
    Ok(())
}

fn watch(l: &mut Loaded) -> Result<()> {
    watch_until(l, monotonic_ns() + 10_000_000_000)
}

/// Every record in the ring, as bytes.
fn drain(l: &mut Loaded) -> Result<Vec<Vec<u8>>> {
    let mut ring = RingBuf::try_from(l.ebpf.map_mut(MON_EVENTS).context(MON_EVENTS)?)?;
    let mut records = Vec::new();
    while let Some(r) = ring.next() {
        records.push(r.to_vec());
    }
    Ok(records)
}

fn budget(l: &Loaded) -> Result<MonitorBudget> {
    let b: PerCpuArray<_, MonitorBudget> = PerCpuArray::try_from(l.ebpf.map(MON_BUDGET).context(MON_BUDGET)?)?;
    Ok(b.get(&0, 0)?.iter().fold(MonitorBudget::default(), |a, c| MonitorBudget {
        sent: a.sent + c.sent,
        lost_rate: a.lost_rate + c.lost_rate,
        lost_ring: a.lost_ring + c.lost_ring,
        ..a
    }))
}

fn run_repeat(l: &Loaded, prog: &str, input: &[u8], repeat: u32) -> Result<u32> {
    // the VTEP guard may be the one program loaded by hand (a module's kfuncs)
    let p: &SchedClassifier = l.ebpf.classifier_ref(prog)?;
    let mut out = vec![0u8; input.len() + 256];
    let opts = TestRunOptions { data_in: Some(input), data_out: Some(&mut out), repeat, ..Default::default() };
    Ok(p.test_run(opts)?.return_value)
}

/// A UDP datagram from a pod of the peer's subnet to ours, 1234 -> 80.
fn inner_udp(src: [u8; 4]) -> Vec<u8> {
    let mut udp = Vec::new();
    udp.extend(1234u16.to_be_bytes());
    udp.extend(80u16.to_be_bytes());
    udp.extend(12u16.to_be_bytes());
    udp.extend([0, 0, 0xde, 0xad, 0xbe, 0xef]);
    ipv4(src, [10, 244, 1, 2], 17, &udp, 0)
}

/// The event decap writes for `frame` from `src` with the inner UDP of [`inner_udp`].
fn decap_event(reason: Counter, src: [u8; 4], inner_src: [u8; 4], len: usize) -> DropEvent {
    let mut e = DropEvent {
        reason: reason as u32,
        ifindex: LO_IFINDEX,
        len: len as u32,
        vni: 1,
        program: Program::Decap as u8,
        flags: EV_OUTER | EV_OUTER_PORTS | EV_VNI | EV_INNER | EV_INNER_PORTS,
        outer_proto: 17,
        inner_proto: 17,
        outer_sport: 40000,
        outer_dport: 8472,
        inner_sport: 1234,
        inner_dport: 80,
        ..Default::default()
    };
    e.outer_src[..4].copy_from_slice(&src);
    e.outer_dst[..4].copy_from_slice(&OUR_IP);
    e.inner_src[..4].copy_from_slice(&inner_src);
    e.inner_dst[..4].copy_from_slice(&[10, 244, 1, 2]);
    e
}

/// The one record `records` must hold, checked byte for byte against
/// `want` (its time only within the run's).
fn the_one(records: &[Vec<u8>], mut want: DropEvent, before: u64, after: u64) -> Result<()> {
    ensure!(records.len() == 1, "{} events, want exactly 1", records.len());
    let got = DropEvent::from_bytes(&records[0]).context("a short record")?;
    ensure!((before..=after).contains(&got.ts_ns), "event time {} outside the run {before}..{after}", got.ts_ns);
    want.ts_ns = got.ts_ns;
    ensure!(records[0].len() >= DROP_EVENT_LEN, "record of {} bytes", records[0].len());
    // SAFETY: DropEvent is plain data without padding (its layout test).
    let want_bytes = unsafe { std::slice::from_raw_parts(&want as *const DropEvent as *const u8, DROP_EVENT_LEN) };
    ensure!(records[0][..DROP_EVENT_LEN] == *want_bytes, "event\n got {got:?}\nwant {want:?}");
    Ok(())
}

#[test]
fn a_strangers_vxlan_dropped_by_decap_is_one_event_while_watched_and_none_otherwise() -> Result<()> {
    let mut l = load(0)?;
    let frame = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner_udp([10, 244, 2, 9]));

    // nobody watches (the map's initial 0): dropped and counted, no event
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 1);
    assert_eq!(drain(&mut l)?.len(), 0);

    watch(&mut l)?;
    let before = monotonic_ns();
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    let after = monotonic_ns();
    the_one(
        &drain(&mut l)?,
        decap_event(Counter::DropUnknownPeer, STRANGER_IP, [10, 244, 2, 9], frame.len()),
        before,
        after,
    )?;
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 2);

    // a watch that ran out (a monitor killed without a word) writes nothing
    watch_until(&mut l, monotonic_ns() - 1)?;
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    assert_eq!(drain(&mut l)?.len(), 0);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 3);
    let b = budget(&l)?;
    assert_eq!((b.sent, b.lost_rate, b.lost_ring), (1, 0, 0));
    Ok(())
}

/// The event program's slot emptied (as the kernel empties an unpinned
/// program array): a watched drop is still a drop, counted, with no event.
#[test]
fn with_the_event_programs_slot_empty_a_drop_is_still_dropped_and_counted() -> Result<()> {
    let mut l = load(0)?;
    let mut slots = ProgramArray::try_from(l.ebpf.map_mut(MON_PROGS).context(MON_PROGS)?)?;
    slots.clear_index(&0)?;
    watch(&mut l)?;
    let frame = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner_udp([10, 244, 2, 9]));
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 1);
    assert_eq!(drain(&mut l)?.len(), 0);
    let b = budget(&l)?;
    assert_eq!((b.sent, b.lost_rate, b.lost_ring), (0, 0, 0));
    // armed again, as every load does: the event is back
    edgevx::dataplane::drop_events::arm(&mut l.ebpf)?;
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    assert_eq!(drain(&mut l)?.len(), 1);
    Ok(())
}

#[test]
fn a_peers_spoofed_inner_source_names_the_peer() -> Result<()> {
    let mut l = load(0)?;
    watch(&mut l)?;
    // 10.244.9.9 is nobody's: outside the peer's 10.244.2.0/24
    let frame = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner_udp([10, 244, 9, 9]));
    let before = monotonic_ns();
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    let after = monotonic_ns();
    let mut want = decap_event(Counter::DropSpoofedSource, PEER_IP, [10, 244, 9, 9], frame.len());
    want.flags |= EV_PEER;
    want.peer[..4].copy_from_slice(&PEER_IP);
    the_one(&drain(&mut l)?, want, before, after)
}

/// The IPv6 half (judge6): both headers' 128-bit addresses, the VNI and
/// the peer, from a peer whose inner source is outside its IPv6 pod subnet.
#[test]
fn an_ipv6_peers_spoofed_inner_source_is_shown_with_both_ipv6_headers() -> Result<()> {
    let mut l = load6(0)?;
    watch(&mut l)?;
    let forged = "2001:db8::7";
    let frame = vxlan6(PEER_IP6, 1, &inner_echo6(forged, POD6));
    let before = monotonic_ns();
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, 1)?, TC_ACT_SHOT);
    let after = monotonic_ns();
    let want = DropEvent {
        reason: Counter::DropSpoofedSource as u32,
        ifindex: LO_IFINDEX,
        len: frame.len() as u32,
        vni: 1,
        program: Program::Decap as u8,
        flags: EV_OUTER | EV_OUTER6 | EV_OUTER_PORTS | EV_VNI | EV_INNER | EV_INNER6 | EV_PEER,
        outer_proto: 17,
        inner_proto: 58,
        outer_sport: 40000,
        outer_dport: 8472,
        outer_src: v6(PEER_IP6),
        outer_dst: v6(OUR_IP6),
        inner_src: v6(forged),
        inner_dst: v6(POD6),
        peer: v6(PEER_IP6),
        ..Default::default()
    };
    the_one(&drain(&mut l)?, want, before, after)
}

#[test]
fn encap_shows_the_inner_packet_it_had_no_route_for() -> Result<()> {
    let mut l = load(0)?;
    watch(&mut l)?;
    let input = eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 99, 2]));
    let before = monotonic_ns();
    assert_eq!(run_repeat(&l, l.encap, &input, 1)?, TC_ACT_SHOT);
    let after = monotonic_ns();
    let mut want = DropEvent {
        reason: Counter::DropNoRoute as u32,
        ifindex: LO_IFINDEX,
        len: input.len() as u32,
        program: Program::Encap as u8,
        flags: EV_INNER,
        inner_proto: 1,
        ..Default::default()
    };
    want.inner_src[..4].copy_from_slice(&[10, 244, 1, 2]);
    want.inner_dst[..4].copy_from_slice(&[10, 244, 99, 2]);
    the_one(&drain(&mut l)?, want, before, after)
}

/// The VTEP guard's drop of a frame decap did not judge, by tail call from
/// whichever VTEP guard this kernel takes (loaded by hand where conntrack
/// is a module): its event-only reason and the inner packet.
#[test]
fn the_vtep_guard_shows_what_decap_did_not_judge() -> Result<()> {
    let mut l = load(FLAG_REQUIRE_JUDGED)?;
    watch(&mut l)?;
    let frame = eth(OUR_MAC, OUR_MAC, 0x0800, &inner_udp([10, 244, 2, 9]));
    let before = monotonic_ns();
    assert_eq!(run_repeat(&l, "edgevx_vtep_guard", &frame, 1)?, TC_ACT_SHOT);
    let after = monotonic_ns();
    let mut want = DropEvent {
        reason: REASON_VTEP_UNJUDGED,
        ifindex: LO_IFINDEX,
        len: frame.len() as u32,
        program: Program::VtepGuard as u8,
        flags: EV_INNER | EV_INNER_PORTS,
        inner_proto: 17,
        inner_sport: 1234,
        inner_dport: 80,
        ..Default::default()
    };
    want.inner_src[..4].copy_from_slice(&[10, 244, 2, 9]);
    want.inner_dst[..4].copy_from_slice(&[10, 244, 1, 2]);
    the_one(&drain(&mut l)?, want, before, after)
}

/// A flood is cut at the budget: no more than `EVENTS_PER_SEC` events a
/// CPU, the rest counted (`repeat` runs the program back to back on one
/// CPU, well within one second). Every drop is still counted.
#[test]
fn the_rate_limit_caps_a_burst_and_counts_the_overflow() -> Result<()> {
    let mut l = load(0)?;
    watch(&mut l)?;
    // one CPU's budget: the test run may otherwise move between CPUs
    // (at a reschedule point) and get a second budget
    // SAFETY: plain libc call.
    let cpu = unsafe { libc::sched_getcpu() };
    run_on(usize::try_from(cpu).context("sched_getcpu")?)?;
    let frame = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner_udp([10, 244, 2, 9]));
    let burst = EVENTS_PER_SEC + 50;
    assert_eq!(run_repeat(&l, "edgevx_decap", &frame, burst)?, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, burst as u64);
    let records = drain(&mut l)?;
    assert_eq!(records.len(), EVENTS_PER_SEC as usize);
    let b = budget(&l)?;
    assert_eq!((b.sent, b.lost_rate, b.lost_ring), (EVENTS_PER_SEC as u64, 50, 0));
    Ok(())
}
