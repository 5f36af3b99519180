//! The XDP judge (ebpf/src/xdp_judge.rs) with BPF_PROG_TEST_RUN, on the
//! frames the TC tests write out by hand: what it drops and counts, what it
//! passes unchanged, and that everything it drops TC's decap drops too
//! (both programs run on the same frames, the same maps behind them).
use anyhow::{Context, Result};
use aya::{
    TestRun, TestRunOptions,
    programs::{ProgramError, Xdp},
};
use edgevx_common::counters::Counter;

use crate::{
    prog_test_run::{
        EXEMPT_IP, Loaded, OUR_IP, PEER_IP, PEER_MAC, STRANGER_IP, TC_ACT_SHOT, eth, inner_icmp, ipv4, load,
        tag_stacks, tagged, vxlan_frame, vxlan_frame_to,
    },
    prog_test_run_v6::{PEER_IP6, POD6, STRANGER_IP6, inner_echo6, load6, vxlan6},
};

pub(crate) const XDP_JUDGE: &str = "edgevx_xdp_judge";
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
/// Where the outer UDP header starts in an IPv4 frame without options.
const UDP_AT: usize = 34;
/// ... and in an IPv6 frame without extension headers.
const UDP_AT6: usize = 54;

const XDP_COUNTERS: [Counter; 3] = [Counter::XdpDropUnknownPeer, Counter::XdpDropBadVxlanFlags, Counter::XdpDropShort];

/// The TC fixture with the XDP judge loaded too.
fn with_xdp(mut l: Loaded) -> Result<Loaded> {
    let p: &mut Xdp = l.ebpf.program_mut(XDP_JUDGE).context("program")?.try_into()?;
    p.load().context("the verifier refused the XDP judge")?;
    Ok(l)
}

/// Runs the XDP judge on `frame`; checks it came back unchanged.
fn xdp(l: &Loaded, what: &str, frame: &[u8]) -> Result<u32> {
    let p: &Xdp = l.ebpf.program(XDP_JUDGE).context("program")?.try_into()?;
    let mut out = vec![0u8; frame.len() + 256];
    let r = p
        .test_run(TestRunOptions { data_in: Some(frame), data_out: Some(&mut out), ..Default::default() })
        .map_err(|e: ProgramError| anyhow::anyhow!("{what}: {e}"))?;
    out.truncate(r.data_size_out as usize);
    assert_eq!(out, frame, "{what}: the XDP judge modified the frame");
    Ok(r.return_value)
}

fn xdp_counters(l: &Loaded) -> Result<Vec<u64>> {
    XDP_COUNTERS.iter().map(|c| l.counter(*c)).collect()
}

fn with_byte(frame: &[u8], at: usize, value: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[at] = value;
    f
}

/// An IPv4 VXLAN frame whose outer header carries fragment word `frag`
/// (checksum fixed up).
fn fragment(frame: &[u8], frag: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[20..22].copy_from_slice(&frag.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = crate::prog_test_run::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c);
    f
}

fn peer_frame() -> Vec<u8> {
    vxlan_frame(PEER_IP, 1, crate::prog_test_run::OUR_MAC, &inner_icmp([10, 244, 1, 2]))
}

#[test]
fn xdp_judge_passes_a_peers_vxlan_and_drops_a_strangers() -> Result<()> {
    let l = with_xdp(load(0)?)?;
    assert_eq!(xdp(&l, "peer", &peer_frame())?, XDP_PASS);
    let exempt = vxlan_frame(EXEMPT_IP, 1, crate::prog_test_run::OUR_MAC, &inner_icmp([10, 244, 1, 2]));
    assert_eq!(xdp(&l, "exempt peer", &exempt)?, XDP_PASS);
    assert_eq!(xdp_counters(&l)?, [0, 0, 0]);
    let stranger = vxlan_frame(STRANGER_IP, 1, crate::prog_test_run::OUR_MAC, &inner_icmp([10, 244, 1, 2]));
    assert_eq!(xdp(&l, "stranger", &stranger)?, XDP_DROP);
    // to another address of ours, or a broadcast: the kernel's socket takes it all the same
    let to_other = vxlan_frame_to(STRANGER_IP, [198, 18, 255, 255], 1, PEER_MAC, &inner_icmp([10, 244, 1, 2]));
    assert_eq!(xdp(&l, "stranger to broadcast", &to_other)?, XDP_DROP);
    assert_eq!(xdp_counters(&l)?, [2, 0, 0]);
    // another port, another protocol: not VXLAN, not judged
    assert_eq!(xdp(&l, "other port", &with_byte(&stranger, UDP_AT + 3, 0x19))?, XDP_PASS);
    let tcp = eth([0; 6], [0; 6], 0x0800, &ipv4(STRANGER_IP, OUR_IP, 6, &[0x9c, 0x40, 0x21, 0x18, 0, 0, 0, 0], 0));
    assert_eq!(xdp(&l, "tcp to 8472", &tcp)?, XDP_PASS);
    assert_eq!(xdp_counters(&l)?, [2, 0, 0]);
    // TC's counters did not move: XDP counts only its own
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 0);
    Ok(())
}

