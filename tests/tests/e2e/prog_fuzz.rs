//! Encap, decap and the pod guard under BPF_PROG_TEST_RUN on random and
//! mutated frames: truncated at every offset, IP options, fragments, VLAN
//! tags (802.1Q and 802.1ad, stacked, in front of IPv4 and IPv6), IPv6 with
//! extension headers, UDP to 8472 that is not VXLAN, wrong flags. On every
//! case:
//! - the verdict is one the program may give for that input;
//! - nothing that is not ours is modified (a pass leaves the frame as it was);
//! - nothing malformed is emitted (a redirect carries exactly the headers
//!   the program is meant to write, around the untouched payload);
//! - the counters add up (one verdict, one counter);
//! - a frame with tags in its bytes is dropped by decap and the pod guard
//!   exactly when UDP to 8472 lies behind them (or more tags than they
//!   walk), as an independent model here reads it; the pod guard drops an
//!   untagged frame exactly when it is UDP to 8472.
//!
//! A fixed seed and case count by default; `EDGEVX_FUZZ_CASES` and
//! `EDGEVX_FUZZ_SEED` run more, or others.
use anyhow::{Result, ensure};
use edgevx_common::{counters::Counter, maps::FLAG_BYPASS_NETFILTER};

use crate::prog_test_run::{
    ETH_P_8021AD, ETH_P_8021Q, EXEMPT_IP, HOST_MAC, Loaded, MAX_TAGS, NEXT, OUR_IP, OUR_MAC, PEER_IP, POD_MAC,
    STRANGER_IP, TC_ACT_REDIRECT, TC_ACT_SHOT, checksum, eth, fix_outer_checksum, inner_icmp, ipv4, load, tagged,
    vxlan_frame, vxlan_frame_to, with_ip_options,
};

const DEFAULT_CASES: u64 = 4000;
const DEFAULT_SEED: u64 = 0x00ed_6e7c_f022;
/// BPF_PROG_TEST_RUN refuses a frame with nothing after the Ethernet header.
const MIN_FRAME: usize = 15;
/// Below this, BPF_PROG_TEST_RUN may refuse a frame (EINVAL) whose
/// ethertype promises a network header it does not hold; those frames
/// never reach the program, so they are skipped, not judged.
const KERNEL_MAY_REFUSE_BELOW: usize = 14 + 40;

/// Runs `prog`; `None` if the kernel refused the input before the program.
fn run(l: &Loaded, prog: &str, f: &[u8]) -> Result<Option<(u32, Vec<u8>)>> {
    match l.run(prog, f) {
        Ok(r) => Ok(Some(r)),
        Err(_) if f.len() < KERNEL_MAY_REFUSE_BELOW => Ok(None),
        Err(e) => Err(e.context(format!("{prog} on {f:02x?}"))),
    }
}

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Counters that record a decap verdict; exactly one moves per judged frame.
const DECAP_VERDICTS: [Counter; 14] = [
    Counter::RxFastPackets,
    Counter::RxStackPackets,
    Counter::RxHostPackets,
    Counter::PassNotOurs,
    Counter::DropUnknownPeer,
    Counter::DropSpoofedSource,
    Counter::DropInnerTtl,
    Counter::DropBadChecksum,
    Counter::DropBadVxlanFlags,
    Counter::DropShortFragment,
    Counter::DropInnerNotIpv4,
    Counter::DropAdjustRoom,
    Counter::DropNoConfig,
    Counter::DropVxlanTagged,
];

/// Counters that record a pod guard verdict.
const POD_GUARD_VERDICTS: [Counter; 2] = [Counter::DropPodVxlan, Counter::DropVxlanTagged];

/// Counters that record an encap verdict.
const ENCAP_VERDICTS: [Counter; 7] = [
    Counter::TxPackets,
    Counter::DropNoRoute,
    Counter::DropNotIpv4,
    Counter::DropAdjustRoom,
    Counter::DropNoConfig,
    Counter::DropFragNeeded,
    Counter::DropTooBig,
];

fn snapshot(l: &Loaded, set: &[Counter]) -> Result<Vec<u64>> {
    set.iter().map(|c| l.counter(*c)).collect()
}

/// Which counters moved between two snapshots, and by how much in all.
fn moved(set: &[Counter], before: &[u64], after: &[u64]) -> (Vec<Counter>, u64) {
    let mut which = Vec::new();
    let mut total = 0;
    for (i, c) in set.iter().enumerate() {
        let d = after[i] - before[i];
        if d > 0 {
            which.push(*c);
            total += d;
        }
    }
    (which, total)
}

/// The frames mutations start from.
fn seeds() -> Vec<Vec<u8>> {
    let from_peer = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[8, 0, 0, 0, 0, 1, 0, 1], 0);
    let to_host = ipv4([10, 244, 2, 2], [10, 244, 1, 0], 17, &[0x13, 0x88, 0x13, 0x88, 0, 12, 0, 0, 1, 2, 3, 4], 0);
    let client = ipv4([203, 0, 113, 7], [10, 244, 1, 2], 6, &[0u8; 20], 0);
    let mut out = vec![
        vxlan_frame(PEER_IP, 1, OUR_MAC, &from_peer),
        vxlan_frame(PEER_IP, 1, OUR_MAC, &to_host),
        vxlan_frame(PEER_IP, 1, [0xff; 6], &from_peer),
        vxlan_frame(EXEMPT_IP, 1, OUR_MAC, &client),
        vxlan_frame(PEER_IP, 1, OUR_MAC, &client),
        vxlan_frame(STRANGER_IP, 1, OUR_MAC, &from_peer),
        vxlan_frame(PEER_IP, 2, OUR_MAC, &from_peer),
        with_ip_options(&vxlan_frame(PEER_IP, 1, OUR_MAC, &from_peer)),
        // encap inputs: routed into flannel.1
        eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 2, 2])),
        eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 3, 9])),
        eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 9, 9])),
        eth([0xff; 6], OUR_MAC, 0x0806, &[0u8; 28]),
    ];
    // fragments: first (MF), middle, last
    for word in [0x2000u16, 0x2003, 0x0007] {
        let mut f = vxlan_frame(PEER_IP, 1, OUR_MAC, &from_peer);
        f[20..22].copy_from_slice(&word.to_be_bytes());
        out.push(fix_outer_checksum(f));
    }
    // VLAN tags in front of the IPv4 header: one, two of either TPID, as many as are walked, one more
    let plain = vxlan_frame(PEER_IP, 1, OUR_MAC, &from_peer);
    let spoofed = vxlan_frame(PEER_IP, 1, OUR_MAC, &client);
    let (q, ad) = (ETH_P_8021Q, ETH_P_8021AD);
    out.push(tagged(&plain, &[(q, 7)]));
    out.push(tagged(&spoofed, &[(q, 0), (q, 0)]));
    out.push(tagged(&spoofed, &[(ad, 0), (q, 0)]));
    out.push(tagged(&vxlan_frame(STRANGER_IP, 1, OUR_MAC, &from_peer), &[(ad, 5), (ad, 0), (q, 9)]));
    out.push(tagged(&plain, &[(q, 0); MAX_TAGS]));
    out.push(tagged(&eth([0xff; 6], [4; 6], 0x0806, &[0u8; 28]), &[(ad, 0); MAX_TAGS + 1]));
    // a pod's VXLAN to a peer node, plain and tagged
    let pod = vxlan_frame_to([10, 244, 1, 2], PEER_IP, 1, OUR_MAC, &from_peer);
    out.push(tagged(&pod, &[(q, 0)]));
    out.push(pod);
    // IPv6 with a hop-by-hop and a destination-options header, then UDP to 8472
    let mut v6 = vec![0x60, 0, 0, 0, 0, 40, 0, 64];
    v6.extend([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    v6.extend([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    v6.extend([60, 0, 1, 4, 0, 0, 0, 0]); // hop-by-hop -> destination options
    v6.extend([17, 0, 1, 4, 0, 0, 0, 0]); // destination options -> UDP
    v6.extend([0x9c, 0x40, 0x21, 0x18, 0, 24, 0, 0, 0x08, 0, 0, 0, 0, 0, 1, 0]);
    v6.extend([0u8; 8]);
    let v6 = eth([2; 6], [4; 6], 0x86dd, &v6);
    out.push(tagged(&v6, &[(q, 0), (ad, 0)]));
    out.push(v6);
    // UDP to 8472 that is not VXLAN
    let mut junk = vec![0x9c, 0x40, 0x21, 0x18, 0, 40, 0, 0];
    junk.extend((0..32u8).map(|i| i.wrapping_mul(37)));
    out.push(eth([2; 6], [4; 6], 0x0800, &ipv4(PEER_IP, OUR_IP, 17, &junk, 0)));
    out
}

/// Whether decap may judge `f` at all: IPv4, UDP, not a later fragment, to 8472.
fn for_our_port(f: &[u8]) -> bool {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 || f[23] != 17 {
        return false;
    }
    let ihl = (f[14] & 0x0f) as usize * 4;
    let later = u16::from_be_bytes([f[20], f[21]]) & 0x1fff != 0;
    ihl >= 20 && !later && f.len() >= 14 + ihl + 4 && f[14 + ihl + 2..14 + ihl + 4] == [0x21, 0x18]
}

fn be16(f: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]))
}

fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD
}

/// Whether `f` has a VLAN tag in its bytes.
fn is_tagged(f: &[u8]) -> bool {
    be16(f, 12).is_some_and(is_vlan)
}

/// The model of what the judges must drop of a tagged frame: UDP to 8472
/// behind its tags, or more than [`MAX_TAGS`] of them. A frame cut inside
/// its tags is not.
fn hides_vxlan(f: &[u8]) -> bool {
    let mut at = 14;
    for _ in 0..MAX_TAGS {
        let Some(ethertype) = be16(f, at + 2) else {
            return false;
        };
        at += 4;
        if !is_vlan(ethertype) {
            return udp_to_8472(f, ethertype, at);
        }
    }
    true
}

/// Whether the packet of `ethertype` at `at` is UDP to 8472 (not a later
/// fragment), or IPv6 behind more than four extension headers.
fn udp_to_8472(f: &[u8], ethertype: u16, at: usize) -> bool {
    let port_at = match ethertype {
        0x0800 if f.len() >= at + 20 && f[at] >> 4 == 4 && f[at] & 0x0f >= 5 => {
            let later = be16(f, at + 6).is_some_and(|w| w & 0x1fff != 0);
            if f[at + 9] != 17 || later {
                return false;
            }
            at + (f[at] & 0x0f) as usize * 4
        }
        0x86dd if f.len() >= at + 40 && f[at] >> 4 == 6 => {
            let (mut next, mut at) = (f[at + 6], at + 40);
            for _ in 0..4 {
                if ![0, 43, 44, 60].contains(&next) {
                    break;
                }
                let Some(h) = f.get(at..at + 8) else {
                    return false;
                };
                if next == 44 && u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0 {
                    return false; // a later fragment
                }
                at += if next == 44 { 8 } else { (h[1] as usize + 1) * 8 };
                next = h[0];
            }
            if [0, 43, 44, 60].contains(&next) {
                return true;
            }
            if next != 17 {
                return false;
            }
            at
        }
        _ => return false,
    };
    be16(f, port_at + 2) == Some(8472)
}