#[test]
fn xdp_judge_drops_a_peers_bad_flags_and_truncated_headers() -> Result<()> {
    let l = with_xdp(load(0)?)?;
    let good = peer_frame();
    let vxlan_at = UDP_AT + 8;
    for (at, value) in [(vxlan_at, 0x00), (vxlan_at, 0x0c), (vxlan_at + 1, 0x80), (vxlan_at + 3, 1), (vxlan_at + 7, 1)]
    {
        assert_eq!(xdp(&l, &format!("byte {at} = {value:#x}"), &with_byte(&good, at, value))?, XDP_DROP);
    }
    assert_eq!(xdp_counters(&l)?, [0, 5, 0]);
    // cut before the inner Ethernet header ends: short; cut after it: TC's to judge
    for cut in [UDP_AT + 4, UDP_AT + 8, UDP_AT + 16, UDP_AT + 29] {
        assert_eq!(xdp(&l, &format!("cut at {cut}"), &good[..cut])?, XDP_DROP);
    }
    assert_eq!(xdp(&l, "whole inner Ethernet", &good[..UDP_AT + 30])?, XDP_PASS);
    // no destination port to read: not known to be VXLAN, by TC either
    assert_eq!(xdp(&l, "cut in the ports", &good[..UDP_AT + 2])?, XDP_PASS);
    assert_eq!(l.run("edgevx_decap", &good[..UDP_AT + 2])?.0, crate::prog_test_run::NEXT);
    assert_eq!(xdp_counters(&l)?, [0, 5, 4]);
    // a stranger's truncated frame counts as a stranger's, as in TC
    let stranger = vxlan_frame(STRANGER_IP, 1, PEER_MAC, &inner_icmp([10, 244, 1, 2]));
    assert_eq!(xdp(&l, "stranger cut", &stranger[..UDP_AT + 10])?, XDP_DROP);
    assert_eq!(xdp_counters(&l)?, [1, 5, 4]);
    Ok(())
}

#[test]
fn xdp_judge_leaves_fragments_and_tagged_frames_to_tc() -> Result<()> {
    let l = with_xdp(load(0)?)?;
    let good = peer_frame();
    // a peer's first fragment, short or with bad flags: TC judges its length and the rest
    let first = fragment(&good, 0x2000);
    assert_eq!(xdp(&l, "first fragment, cut", &first[..UDP_AT + 12])?, XDP_PASS);
    assert_eq!(xdp(&l, "first fragment, bad flags", &with_byte(&first, UDP_AT + 8, 0x0c))?, XDP_PASS);
    // a later fragment has no UDP header, whoever sent it
    let stranger = vxlan_frame(STRANGER_IP, 1, PEER_MAC, &inner_icmp([10, 244, 1, 2]));
    assert_eq!(xdp(&l, "stranger's later fragment", &fragment(&stranger, 0x0003))?, XDP_PASS);
    assert_eq!(xdp_counters(&l)?, [0, 0, 0]);
    // but a stranger's first fragment holds the UDP header: dropped, as TC drops it
    assert_eq!(xdp(&l, "stranger's first fragment", &fragment(&stranger, 0x2000))?, XDP_DROP);
    assert_eq!(xdp_counters(&l)?, [1, 0, 0]);
    // VLAN tags in the bytes: TC drops the VXLAN behind them (tagged.rs); XDP does not look
    for tags in tag_stacks() {
        assert_eq!(xdp(&l, &format!("tags {tags:x?}"), &tagged(&stranger, &tags))?, XDP_PASS);
    }
    assert_eq!(xdp_counters(&l)?, [1, 0, 0]);
    Ok(())
}