fn check_decap(l: &Loaded, f: &[u8]) -> Result<()> {
    let before = snapshot(l, &DECAP_VERDICTS)?;
    let Some((rc, out)) = run(l, "edgevx_decap", f)? else {
        return Ok(());
    };
    let after = snapshot(l, &DECAP_VERDICTS)?;
    let (which, total) = moved(&DECAP_VERDICTS, &before, &after);
    if is_tagged(f) {
        let hidden = hides_vxlan(f);
        match rc {
            TC_ACT_SHOT => ensure!(hidden && which == [Counter::DropVxlanTagged], "dropped {which:?}: {f:02x?}"),
            NEXT => ensure!(!hidden && total == 0 && out == f, "passed {which:?}, hidden {hidden}: {f:02x?}"),
            other => anyhow::bail!("decap verdict {other} for a tagged frame {f:02x?}"),
        }
        return Ok(());
    }
    let ours = for_our_port(f);
    match rc {
        NEXT => {
            ensure!(out == f, "decap passed a modified frame: {f:02x?}");
            ensure!(total <= 1, "one pass, counters {which:?}");
            ensure!(ours || total == 0, "a frame not to our port was counted: {which:?}");
        }
        TC_ACT_SHOT => {
            ensure!(ours, "decap dropped a frame that is not VXLAN to our port: {f:02x?}");
            ensure!(total == 1, "one drop, counters {which:?}: {f:02x?}");
        }
        TC_ACT_REDIRECT => {
            ensure!(ours && total == 1, "redirect: counters {which:?}");
            let src = [f[26], f[27], f[28], f[29]];
            ensure!(src == PEER_IP || src == EXEMPT_IP, "redirected VXLAN from {src:?}");
            ensure!(f[14] == 0x45 && checksum(&f[14..34]) == [0, 0], "redirected a bad outer header: {f:02x?}");
            ensure!(f[42..46] == [0x08, 0, 0, 0] && f[49] == 0, "redirected bad VXLAN flags");
            let inner = &f[64..];
            ensure!(
                inner[0] >> 4 == 4 && inner[0] & 0x0f >= 5 && inner[8] > 1 && f[62..64] == [0x08, 0x00],
                "redirected a bad inner header: {f:02x?}"
            );
            if src == PEER_IP {
                ensure!(inner[12..15] == [10, 244, 2], "redirected a spoofed inner source {:?}", &inner[12..16]);
            }
            ensure!(out == eth(POD_MAC, HOST_MAC, 0x0800, inner), "the redirected frame is not the inner packet");
        }
        other => anyhow::bail!("decap verdict {other} for {f:02x?}"),
    }
    Ok(())
}

fn check_pod_guard(l: &Loaded, f: &[u8]) -> Result<()> {
    let before = snapshot(l, &POD_GUARD_VERDICTS)?;
    let Some((rc, out)) = run(l, "edgevx_pod_guard", f)? else {
        return Ok(());
    };
    let (which, _) = moved(&POD_GUARD_VERDICTS, &before, &snapshot(l, &POD_GUARD_VERDICTS)?);
    let want = match be16(f, 12) {
        Some(t) if is_vlan(t) => hides_vxlan(f).then_some(Counter::DropVxlanTagged),
        Some(t) => udp_to_8472(f, t, 14).then_some(Counter::DropPodVxlan),
        None => None,
    };
    match want {
        Some(c) => ensure!(rc == TC_ACT_SHOT && which == [c], "pod guard: {rc} {which:?}, want {c:?}: {f:02x?}"),
        None => ensure!(rc == NEXT && which.is_empty() && out == f, "pod guard: {rc} {which:?}: {f:02x?}"),
    }
    Ok(())
}

fn check_encap(l: &Loaded, f: &[u8]) -> Result<()> {
    let before = snapshot(l, &ENCAP_VERDICTS)?;
    let Some((rc, out)) = run(l, l.encap, f)? else {
        return Ok(());
    };
    let after = snapshot(l, &ENCAP_VERDICTS)?;
    let (which, total) = moved(&ENCAP_VERDICTS, &before, &after);
    ensure!(total == 1, "encap: one verdict, counters {which:?}: {f:02x?}");
    match rc {
        TC_ACT_SHOT => ensure!(!which.contains(&Counter::TxPackets), "dropped but counted as sent"),
        TC_ACT_REDIRECT if which == [Counter::TxPackets] => {
            ensure!(out.len() == f.len() + 50, "encap grew the frame by {}", out.len() as i64 - f.len() as i64);
            ensure!(out[..12] == f[..12] && out[64..] == f[14..], "encap changed what it wraps");
            let ip = &out[14..34];
            ensure!(ip[0] == 0x45 && checksum(ip) == [0, 0], "bad outer IPv4 header {ip:02x?}");
            ensure!(u16::from_be_bytes([ip[2], ip[3]]) as usize == out.len() - 14, "outer length");
            ensure!(ip[12..16] == OUR_IP && (ip[16..20] == PEER_IP || ip[16..20] == EXEMPT_IP), "outer addresses");
            ensure!(out[36..38] == [0x21, 0x18] && out[42..50] == [0x08, 0, 0, 0, 0, 0, 1, 0], "UDP/VXLAN");
            ensure!(u16::from_be_bytes([out[38], out[39]]) as usize == out.len() - 34, "UDP length");
            ensure!(out[56..62] == OUR_MAC && out[62..64] == [0x08, 0x00], "inner Ethernet header");
        }
        TC_ACT_REDIRECT => {
            ensure!(which == [Counter::DropFragNeeded], "redirect counted as {which:?}");
            ensure!(out.len() == 14 + 56 && out[23] == 1 && out[34..36] == [3, 4], "not a frag-needed: {out:02x?}");
        }
        other => anyhow::bail!("encap verdict {other} for {f:02x?}"),
    }
    Ok(())
}

/// A VLAN tag's TPID: mostly one the kernel strips, sometimes another.
fn tpid(rng: &mut Rng) -> u16 {
    [ETH_P_8021Q, ETH_P_8021AD, ETH_P_8021Q, 0x9100, rng.next() as u16][rng.below(5)]
}

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut f = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        match rng.below(8) {
            0 => {
                let at = rng.below(f.len());
                f[at] = rng.byte();
            }
            1 => {
                let at = rng.below(f.len());
                f[at] ^= 1 << rng.below(8);
            }
            2 => f.truncate(MIN_FRAME + rng.below(f.len().saturating_sub(MIN_FRAME).max(1))),
            3 => f.extend((0..rng.below(64)).map(|_| rng.byte())),
            // a header field that matters, set to a boundary value
            4 => {
                let at = [14, 20, 21, 22, 23, 36, 37, 42, 49, 62, 63, 64, 72, 76][rng.below(14)];
                if at < f.len() {
                    f[at] = [0, 1, 0x08, 0x45, 0xff, 0x8c][rng.below(6)];
                }
            }
            // one to three tags pushed in front of the ethertype, or the first one popped
            5 if f.len() >= 14 => {
                let tags: Vec<_> = (0..1 + rng.below(3)).map(|_| (tpid(rng), rng.below(4096) as u16)).collect();
                f = tagged(&f, &tags);
            }
            6 if f.len() >= 18 && is_tagged(&f) => {
                f.drain(12..16);
            }
            _ => {}
        }
        if rng.below(2) == 0 && f.len() >= 34 && f[12..14] == [0x08, 0x00] && f[14] & 0x0f == 5 {
            f = fix_outer_checksum(f);
        }
    }
    if f.len() < MIN_FRAME {
        f.resize(MIN_FRAME, 0);
    }
    f
}

#[test]
fn encap_decap_and_the_pod_guard_hold_their_invariants_on_random_and_mutated_frames() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let seeds = seeds();
    // every seed, truncated at every offset
    for s in &seeds {
        for len in MIN_FRAME..=s.len() {
            check_decap(&l, &s[..len])?;
            check_encap(&l, &s[..len])?;
            check_pod_guard(&l, &s[..len])?;
        }
    }
    let mut rng = Rng(env_u64("EDGEVX_FUZZ_SEED", DEFAULT_SEED) | 1);
    for case in 0..env_u64("EDGEVX_FUZZ_CASES", DEFAULT_CASES) {
        let f = if rng.below(8) == 0 {
            (0..MIN_FRAME + rng.below(200)).map(|_| rng.byte()).collect()
        } else {
            let base = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, base)
        };
        check_decap(&l, &f).map_err(|e| e.context(format!("decap case {case}")))?;
        check_encap(&l, &f).map_err(|e| e.context(format!("encap case {case}")))?;
        check_pod_guard(&l, &f).map_err(|e| e.context(format!("pod guard case {case}")))?;
    }
    // the seeds themselves still do what they are for
    assert!(l.counter(Counter::RxFastPackets)? > 0 && l.counter(Counter::TxPackets)? > 0);
    assert!(l.counter(Counter::DropSpoofedSource)? > 0 && l.counter(Counter::DropUnknownPeer)? > 0);
    assert!(l.counter(Counter::DropVxlanTagged)? > 0 && l.counter(Counter::DropPodVxlan)? > 0);
    Ok(())
}