#[test]
fn xdp_judge_drops_an_ipv6_strangers_vxlan_only_with_ipv6_on() -> Result<()> {
    let stranger = vxlan6(STRANGER_IP6, 1, &inner_echo6("fd00:10:244:2::2", POD6));
    let peer = vxlan6(PEER_IP6, 1, &inner_echo6("fd00:10:244:2::2", POD6));
    let off = with_xdp(load(0)?)?;
    assert_eq!(xdp(&off, "IPv6 off: stranger", &stranger)?, XDP_PASS);
    assert_eq!(xdp_counters(&off)?, [0, 0, 0]);
    let on = with_xdp(load6(0)?)?;
    assert_eq!(xdp(&on, "peer", &peer)?, XDP_PASS);
    assert_eq!(xdp(&on, "stranger", &stranger)?, XDP_DROP);
    assert_eq!(xdp(&on, "peer, bad flags", &with_byte(&peer, UDP_AT6 + 8, 0x88))?, XDP_DROP);
    assert_eq!(xdp(&on, "peer, cut", &peer[..UDP_AT6 + 20])?, XDP_DROP);
    assert_eq!(xdp_counters(&on)?, [1, 1, 1]);
    // behind a hop-by-hop header: TC walks it for a peer, the sk_lookup guard refuses a stranger
    let mut hop = stranger.clone();
    hop[20] = 0; // next header: hop-by-hop options
    hop.splice(UDP_AT6..UDP_AT6, [17, 0, 1, 4, 0, 0, 0, 0]);
    assert_eq!(xdp(&on, "stranger behind hop-by-hop", &hop)?, XDP_PASS);
    assert_eq!(xdp_counters(&on)?, [1, 1, 1]);
    Ok(())
}

/// Frames around every rule: each family, each sender, every cut, every
/// VXLAN flag byte value in a few positions, fragments, tags, ports.
fn corpus() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let inner = inner_icmp([10, 244, 1, 2]);
    let spoofed = inner_icmp([10, 244, 1, 2]); // from 10.244.1.2: not the peer's pod CIDR
    for src in [PEER_IP, STRANGER_IP, EXEMPT_IP] {
        for f in [
            vxlan_frame(src, 1, crate::prog_test_run::OUR_MAC, &inner),
            vxlan_frame(src, 2, PEER_MAC, &spoofed),
            vxlan_frame_to(src, [198, 18, 9, 9], 1, PEER_MAC, &inner),
        ] {
            for cut in (14..f.len()).step_by(3) {
                frames.push(f[..cut].to_vec());
            }
            for at in UDP_AT + 8..UDP_AT + 16 {
                for value in [0x00, 0x01, 0x08, 0x0c, 0x80, 0xff] {
                    frames.push(with_byte(&f, at, value));
                }
            }
            for frag in [0x2000, 0x2001, 0x0001, 0x4000] {
                let fr = fragment(&f, frag);
                frames.push(fr[..UDP_AT + 12].to_vec());
                frames.push(fr);
            }
            frames.push(with_byte(&f, 14, 0x46)); // IHL 6: options
            frames.push(with_byte(&f, 24, f[24] ^ 1)); // bad outer checksum
            for tags in tag_stacks().into_iter().take(4) {
                frames.push(tagged(&f, &tags));
            }
            frames.push(f);
        }
    }
    for src in [PEER_IP6, STRANGER_IP6] {
        let f = vxlan6(src, 1, &inner_echo6("fd00:10:244:2::2", POD6));
        for cut in (14..f.len()).step_by(3) {
            frames.push(f[..cut].to_vec());
        }
        for at in UDP_AT6 + 8..UDP_AT6 + 16 {
            frames.push(with_byte(&f, at, 0x0c));
        }
        frames.push(with_byte(&f, UDP_AT6 + 30 + 12, 0x08)); // inner IPv4 ethertype
        frames.push(f);
    }
    frames
}

/// The invariant: XDP's drops are a subset of TC's. Every frame the XDP
/// judge drops, decap (the authority) drops too, with IPv6 off and on.
#[test]
fn every_frame_the_xdp_judge_drops_tc_decap_drops_too() -> Result<()> {
    for (family, l) in [("IPv6 off", with_xdp(load(0)?)?), ("IPv6 on", with_xdp(load6(0)?)?)] {
        let (mut dropped, mut passed) = (0, 0);
        for (i, frame) in corpus().iter().enumerate() {
            let verdict = xdp(&l, &format!("{family}: frame {i}"), frame)?;
            match verdict {
                XDP_DROP => {
                    dropped += 1;
                    let (tc, _) = l.run("edgevx_decap", frame)?;
                    assert_eq!(tc, TC_ACT_SHOT, "{family}: frame {i} dropped by XDP, not by TC: {frame:02x?}");
                }
                XDP_PASS => passed += 1,
                other => panic!("{family}: frame {i}: XDP verdict {other}"),
            }
        }
        // the corpus exercises both verdicts, and every XDP counter
        assert!(dropped > 50 && passed > 50, "{family}: {dropped} dropped, {passed} passed");
        let counted: u64 = xdp_counters(&l)?.iter().sum();
        assert_eq!(counted, dropped, "{family}: counters");
        assert!(xdp_counters(&l)?.iter().all(|c| *c > 0), "{family}: {:?}", xdp_counters(&l)?);
    }
    Ok(())
}
